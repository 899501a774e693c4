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
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(flowrepl_bin())
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
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
        let out = Command::new("timeout")
            .args(["-k", "10", "400"])
            .arg(mcp_venv().join("bin/python"))
            .arg(workspace_root().join("tests/mcp/serve_client.py"))
            .arg(scenario)
            .args(["--url", &self.url, "--token", TOKEN])
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
