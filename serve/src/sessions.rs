//! MCP sessions: at most `--max-sessions` open, each ending `--session-expiry` after its last
//! request (rmcp's session manager ends it), and the memory of ended ones given back.
//!
//! Ended sessions' memory is freed inside the process but glibc keeps it (a session's
//! allocations are spread over the runtime threads' arenas): three rounds of 1000 sessions
//! left to expire took the server from 20 to 76, 101 and 117 MB and it never came down.
//! [`give_back_memory`] asks glibc to return free memory (`malloc_trim`) when many sessions
//! have ended since it last did: the same rounds then peak at 78, 80 and 80 MB and fall back
//! to 29–31 MB after each.

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use std::sync::Arc;
use std::time::Duration;

/// How often the session count is looked at.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Sessions ended since the last trim that make the next one worth it (a trim walks the
/// free memory of every arena: 10 to 20 ms for the 50 MB of 1000 sessions here).
const ENDED_FOR_A_TRIM: usize = 100;

/// Gives the memory of ended sessions back to the system: when at least
/// `ENDED_FOR_A_TRIM` (100) fewer sessions are open than at the most since the last trim,
/// `malloc_trim`. Runs until the runtime ends.
pub async fn give_back_memory(sessions: Arc<LocalSessionManager>) {
    let mut most = 0;
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let open = sessions.sessions.read().await.len();
        most = most.max(open);
        if most - open >= ENDED_FOR_A_TRIM {
            let started = std::time::Instant::now();
            // Off the runtime's threads: it holds the allocator's locks while it works.
            let _ = tokio::task::spawn_blocking(trim).await;
            tracing::debug!(ended = most - open, took = ?started.elapsed(), "ended sessions' memory given back");
            most = open;
        }
    }
}

/// Returns free heap memory to the system (glibc; elsewhere nothing).
fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A `DELETE` of a session that is not open is 404. A request that would open a session (a
/// POST without `Mcp-Session-Id`) while `max` are open is answered 503: sessions are memory
/// a token holder could otherwise grow without bound (54,420 in 20 s, 3 GB, in the attack
/// pass).
pub async fn at_most(
    sessions: Arc<LocalSessionManager>,
    max: usize,
    expiry: Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let id = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok());
    if request.method() == axum::http::Method::DELETE {
        // rmcp answers an unknown one as if it had ended it.
        let known = match id {
            Some(id) => sessions.sessions.read().await.contains_key(id),
            None => false,
        };
        if !known {
            return (
                axum::http::StatusCode::NOT_FOUND,
                "no such MCP session (ended, expired, or never opened)\n",
            )
                .into_response();
        }
    }
    let opens = request.method() == axum::http::Method::POST && id.is_none();
    if opens && sessions.sessions.read().await.len() >= max {
        let mut r = (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("{max} MCP sessions are open (--max-sessions): end one (DELETE) or wait for one to expire ({} s after its last request)\n", expiry.as_secs()),
        )
            .into_response();
        r.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("5"),
        );
        return r;
    }
    next.run(request).await
}
