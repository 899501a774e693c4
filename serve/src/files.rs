//! A task's workspace files over plain HTTP, for platforms: `PUT`, `GET`, `HEAD` and `DELETE`
//! `/files/<plan>/<task>/<path>`, behind the same token as `/mcp`, the same `Host` and `Origin`
//! rules ([`guard`]), streamed both ways (no base64, never a whole file in memory), served by
//! the server itself, so they work while the task's kernel is stopped. The same places serve
//! the MCP file tools and resources ([`Places`]).
//!
//! | request | answer |
//! | --- | --- |
//! | `PUT` with the bytes as the body | 200 and the file as JSON (`path`, `bytes`, `sha256`, `mime_type`) |
//! | `GET` | 200 and the bytes (`Content-Type` guessed, `Content-Length`, `Accept-Ranges`) |
//! | `GET` with one byte range | 206 and those bytes (`Content-Range`); 416 past the end |
//! | `HEAD` | the `GET`'s head, no body |
//! | `DELETE` | 204 |
//!
//! Refusals are text: 400 (a bad path, a name over 255 bytes or a path over 4095), 403
//! (outside the workspace, through a link, a hard link, flowrepl's own folder), 404 (no such
//! file; a task that does not exist, for which nothing is made), 409 (not a regular file; a
//! file that changed before its first byte was read), 413 (over `--max-file-bytes`), 507 (over
//! `--max-workspace-mb`), 503 (with `--store`, the task is held by another server).
//! With `--store`, a `PUT` or `DELETE` starts the task's kernel first, which takes the task's
//! lease, so that the change goes to the store with the next state.

use super::child::{Spawn, TaskKey};
use super::pool::Pool;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use flowrepl_files::{FileError, Kind, Limits, Recorder, Via, Workspace};
use http_body::Frame;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The route of a task's files.
pub const FILES_ROUTE: &str = "/files/{plan}/{task}/{*path}";

/// Body frames waiting for the upload's writer.
const PIECES_AHEAD: usize = 64;
/// The size of a download's chunks, and how many wait in line for the client.
const READ_CHUNK: usize = 1 << 20;
const CHUNKS_AHEAD: usize = 8;

/// Where the tasks' workspaces and logs are, and their limits.
#[derive(Debug)]
pub struct Places {
    /// How kernels are started (their workspaces).
    pub spawn: Spawn,
    /// The log folder (absolute): `file` records go to each task's log.
    pub log_dir: PathBuf,
    /// `--max-file-bytes`, `--max-workspace-mb`.
    pub limits: Limits,
    /// The kernels' output budget (`download_file` gives text within it).
    pub max_chars: usize,
    /// `--store` is set: changes need the task's lease (its kernel).
    pub store: bool,
}

impl Places {
    /// The task's workspace, recording as this server. With `create`, made if missing (an
    /// upload); without, a task that has no workspace is [`FileError::NoTask`] and nothing is
    /// made: no folder, no log, no record (a probe of names leaves no trace).
    pub fn open(&self, key: &TaskKey, create: bool) -> Result<Workspace, FileError> {
        let root = if create {
            self.spawn
                .make_workspace(key)
                .map_err(|source| FileError::Io {
                    path: String::new(),
                    source,
                })?
        } else {
            let root = self.spawn.workspace_of(key);
            if !root.is_dir() {
                return Err(FileError::NoTask {
                    plan: flowrepl_files::shown(&key.plan),
                    task: flowrepl_files::shown(&key.task),
                });
            }
            root
        };
        let log_file = flowrepl_task_logger::task_log_path(&self.log_dir, &key.plan, &key.task);
        let recorder = Recorder::new(
            log_file.clone(),
            &key.plan,
            &key.task,
            Some(&key.task),
            &self.spawn.holder,
        );
        Workspace::open(
            &root,
            Some(&self.log_dir),
            self.limits,
            Some(Arc::new(recorder)),
            self.store
                .then(|| flowrepl_task_logger::path::workspace_marker(&log_file)),
        )
    }
}

