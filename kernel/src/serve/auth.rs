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
fn random_hex(n: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; n];
    let mut f = std::fs::File::open("/dev/urandom")?;
    std::io::Read::read_exact(&mut f, &mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware: `Authorization: Bearer <token>` or 401.
pub async fn require_token(token: Arc<str>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(t) if same(t.as_bytes(), token.as_bytes()) => next.run(request).await,
        other => {
            tracing::info!(
                given = other.is_some(),
                uri = %request.uri(),
                "refused: no or wrong bearer token"
            );
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
    }
}
