//! The egress proxy of one worker: a thread of its own with a single-threaded tokio runtime,
//! started when the worker is spawned and stopped with it.
//!
//! # What it serves
//! - `CONNECT host:port HTTP/1.1`: a tunnel. When the cell's first bytes in it are a TLS
//!   ClientHello, its server name (SNI) must be `host`; the tunnel is then opaque (no TLS
//!   interception: what goes through is between the cell and the host).
//! - `METHOD http://host[:port]/path HTTP/1.1`: one plain HTTP request per connection,
//!   forwarded in origin form with `Connection: close` and without the proxy's hop-by-hop
//!   headers; a `Host` header must name the same host and port. Its body is framed exactly
//!   (`Body`): the `Content-Length` bytes, or a chunked body to its last chunk (re-chunked);
//!   nothing the cell sends after it reaches the host (read and dropped, counted in the
//!   record's `bytes_dropped`): a second request cannot ride on an allowed one.
//!
//! Anything else gets `400`; a name no rule allows, or one that resolves only to internal
//! addresses without a rule naming it, gets `403` with the reason in the status line (which
//! Python's `http.client`, hence urllib and requests, show in their error) and in the body.
//!
//! # Limits (each named in `docs/sandbox.md`)
//! [`MAX_CONNECTIONS`] open at once (past it `503`); a request head of at most
//! [`MAX_HEAD`] bytes within [`HEAD_TIMEOUT`]; a name resolved within [`RESOLVE_TIMEOUT`];
//! each address tried within [`CONNECT_TIMEOUT`]. An open tunnel or transfer has no time
//! limit: it ends when the host closes it (a cell closing its side is passed on, and the
//! host's answer still comes), when the cell's side fails, or when the worker ends.

use crate::record::{Connection, Recorder, Who};
use crate::rules::{canonical_host, Rules};
use crate::tls::{client_hello, Hello, MAX_FIRST_BYTES};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Connections open at once through one worker's proxy.
pub const MAX_CONNECTIONS: usize = 256;
/// A request head's largest size.
pub const MAX_HEAD: usize = 64 << 10;
/// A request head must arrive within it (and a tunnel's first bytes, when the cell speaks
/// first).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// A name must resolve within it.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Each address of a host is tried for this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the end of a worker waits for its open connections to be recorded.
const DRAIN: Duration = Duration::from_secs(1);
/// What one `splice` moves at most, and each direction's pipe size.
const BUFFER: usize = 1 << 20;

/// What the proxy decides by and records into.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The rules in force.
    pub rules: Arc<Rules>,
    /// The task log (`None`: `--no-log`).
    pub log: Option<PathBuf>,
    /// Whose records they are.
    pub who: Who,
}

