//! Addresses a name may resolve to only when a rule names it explicitly: the host's own
//! services and its network's (DNS rebinding: a name under an allowed `*.domain` made to
//! resolve to 127.0.0.1 must not reach the host's database).
//!
//! Internal is any address of a special-purpose range that is not a public host on the
//! internet ([`internal`]: loopback, private, link-local, shared, documentation, benchmarking,
//! reserved, multicast, unique- and site-local, the IETF's protocol assignments, the
//! transition prefixes that lead to an IPv4 address by another way), and any address assigned
//! to one of this host's own interfaces ([`local_addresses`], [`internal_here`]): a VM whose
//! `eth0` has a public-looking address is reached through it as well as through 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why `ip` is internal by its range (`loopback`, `private`, ...), or `None` for a public
/// address. IPv4-mapped IPv6 (`::ffff:a.b.c.d`), NAT64's well-known prefix
/// (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::/48`) are judged by the IPv4 address they
/// lead to; the other transition prefixes (IPv4-compatible `::a.b.c.d`, local-use NAT64
/// `64:ff9b:1::/48`, Teredo `2001::/32`) are internal whatever they embed.
pub fn internal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => internal_v4(v4),
            None => internal_v6(v6),
        },
    }
}

/// Why `ip` is internal: by its range ([`internal`]), or because it is one of `local`, the
/// addresses of this host's own interfaces ([`local_addresses`]).
/// An IPv6 address that leads to an IPv4 one (NAT64's well-known prefix, 6to4) is judged by
/// that one too.
pub fn internal_here(ip: IpAddr, local: &[IpAddr]) -> Option<&'static str> {
    internal(ip).or_else(|| {
        let ip = ip.to_canonical();
        let to = leads_to(ip).map(IpAddr::V4);
        local
            .iter()
            .map(|l| l.to_canonical())
            .any(|l| l == ip || Some(l) == to)
            .then_some("this host's own (an address of one of its interfaces)")
    })
}

/// The IPv4 address NAT64's well-known prefix or 6to4 leads to.
fn leads_to(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let s = v6.segments();
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(last_v4(v6))
    } else if s[0] == 0x2002 {
        let [a, b] = s[1].to_be_bytes();
        let [c, d] = s[2].to_be_bytes();
        Some(Ipv4Addr::new(a, b, c, d))
    } else {
        None
    }
}

/// The addresses assigned to this host's interfaces (in the proxy's network namespace), read
/// with `getifaddrs(3)`: one netlink dump, some tens of microseconds.
pub fn local_addresses() -> std::io::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for i in nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)? {
        let Some(a) = i.address else { continue };
        if let Some(v4) = a.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = a.as_sockaddr_in6() {
            out.push(IpAddr::V6(v6.ip()));
        }
    }
    Ok(out)
}

/// `ip` is in `net/len`.
fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn internal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private"
    } else if ip.is_link_local() {
        "link-local"
    } else if a == 100 && (64..128).contains(&b) {
        "shared (carrier-grade NAT)"
    } else if a == 0 {
        "unspecified (this network)"
    } else if ip.is_broadcast() {
        "broadcast"
    } else if in_v4(ip, [192, 0, 0, 0], 24) {
        "IETF protocol assignment"
    } else if in_v4(ip, [192, 0, 2, 0], 24)
        || in_v4(ip, [198, 51, 100, 0], 24)
        || in_v4(ip, [203, 0, 113, 0], 24)
    {
        "documentation"
    } else if in_v4(ip, [198, 18, 0, 0], 15) {
        "benchmarking"
    } else if in_v4(ip, [192, 88, 99, 0], 24) {
        "6to4 relay anycast"
    } else if ip.is_multicast() {
        "multicast"
    } else if a >= 240 {
        "reserved"
    } else {
        return None;
    })
}

