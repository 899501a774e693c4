//! The server name (SNI) in a TLS ClientHello: what a tunnel's first bytes say they are
//! going to. Read only, never decrypted or changed; the bytes are the cell's, so everything
//! is bounds-checked and a hello larger than one TLS record is not read further.

/// What a tunnel's first bytes are.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A ClientHello naming this server (lowercase, no final dot).
    Sni(String),
    /// A ClientHello without a server name (a client that connects to an address).
    NoSni,
    /// Not TLS: some other protocol in the tunnel.
    NotTls,
    /// The start of a TLS record: more bytes are needed.
    Incomplete,
    /// A TLS record that is not a well-formed ClientHello.
    Malformed(&'static str),
}

/// The largest TLS record (2^14 bytes and its 5-byte header, with room for the expansion
/// TLS 1.2 allows).
pub const MAX_RECORD: usize = 5 + (1 << 14) + 2048;

/// Reads the first record of a tunnel.
pub fn client_hello(bytes: &[u8]) -> Hello {
    if bytes.is_empty() {
        return Hello::Incomplete;
    }
    if bytes[0] != 0x16 {
        return Hello::NotTls;
    }
    if bytes.len() < 5 {
        return Hello::Incomplete;
    }
    if bytes[1] != 3 {
        return Hello::NotTls;
    }
    let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
    if bytes.len() < 5 + len {
        return Hello::Incomplete;
    }
    match parse(&bytes[5..5 + len]) {
        Ok(h) => h,
        Err(why) => Hello::Malformed(why),
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

fn parse(record: &[u8]) -> Result<Hello, &'static str> {
    let mut r = Reader(record);
    if r.u8("no handshake type")? != 1 {
        return Err("the first handshake message is not a ClientHello");
    }
    let len = r.take(3, "a short handshake header")?;
    let len = (usize::from(len[0]) << 16) | (usize::from(len[1]) << 8) | usize::from(len[2]);
    if len > r.0.len() {
        return Err("a ClientHello longer than its first record");
    }
    let mut h = Reader(r.take(len, "a short ClientHello")?);
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
        // Lengths that point past the record: malformed, never a panic.
        let mut bad = h.clone();
        bad[8] = 0xff;
        assert!(matches!(client_hello(&bad), Hello::Malformed(_)));
        for i in 5..h.len() {
            let mut b = h.clone();
            b[i] ^= 0xff;
            let _ = client_hello(&b);
        }
    }
}