/// A running proxy; stopped (its connections cut and recorded) when dropped.
#[derive(Debug)]
pub struct Proxy {
    cancel: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts the proxy of a worker just spawned: on a thread of its own, it receives the
    /// listening socket the worker hands over through `channel` (the kernel's end of the
    /// socket pair whose other end is the worker's `PROXY_FD`), then serves it. A worker
    /// that ends before handing it over ends the thread.
    pub fn start(
        channel: std::os::unix::net::UnixStream,
        config: ProxyConfig,
    ) -> io::Result<Proxy> {
        channel.set_nonblocking(true)?;
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("flowrepl-egress".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "the egress proxy cannot start");
                        return;
                    }
                };
                rt.block_on(run(channel, config, stop));
                rt.shutdown_background();
            })?;
        Ok(Proxy {
            cancel,
            thread: Some(thread),
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Receives the listener, then accepts until cancelled; then cuts what is open and waits
/// (at most [`DRAIN`]) for its records.
async fn run(
    channel: std::os::unix::net::UnixStream,
    config: ProxyConfig,
    cancel: CancellationToken,
) {
    let listener = tokio::select! {
        l = receive(channel) => match l {
            Ok(l) => l,
            Err(e) => {
                // The worker ended first, or sent something else: no proxy, and cells'
                // connections are refused by the namespace.
                tracing::warn!(error = %e, "the egress proxy got no listening socket from the worker");
                return;
            }
        },
        _ = cancel.cancelled() => return,
    };
    let shared = Arc::new(Shared {
        rules: config.rules,
        recorder: Recorder::new(config.who, config.log),
        cancel: cancel.clone(),
        slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        open: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = cancel.cancelled() => break,
        };
        while tasks.try_join_next().is_some() {}
        match accepted {
            Ok((stream, _)) => {
                let shared = Arc::clone(&shared);
                shared.open.fetch_add(1, Ordering::Relaxed);
                tasks.spawn(async move { shared.serve(stream).await });
            }
            Err(e) => {
                // Out of descriptors, most likely: wait for some to be freed.
                tracing::warn!(error = %e, "the egress proxy cannot accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let _ = tokio::time::timeout(DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
    // What was accepted and will have no record of its own (cut and not finished within the
    // drain), and what the budget left out since the last record: in a last record.
    shared.recorder.finish(shared.open.load(Ordering::Relaxed));
}

/// Receives the listening socket from the worker and checks it is one: a TCP socket,
/// listening, on the loopback address.
async fn receive(channel: std::os::unix::net::UnixStream) -> io::Result<tokio::net::TcpListener> {
    let channel = tokio::net::UnixStream::from_std(channel)?;
    let fd = loop {
        channel.readable().await?;
        match channel.try_io(tokio::io::Interest::READABLE, || {
            recv_fd(channel.as_raw_fd())
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => break r?,
        }
    };
    let is_listening =
        nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::AcceptConn).unwrap_or(false);
    let listener = std::net::TcpListener::from(fd);
    match listener.local_addr() {
        Ok(SocketAddr::V4(a)) if a.ip().is_loopback() && is_listening => {}
        other => {
            return Err(io::Error::other(format!(
                "the worker's socket is not a listening loopback TCP socket ({other:?})"
            )))
        }
    }
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

/// One descriptor from the channel (close-on-exec).
fn recv_fd(channel: RawFd) -> io::Result<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut payload = [0u8; 2];
    let mut iov = [io::IoSliceMut::new(&mut payload)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        channel,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(r) = c {
            // SAFETY: the kernel just installed these descriptors in this process for us.
            fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the worker closed the channel",
        ));
    }
    if fds.len() != 1 {
        return Err(io::Error::other(format!(
            "{} descriptors where one was expected",
            fds.len()
        )));
    }
    Ok(fds.remove(0))
}

struct Shared {
    rules: Arc<Rules>,
    recorder: Recorder,
    cancel: CancellationToken,
    slots: Arc<tokio::sync::Semaphore>,
    /// Connections accepted whose record is not written yet.
    open: AtomicU64,
}

/// Why a connection was refused or failed: the status answered (0: none can be sent any
/// more) and the reason, one line, also the record's `error`.
#[derive(Debug)]
struct Refusal {
    status: u16,
    reason: String,
}

fn refusal(status: u16, reason: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason: reason.into(),
    }
}

impl Shared {
    async fn serve(&self, mut client: TcpStream) {
        let accepted = chrono::Utc::now();
        let started = Instant::now();
        let _ = client.set_nodelay(true);
        let mut c = Connection {
            via: "http",
            ..Connection::default()
        };
        let Ok(_slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            let why =
                format!("more than {MAX_CONNECTIONS} connections through the egress proxy at once");
            respond(&mut client, 503, &why).await;
            c.error = Some(why);
            self.record(&c, accepted, started);
            return;
        };
        if let Err(r) = self.handle(&mut client, &mut c).await {
            if r.status != 0 {
                respond(&mut client, r.status, &r.reason).await;
            }
            c.error = Some(r.reason);
        }
        self.record(&c, accepted, started);
    }

    fn record(&self, c: &Connection, accepted: chrono::DateTime<chrono::Utc>, started: Instant) {
        self.recorder.write(c, accepted, started.elapsed());
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Serves one connection; `Err` when it was refused or failed (status 0: no answer can
    /// be sent any more).
    async fn handle(&self, client: &mut TcpStream, c: &mut Connection) -> Result<(), Refusal> {
        let mut buf = Vec::with_capacity(1024);
        let read = tokio::select! {
            h = tokio::time::timeout(HEAD_TIMEOUT, read_head(client, &mut buf)) => match h {
                Ok(r) => r,
                Err(_) => Err(refusal(408, format!("no request within {} s", HEAD_TIMEOUT.as_secs()))),
            },
            _ = self.cancel.cancelled() => Err(refusal(0, "the worker ended")),
        };
        let rest = match read {
            Ok(rest) => rest,
            Err(r) => {
                // A head that did not end (too long, too slow): what its first line names.
                named_by_first_line(&buf, c);
                return Err(r);
            }
        };
        let head = buf;
        let request = Request::parse(&head, c)?;
        let allowed = self.rules.allows(&request.host, request.port).ok_or_else(|| {
            refusal(
                403,
                format!(
                    "no rule allows {}; add the rule {} (or {} for any port) to --sandbox-net=allow:",
                    request.target(),
                    request.target(),
                    request.host_display()
                ),
            )
        })?;
        c.rule = Some(allowed.rule.clone());
        let addrs = tokio::select! {
            a = self.resolve(&request, allowed.explicit, &allowed.rule) => a?,
            _ = self.cancel.cancelled() => return Err(refusal(0, "the worker ended")),
        };
        let (mut upstream, addr) = tokio::select! {
            u = connect(&addrs, &request) => u?,
            _ = self.cancel.cancelled() => return Err(refusal(0, "the worker ended")),
        };
        c.address = Some(addr.ip().to_string());
        let _ = upstream.set_nodelay(true);
        let mut first = rest;
        if !request.connect {
            return self.forward(client, &upstream, &request, first, c).await;
        }
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .map_err(|e| refusal(0, format!("the cell closed the connection: {e}")))?;
        self.check_tls(client, &mut upstream, &mut first, &request)
            .await?;
        c.allowed = true;
        if !first.is_empty() {
            write_all(&upstream, &first)
                .await
                .map_err(|e| refusal(0, format!("cannot send to {}: {e}", request.target())))?;
            c.bytes_up += first.len() as u64;
        }
        let (mut up, mut down) = (0u64, 0u64);
        let outcome = self
            .relay(
                async { pump(client, &upstream, &mut up, u64::MAX).await.map(drop) },
                async { pump(&upstream, client, &mut down, u64::MAX).await.map(drop) },
            )
            .await;
        c.bytes_up += up;
        c.bytes_down += down;
        outcome.map_err(|e| refusal(0, e))
    }

    /// Forwards a plain HTTP request: its head, exactly its body, nothing after; the host's
    /// answer back to the cell.
    async fn forward(
        &self,
        client: &TcpStream,
        upstream: &TcpStream,
        request: &Request,
        first: Vec<u8>,
        c: &mut Connection,
    ) -> Result<(), Refusal> {
        write_all(upstream, &request.forwarded)
            .await
            .map_err(|e| refusal(502, format!("cannot send to {}: {e}", request.target())))?;
        c.allowed = true;
        c.bytes_up += request.forwarded.len() as u64;
        let (mut up, mut down, mut dropped) = (0u64, 0u64, 0u64);
        let outcome = {
            let to_host = async {
                send_body(client, upstream, request.body, first, &mut up, &mut dropped).await?;
                // The request is complete: what the cell sends now is not forwarded. Read and
                // counted until it closes (its close is passed on).
                let mut buf = vec![0u8; 16 << 10];
                loop {
                    match read_some(client, &mut buf).await? {
                        0 => break,
                        n => dropped += n as u64,
                    }
                }
                let _ = nix::sys::socket::shutdown(
                    upstream.as_raw_fd(),
                    nix::sys::socket::Shutdown::Write,
                );
                Ok(())
            };
            let to_cell = async { pump(upstream, client, &mut down, u64::MAX).await.map(drop) };
            self.relay(to_host, to_cell).await
        };
        c.bytes_up += up;
        c.bytes_down += down;
        c.bytes_dropped = dropped;
        outcome.map_err(|e| refusal(0, e))
    }

    /// Runs both directions until the host's side ends (or the cell's fails, or the worker
    /// ends).
    async fn relay(
        &self,
        to_host: impl std::future::Future<Output = io::Result<()>>,
        to_cell: impl std::future::Future<Output = io::Result<()>>,
    ) -> Result<(), String> {
        tokio::pin!(to_host, to_cell);
        let mut cell_done = false;
        loop {
            tokio::select! {
                // The cell closed its side (or half-closed it): the host's answer still
                // comes.
                r = &mut to_host, if !cell_done => match r {
                    Ok(()) => cell_done = true,
                    Err(e) => break Err(format!("the cell's side: {e}")),
                },
                // The host closed: the connection ends (a cell that keeps its socket
                // open would otherwise hold it for ever).
                r = &mut to_cell => break r.map_err(|e| format!("the host's side: {e}")),
                _ = self.cancel.cancelled() => break Err("cut: the worker ended".to_string()),
            }
        }
    }

    /// The host's addresses the rule lets the connection reach.
    async fn resolve(
        &self,
        request: &Request,
        explicit: bool,
        rule: &str,
    ) -> Result<Vec<SocketAddr>, Refusal> {
        let all: Vec<SocketAddr> = match request.host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, request.port)],
            Err(_) => {
                let lookup = tokio::net::lookup_host((request.host.as_str(), request.port));
                match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
                    Ok(Ok(a)) => a.collect(),
                    Ok(Err(e)) => {
                        return Err(refusal(
                            502,
                            format!("cannot resolve {}: {e}", request.host),
                        ))
                    }
                    Err(_) => {
                        return Err(refusal(
                            504,
                            format!(
                                "{} did not resolve within {} s",
                                request.host,
                                RESOLVE_TIMEOUT.as_secs()
                            ),
                        ))
                    }
                }
            }
        };
        if explicit {
            return Ok(all);
        }
        // Read per decision (a wildcard rule's only): an interface's address may change.
        let local = crate::address::local_addresses().map_err(|e| {
            refusal(
                502,
                format!("cannot read this host's interface addresses: {e}"),
            )
        })?;
        let (ok, internal): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|a| crate::address::internal_here(a.ip(), &local).is_none());
        match (ok.is_empty(), internal.first()) {
            (true, Some(a)) => Err(refusal(
                403,
                format!(
                    "{} resolves to {}, an internal address ({}): only a rule naming {} itself allows that (the rule {rule} does not)",
                    request.host,
                    a.ip(),
                    crate::address::internal_here(a.ip(), &local).unwrap_or("internal"),
                    request.host_display()
                ),
            )),
            (true, None) => Err(refusal(502, format!("{} has no address", request.host))),
            (false, _) => Ok(ok),
        }
    }

    /// Reads the tunnel's first bytes; when they are a TLS ClientHello, its server name must
    /// be the host the tunnel was allowed for. A host that speaks first passes.
    async fn check_tls(
        &self,
        client: &mut TcpStream,
        upstream: &mut TcpStream,
        first: &mut Vec<u8>,
        request: &Request,
    ) -> Result<(), Refusal> {
        let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
        let mut buf = [0u8; 4096];
        let mut peeked = [0u8; 1];
        loop {
            match client_hello(first) {
                Hello::Sni(name) if name == request.host => return Ok(()),
                Hello::Sni(name) => {
                    return Err(refusal(
                        0,
                        format!(
                            "the TLS server name {name:?} is not the host the tunnel was allowed for ({})",
                            request.host
                        ),
                    ))
                }
                Hello::Malformed(why) => {
                    return Err(refusal(0, format!("a TLS ClientHello that cannot be read: {why}")))
                }
                Hello::NoSni | Hello::NotTls => return Ok(()),
                Hello::Incomplete if first.len() >= MAX_FIRST_BYTES => {
                    return Err(refusal(0, "a TLS ClientHello over its largest size"))
                }
                Hello::Incomplete => {}
            }
            tokio::select! {
                n = client.read(&mut buf) => match n {
                    Ok(0) => return Ok(()),
                    Ok(n) => first.extend_from_slice(&buf[..n]),
                    Err(e) => return Err(refusal(0, format!("the cell closed the connection: {e}"))),
                },
                // The host speaks first: not TLS from the cell's side. (`peek` waits for
                // bytes; readiness alone may be reported spuriously.)
                r = upstream.peek(&mut peeked), if first.is_empty() => {
                    return r.map(|_| ()).map_err(|e| refusal(0, e.to_string()));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(refusal(0, format!("no TLS ClientHello within {} s", HEAD_TIMEOUT.as_secs())))
                }
                _ = self.cancel.cancelled() => return Err(refusal(0, "the worker ended")),
            }
        }
    }
}

/// Tries each address in turn.
async fn connect(
    addrs: &[SocketAddr],
    request: &Request,
) -> Result<(TcpStream, SocketAddr), Refusal> {
    let mut last = String::new();
    for a in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok((s, *a)),
            Ok(Err(e)) => last = format!("{a}: {e}"),
            Err(_) => last = format!("{a}: no answer within {} s", CONNECT_TIMEOUT.as_secs()),
        }
    }
    Err(refusal(
        502,
        format!("cannot connect to {} ({last})", request.target()),
    ))
}

