//! A real S3-compatible server for the `--store` tests: moto's server mode (`moto_server`,
//! from the test venv, `tests/mcp/requirements.txt`), started per test on a free loopback
//! port and stopped when dropped; and a TCP proxy in front of it that a test can cut, to make
//! the store unreachable for a while.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running `moto_server` with one bucket.
pub struct S3Server {
    child: Child,
    /// moto's request log (its stderr: one line per request).
    log: tempfile::NamedTempFile,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The bucket the tests store in.
    pub bucket: String,
}

/// `moto_server` of the test venv (made when missing).
pub fn moto_server() -> PathBuf {
    crate::mcp::mcp_venv().join("bin/moto_server")
}

/// One HTTP/1.1 request without a body; the status code and the body. moto without auth
/// takes any signature, but answers an anonymous GET with 403 (the object is not public), so
/// the request carries a made-up one.
pub fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\nAuthorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

/// One HTTP/1.1 request with a body (as [`http`]); the status code and the body.
pub fn http_body(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\nAuthorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

impl S3Server {
    /// Starts a server and makes the bucket `bucket`; `env` is set for the server (moto's
    /// own settings).
    pub fn start_with(bucket: &str, env: &[(&str, &str)]) -> S3Server {
        let port = crate::free_port();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(moto_server())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("moto_server starts");
        crate::wait_listening(port, Duration::from_secs(30), "moto_server");
        let (code, body) = http(port, "PUT", &format!("/{bucket}"));
        assert_eq!(code, 200, "bucket not made: {body}");
        S3Server {
            child,
            log,
            port,
            bucket: bucket.to_owned(),
        }
    }

    /// Starts a server with the bucket `flowrepl`.
    pub fn start() -> S3Server {
        S3Server::start_with("flowrepl", &[])
    }

    /// The environment a kernel needs to reach it through `port` (its own, or a proxy's).
    pub fn env_via(&self, port: u16) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The environment a kernel needs to reach it.
    pub fn env(&self) -> Vec<(String, String)> {
        self.env_via(self.port)
    }

    /// `s3://<bucket>/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// The keys under `prefix` in the bucket, sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let (code, body) = http(
            self.port,
            "GET",
            &format!("/{}?list-type=2&max-keys=1000&prefix={prefix}", self.bucket),
        );
        assert_eq!(code, 200, "{body}");
        let mut keys: Vec<String> = body
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_owned()))
            .collect();
        keys.sort();
        keys
    }

    /// The requests moto has served so far whose path starts with `/<bucket>/<prefix>`, as
    /// (method, path), from its request log.
    pub fn requests(&self, prefix: &str) -> Vec<(String, String)> {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let want = format!("/{}/{prefix}", self.bucket);
        text.lines()
            .filter_map(|line| {
                // `127.0.0.1 - - [date] "PUT /bucket/key HTTP/1.1" 200 -`, with colour codes.
                let (_, rest) = line.split_once('"')?;
                let rest = rest.trim_start_matches(|c: char| {
                    c == '\u{1b}' || c == '[' || c.is_ascii_digit() || c == ';' || c == 'm'
                });
                let mut words = rest.split_whitespace();
                let method = words.next()?.to_owned();
                let path = words.next()?.to_owned();
                path.starts_with(&want).then_some((method, path))
            })
            .collect()
    }

    /// Writes the object at `key` (a hand edit of the store).
    pub fn put(&self, key: &str, body: &[u8]) {
        let (code, said) = http_body(self.port, "PUT", &format!("/{}/{key}", self.bucket), body);
        assert_eq!(code, 200, "{said}");
    }

    /// Removes the object at `key`.
    pub fn delete(&self, key: &str) {
        let (code, said) = http(self.port, "DELETE", &format!("/{}/{key}", self.bucket));
        assert!(code == 204 || code == 200, "{code} {said}");
    }

    /// The object at `key`, if any.
    pub fn get(&self, key: &str) -> Option<String> {
        let (code, body) = http(self.port, "GET", &format!("/{}/{key}", self.bucket));
        (code == 200).then_some(body)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy on loopback that can be cut: while cut, its connections are closed and new
/// ones are closed as soon as they are accepted (the store is unreachable).
pub struct CutProxy {
    /// Its port.
    pub port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl CutProxy {
    /// A proxy to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::<TcpStream>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, o, s) = (Arc::clone(&cut), Arc::clone(&open), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                client.set_nonblocking(false).unwrap();
                if c.load(Ordering::Relaxed) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                {
                    let mut open = o.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Write);
                    });
                }
            }
        });
        CutProxy {
            port,
            cut,
            open,
            stop,
        }
    }

    /// Closes every connection and refuses new ones until [`CutProxy::mend`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn mend(&self) {
        self.cut.store(false, Ordering::Relaxed);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}
