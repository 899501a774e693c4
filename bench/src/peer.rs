//! A peer process spoken to in lines over pipes: the kernel, the plain REPL, the raw echo.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A running peer.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The last line read.
    pub line: Vec<u8>,
    /// Time from spawn to the ready line (or to spawn, without one).
    pub start: Duration,
}

impl Peer {
    /// Starts `cmd`; with `wait_ready`, waits for its `__READY__` line.
    pub fn spawn(mut cmd: Command, wait_ready: bool) -> Peer {
        let t = Instant::now();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            stdin,
            stdout,
            line: Vec::with_capacity(2 << 20),
            start: Duration::ZERO,
        };
        if wait_ready {
            p.read_line();
            assert!(
                p.line_str().contains("__READY__"),
                "no ready line: {}",
                p.line_str()
            );
        }
        p.start = t.elapsed();
        p
    }

    /// Reads one line into [`Peer::line`].
    pub fn read_line(&mut self) {
        self.line.clear();
        let n = self.stdout.read_until(b'\n', &mut self.line).expect("read");
        assert!(n > 0, "peer closed its stdout");
    }

    fn line_str(&self) -> &str {
        std::str::from_utf8(&self.line).unwrap_or("<not utf-8>")
    }

    /// Sends a request line and waits for the whole reply line; returns the round trip.
    pub fn round_trip(&mut self, req: &[u8]) -> Duration {
        let t = Instant::now();
        self.stdin.write_all(req).unwrap();
        self.read_line();
        t.elapsed()
    }

    /// The last line as JSON.
    pub fn reply(&self) -> Value {
        serde_json::from_slice(&self.line).expect("reply is JSON")
    }

    /// Its resident set, in KiB.
    pub fn rss_kb(&self) -> u64 {
        rss_of(self.child.id())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An `execute_code` request line.
pub fn request(code: &str) -> Vec<u8> {
    let mut v = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "execute_code", "params": {"code": code}
    }))
    .unwrap();
    v.push(b'\n');
    v
}

/// VmRSS of a process, in KiB (0 if it is gone).
pub fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The kernel at `kernel`, logging to `logs`; `worker` for worker mode.
pub fn kernel_cmd(kernel: &Path, logs: &Path, worker: bool) -> Command {
    let mut c = Command::new(kernel);
    c.env("FLOWREPL_LOG_DIR", logs).env("FLOWREPL_LOG", "warn");
    if worker {
        c.env("USE_SUBPROCESS_WORKER", "1");
    }
    c
}

/// The real interpreter behind `python3` (not the pyenv shim).
pub fn real_python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