/// Reads up to the end of a request head into `buf` (what was read stays there when it
/// fails); returns the bytes after it.
async fn read_head(client: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Vec<u8>, Refusal> {
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| refusal(0, format!("the cell closed the connection: {e}")))?;
        if n == 0 {
            return Err(refusal(0, "the connection closed before a request"));
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = memchr::memmem::find(&buf[from..], b"\r\n\r\n") {
            let end = from + i + 4;
            return Ok(buf.split_off(end));
        }
        // A head ended by a bare LF line: refused now, not left waiting for a CRLF CRLF
        // that never comes.
        // (No CRLF CRLF came before it, so a "\n\n" is an empty line ended by a bare LF.)
        if memchr::memmem::find(&buf[from..], b"\n\n").is_some() {
            return Err(refusal(400, "a request head with bare LF line ends"));
        }
        if buf.len() > MAX_HEAD {
            return Err(refusal(
                431,
                format!("a request head over {MAX_HEAD} bytes"),
            ));
        }
    }
}

/// A plain HTTP request's body, as its framing says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// Neither `Content-Length` nor `Transfer-Encoding`: no body.
    None,
    /// `Content-Length: n`: exactly `n` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`: chunks up to the last (size 0) and its trailer section.
    Chunked,
}

/// A request to the proxy, as far as it decides by it.
#[derive(Debug)]
struct Request {
    connect: bool,
    /// Canonical ([`canonical_host`]).
    host: String,
    port: u16,
    method: String,
    /// Origin form (`/path?query`), for a plain HTTP request.
    path: String,
    /// A plain HTTP request's body.
    body: Body,
    /// A plain HTTP request's head as sent to the host ([`Request::forward`]); empty for
    /// CONNECT.
    forwarded: Vec<u8>,
}

