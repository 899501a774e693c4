//! One framing per request: a request with both `Transfer-Encoding` and `Content-Length` is
//! refused (400) and its connection closed, as RFC 9112 (6.1) allows. hyper decodes such a
//! request as chunked and drops the `Content-Length` before the service could see it, while a
//! proxy in front may have framed it by its length: the bytes one of them takes as the body,
//! the other takes as the next request (request smuggling). So is a `Transfer-Encoding`
//! that is not exactly one `chunked` (`chunked, chunked` applies it twice, which RFC 9112
//! forbids; no other coding is served).
//!
//! [`Framing`] wraps a connection's reads: it holds each request head until it is whole,
//! follows each body's framing (a length, or chunks and trailers) to find the next head, and
//! when a head names both headers, spoils its method's first byte (`@`, never in a method
//! token), so that hyper refuses it with its 400 and closes the connection. Nothing else is
//! changed; bytes pass on in order. A head over [`MAX_HEAD`] (hyper refuses those), an upgrade,
//! or a body whose framing cannot be followed ends the watching for that connection (hyper
//! refuses a malformed chunk itself).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest head followed (hyper's own limit is lower).
pub const MAX_HEAD: usize = 1 << 20;
/// The longest chunk-size or trailer line followed.
const MAX_LINE: usize = 8192;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Collecting a request head.
    Head,
    /// A body of this many bytes left.
    Fixed(u64),
    /// A chunk-size line.
    ChunkSize,
    /// This many bytes of chunk data left, then its CRLF.
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// Trailer lines, up to an empty one.
    Trailer,
    /// No more watching.
    Pass,
}

/// The framing follower of one connection's incoming bytes.
#[derive(Debug)]
pub struct Follower {
    state: State,
    /// The head (or line) being collected.
    held: Vec<u8>,
    /// Heads refused so far.
    pub refused: u64,
}

impl Default for Follower {
    fn default() -> Self {
        Follower {
            state: State::Head,
            held: Vec::new(),
            refused: 0,
        }
    }
}