/// What the routes share.
#[derive(Clone)]
pub struct Files {
    /// The kernels (with `--store`, a change starts the task's).
    pub pool: Arc<Pool>,
    /// The places.
    pub places: Arc<Places>,
}

impl Files {
    /// With `--store`, makes sure this server holds the task (its kernel runs) before a change.
    pub async fn hold(&self, key: &TaskKey) -> Result<(), String> {
        if !self.places.store {
            return Ok(());
        }
        self.pool
            .kernel(key)
            .await
            .map(drop)
            .map_err(|e| format!("{}: {e}", key.task))
    }
}

/// The status of a refusal.
pub fn status(e: &FileError) -> StatusCode {
    match e.kind() {
        Kind::BadRequest => StatusCode::BAD_REQUEST,
        Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::Full => StatusCode::INSUFFICIENT_STORAGE,
        Kind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn refusal(e: &FileError) -> Response {
    (status(e), format!("{e}\n")).into_response()
}

/// `PUT`, `GET` and `DELETE` of a task's file.
pub async fn serve(
    State(files): State<Files>,
    UrlPath((plan, task, path)): UrlPath<(String, String, String)>,
    request: Request,
) -> Response {
    if let Err(why) = super::route::check_ids(&plan, &task) {
        return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
    }
    let key = TaskKey { plan, task };
    let method = request.method().clone();
    if method == Method::PUT || method == Method::DELETE {
        if let Err(why) = files.hold(&key).await {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response();
        }
    }
    let places = Arc::clone(&files.places);
    let create = method == Method::PUT;
    let ws = match tokio::task::spawn_blocking(move || places.open(&key, create)).await {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => return refusal(&e),
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    match method {
        Method::PUT => put(ws, &path, request).await,
        Method::GET => get(ws, &path, request.headers(), false).await,
        Method::HEAD => get(ws, &path, request.headers(), true).await,
        Method::DELETE => {
            match tokio::task::spawn_blocking(move || ws.delete(&path, Via::Http)).await {
                Ok(Ok(_)) => StatusCode::NO_CONTENT.into_response(),
                Ok(Err(e)) => refusal(&e),
                Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            }
        }
        _ => {
            let mut r =
                (StatusCode::METHOD_NOT_ALLOWED, "PUT, GET, HEAD or DELETE\n").into_response();
            r.headers_mut().insert(
                header::ALLOW,
                header::HeaderValue::from_static("PUT, GET, HEAD, DELETE"),
            );
            r
        }
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// What the body's reader hands the upload's writer.
enum Piece {
    Data(Bytes),
    /// The body ended whole: put the file in place.
    End,
}

/// The body's bytes into the file as they come: this task reads the socket, a blocking
/// thread writes and hashes (the two run at once); the bytes are handed over, not copied.
async fn put(ws: Workspace, path: &str, request: Request) -> Response {
    use http_body_util::BodyExt;
    let length = content_length(request.headers());
    let mut up = match ws.upload(path, length, Via::Http) {
        Ok(u) => u,
        Err(e) => return refusal(&e),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Piece>(PIECES_AHEAD);
    let writer = tokio::task::spawn_blocking(move || {
        while let Some(piece) = rx.blocking_recv() {
            match piece {
                Piece::Data(d) => up.write(&d)?,
                Piece::End => return up.finish().map(Some),
            }
        }
        // The body was cut: the upload is dropped (nothing written; the cut recorded).
        Ok(None)
    });
    let mut body = request.into_body();
    let cut = loop {
        let frame = match body.frame().await {
            Some(Ok(f)) => f,
            // The client went away or the body timed out.
            Some(Err(e)) => break Some(e.to_string()),
            None => {
                let _ = tx.send(Piece::End).await;
                break None;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if tx.send(Piece::Data(data)).await.is_err() {
            break None; // the writer stopped: its error is the answer
        }
    };
    drop(tx);
    match (writer.await, cut) {
        (Ok(Err(e)), _) => refusal(&e),
        (Ok(Ok(Some(info))), _) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&info).unwrap_or_default() + "\n",
        )
            .into_response(),
        (Ok(Ok(None)), Some(why)) => (
            StatusCode::BAD_REQUEST,
            format!("the body was cut: {why}\n"),
        )
            .into_response(),
        (Ok(Ok(None)), None) | (Err(_), _) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// What the download's reader hands its hasher.
enum Read {
    Chunk(Bytes),
    /// Every byte promised was sent: record it.
    Done,
    /// The file changed while it was read (its size now): the answer was cut.
    Changed(u64),
}

/// What a request's `Range` asks of a file of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The whole file (no range, several ranges, an `If-Range`, or a range that does not
    /// parse, which RFC 9110 lets a server ignore).
    Whole,
    /// `len` bytes from `start`.
    Part {
        /// The first byte.
        start: u64,
        /// How many.
        len: u64,
    },
    /// No byte of the file is in the range: 416.
    Unsatisfiable,
}

/// Reads a `Range` header (single byte ranges: `bytes=a-b`, `a-`, `-n`).
pub fn wanted(headers: &HeaderMap, size: u64) -> Want {
    let Some(v) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Want::Whole;
    };
    if headers.contains_key(header::IF_RANGE) || headers.get_all(header::RANGE).iter().count() > 1 {
        return Want::Whole;
    }
    let Some((unit, spec)) = v.split_once('=') else {
        return Want::Whole;
    };
    let spec = spec.trim();
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return Want::Whole;
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Want::Whole;
    };
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    match (a.trim(), b.trim()) {
        ("", n) => match number(n) {
            None => Want::Whole,
            Some(0) => Want::Unsatisfiable,
            Some(_) if size == 0 => Want::Unsatisfiable,
            Some(n) => {
                let len = n.min(size);
                Want::Part {
                    start: size - len,
                    len,
                }
            }
        },
        (a, "") => match number(a) {
            None => Want::Whole,
            Some(a) if a >= size => Want::Unsatisfiable,
            Some(a) => Want::Part {
                start: a,
                len: size - a,
            },
        },
        (a, b) => match (number(a), number(b)) {
            (Some(a), Some(b)) if a <= b => {
                if a >= size {
                    Want::Unsatisfiable
                } else {
                    Want::Part {
                        start: a,
                        len: b.min(size - 1) - a + 1,
                    }
                }
            }
            _ => Want::Whole,
        },
    }
}

/// What says the file was rewritten: its size, modification and change times.
fn signature(m: &std::fs::Metadata) -> (u64, i64, i64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// The file's bytes to the client (`GET`; a `HEAD` gets the same head and no body): one
/// blocking thread reads them a chunk ahead and hands each to the response and to a second
/// thread that hashes (SHA-256, which bounds the speed, runs beside the copying), which
/// records the download once every byte was sent. A single byte range is answered 206.
/// Exactly the bytes promised by `Content-Length` are read; a file that changes while it is
/// read (its size, modification or change time moved: a cell is writing it) ends the answer
/// short before the bytes read after the change are sent, so the client sees a cut body,
/// never a whole-looking mix, and the record says so with the real counts.
async fn get(ws: Workspace, path: &str, headers: &HeaderMap, head: bool) -> Response {
    use std::io::{Seek, SeekFrom};
    let mut download = match ws.download(path, Via::Http) {
        Ok(d) => d,
        Err(e) => return refusal(&e),
    };
    let opened = download.reader().and_then(|f| Ok((f.metadata()?, f)));
    let (meta, mut file) = match opened {
        Ok(m) => m,
        Err(source) => {
            return refusal(&FileError::Io {
                path: flowrepl_files::shown(path),
                source,
            })
        }
    };
    let size = download.size();
    let before = signature(&meta);
    let mime = download.mime_type();
    let (status, start, len) = match wanted(headers, size) {
        Want::Whole => (StatusCode::OK, 0, size),
        Want::Part { start, len } => (StatusCode::PARTIAL_CONTENT, start, len),
        Want::Unsatisfiable => {
            let why = format!("the range asked for is not in the file ({size} bytes)");
            if head {
                download.discard();
            } else {
                download.refuse(why.clone());
            }
            let mut r = (StatusCode::RANGE_NOT_SATISFIABLE, format!("{why}\n")).into_response();
            if let Ok(v) = header::HeaderValue::from_str(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    let mut heads = HeaderMap::new();
    heads.insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
    heads.insert(
        header::ACCEPT_RANGES,
        header::HeaderValue::from_static("bytes"),
    );
    if let Ok(v) = header::HeaderValue::from_str(mime) {
        heads.insert(header::CONTENT_TYPE, v);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        let range = format!("bytes {start}-{}/{size}", start + len - 1);
        if let Ok(v) = header::HeaderValue::from_str(&range) {
            heads.insert(header::CONTENT_RANGE, v);
        }
    }
    if head {
        download.discard();
        let mut r = Response::new(Body::empty());
        *r.status_mut() = status;
        *r.headers_mut() = heads;
        return r;
    }
    download.range(len);
    if start > 0 {
        if let Err(source) = file.seek(SeekFrom::Start(start)) {
            return refusal(&FileError::Io {
                path: flowrepl_files::shown(path),
                source,
            });
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
    let (to_hash, hashing) = std::sync::mpsc::sync_channel::<Read>(CHUNKS_AHEAD);
    tokio::task::spawn_blocking(move || {
        let mut download = download;
        while let Ok(piece) = hashing.recv() {
            match piece {
                Read::Chunk(c) => download.hash(&c),
                Read::Done => {
                    download.finish();
                    return;
                }
                Read::Changed(now) => {
                    download.changed(now);
                    return;
                }
            }
        }
        // Dropped unfinished: recorded as cut short.
    });
    tokio::task::spawn_blocking(move || {
        let mut left = len;
        let changed = |file: &std::fs::File| -> Option<u64> {
            let now = file.metadata().ok()?;
            (signature(&now) != before || now.len() != size).then_some(now.len())
        };
        let cut = |now: u64| {
            let _ = to_hash.send(Read::Changed(now));
            let _ = tx.blocking_send(Err(std::io::Error::other(CHANGED)));
        };
        loop {
            if left == 0 {
                // Every byte promised was read: sent only if the file did not move meanwhile.
                if let Some(now) = changed(&file) {
                    return cut(now);
                }
                let _ = to_hash.send(Read::Done);
                return;
            }
            let mut chunk = bytes::BytesMut::with_capacity(READ_CHUNK);
            let max = READ_CHUNK.min(usize::try_from(left).unwrap_or(READ_CHUNK));
            match flowrepl_files::read_into(&file, &mut chunk, max) {
                // Shorter than promised: it was cut while read.
                Ok(0) => return cut(changed(&file).unwrap_or(0)),
                Ok(n) => {
                    if let Some(now) = changed(&file) {
                        return cut(now);
                    }
                    left -= n as u64;
                    let chunk = chunk.freeze();
                    if tx.blocking_send(Ok(chunk.clone())).is_err() {
                        return; // the client went away
                    }
                    if to_hash.send(Read::Chunk(chunk)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    // The first chunk (or why there is none) before the head is sent: a file that changed
    // before a byte was read is a plain refusal, not a connection closed without a word.
    let mut rx = rx;
    let first = match rx.recv().await {
        Some(Ok(chunk)) => Some(chunk),
        Some(Err(e)) if e.to_string().contains(CHANGED) => {
            return (
                StatusCode::CONFLICT,
                format!(
                    "{:?}: {CHANGED} (a cell is writing it); nothing was sent, try again\n",
                    flowrepl_files::shown(path)
                ),
            )
                .into_response()
        }
        Some(Err(e)) => {
            return refusal(&FileError::Io {
                path: flowrepl_files::shown(path),
                source: e,
            })
        }
        None => None,
    };
    let mut r = Response::new(Body::new(Chunks { first, rx }));
    *r.status_mut() = status;
    *r.headers_mut() = heads;
    r
}

/// What a download cut by a change says.
const CHANGED: &str = "the file changed while it was read";

/// A body of chunks read ahead by a blocking thread.
struct Chunks {
    /// The first chunk, taken before the head was sent.
    first: Option<Bytes>,
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        self.rx.poll_recv(cx).map(|c| c.map(|r| r.map(Frame::data)))
    }
}

/// The `Host` and `Origin` rules of `/mcp` (rmcp's, from the same lists) for the other
/// routes: a `Host` not allowed, or an `Origin` not allowed, is 403 (a page of another origin,
/// or a DNS-rebound name, reaching this server).
#[derive(Debug, Clone)]
pub struct Guard {
    hosts: Arc<[String]>,
    origins: Arc<[String]>,
}

impl Guard {
    /// The rules of `config`.
    pub fn of(
        config: &rmcp::transport::streamable_http_server::StreamableHttpServerConfig,
    ) -> Guard {
        Guard {
            hosts: config.allowed_hosts.clone().into(),
            origins: config.allowed_origins.clone().into(),
        }
    }

    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let Ok(host) = axum::http::uri::Authority::try_from(host) else {
            return false;
        };
        let name = normalize(host.host());
        self.hosts.iter().any(|allowed| {
            match axum::http::uri::Authority::try_from(allowed.as_str()) {
                Ok(a) => {
                    normalize(a.host()) == name
                        && a.port_u16().is_none_or(|p| host.port_u16() == Some(p))
                }
                Err(_) => normalize(allowed) == name,
            }
        })
    }

    fn origin_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Some((scheme, host, port)) = origin.to_str().ok().and_then(split_origin) else {
            return false;
        };
        self.origins.iter().any(|allowed| {
            let (base, any_port) = match allowed.strip_suffix(":*") {
                Some(b) => (b, true),
                None => (allowed.as_str(), false),
            };
            split_origin(base).is_some_and(|(s, h, p)| {
                s == scheme
                    && h == host
                    && (any_port
                        || p.is_none()
                        || p.or(default_port(&s)) == port.or(default_port(&scheme)))
            })
        })
    }
}

fn normalize(host: &str) -> String {
    host.trim_matches(['[', ']']).to_ascii_lowercase()
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// `scheme://host[:port]` as (scheme, host, port).
fn split_origin(origin: &str) -> Option<(String, String, Option<u16>)> {
    let uri = axum::http::Uri::try_from(origin.trim()).ok()?;
    let authority = uri.authority()?;
    Some((
        uri.scheme_str()?.to_ascii_lowercase(),
        normalize(authority.host()),
        authority.port_u16(),
    ))
}

/// Refuses a request whose `Host` or `Origin` the rules do not allow.
pub async fn guard(
    State(guard): State<Guard>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    if !guard.host_allowed(request.headers()) {
        return (
            StatusCode::FORBIDDEN,
            "Forbidden: Host header is not allowed\n",
        )
            .into_response();
    }
    if !guard.origin_allowed(request.headers()) {
        return (
            StatusCode::FORBIDDEN,
            "Forbidden: Origin header is not allowed\n",
        )
            .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guard {
        Guard {
            hosts: vec![
                "localhost".into(),
                "127.0.0.1".into(),
                "127.0.0.1:8765".into(),
            ]
            .into(),
            origins: vec!["http://localhost:*".into(), "https://app.example".into()].into(),
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn hosts_and_origins_as_rmcp_checks_them() {
        let g = guard();
        assert!(g.host_allowed(&headers(&[("host", "localhost:9999")])));
        assert!(g.host_allowed(&headers(&[("host", "127.0.0.1:8765")])));
        assert!(!g.host_allowed(&headers(&[("host", "evil.example:8765")])));
        assert!(!g.host_allowed(&headers(&[])));
        assert!(g.origin_allowed(&headers(&[])));
        assert!(g.origin_allowed(&headers(&[("origin", "http://localhost:3000")])));
        assert!(g.origin_allowed(&headers(&[("origin", "https://app.example")])));
        assert!(!g.origin_allowed(&headers(&[("origin", "https://evil.example")])));
        assert!(!g.origin_allowed(&headers(&[("origin", "null")])));
    }
}