/// The IPv4 address in the last 32 bits.
fn last_v4(ip: Ipv6Addr) -> Ipv4Addr {
    let o = ip.octets();
    Ipv4Addr::new(o[12], o[13], o[14], o[15])
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(if ip.is_loopback() {
        "loopback"
    } else if ip.is_unspecified() {
        "unspecified"
    } else if s[..6] == [0; 6] {
        // IPv4-compatible (::a.b.c.d), deprecated: no public host has one.
        "IPv4-compatible (deprecated)"
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64's well-known prefix: a gateway connects to the IPv4 address it embeds (on an
        // IPv6-only network with DNS64, every public name resolves to one).
        return internal_v4(last_v4(ip)).map(|_| "NAT64 of an internal IPv4 address");
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        "local-use NAT64"
    } else if s[0] == 0x2002 {
        // 6to4: the IPv4 address of the site's 6to4 router is in bits 16-48.
        let [a, b] = s[1].to_be_bytes();
        let [c, d] = s[2].to_be_bytes();
        return internal_v4(Ipv4Addr::new(a, b, c, d)).map(|_| "6to4 of an internal IPv4 address");
    } else if s[0] == 0x2001 && s[1] == 0 {
        "Teredo"
    } else if s[0] == 0x2001 && s[1] < 0x200 {
        // 2001::/23, the IETF's protocol assignments (benchmarking 2001:2::/48, ORCHID...).
        "IETF protocol assignment"
    } else if (s[0] == 0x2001 && s[1] == 0xdb8) || (s[0] == 0x3fff && s[1] < 0x1000) {
        "documentation"
    } else if s[..4] == [0x100, 0, 0, 0] {
        "discard-only"
    } else if s[0] == 0x5f00 {
        "segment routing (SRv6)"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "private (unique local)"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "link-local"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "site-local (deprecated)"
    } else if ip.is_multicast() {
        "multicast"
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check before the special ranges were added: what each new range got past.
    fn previous(ip: IpAddr) -> Option<&'static str> {
        fn v4(ip: Ipv4Addr) -> Option<&'static str> {
            let [a, b, ..] = ip.octets();
            (ip.is_loopback()
                || ip.is_private()
                || ip.is_link_local()
                || a == 100 && (64..128).contains(&b)
                || a == 0
                || ip.is_broadcast()
                || ip.is_multicast()
                || a >= 240)
                .then_some("internal")
        }
        match ip {
            IpAddr::V4(a) => v4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(m) => v4(m),
                None => {
                    let first = a.segments()[0];
                    if a.is_loopback()
                        || a.is_unspecified()
                        || first & 0xfe00 == 0xfc00
                        || first & 0xffc0 == 0xfe80
                        || a.is_multicast()
                    {
                        Some("internal")
                    } else if a.to_ipv4().is_some() && first == 0 {
                        a.to_ipv4().and_then(v4)
                    } else {
                        None
                    }
                }
            },
        }
    }

    #[test]
    fn internal_and_public() {
        for a in [
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "ff02::1",
        ] {
            assert!(internal(a.parse().unwrap()).is_some(), "{a}");
        }
        for a in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            // NAT64 and 6to4 of a public address: what an IPv6-only network reaches it by.
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "2001:200::1",
            "2001:4860:4860::8888",
            "4000::1",
        ] {
            assert_eq!(internal(a.parse().unwrap()), None, "{a}");
        }
    }

    /// Each special range added is internal now, and got past the check before (the control:
    /// the same address with only the new ranges left out is public).
    #[test]
    fn the_special_ranges_are_internal_and_were_not_before() {
        for (a, why) in [
            ("192.0.0.8", "IETF protocol assignment"),
            ("192.0.2.2", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.200", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.254", "benchmarking"),
            ("192.88.99.1", "6to4 relay anycast"),
            ("::ffff:192.0.2.2", "documentation"),
            ("64:ff9b::127.0.0.1", "NAT64 of an internal IPv4 address"),
            ("64:ff9b::a9fe:a9fe", "NAT64 of an internal IPv4 address"),
            ("64:ff9b::192.0.2.1", "NAT64 of an internal IPv4 address"),
            ("64:ff9b:1::808:808", "local-use NAT64"),
            ("2002:7f00:1::1", "6to4 of an internal IPv4 address"),
            ("2002:c000:202::1", "6to4 of an internal IPv4 address"),
            ("2001::1", "Teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
            ("2001:2::1", "IETF protocol assignment"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("100::1", "discard-only"),
            ("5f00::1", "segment routing (SRv6)"),
            ("::8.8.8.8", "IPv4-compatible (deprecated)"),
            ("::192.0.2.1", "IPv4-compatible (deprecated)"),
            ("fec0::1", "site-local (deprecated)"),
            ("feff::1", "site-local (deprecated)"),
        ] {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(internal(ip), Some(why), "{a}");
            assert_eq!(previous(ip), None, "{a} was internal before already");
        }
        // Already internal before, with the reason now given.
        for (a, why) in [
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
            ("fc00::1", "private (unique local)"),
            ("::127.0.0.1", "IPv4-compatible (deprecated)"),
        ] {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(internal(ip), Some(why), "{a}");
            assert!(previous(ip).is_some(), "{a}");
        }
    }

    /// An address of one of this host's interfaces is internal, whatever its range; the
    /// control: the same address without the interfaces is public.
    #[test]
    fn the_hosts_own_addresses_are_internal() {
        let public: IpAddr = "1.2.3.4".parse().unwrap();
        let mapped: IpAddr = "::ffff:1.2.3.4".parse().unwrap();
        let local = [public, "2606:4700::1".parse().unwrap()];
        assert_eq!(internal(public), None);
        assert_eq!(internal_here(public, &[]), None);
        assert!(internal_here(public, &local)
            .unwrap()
            .contains("this host's own"));
        assert!(internal_here(mapped, &local).is_some());
        assert!(internal_here("2606:4700::1".parse().unwrap(), &local).is_some());
        // Through NAT64 or 6to4 to the host's own IPv4 address.
        for a in ["64:ff9b::1.2.3.4", "2002:102:304::1"] {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(internal(ip), None, "{a}");
            assert!(internal_here(ip, &local).is_some(), "{a}");
            assert_eq!(internal_here(ip, &[]), None, "{a}");
        }
        assert_eq!(internal_here("8.8.8.8".parse().unwrap(), &local), None);
        // And they are read: loopback is always among them.
        let here = local_addresses().unwrap();
        assert!(here.contains(&"127.0.0.1".parse().unwrap()), "{here:?}");
    }
}
