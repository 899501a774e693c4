//! Who may call: a bearer token on every request (401 without it), and the `Host` and
//! `Origin` checks against DNS rebinding (403; rmcp's, configured in [`super::http_config`]).

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The token's environment variable.
pub const TOKEN_ENV: &str = "FLOWREPL_TOKEN";

/// Where the token came from, for the start-up line.
#[derive(Debug)]
pub enum TokenSource {
    /// `--token-file`.
    File(PathBuf),
    /// `FLOWREPL_TOKEN`.
    Environment,
    /// Made at start and written here.
    Made(PathBuf),
}

/// Why there is no token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file cannot be read.
    #[error("cannot read the token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Too short to be a secret.
    #[error("the token ({from}) must be at least 16 characters")]
    TooShort {
        /// Where it came from.
        from: String,
    },
    /// The token made at start cannot be written.
    #[error("cannot write the token to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The token: `--token-file`, else `FLOWREPL_TOKEN`, else 32 random bytes (hex) written 0600
/// to `<state_dir>/token` (the folder made 0700).
pub fn token(file: Option<&Path>, state_dir: &Path) -> Result<(String, TokenSource), TokenError> {
    let check = |t: String, from: &str| {
        let t = t.trim().to_owned();
        if t.len() < 16 {
            return Err(TokenError::TooShort { from: from.into() });
        }
        Ok(t)
    };
    if let Some(path) = file {
        let t = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.into(),
            source,
        })?;
        return Ok((
            check(t, &path.display().to_string())?,
            TokenSource::File(path.into()),
        ));
    }
    if let Ok(t) = std::env::var(TOKEN_ENV) {
        return Ok((check(t, TOKEN_ENV)?, TokenSource::Environment));
    }
    let path = state_dir.join("token");
    let write_err = |source| TokenError::Write {
        path: path.clone(),
        source,
    };
    let t = random_hex(32).map_err(write_err)?;
    std::fs::create_dir_all(state_dir).map_err(write_err)?;
    std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(write_err)?;
    // A new file each start (an old one, perhaps readable by others, is replaced, not reused).
    let tmp = state_dir.join(".token.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(write_err)?;
    f.write_all(t.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.sync_all())
        .map_err(write_err)?;
    std::fs::rename(&tmp, &path).map_err(write_err)?;
    Ok((t, TokenSource::Made(path)))
}

/// `n` bytes from the kernel's random source, as hex.
pub(crate) fn random_hex(n: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; n];
    let mut f = std::fs::File::open("/dev/urandom")?;
    std::io::Read::read_exact(&mut f, &mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares in time independent of where they differ and of their lengths: the SHA-256 of
/// each, compared byte by byte without stopping early.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    use sha2::Digest;
    let (a, b) = (sha2::Sha256::digest(a), sha2::Sha256::digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// How often a line about refused requests is logged at the most.
pub const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest path a refusal line shows (never the query, where a token may have been put).
const SHOWN_PATH: usize = 80;

/// Who may call, and the refusals counted: a stranger's requests must not turn into log lines
/// one for one (a keep-alive connection sent 19,523 in 5 s, 1.25 GB of log with full URIs).
#[derive(Debug)]
pub struct Gate {
    token: Arc<str>,
    refused: std::sync::atomic::AtomicU64,
    last_line: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl Gate {
    /// A gate for `token`.
    pub fn new(token: Arc<str>) -> Gate {
        Gate {
            token,
            refused: std::sync::atomic::AtomicU64::new(0),
            last_line: std::sync::Mutex::new((None, 0)),
        }
    }

    /// Counts a refusal; logs one line (the count since the last line, the latest path cut
    /// short, no query) at most every [`REFUSAL_LOG_EVERY`].
    fn note(&self, why: &str, request: &Request) {
        let total = self
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let now = std::time::Instant::now();
        let mut last = flowrepl_os::lock(&self.last_line);
        if last
            .0
            .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_EVERY)
        {
            return;
        }
        let since = total - last.1;
        *last = (Some(now), total);
        drop(last);
        let path: String = request.uri().path().chars().take(SHOWN_PATH).collect();
        tracing::info!(
            refused = since,
            total,
            latest = %format!("{} {path}", request.method()),
            "refused {why} (one line per {} s at most)",
            REFUSAL_LOG_EVERY.as_secs()
        );
    }
}

/// A header given more than once, which only its first would be checked for.
fn repeated(request: &Request) -> Option<&'static str> {
    [header::AUTHORIZATION, header::HOST]
        .into_iter()
        .find(|h| request.headers().get_all(h).iter().nth(1).is_some())
        .map(|h| {
            if h == header::HOST {
                "Host"
            } else {
                "Authorization"
            }
        })
}

/// The middleware: `Authorization: Bearer <token>` (the scheme in any case) or 401; a
/// repeated `Authorization` or `Host` header is 400.
pub async fn require_token(gate: Arc<Gate>, request: Request, next: Next) -> Response {
    if let Some(h) = repeated(&request) {
        gate.note("requests with a repeated header", &request);
        return (
            StatusCode::BAD_REQUEST,
            format!("the {h} header is given more than once\n"),
        )
            .into_response();
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    match given {
        Some(t) if same(t.as_bytes(), gate.token.as_bytes()) => next.run(request).await,
        _ => {
            gate.note("requests without a valid bearer token", &request);
            let mut r = (
                StatusCode::UNAUTHORIZED,
                "a bearer token is required (Authorization: Bearer <token>; see `flowrepl serve --help`)\n",
            )
                .into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"flowrepl\""),
            );
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_made_private_and_replaced_at_each_start() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (a, src) = token(None, &state).unwrap();
        assert!(matches!(src, TokenSource::Made(_)));
        assert_eq!(a.len(), 64);
        let meta = std::fs::metadata(state.join("token")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dmeta = std::fs::metadata(&state).unwrap();
        assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
        let (b, _) = token(None, &state).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            std::fs::read_to_string(state.join("token")).unwrap().trim(),
            b
        );
    }

    #[test]
    fn a_token_file_is_read_and_a_short_token_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        std::fs::write(&f, "0123456789abcdef0123\n").unwrap();
        assert_eq!(
            token(Some(&f), dir.path()).unwrap().0,
            "0123456789abcdef0123"
        );
        std::fs::write(&f, "short").unwrap();
        assert!(matches!(
            token(Some(&f), dir.path()),
            Err(TokenError::TooShort { .. })
        ));
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
        assert!(!same(b"", b"abc") && same(b"", b""));
    }
}
