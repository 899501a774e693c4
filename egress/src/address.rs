//! Addresses a name may resolve to only when a rule names it explicitly: the host's own
//! services and its network's (DNS rebinding: a name under an allowed `*.domain` made to
//! resolve to 127.0.0.1 must not reach the host's database).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why `ip` is internal (`loopback`, `private`, ...), or `None` for a public address.
pub fn internal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => internal_v4(v4),
            None => internal_v6(v6),
        },
    }
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
    } else if a == 0 || ip.is_broadcast() {
        "unspecified"
    } else if ip.is_multicast() || a >= 240 {
        "multicast or reserved"
    } else {
        return None;
    })
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(if ip.is_loopback() {
        "loopback"
    } else if ip.is_unspecified() {
        "unspecified"
    } else if first & 0xfe00 == 0xfc00 {
        "private (unique local)"
    } else if first & 0xffc0 == 0xfe80 {
        "link-local"
    } else if ip.is_multicast() {
        "multicast"
    } else if ip.to_ipv4().is_some() && first == 0 {
        // IPv4-compatible (::a.b.c.d), deprecated: judged as its IPv4 address.
        return ip.to_ipv4().and_then(internal_v4);
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            assert_eq!(internal(a.parse().unwrap()), None, "{a}");
        }
    }
}