impl Follower {
    /// Takes the next bytes read; appends to `out` what may be handed on (a head only once it
    /// is whole).
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() {
            match self.state {
                State::Pass => {
                    out.extend_from_slice(data);
                    return;
                }
                State::Fixed(n) => {
                    let take = (n.min(data.len() as u64)) as usize;
                    out.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    self.state = if n == take as u64 {
                        State::Head
                    } else {
                        State::Fixed(n - take as u64)
                    };
                }
                State::ChunkData(n) => {
                    let take = (n.min(data.len() as u64)) as usize;
                    out.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    self.state = if n == take as u64 {
                        State::ChunkEnd
                    } else {
                        State::ChunkData(n - take as u64)
                    };
                }
                State::ChunkSize | State::ChunkEnd | State::Trailer => {
                    // One line, handed on as it comes.
                    let end = data.iter().position(|&b| b == b'\n');
                    let take = end.map_or(data.len(), |e| e + 1);
                    self.held.extend_from_slice(&data[..take]);
                    out.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if end.is_none() {
                        if self.held.len() > MAX_LINE {
                            self.state = State::Pass;
                        }
                        continue;
                    }
                    let line = std::mem::take(&mut self.held);
                    let line = trim_line(&line);
                    self.state = match self.state {
                        State::ChunkEnd if line.is_empty() => State::ChunkSize,
                        State::ChunkSize => match chunk_size(line) {
                            Some(0) => State::Trailer,
                            Some(n) => State::ChunkData(n),
                            None => State::Pass,
                        },
                        State::Trailer if line.is_empty() => State::Head,
                        State::Trailer => State::Trailer,
                        _ => State::Pass,
                    };
                }
                State::Head => {
                    self.held.extend_from_slice(data);
                    data = &[];
                    // Empty lines before a request line are passed on (hyper skips them).
                    let blank = self
                        .held
                        .iter()
                        .take_while(|&&b| b == b'\r' || b == b'\n')
                        .count();
                    if blank > 0 {
                        out.extend(self.held.drain(..blank));
                    }
                    let Some(end) = head_end(&self.held) else {
                        if self.held.len() > MAX_HEAD {
                            out.append(&mut self.held);
                            self.state = State::Pass;
                        }
                        continue;
                    };
                    let rest = self.held.split_off(end);
                    let mut head = std::mem::take(&mut self.held);
                    self.state = self.judge(&mut head);
                    out.extend_from_slice(&head);
                    // What came after the head is the body's, or the next head's.
                    self.feed(&rest, out);
                }
            }
        }
    }

    /// Whether the next `n` bytes are all body (or no longer watched): if so they are taken
    /// as they are.
    pub fn body_takes(&mut self, n: usize) -> bool {
        let n = n as u64;
        match self.state {
            State::Pass => true,
            State::Fixed(left) if left > n => {
                self.state = State::Fixed(left - n);
                true
            }
            State::ChunkData(left) if left > n => {
                self.state = State::ChunkData(left - n);
                true
            }
            _ => false,
        }
    }

    /// The framing of the body after `head`; spoils a head with both framings.
    fn judge(&mut self, head: &mut [u8]) -> State {
        let (mut chunked, mut te, mut length, mut upgrade) = (false, false, None, false);
        // Every transfer coding named, over every `Transfer-Encoding` line: only one
        // `chunked` is served (`chunked, chunked` applies it twice, which RFC 9112 forbids;
        // another coding is not supported).
        let mut codings = 0usize;
        let mut only_chunked = true;
        let mut lines = head.split(|&b| b == b'\n');
        let request_line = lines.next().map(trim_line).unwrap_or_default();
        if request_line.starts_with(b"CONNECT ") {
            upgrade = true;
        }
        for line in lines {
            let line = trim_line(line);
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                te = true;
                for coding in value.split(|&b| b == b',').map(trim) {
                    codings += 1;
                    only_chunked &= coding.eq_ignore_ascii_case(b"chunked");
                }
                chunked = value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"content-length") {
                length = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok());
                if length.is_none() {
                    return State::Pass; // hyper refuses it
                }
            } else if name.eq_ignore_ascii_case(b"upgrade") {
                upgrade = true;
            }
        }
        if te && (length.is_some() || codings != 1 || !only_chunked) {
            head[0] = b'@';
            self.refused += 1;
            return State::Pass;
        }
        match (upgrade, te, chunked, length) {
            (true, ..) => State::Pass,
            (_, true, true, _) => State::ChunkSize,
            (_, true, false, _) => State::Pass, // hyper refuses it
            (_, _, _, Some(0)) | (_, _, _, None) => State::Head,
            (_, _, _, Some(n)) => State::Fixed(n),
        }
    }
}

/// Where a head ends (after its empty line), LF or CRLF.
fn head_end(b: &[u8]) -> Option<usize> {
    (1..b.len()).find_map(|i| {
        let lf_lf = b[i - 1] == b'\n';
        let crlf_crlf = i >= 2 && b[i - 1] == b'\r' && b[i - 2] == b'\n';
        (b[i] == b'\n' && (lf_lf || crlf_crlf)).then_some(i + 1)
    })
}