/// Headers a `Connection` header may not name: the request's framing and routing depend on
/// them, and dropping them as hop-by-hop would turn a body into another request.
const NOT_HOP_BY_HOP: [&str; 4] = ["content-length", "transfer-encoding", "host", "trailer"];

/// What a refused request named, for its record: the host (canonical when it is one, else
/// as written, without control characters, at most 253 characters) and the port (0 when
/// none could be read).
fn named(authority: &str, default_port: u16) -> (String, u16) {
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = split_authority(authority, default_port).unwrap_or((authority, 0));
    let host = canonical_host(host).unwrap_or_else(|_| {
        host.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(253)
            .collect()
    });
    (host, port)
}

/// What the first line of a head that never ended names (`METHOD TARGET ...`), into `c`.
fn named_by_first_line(buf: &[u8], c: &mut Connection) {
    let line = &buf[..memchr::memchr(b'\n', buf).unwrap_or(buf.len())];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = String::from_utf8_lossy(&line[..line.len().min(4096)]);
    let mut words = line.split(' ');
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return;
    };
    let (authority, port) = if method.eq_ignore_ascii_case("CONNECT") {
        c.via = "connect";
        (target, 0)
    } else if let Some(rest) = strip_prefix_ignore_case(target, "http://") {
        c.via = "http";
        (rest, 80)
    } else if let Some(rest) = strip_prefix_ignore_case(target, "https://") {
        c.via = "http";
        (rest, 443)
    } else {
        return;
    };
    let authority = &authority[..authority.find(['/', '?']).unwrap_or(authority.len())];
    (c.host, c.port) = named(authority, port);
}

