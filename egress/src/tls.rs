//! The server name (SNI) in a TLS ClientHello: what a tunnel's first bytes say they are
//! going to. Read only, never decrypted or changed; the bytes are the cell's, so everything
//! is bounds-checked. A ClientHello may be split over several handshake records (legal TLS):
//! their fragments are put together, up to [`MAX_HELLO`] bytes in at most [`MAX_FRAGMENTS`]
//! records.

/// What a tunnel's first bytes are.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A ClientHello naming this server (lowercase, no final dot).
    Sni(String),
    /// A ClientHello without a server name (a client that connects to an address).
    NoSni,
    /// Not TLS: some other protocol in the tunnel.
    NotTls,
    /// The start of a ClientHello: more bytes are needed.
    Incomplete,
    /// TLS records that are not a well-formed ClientHello.
    Malformed(&'static str),
}

/// The largest TLS record (2^14 bytes and its 5-byte header, with room for the expansion
/// TLS 1.2 allows).
pub const MAX_RECORD: usize = 5 + (1 << 14) + 2048;
/// The largest ClientHello read: 16 KiB and its 4-byte handshake header (a browser's, with a
/// post-quantum key share, is under 2 KiB).
pub const MAX_HELLO: usize = 4 + (1 << 14);
/// The most records a ClientHello may be split over.
pub const MAX_FRAGMENTS: usize = 64;
/// The most bytes a tunnel's first bytes can be before [`client_hello`] decides: a hello of
/// [`MAX_HELLO`] bytes in [`MAX_FRAGMENTS`] records.
pub const MAX_FIRST_BYTES: usize = MAX_HELLO + 5 * MAX_FRAGMENTS;