fn trim_line(l: &[u8]) -> &[u8] {
    let l = l.strip_suffix(b"\n").unwrap_or(l);
    l.strip_suffix(b"\r").unwrap_or(l)
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// A chunk-size line's size (hex, before any extension).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let hex = trim(line.split(|&b| b == b';').next().unwrap_or_default());
    if hex.is_empty() || hex.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// A connection whose reads pass through a [`Follower`].
pub struct Framing<T> {
    inner: T,
    follower: Follower,
    ready: Vec<u8>,
    at: usize,
    eof: bool,
}

impl<T> Framing<T> {
    /// Watches `inner`'s incoming requests.
    pub fn new(inner: T) -> Framing<T> {
        Framing {
            inner,
            follower: Follower::default(),
            ready: Vec::new(),
            at: 0,
            eof: false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Framing<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.at < this.ready.len() {
                let n = (this.ready.len() - this.at).min(buf.remaining());
                buf.put_slice(&this.ready[this.at..this.at + n]);
                this.at += n;
                if this.at == this.ready.len() {
                    this.ready.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            // Straight into the caller's buffer; bytes that are all body pass as they are
            // (no copy), the others are taken back and go through the follower.
            let before = buf.filled().len();
            match Pin::new(&mut this.inner).poll_read(cx, buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let got = &buf.filled()[before..];
                    if got.is_empty() {
                        // The end: a head never finished goes on as it is.
                        this.eof = true;
                        this.ready.append(&mut this.follower.held);
                        continue;
                    }
                    if this.follower.body_takes(got.len()) {
                        return Poll::Ready(Ok(()));
                    }
                    let mut out = std::mem::take(&mut this.ready);
                    this.follower.feed(got, &mut out);
                    this.ready = out;
                    buf.set_filled(before);
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Framing<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(chunks: &[&[u8]]) -> (Vec<u8>, u64) {
        let mut f = Follower::default();
        let mut out = Vec::new();
        for c in chunks {
            f.feed(c, &mut out);
        }
        (out, f.refused)
    }

    #[test]
    fn only_a_head_with_both_framings_is_spoiled() {
        // A length body holding header-like text, a chunked body with an extension and a
        // trailer, then a head with both framings, all on one connection, in pieces.
        let body = b"x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n";
        let mut stream = format!(
            "PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        stream.extend_from_slice(body);
        stream.extend_from_slice(
            b"PUT /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nGET /\r\n0\r\nT: v\r\n\r\n",
        );
        let smuggle = b"PUT /c HTTP/1.1\r\nHost: h\r\ncontent-length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        stream.extend_from_slice(smuggle);
        for size in [1, 7, 4096] {
            let pieces: Vec<&[u8]> = stream.chunks(size).collect();
            let (out, refused) = through(&pieces);
            assert_eq!(refused, 1, "pieces of {size}");
            let mut want = stream.clone();
            let at = want.len() - smuggle.len();
            want[at] = b'@';
            assert_eq!(out, want, "pieces of {size}");
        }
        // Bodies taken whole by `body_takes` (as the reader does) leave the same state.
        let mut f = Follower::default();
        let mut out = Vec::new();
        let mut rest: &[u8] = &stream;
        while !rest.is_empty() {
            let n = rest.len().min(5);
            if f.body_takes(n) {
                out.extend_from_slice(&rest[..n]);
            } else {
                f.feed(&rest[..n], &mut out);
            }
            rest = &rest[n..];
        }
        assert_eq!(f.refused, 1);
        assert_eq!(out[out.len() - smuggle.len()], b'@');
        // The same head with one framing passes untouched.
        let one = b"PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(through(&[one]), (one.to_vec(), 0));
        // Chunked applied twice, on one line or two, or another coding: spoiled (400).
        for te in [
            "Transfer-Encoding: chunked, chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
        ] {
            let head = format!("PUT /c HTTP/1.1\r\nHost: h\r\n{te}\r\n0\r\n\r\n");
            let (out, refused) = through(&[head.as_bytes()]);
            assert_eq!((out[0], refused), (b'@', 1), "{te}");
        }
    }

    /// hyper itself, with and without the follower: the request with both framings reaches
    /// the service (as chunked) without it, and is 400 with it.
    #[tokio::test]
    async fn hyper_takes_both_framings_without_the_follower_and_refuses_them_with_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        async fn answer(guarded: bool) -> String {
            let (mut client, server) = tokio::io::duplex(1 << 16);
            let service = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(hyper::Response::new(String::from("reached")))
            });
            let conn = async move {
                let b = hyper::server::conn::http1::Builder::new();
                if guarded {
                    let io = hyper_util::rt::TokioIo::new(Framing::new(server));
                    let _ = b.serve_connection(io, service).await;
                } else {
                    let io = hyper_util::rt::TokioIo::new(server);
                    let _ = b.serve_connection(io, service).await;
                }
            };
            let task = tokio::spawn(conn);
            client
                .write_all(b"PUT /files/p/t/x HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n")
                .await
                .unwrap();
            let mut reply = String::new();
            let _ = client.read_to_string(&mut reply).await;
            let _ = task.await;
            reply
        }
        let open = answer(false).await;
        assert!(
            open.starts_with("HTTP/1.1 200") && open.contains("reached"),
            "{open}"
        );
        let guarded = answer(true).await;
        assert!(guarded.starts_with("HTTP/1.1 400"), "{guarded}");
        assert!(!guarded.contains("reached"), "{guarded}");
    }
}
