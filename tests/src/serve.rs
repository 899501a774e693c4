//! `flowrepl serve` test support: a server on a free loopback port with a known token, in a
//! folder of its own (logs, workspaces, state), and a runner for the scenarios in
//! `tests/mcp/serve_client.py` (the official Python SDK's streamable HTTP client).

use crate::mcp::mcp_venv;
use crate::{flowrepl_bin, workspace_root};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The token every test server takes.
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// A running `flowrepl serve`.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    /// Its folder: `logs/`, `workspaces/`, `state/`.
    pub dir: tempfile::TempDir,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// Starts `flowrepl serve` with `args` (besides the listen address, the folders and the
    /// token) and waits for its address line. Its kernels use the MCP venv's Python.
    pub fn start(args: &[&str]) -> Server {
        Server::start_with("127.0.0.1:0", args, &[])
    }

    /// [`Server::start`] listening on `listen`, with `env` set for it (and its kernels).
    pub fn start_with(listen: &str, args: &[&str], env: &[(String, String)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(flowrepl_bin())
            .arg("serve")
            .args(["--listen", listen])
            .arg("--log-dir")
            .arg(dir.path().join("logs"))
            .arg("--workspace-root")
            .arg(dir.path().join("workspaces"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--python")
            .arg(mcp_venv())
            .args(args)
            .env("FLOWREPL_TOKEN", TOKEN)
            .env("FLOWREPL_LOG", "info")
            .env_remove("FLOW_PLAN_ID")
            .env_remove("FLOW_TASK_ID")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start flowrepl serve");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = BufReader::new(child.stderr.take().unwrap());
        let keep = std::sync::Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                if let Some(rest) = line.split("MCP at ").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
                }
                let mut all = keep.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "flowrepl serve printed no address:\n{}",
                    stderr.lock().unwrap()
                )
            });
        Server {
            child,
            url,
            dir,
            stderr,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The log folder.
    pub fn logs(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    /// A task's log file (plan `local`, the default).
    pub fn log_of(&self, task: &str) -> PathBuf {
        flowrepl_task_logger::task_log_path(&self.logs(), "local", task)
    }

    /// Runs `tests/mcp/serve_client.py SCENARIO` against this server, with `extra` flags;
    /// panics with the client's output unless it passes; returns the facts it printed.
    pub fn run(&self, scenario: &str, extra: &[&str]) -> Value {
        self.run_at(&self.url, scenario, extra)
    }

    /// [`Server::run`] against `url` (a task's own URL, or a proxy in front).
    pub fn run_at(&self, url: &str, scenario: &str, extra: &[&str]) -> Value {
        let out = Command::new("timeout")
            .args(["-k", "10", "400"])
            .arg(mcp_venv().join("bin/python"))
            .arg(workspace_root().join("tests/mcp/serve_client.py"))
            .arg(scenario)
            .args(["--url", url, "--token", TOKEN])
            .args(["--serve-pid", &self.pid().to_string()])
            .args(extra)
            .output()
            .expect("run the serve client");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("Session termination failed"),
            "the SDK could not end its session cleanly:\n{stderr}"
        );
        assert!(
            out.status.success(),
            "serve scenario {scenario} failed:\n{}\n{stdout}\n--- server:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.stderr()
        );
        serde_json::from_str(stdout.lines().last().unwrap_or("{}"))
            .unwrap_or_else(|e| panic!("scenario {scenario} printed no facts ({e}): {stdout}"))
    }

    /// Waits up to `timeout` for it to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        crate::kill(self.child.id(), libc::SIGTERM);
        if self.wait(Duration::from_secs(20)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if !std::thread::panicking() {
            crate::schema::validate_logs(&self.logs());
        }
    }
}

/// Processes whose command line mentions `path` (a server's folder: its kernels and workers
/// name it in their flags).
pub fn processes_naming(path: &Path) -> Vec<(u32, String)> {
    let needle = path.display().to_string();
    crate::all_pids()
        .filter_map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains(&needle) && crate::alive(pid)).then_some((pid, cmd))
        })
        .collect()
}

/// One keep-alive HTTP/1.1 connection spoken by hand (for what an SDK client would not send:
/// many refused requests, repeated headers, half-sent requests).
pub struct RawHttp {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

impl RawHttp {
    /// Connects to the server at `url` (`http://HOST:PORT/mcp`).
    pub fn connect(url: &str) -> RawHttp {
        let addr = url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        RawHttp {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `head` (the request line and headers, without the blank line) and `body`, and
    /// returns the status of the reply (its body read and dropped).
    pub fn request(&mut self, head: &str, body: &str) -> u16 {
        self.exchange(head, body).0
    }

    /// Like [`RawHttp::request`]: the status, the reply's head and its body.
    pub fn exchange(&mut self, head: &str, body: &str) -> (u16, String, String) {
        use std::io::{Read, Write};
        let msg = format!("{head}\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        self.stream.write_all(msg.as_bytes()).unwrap();
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let text = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                let header = |name: &str| {
                    text.lines().find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                    })
                };
                let whole = if header("transfer-encoding")
                    .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
                {
                    dechunk(&self.buf[end + 4..])
                } else {
                    let len: usize = header("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    (self.buf.len() >= end + 4 + len).then(|| {
                        let body = &self.buf[end + 4..end + 4 + len];
                        (String::from_utf8_lossy(body).into_owned(), len)
                    })
                };
                if let Some((body, used)) = whole {
                    self.buf.drain(..end + 4 + used);
                    let status = text
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    return (status, text, body);
                }
            }
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

impl Server {
    /// `HOST:PORT` of its address.
    pub fn host(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    }

    /// The head of a POST to its endpoint with the token (and `extra` header lines).
    pub fn post_head(&self, extra: &str) -> String {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer {TOKEN}{extra}",
            self.host()
        )
    }
}

/// An `initialize` request's body.
pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

/// The `Mcp-Session-Id` of a reply's head.
pub fn session_id(head: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("mcp-session-id")
            .then(|| v.trim().to_owned())
    })
}

/// The resident memory of `pid` in KiB.
pub fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A whole chunked body at the start of `buf`: the body and the bytes it took, or `None`
/// while its last chunk has not come.
fn dechunk(buf: &[u8]) -> Option<(String, usize)> {
    let mut at = 0;
    let mut body = Vec::new();
    loop {
        let line_end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&buf[at..line_end])
                .split(';')
                .next()?
                .trim(),
            16,
        )
        .ok()?;
        let data = line_end + 2;
        if buf.len() < data + size + 2 {
            return None;
        }
        body.extend_from_slice(&buf[data..data + size]);
        at = data + size + 2;
        if size == 0 {
            return Some((String::from_utf8_lossy(&body).into_owned(), at));
        }
    }
}

impl RawHttp {
    /// Opens an MCP session on `server` (`initialize`, then `notifications/initialized`) and
    /// returns the head of a POST within it.
    pub fn open_session(&mut self, server: &Server) -> String {
        let (status, head, _) = self.exchange(&server.post_head(""), INITIALIZE);
        assert_eq!(status, 200, "{head}");
        let session = session_id(&head).expect("a session id");
        let post = server.post_head(&format!(
            "\r\nMcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-06-18"
        ));
        let status = self.request(
            &post,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        );
        assert!(status == 202 || status == 200, "{status}");
        post
    }

    /// Whether the server has closed this connection (a read sees its end at once).
    pub fn closed(&mut self) -> bool {
        use std::io::Read;
        self.stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0))
    }
}