impl Request {
    /// Parses a request head; what it names (via, host, port) goes into `c` as soon as it is
    /// read, so that a refusal's record says what was asked for.
    fn parse(head: &[u8], c: &mut Connection) -> Result<Request, Refusal> {
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            // The head as read ends at the first CRLF CRLF: a head that httparse ends
            // before (bare LF line ends) would leave bytes that are neither head nor body.
            Ok(httparse::Status::Complete(n)) if n == head.len() => {}
            Ok(httparse::Status::Complete(_)) => {
                named_by_first_line(head, c);
                return Err(refusal(400, "a request head with bare LF line ends"));
            }
            Ok(httparse::Status::Partial) => {
                named_by_first_line(head, c);
                return Err(refusal(400, "an incomplete request head"));
            }
            Err(e) => {
                // (A folded or malformed header line: the request line still named a host.)
                named_by_first_line(head, c);
                return Err(refusal(400, format!("not an HTTP request: {e}")));
            }
        }
        let method = req.method.unwrap_or_default().to_string();
        let target = req.path.unwrap_or_default();
        let connect = method.eq_ignore_ascii_case("CONNECT");
        c.via = if connect { "connect" } else { "http" };
        let (authority, path, default_port) = if connect {
            (target, "", 0)
        } else if let Some(rest) = strip_prefix_ignore_case(target, "http://") {
            let (a, p) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
            (a, p, 80)
        } else if let Some(rest) = strip_prefix_ignore_case(target, "https://") {
            let a = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
            (c.host, c.port) = named(a, 443);
            return Err(refusal(
                400,
                "an https:// URL goes through CONNECT (set HTTPS_PROXY, as the sandbox does)",
            ));
        } else {
            if let Some(h) = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
            {
                (c.host, c.port) = named(&String::from_utf8_lossy(h.value), 80);
            }
            return Err(refusal(
                400,
                "this is the sandbox's egress proxy: ask it for an absolute http:// URL, or CONNECT host:port",
            ));
        };
        (c.host, c.port) = named(authority, default_port);
        if authority.contains('@') {
            return Err(refusal(
                400,
                "credentials in the URL's host part are not forwarded",
            ));
        }
        let (host, port) = split_authority(authority, default_port)
            .map_err(|why| refusal(400, format!("{authority:?} is not host:port: {why}")))?;
        let host = canonical_host(host).map_err(|why| refusal(400, format!("{host:?}: {why}")))?;
        let path = if path.is_empty() { "/" } else { path };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        let mut request = Request {
            connect,
            host,
            port,
            method,
            path,
            body: Body::None,
            forwarded: Vec::new(),
        };
        if !connect {
            for h in req.headers.iter() {
                if h.name.eq_ignore_ascii_case("host") {
                    let named = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| split_authority(v.trim(), 80).ok())
                        .and_then(|(h, p)| canonical_host(h).ok().map(|h| (h, p)));
                    if named.as_ref() != Some(&(request.host.clone(), request.port)) {
                        return Err(refusal(
                            400,
                            format!(
                                "the Host header does not name {}, the URL's host",
                                request.target()
                            ),
                        ));
                    }
                }
            }
            request.body = framing(req.headers)?;
            request.forwarded = request.forward(req.headers, head.len());
        }
        Ok(request)
    }

    /// `host:port` as asked for (an IPv6 address in brackets).
    fn target(&self) -> String {
        format!("{}:{}", self.host_display(), self.port)
    }

    fn host_display(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }

    /// The head sent to the host: origin form, the proxy's and the connection's hop-by-hop
    /// headers removed, the framing header written as the proxy reads it ([`framing`]),
    /// `Connection: close`.
    fn forward(&self, headers: &[httparse::Header<'_>], size: usize) -> Vec<u8> {
        // Headers the Connection header names are hop-by-hop too ([`framing`] refused the
        // ones that are not).
        let named: Vec<String> = headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .flat_map(|h| {
                String::from_utf8_lossy(h.value)
                    .split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .collect();
        let dropped = |name: &str| {
            let n = name.to_ascii_lowercase();
            matches!(
                n.as_str(),
                "connection"
                    | "proxy-connection"
                    | "keep-alive"
                    | "proxy-authorization"
                    | "te"
                    | "upgrade"
                    | "content-length"
                    | "transfer-encoding"
            ) || named.contains(&n)
        };
        let mut out = Vec::with_capacity(size + 32);
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, self.path).as_bytes());
        let mut has_host = false;
        for h in headers.iter().filter(|h| !dropped(h.name)) {
            has_host |= h.name.eq_ignore_ascii_case("host");
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        if !has_host {
            let host = if self.port == 80 {
                self.host_display()
            } else {
                self.target()
            };
            out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
        }
        match self.body {
            Body::None => {}
            Body::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
            Body::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out
    }
}

/// A request's body framing, read strictly: one `Content-Length` of digits, or one
/// `Transfer-Encoding: chunked`, never both; a `Connection` header may not name a header
/// the framing or routing depends on ([`NOT_HOP_BY_HOP`]). Anything else is refused: where
/// the proxy and the host could read a body's end differently, the rest would be another
/// request.
fn framing(headers: &[httparse::Header<'_>]) -> Result<Body, Refusal> {
    let mut length = None;
    let mut chunked = false;
    for h in headers {
        let value = std::str::from_utf8(h.value).unwrap_or("\u{fffd}").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Err(refusal(400, "several Content-Length headers"));
            }
            let n = (!value.is_empty()
                && value.len() <= 18
                && value.bytes().all(|b| b.is_ascii_digit()))
            .then(|| value.parse::<u64>().ok())
            .flatten()
            .ok_or_else(|| refusal(400, format!("Content-Length {value:?} is not one number")))?;
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if chunked {
                return Err(refusal(400, "several Transfer-Encoding headers"));
            }
            if !value.eq_ignore_ascii_case("chunked") {
                return Err(refusal(
                    501,
                    format!("Transfer-Encoding {value:?}: only chunked is forwarded"),
                ));
            }
            chunked = true;
        } else if h.name.eq_ignore_ascii_case("connection") {
            for name in value.split(',').map(|n| n.trim()) {
                if let Some(n) = NOT_HOP_BY_HOP.iter().find(|n| n.eq_ignore_ascii_case(name)) {
                    return Err(refusal(
                        400,
                        format!("a Connection header naming {n}, which the request's framing or routing depends on"),
                    ));
                }
            }
        }
    }
    match (length, chunked) {
        (Some(_), true) => Err(refusal(400, "both Content-Length and Transfer-Encoding")),
        (Some(n), false) => Ok(Body::Length(n)),
        (None, true) => Ok(Body::Chunked),
        (None, false) => Ok(Body::None),
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

/// `host[:port]` (IPv6 in brackets); `default` when no port is given (0: a port is needed).
fn split_authority(a: &str, default: u16) -> Result<(&str, u16), String> {
    let (host, port) = if let Some(inner) = a.strip_prefix('[') {
        let (h, after) = inner.split_once(']').ok_or("an opening [ without its ]")?;
        (h, after.strip_prefix(':'))
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err("an IPv6 address goes in brackets".into()),
            None => (a, None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{p:?} is not a port"))?,
        None if default > 0 => default,
        None => return Err("no port".into()),
    };
    Ok((host, port))
}

/// Answers a refusal and closes: the reason in the status line and the body.
async fn respond(client: &mut TcpStream, status: u16, reason: &str) {
    let phrase: String = format!("flowrepl egress: {reason}")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(1000)
        .collect();
    let body = format!("{phrase}\n");
    let head = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Flowrepl-Egress: refused\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        client.write_all(head.as_bytes()).await?;
        client.write_all(body.as_bytes()).await?;
        client.shutdown().await
    })
    .await;
}

/// Copies `from` to `to` until `from` ends (then shuts `to`'s writing side, and returns
/// `true`) or `limit` bytes have been copied (`false`); `n` counts what was written (kept
/// when the copy fails or is dropped). The bytes go through a pipe with `splice(2)`, never
/// through this process's memory: on loopback a copy through user space left the proxy at a
/// third of the direct speed.
async fn pump(from: &TcpStream, to: &TcpStream, n: &mut u64, limit: u64) -> io::Result<bool> {
    use nix::fcntl::{splice, SpliceFFlags};
    let (pipe_out, pipe_in) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(io::Error::from)?;
    // A larger pipe moves more per call; the default (64 KiB) where the limit refuses.
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        libc::fcntl(
            pipe_in.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            BUFFER as libc::c_int,
        )
    };
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let mut left = limit;
    while left > 0 {
        let most = usize::try_from(left).unwrap_or(usize::MAX).min(BUFFER);
        // Fill the pipe from the socket (it is empty here: EAGAIN is the socket's).
        let filled = loop {
            from.readable().await?;
            match from.try_io(tokio::io::Interest::READABLE, || {
                splice(from, None, &pipe_in, None, most, flags).map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => break r?,
            }
        };
        if filled == 0 {
            let _ = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
            return Ok(true);
        }
        left -= filled as u64;
        // Drain it into the other socket (EAGAIN is that socket's: the pipe holds bytes).
        let mut pending = filled;
        while pending > 0 {
            to.writable().await?;
            match to.try_io(tokio::io::Interest::WRITABLE, || {
                splice(&pipe_out, None, to, None, pending, flags).map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
                Ok(k) => {
                    pending -= k;
                    *n += k as u64;
                }
            }
        }
    }
    Ok(false)
}

/// Reads what is there (0: the end).
async fn read_some(from: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn write_all(to: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        to.writable().await?;
        match to.try_write(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
            Ok(n) => buf = &buf[n..],
        }
    }
    Ok(())
}

/// Sends a plain HTTP request's body to the host, exactly as far as its framing says:
/// `first` (what came with the head) then the cell's socket. Returns when the body is
/// complete, or the cell closed first; what `first` holds past the body is counted in
/// `dropped`.
async fn send_body(
    client: &TcpStream,
    upstream: &TcpStream,
    body: Body,
    first: Vec<u8>,
    up: &mut u64,
    dropped: &mut u64,
) -> io::Result<()> {
    match body {
        Body::None => *dropped += first.len() as u64,
        Body::Length(n) => {
            let k = usize::try_from(n).unwrap_or(usize::MAX).min(first.len());
            write_all(upstream, &first[..k]).await?;
            *up += k as u64;
            *dropped += (first.len() - k) as u64;
            if n > k as u64 {
                // The rest spliced, exactly.
                pump(client, upstream, up, n - k as u64).await?;
            }
        }
        Body::Chunked => send_chunked(client, upstream, first, up, dropped).await?,
    }
    Ok(())
}

/// A chunk size line's (or a trailer line's) largest size.
const MAX_LINE: usize = 4096;

/// Relays a chunked body to its last chunk, re-chunked: each chunk as `SIZE CRLF DATA CRLF`
/// with its size in lowercase hex and no extension, the trailer section dropped (`0 CRLF
/// CRLF`). A body that is not strictly chunked (a size that is not 1 to 16 hex digits, a
/// line with a bare CR or LF, data not followed by CRLF) cuts the connection: what the host
/// got is an incomplete body, never the start of another request.
async fn send_chunked(
    client: &TcpStream,
    upstream: &TcpStream,
    mut buf: Vec<u8>,
    up: &mut u64,
    dropped: &mut u64,
) -> io::Result<()> {
    fn bad(why: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a chunked body that cannot be read: {why}"),
        )
    }
    let mut chunk = vec![0u8; 64 << 10];
    let mut at = 0;
    // Reads more into `buf` (what was parsed dropped first); `false` at the cell's end.
    macro_rules! more {
        () => {{
            buf.drain(..at);
            at = 0;
            let n = read_some(client, &mut chunk).await?;
            buf.extend_from_slice(&chunk[..n]);
            n > 0
        }};
    }
    // The next CRLF-ended line, without control characters but tabs.
    macro_rules! next_line {
        ($what:expr) => {{
            loop {
                if let Some(i) = memchr::memmem::find(&buf[at..], b"\r\n") {
                    let line = buf[at..at + i].to_vec();
                    at += i + 2;
                    if line.iter().any(|&b| b != b'\t' && (b < 0x20 || b == 0x7f)) {
                        return Err(bad(concat!("a control character in ", $what)));
                    }
                    break Some(line);
                }
                if buf.len() - at > MAX_LINE {
                    return Err(bad(concat!($what, " over 4 KiB")));
                }
                if !more!() {
                    break None;
                }
            }
        }};
    }
    loop {
        let Some(line) = next_line!("a chunk size line") else {
            return Ok(());
        };
        let digits = line
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii_end();
        if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(bad("a chunk size that is not 1 to 16 hex digits"));
        }
        let size = u64::from_str_radix(std::str::from_utf8(digits).unwrap_or("x"), 16)
            .map_err(|_| bad("a chunk size that is not a number"))?;
        if size == 0 {
            break;
        }
        let head = format!("{size:x}\r\n");
        write_all(upstream, head.as_bytes()).await?;
        *up += head.len() as u64;
        let mut left = size;
        while left > 0 {
            if at == buf.len() && !more!() {
                return Ok(());
            }
            let k = usize::try_from(left)
                .unwrap_or(usize::MAX)
                .min(buf.len() - at);
            write_all(upstream, &buf[at..at + k]).await?;
            *up += k as u64;
            at += k;
            left -= k as u64;
        }
        while buf.len() - at < 2 {
            if !more!() {
                return Ok(());
            }
        }
        if &buf[at..at + 2] != b"\r\n" {
            return Err(bad("a chunk's data not followed by CRLF"));
        }
        at += 2;
        write_all(upstream, b"\r\n").await?;
        *up += 2;
    }
    // The trailer section: read to its end, dropped.
    let mut trailers = 0;
    loop {
        let Some(line) = next_line!("a trailer line") else {
            return Ok(());
        };
        if line.is_empty() {
            break;
        }
        trailers += line.len();
        if trailers > MAX_HEAD {
            return Err(bad("trailers over 64 KiB"));
        }
    }
    write_all(upstream, b"0\r\n\r\n").await?;
    *up += 5;
    *dropped += (buf.len() - at) as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &[u8]) -> Result<Request, Refusal> {
        Request::parse(head, &mut Connection::default())
    }

    #[test]
    fn requests_are_read_as_the_proxy_decides_by_them() {
        let r = parse(b"CONNECT LocalHost.:8443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(r.connect);
        assert_eq!((r.host.as_str(), r.port), ("localhost", 8443));
        let r = parse(b"GET http://[::1]:81?q=1 HTTP/1.1\r\nHost: [::1]:81\r\n\r\n").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("::1", 81, "/?q=1")
        );
        let r = parse(b"GET http://example.com/a/b HTTP/1.1\r\nhost: EXAMPLE.com\r\n\r\n").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str(), r.body),
            ("example.com", 80, "/a/b", Body::None)
        );
        for (head, why) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], "absolute http://"),
            (b"GET https://example.com/ HTTP/1.1\r\n\r\n", "CONNECT"),
            (b"CONNECT example.com HTTP/1.1\r\n\r\n", "no port"),
            (
                b"GET http://example.com/ HTTP/1.1\r\nHost: other.com\r\n\r\n",
                "Host header",
            ),
            (
                b"GET http://user:pw@example.com/ HTTP/1.1\r\n\r\n",
                "credentials",
            ),
            (b"\x16\x03\x01\x00\x05hello\r\n\r\n", "not an HTTP request"),
            (
                b"GET http://example.com/ HTTP/1.1\nHost: example.com\n\nGET http://x/ HTTP/1.1\r\n\r\n",
                "bare LF",
            ),
        ] {
            let e = parse(head).unwrap_err();
            assert!(
                e.reason.contains(why),
                "{}: {}",
                String::from_utf8_lossy(head),
                e.reason
            );
        }
    }

    /// A refused request's record names what it asked for (never credentials).
    #[test]
    fn a_refused_request_records_what_it_named() {
        for (head, via, host, port) in [
            (
                &b"GET http://example.com:8080/ HTTP/1.1\r\nHost: other.com\r\n\r\n"[..],
                "http",
                "example.com",
                8080,
            ),
            (
                b"GET http://user:pw@Example.com/ HTTP/1.1\r\n\r\n",
                "http",
                "example.com",
                80,
            ),
            (b"GET https://example.com/x HTTP/1.1\r\n\r\n", "http", "example.com", 443),
            (b"GET /x HTTP/1.1\r\nHost: example.com:81\r\n\r\n", "http", "example.com", 81),
            (b"CONNECT example.com HTTP/1.1\r\n\r\n", "connect", "example.com", 0),
            (
                b"GET http://example.com/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                "http",
                "example.com",
                80,
            ),
            (b"GET http://exa$mple.com/ HTTP/1.1\r\n\r\n", "http", "exa$mple.com", 80),
            // A header httparse refuses (a folded line, a space before the colon): the
            // request line still named the host (the record said "" and 0).
            (
                b"GET http://localhost:18081/ HTTP/1.1\r\nHost: localhost:18081\r\nX: a\r\n b\r\n\r\n",
                "http",
                "localhost",
                18081,
            ),
            (
                b"GET http://localhost:18081/ HTTP/1.1\r\nHost : evil.example\r\n\r\n",
                "http",
                "localhost",
                18081,
            ),
        ] {
            let mut c = Connection::default();
            assert!(Request::parse(head, &mut c).is_err());
            assert_eq!(
                (c.via, c.host.as_str(), c.port),
                (via, host, port),
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    /// A head that never ended (too long, too slow) records what its first line named.
    #[test]
    fn a_head_that_never_ended_records_what_its_first_line_named() {
        for (buf, via, host, port) in [
            (
                &b"GET http://Example.com:81/x?y HTTP/1.1\r\nX: aaaa"[..],
                "http",
                "example.com",
                81,
            ),
            (b"POST https://example.com/", "http", "example.com", 443),
            (
                b"CONNECT example.com:443 HTTP/1.1\r\n",
                "connect",
                "example.com",
                443,
            ),
            (b"GET /x HTTP/1.1\r\n", "http", "", 0),
            (b"\x16\x03\x01", "http", "", 0),
        ] {
            let mut c = Connection {
                via: "http",
                ..Connection::default()
            };
            named_by_first_line(buf, &mut c);
            assert_eq!((c.via, c.host.as_str(), c.port), (via, host, port));
        }
    }

    #[test]
    fn the_forwarded_head_drops_hop_by_hop_headers() {
        let head = b"POST http://example.com:8080/x HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nProxy-Connection: keep-alive\r\nContent-Length: 2\r\n\r\n";
        let r = parse(head).unwrap();
        let out = String::from_utf8(r.forwarded).unwrap();
        assert_eq!(
            out,
            "POST /x HTTP/1.1\r\nHost: example.com:8080\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
        let r = parse(
            b"POST http://example.com/ HTTP/1.1\r\nTransfer-Encoding: Chunked\r\nX: 1\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, Body::Chunked);
        assert_eq!(
            String::from_utf8(r.forwarded).unwrap(),
            "POST / HTTP/1.1\r\nX: 1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        );
    }

    /// Framing the proxy and a host could read differently is refused; the control: the same
    /// request framed plainly passes.
    #[test]
    fn ambiguous_framing_is_refused() {
        let req = |headers: &str| {
            parse(format!("POST http://example.com/ HTTP/1.1\r\n{headers}\r\n").as_bytes())
        };
        for (headers, why) in [
            (
                "Content-Length: 5\r\nConnection: content-length\r\n",
                "Connection header naming content-length",
            ),
            (
                "Connection: close, Transfer-Encoding\r\n",
                "naming transfer-encoding",
            ),
            ("Connection: HOST\r\n", "naming host"),
            (
                "Content-Length: 5\r\nContent-Length: 5\r\n",
                "several Content-Length",
            ),
            ("Content-Length: 5, 5\r\n", "is not one number"),
            ("Content-Length: +5\r\n", "is not one number"),
            ("Content-Length: 0x5\r\n", "is not one number"),
            (
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                "both",
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                "several Transfer-Encoding",
            ),
            ("Transfer-Encoding: gzip, chunked\r\n", "only chunked"),
            ("Transfer-Encoding: identity\r\n", "only chunked"),
        ] {
            let e = req(headers).unwrap_err();
            assert!(e.reason.contains(why), "{headers}: {}", e.reason);
        }
        assert_eq!(
            req("Content-Length: 5\r\nConnection: keep-alive\r\n")
                .unwrap()
                .body,
            Body::Length(5)
        );
        assert_eq!(
            req("Content-Length:  007 \r\n").unwrap().body,
            Body::Length(7)
        );
        assert_eq!(
            req("Transfer-Encoding: chunked\r\n").unwrap().body,
            Body::Chunked
        );
    }

    /// The chunked relay: what reaches the host, what is dropped, what is refused.
    #[test]
    fn chunked_bodies_are_relayed_to_their_last_chunk() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let run = |first: &'static [u8], later: &'static [u8]| {
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let mut cell = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
                let (client, _) = l.accept().await.unwrap();
                let mut host = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
                let (upstream, _) = l.accept().await.unwrap();
                cell.write_all(later).await.unwrap();
                cell.shutdown().await.unwrap();
                let (mut up, mut dropped) = (0, 0);
                let r = send_body(
                    &client,
                    &upstream,
                    Body::Chunked,
                    first.to_vec(),
                    &mut up,
                    &mut dropped,
                )
                .await;
                drop(upstream);
                let mut got = Vec::new();
                host.read_to_end(&mut got).await.unwrap();
                assert_eq!(up, got.len() as u64);
                (
                    r.map_err(|e| e.to_string()),
                    String::from_utf8(got).unwrap(),
                    dropped,
                )
            })
        };
        let (r, got, dropped) = run(
            b"5;ext=1\r\nhello\r\n",
            b"A\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nGET http://other/ HTTP/1.1\r\n\r\n",
        );
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(got, "5\r\nhello\r\na\r\n0123456789\r\n0\r\n\r\n");
        assert_eq!(dropped, 30);
        // All in the first bytes, byte-split sizes.
        let (r, got, dropped) = run(b"000003\r\nabc\r\n0\r\n\r\nmore", b"");
        assert!(r.is_ok());
        assert_eq!((got.as_str(), dropped), ("3\r\nabc\r\n0\r\n\r\n", 4));
        for (first, why) in [
            (&b"5\nhello\r\n0\r\n\r\n"[..], "control character"),
            (b"5\r\nhelloXX0\r\n\r\n", "not followed by CRLF"),
            (b"-5\r\nhello\r\n", "hex digits"),
            (b"12345678901234567\r\n", "hex digits"),
            (b"\r\n", "hex digits"),
            (b"0x5\r\nhello\r\n", "hex digits"),
        ] {
            let (r, got, _) = run(first, b"");
            assert!(r.as_ref().unwrap_err().contains(why), "{first:?}: {r:?}");
            assert!(!got.contains("0\r\n\r\n"), "{got:?}");
        }
        // The cell closing mid-body: the host has an incomplete body.
        let (r, got, _) = run(b"5\r\nhel", b"");
        assert!(r.is_ok());
        assert_eq!(got, "5\r\nhel");
    }
}