/// Reads the ClientHello at the start of a tunnel, from as many handshake records as it
/// spans.
pub fn client_hello(bytes: &[u8]) -> Hello {
    if bytes.is_empty() {
        return Hello::Incomplete;
    }
    // A first byte that is a TLS record's type is TLS, whatever follows: only a handshake
    // record of TLS's version may open it (a server may skip an alert or take another
    // version and read the hello after it: passing such bytes as "not TLS" would let a hello
    // naming another server through).
    if (0x14..=0x18).contains(&bytes[0]) && bytes[0] != 0x16 {
        return Hello::Malformed("a TLS record other than a handshake before the ClientHello");
    }
    if bytes[0] != 0x16 {
        return Hello::NotTls;
    }
    if bytes.len() >= 2 && bytes[1] != 3 {
        return Hello::Malformed("a TLS record of another protocol version");
    }
    // The handshake message, put together from the records' fragments.
    let mut message: Vec<u8> = Vec::new();
    let mut at = 0;
    let mut records = 0;
    loop {
        if let Some(&kind) = message.first() {
            if kind != 1 {
                return Hello::Malformed("the first handshake message is not a ClientHello");
            }
        }
        if message.len() >= 4 {
            let len = 4
                + ((usize::from(message[1]) << 16)
                    | (usize::from(message[2]) << 8)
                    | usize::from(message[3]));
            if len > MAX_HELLO {
                return Hello::Malformed("a ClientHello over 16 KiB");
            }
            if message.len() >= len {
                return match parse(&message[4..len]) {
                    Ok(h) => h,
                    Err(why) => Hello::Malformed(why),
                };
            }
        }
        let rest = &bytes[at..];
        if rest.is_empty() {
            return Hello::Incomplete;
        }
        if rest[0] != 0x16 {
            return Hello::Malformed("a record other than a handshake inside the ClientHello");
        }
        if rest.len() >= 2 && rest[1] != 3 {
            return Hello::Malformed("a record of another protocol version inside the ClientHello");
        }
        if rest.len() < 5 {
            return Hello::Incomplete;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 {
            return Hello::Malformed("an empty handshake record");
        }
        if 5 + len > MAX_RECORD {
            return Hello::Malformed("a TLS record over its largest size");
        }
        records += 1;
        if records > MAX_FRAGMENTS {
            return Hello::Malformed("a ClientHello split over more than 64 records");
        }
        // A record not all there yet still gives what it has: the hello may end in it.
        let have = len.min(rest.len() - 5);
        message.extend_from_slice(&rest[5..5 + have]);
        at += 5 + have;
    }
}

/// A cursor over the cell's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err(what);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<usize, &'static str> {
        Ok(usize::from(self.take(1, what)?[0]))
    }

    fn u16(&mut self, what: &'static str) -> Result<usize, &'static str> {
        let b = self.take(2, what)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a length prefix of `prefix` bytes.
    fn vec(&mut self, prefix: usize, what: &'static str) -> Result<Reader<'a>, &'static str> {
        let n = match prefix {
            1 => self.u8(what)?,
            _ => self.u16(what)?,
        };
        Ok(Reader(self.take(n, what)?))
    }
}

/// The body of a ClientHello message (after its 4-byte header).
fn parse(body: &[u8]) -> Result<Hello, &'static str> {
    let mut h = Reader(body);
    h.take(2 + 32, "no version or random")?;
    h.vec(1, "no session id")?;
    h.vec(2, "no cipher suites")?;
    h.vec(1, "no compression methods")?;
    if h.0.is_empty() {
        return Ok(Hello::NoSni);
    }
    let mut exts = h.vec(2, "short extensions")?;
    while !exts.0.is_empty() {
        let kind = exts.u16("a short extension")?;
        let mut body = exts.vec(2, "a short extension")?;
        if kind != 0 {
            continue;
        }
        let mut names = body.vec(2, "a short server name list")?;
        while !names.0.is_empty() {
            let name_type = names.u8("a short server name")?;
            let name = names.vec(2, "a short server name")?;
            if name_type == 0 {
                let name = std::str::from_utf8(name.0).map_err(|_| "a server name not in ASCII")?;
                let name = name.strip_suffix('.').unwrap_or(name);
                return Ok(Hello::Sni(name.to_ascii_lowercase()));
            }
        }
        return Err("a server name extension without a host name");
    }
    Ok(Hello::NoSni)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello record, with a server name when given.
    pub(crate) fn hello(sni: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = sni {
            let n = name.len() as u16;
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(n + 5).to_be_bytes());
            ext.extend_from_slice(&(n + 3).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&n.to_be_bytes());
            ext.extend_from_slice(name.as_bytes());
        }
        // Another extension first (supported_versions), as real clients send.
        let mut exts = vec![0, 43, 0, 3, 2, 3, 4];
        exts.extend_from_slice(&ext);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn server_names_and_the_rest() {
        let h = hello(Some("API.Example.com."));
        assert_eq!(client_hello(&h), Hello::Sni("api.example.com".into()));
        assert_eq!(client_hello(&hello(None)), Hello::NoSni);
        for cut in [1, 4, 5, h.len() - 1] {
            assert_eq!(client_hello(&h[..cut]), Hello::Incomplete, "{cut}");
        }
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(client_hello(b"SSH-2.0-x\r\n"), Hello::NotTls);
        // TLS-shaped first bytes that are not a handshake record of TLS's version: an alert,
        // a ChangeCipherSpec or application data before the hello, or version 0x0000 (a
        // server may skip or accept them and read the hello behind): never "not TLS".
        for first in [
            &[0x15, 3, 1, 0, 2, 1, 0][..],
            &[0x14, 3, 1, 0, 1, 1],
            &[0x17, 3, 3, 0, 0],
            &[0x16, 0, 0, 0, 4, 1, 0, 0, 0],
        ] {
            assert!(
                matches!(client_hello(first), Hello::Malformed(_)),
                "{first:?}"
            );
        }
        // A length over the bound: malformed, never a wait; flipped bytes never a panic.
        let mut bad = h.clone();
        bad[6] = 0xff;
        assert_eq!(
            client_hello(&bad),
            Hello::Malformed("a ClientHello over 16 KiB")
        );
        for i in 5..h.len() {
            let mut b = h.clone();
            b[i] ^= 0xff;
            let _ = client_hello(&b);
        }
    }

    /// The records of `hello` re-cut so that its handshake message is split at `cuts`.
    pub(crate) fn split(hello: &[u8], cuts: &[usize]) -> Vec<u8> {
        let message = &hello[5..];
        let mut out = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain(std::iter::once(&message.len())) {
            out.extend_from_slice(&[0x16, 3, 1]);
            out.extend_from_slice(&((to - from) as u16).to_be_bytes());
            out.extend_from_slice(&message[from..to]);
            from = to;
        }
        out
    }

    /// A ClientHello split over 2 and 3 records (the server name in the last one, or in the
    /// header's record alone) reads as one; cut anywhere, it is incomplete; each record is
    /// checked.
    #[test]
    fn a_hello_split_over_records_is_put_together() {
        let h = hello(Some("api.example.com"));
        let n = h.len() - 5;
        for cuts in [
            vec![2],
            vec![40],
            vec![n - 3],
            vec![1, 3],
            vec![4, n - 10],
            vec![30, 60],
        ] {
            let s = split(&h, &cuts);
            assert_eq!(
                client_hello(&s),
                Hello::Sni("api.example.com".into()),
                "{cuts:?}"
            );
            for cut in 1..s.len() {
                assert_eq!(client_hello(&s[..cut]), Hello::Incomplete, "{cuts:?} {cut}");
            }
            // What follows the hello (the rest of the handshake, data) is not read.
            let mut more = s.clone();
            more.extend_from_slice(b"\x17\x03\x03\x00\x05hello");
            assert_eq!(client_hello(&more), Hello::Sni("api.example.com".into()));
        }
        assert_eq!(client_hello(&split(&hello(None), &[10, 20])), Hello::NoSni);
        // Another record type in the middle, an empty record, too many records.
        let s = split(&h, &[10]);
        let mut alert = s[..15].to_vec();
        alert.extend_from_slice(&[0x15, 3, 3, 0, 2, 2, 40]);
        assert!(matches!(client_hello(&alert), Hello::Malformed(_)));
        let mut empty = s[..15].to_vec();
        empty.extend_from_slice(&[0x16, 3, 1, 0, 0]);
        assert_eq!(
            client_hello(&empty),
            Hello::Malformed("an empty handshake record")
        );
        let many: Vec<usize> = (1..70).collect();
        assert_eq!(
            client_hello(&split(&h, &many)),
            Hello::Malformed("a ClientHello split over more than 64 records")
        );
        let many: Vec<usize> = (1..64).collect();
        assert_eq!(
            client_hello(&split(&h, &many)),
            Hello::Sni("api.example.com".into())
        );
        // A message that is not a ClientHello is refused from its first byte.
        let mut server = split(&h, &[1]);
        server[5] = 2;
        assert!(matches!(client_hello(&server[..6]), Hello::Malformed(_)));
    }
}
