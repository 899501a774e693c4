//! The HTTP listener of `flowrepl serve`: every connection timed and counted, so that nobody,
//! with or without the token, can hold the server's connections or descriptors.
//!
//! - **Header timeout** (`--header-timeout`, 30 s): a request's head must arrive whole within
//!   it, and a keep-alive connection waiting for its next request is closed after it (hyper's
//!   own timer, which `axum::serve` left unset: 100 half-sent requests were still open 45 s
//!   later). A response being sent (an SSE stream, a long call) is never cut by it.
//! - **Body timeout** (`--body-timeout`, 120 s): a request's body must arrive within it, else
//!   408 (see [`body_within`]; the body still streams, it is not buffered here).
//! - **Connection cap** (`--max-connections`, 512, lowered to what the descriptor limit leaves
//!   after the kernels' own): past it, a new connection is answered `503` with `Retry-After`
//!   and closed at once, never left unanswered.
//! - **One framing per request**: a request with both `Transfer-Encoding` and
//!   `Content-Length` is 400 and its connection closed ([`crate::framing`]).
//! - `TCP_NODELAY` on every connection (a reply written in two parts waited 40 ms for the
//!   client's delayed ACK).
//!
//! On shutdown the listener stops accepting, and each open connection ends once its current
//! response is sent.

use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// Descriptors kept for each kernel the server may run (its three pipes, with room).
const FDS_PER_KERNEL: u64 = 8;
/// Descriptors kept for everything else (logs, the listener, files being read).
const FDS_RESERVED: u64 = 64;

/// The listener's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request head must arrive within it; an idle keep-alive connection is closed after it.
    pub header_timeout: Duration,
    /// A request body must arrive within it.
    pub body_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

impl Limits {
    /// `wanted` connections at most, fewer when the descriptor limit (raised to its hard
    /// limit first) leaves less after `max_kernels` kernels.
    pub fn fit(mut self, max_kernels: u32) -> Limits {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let fds = match getrlimit(Resource::RLIMIT_NOFILE) {
            Ok((soft, hard)) => {
                if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                    hard
                } else {
                    soft
                }
            }
            Err(_) => 1024,
        };
        let left = fds
            .saturating_sub(FDS_RESERVED)
            .saturating_sub(u64::from(max_kernels) * FDS_PER_KERNEL);
        let fit = usize::try_from(left).unwrap_or(usize::MAX).max(1);
        if fit < self.max_connections {
            tracing::warn!(
                wanted = self.max_connections,
                allowed = fit,
                descriptors = fds,
                "--max-connections lowered to what the descriptor limit leaves after the kernels'"
            );
            self.max_connections = fit;
        }
        self
    }
}

/// Serves `app` on `listener` until `stop`, then lets open connections finish their current
/// response (at most `drain`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: Limits,
    stop: CancellationToken,
    drain: Duration,
) {
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut refused: u64 = 0;
    let mut last_refusal_line: Option<std::time::Instant> = None;
    loop {
        let (mut tcp, _peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or the like: wait instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            refused += 1;
            if last_refusal_line.is_none_or(|t| t.elapsed() >= crate::auth::REFUSAL_LOG_EVERY) {
                last_refusal_line = Some(std::time::Instant::now());
                tracing::warn!(
                    refused,
                    max = limits.max_connections,
                    "connections refused at --max-connections (one line per 10 s at most)"
                );
            }
            tokio::spawn(async move {
                let reply = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
                    BUSY.len(),
                    BUSY
                );
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), tcp.write_all(reply.as_bytes()))
                        .await;
                let _ = tcp.shutdown().await;
            });
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(crate::framing::Framing::new(tcp)), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(drain, graceful.shutdown()).await;
}

/// What a connection past the cap is told.
const BUSY: &str = "too many connections (--max-connections): retry shortly\n";

/// A middleware: the request's body must arrive within `timeout`, else 408. The body is
/// passed on as it streams (not buffered here: a body at the size limit is held once, by
/// the MCP layer), with a deadline that ends it with an error when it passes; the response
/// is then replaced by the 408.
pub async fn body_within(
    timeout: Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (parts, body) = request.into_parts();
    let body = Deadline {
        inner: body,
        sleep: Box::pin(tokio::time::sleep(timeout)),
        fired: Arc::clone(&fired),
    };
    let response = next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::new(body),
        ))
        .await;
    if fired.load(std::sync::atomic::Ordering::Acquire) {
        return (
            axum::http::StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s (--body-timeout)\n",
                timeout.as_secs()
            ),
        )
            .into_response();
    }
    response
}

/// A body that fails once its deadline passes before its end.
struct Deadline {
    inner: axum::body::Body,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    fired: Arc<std::sync::atomic::AtomicBool>,
}

impl http_body::Body for Deadline {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.fired.store(true, std::sync::atomic::Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new("the body timeout passed"))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
