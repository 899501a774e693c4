//! The egress proxy of one worker: a thread of its own with a single-threaded tokio runtime,
//! started when the worker is spawned and stopped with it.
//!
//! # What it serves
//! - `CONNECT host:port HTTP/1.1`: a tunnel. When the cell's first bytes in it are a TLS
//!   ClientHello, its server name (SNI) must be `host`; the tunnel is then opaque (no TLS
//!   interception: what goes through is between the cell and the host).
//! - `METHOD http://host[:port]/path HTTP/1.1`: one plain HTTP request, forwarded in origin
//!   form with `Connection: close` and without the proxy's hop-by-hop headers; a `Host`
//!   header must name the same host and port.
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
use crate::tls::{client_hello, Hello, MAX_RECORD};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
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
            self.recorder.write(&c, accepted, started.elapsed());
            return;
        };
        if let Err(r) = self.handle(&mut client, &mut c).await {
            if r.status != 0 {
                respond(&mut client, r.status, &r.reason).await;
            }
            c.error = Some(r.reason);
        }
        self.recorder.write(&c, accepted, started.elapsed());
    }

    /// Serves one connection; `Err` when it was refused or failed (status 0: no answer can
    /// be sent any more).
    async fn handle(&self, client: &mut TcpStream, c: &mut Connection) -> Result<(), Refusal> {
        let (head, rest) = tokio::select! {
            h = tokio::time::timeout(HEAD_TIMEOUT, read_head(client)) => match h {
                Ok(Ok(h)) => h,
                Ok(Err(r)) => return Err(r),
                Err(_) => return Err(refusal(408, format!("no request within {} s", HEAD_TIMEOUT.as_secs()))),
            },
            _ = self.cancel.cancelled() => return Err(refusal(0, "the worker ended")),
        };
        let request = Request::parse(&head)?;
        c.via = if request.connect { "connect" } else { "http" };
        c.host.clone_from(&request.host);
        c.port = request.port;
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
        if request.connect {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .map_err(|e| refusal(0, format!("the cell closed the connection: {e}")))?;
            self.check_tls(client, &mut upstream, &mut first, &request)
                .await?;
        } else {
            upstream
                .write_all(&request.forwarded)
                .await
                .map_err(|e| refusal(502, format!("cannot send to {}: {e}", request.target())))?;
        }
        c.allowed = true;
        if !first.is_empty() {
            upstream
                .write_all(&first)
                .await
                .map_err(|e| refusal(0, format!("cannot send to {}: {e}", request.target())))?;
            c.bytes_up += first.len() as u64;
        }
        let (mut up, mut down) = (0u64, 0u64);
        let outcome = {
            let to_host = pump(client, &upstream, &mut up);
            let to_cell = pump(&upstream, client, &mut down);
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
        };
        c.bytes_up += up;
        c.bytes_down += down;
        outcome.map_err(|e| refusal(0, e))
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
        let (ok, internal): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|a| crate::address::internal(a.ip()).is_none());
        match (ok.is_empty(), internal.first()) {
            (true, Some(a)) => Err(refusal(
                403,
                format!(
                    "{} resolves to {}, a {} address: only a rule naming {} itself allows that (the rule {rule} does not)",
                    request.host,
                    a.ip(),
                    crate::address::internal(a.ip()).unwrap_or("internal"),
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
                Hello::Incomplete if first.len() >= MAX_RECORD => {
                    return Err(refusal(0, "a TLS ClientHello larger than one record"))
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

/// Reads up to the end of a request head; returns it and the bytes after it.
async fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
    let mut buf = Vec::with_capacity(1024);
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
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(refusal(
                431,
                format!("a request head over {MAX_HEAD} bytes"),
            ));
        }
    }
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
    /// A plain HTTP request's head as sent to the host ([`Request::forward`]); empty for
    /// CONNECT.
    forwarded: Vec<u8>,
}

impl Request {
    fn parse(head: &[u8]) -> Result<Request, Refusal> {
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => {
                return Err(refusal(400, "an incomplete request head"))
            }
            Err(e) => return Err(refusal(400, format!("not an HTTP request: {e}"))),
        }
        let method = req.method.unwrap_or_default().to_string();
        let target = req.path.unwrap_or_default();
        let connect = method.eq_ignore_ascii_case("CONNECT");
        let (authority, path, default_port) = if connect {
            (target, "", 0)
        } else if let Some(rest) = strip_prefix_ignore_case(target, "http://") {
            let (a, p) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
            (a, p, 80)
        } else if strip_prefix_ignore_case(target, "https://").is_some() {
            return Err(refusal(
                400,
                "an https:// URL goes through CONNECT (set HTTPS_PROXY, as the sandbox does)",
            ));
        } else {
            return Err(refusal(
                400,
                "this is the sandbox's egress proxy: ask it for an absolute http:// URL, or CONNECT host:port",
            ));
        };
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
    /// headers removed, `Connection: close`.
    fn forward(&self, headers: &[httparse::Header<'_>], size: usize) -> Vec<u8> {
        // Headers the Connection header names are hop-by-hop too.
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
        let hop = |name: &str| {
            let n = name.to_ascii_lowercase();
            matches!(
                n.as_str(),
                "connection"
                    | "proxy-connection"
                    | "keep-alive"
                    | "proxy-authorization"
                    | "te"
                    | "upgrade"
            ) || named.contains(&n)
        };
        let mut out = Vec::with_capacity(size + 32);
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, self.path).as_bytes());
        let mut has_host = false;
        for h in headers.iter().filter(|h| !hop(h.name)) {
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
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out
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

/// Copies `from` to `to` until `from` ends, then shuts `to`'s writing side; `n` counts what
/// was written (kept when the copy fails or is dropped). The bytes go through a pipe with
/// `splice(2)`, never through this process's memory: on loopback a copy through user space
/// left the proxy at a third of the direct speed.
async fn pump(from: &TcpStream, to: &TcpStream, n: &mut u64) -> io::Result<()> {
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
    loop {
        // Fill the pipe from the socket (it is empty here: EAGAIN is the socket's).
        let filled = loop {
            from.readable().await?;
            match from.try_io(tokio::io::Interest::READABLE, || {
                splice(from, None, &pipe_in, None, BUFFER, flags).map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => break r?,
            }
        };
        if filled == 0 {
            let _ = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
            return Ok(());
        }
        // Drain it into the other socket (EAGAIN is that socket's: the pipe holds bytes).
        let mut left = filled;
        while left > 0 {
            to.writable().await?;
            match to.try_io(tokio::io::Interest::WRITABLE, || {
                splice(&pipe_out, None, to, None, left, flags).map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
                Ok(k) => {
                    left -= k;
                    *n += k as u64;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_as_the_proxy_decides_by_them() {
        let r = Request::parse(b"CONNECT LocalHost.:8443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(r.connect);
        assert_eq!((r.host.as_str(), r.port), ("localhost", 8443));
        let r =
            Request::parse(b"GET http://[::1]:81?q=1 HTTP/1.1\r\nHost: [::1]:81\r\n\r\n").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("::1", 81, "/?q=1")
        );
        let r = Request::parse(b"GET http://example.com/a/b HTTP/1.1\r\nhost: EXAMPLE.com\r\n\r\n")
            .unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("example.com", 80, "/a/b")
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
        ] {
            let e = Request::parse(head).unwrap_err();
            assert!(
                e.reason.contains(why),
                "{}: {}",
                String::from_utf8_lossy(head),
                e.reason
            );
        }
    }

    #[test]
    fn the_forwarded_head_drops_hop_by_hop_headers() {
        let head = b"POST http://example.com:8080/x HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nProxy-Connection: keep-alive\r\nContent-Length: 2\r\n\r\n";
        let r = Request::parse(head).unwrap();
        let out = String::from_utf8(r.forwarded).unwrap();
        assert_eq!(
            out,
            "POST /x HTTP/1.1\r\nHost: example.com:8080\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
    }
}
