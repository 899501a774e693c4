//! MCP test support: a venv with the official Python MCP SDK (and matplotlib), and a runner
//! for the scenarios in `tests/mcp/client.py`.

use crate::{base_python, flowrepl_bin, workspace_root};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The venv with `tests/mcp/requirements.txt` installed (`target/mcp-venv`), made once per
/// test process by `tests/mcp/make-venv` (the script `.ci/run` and `bench/run` use; it does
/// nothing when the venv is up to date), under a file lock shared by test processes.
pub fn mcp_venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let root = workspace_root();
        let venv = root.join("target/mcp-venv");
        std::fs::create_dir_all(root.join("target")).unwrap();
        let lock = std::fs::File::create(root.join("target/mcp-venv.lock")).unwrap();
        // SAFETY: flock on an open file; released when `lock` is dropped.
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
        let ok = Command::new(root.join("tests/mcp/make-venv"))
            .arg(base_python())
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "tests/mcp/make-venv failed (it needs PyPI)");
        drop(lock);
        venv
    })
}

/// How to run a scenario.
#[derive(Default, Clone)]
pub struct Scenario {
    /// Worker mode.
    pub worker: bool,
    /// Extra environment for the kernel (`K=V`).
    pub env: Vec<(String, String)>,
}

impl Scenario {
    /// In-process or worker mode by name (see [`crate::MODES`]).
    pub fn mode(mode: &str) -> Scenario {
        Scenario {
            worker: mode == "worker",
            ..Scenario::default()
        }
    }

    /// Adds a kernel environment variable.
    pub fn env(mut self, k: &str, v: impl Into<String>) -> Scenario {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Runs `tests/mcp/client.py NAME` against `flowrepl mcp` (Python: the MCP venv, so
    /// matplotlib imports in cells). Panics with the client's output unless it passes.
    /// Returns the facts it printed and the task log file.
    pub fn run(&self, name: &str) -> (Value, PathBuf, tempfile::TempDir) {
        let venv = mcp_venv();
        let logs = tempfile::tempdir().unwrap();
        // The client ends a scenario that hangs itself; `timeout` is the backstop for a
        // client that cannot (a test must fail, never wait forever).
        let mut cmd = Command::new("timeout");
        cmd.args(["-k", "10", "200"])
            .arg(venv.join("bin/python"))
            .arg(workspace_root().join("tests/mcp/client.py"))
            .arg(name)
            .arg("--flowrepl")
            .arg(flowrepl_bin())
            .arg("--log-dir")
            .arg(logs.path())
            .arg("--python")
            .arg(venv)
            .args(["--env", "FLOW_PLAN_ID=plan-mcp", "--env"])
            .arg(format!("FLOW_TASK_ID=task-{name}"));
        if self.worker {
            cmd.arg("--worker");
        }
        for (k, v) in &self.env {
            cmd.arg("--env").arg(format!("{k}={v}"));
        }
        let out = cmd.output().expect("run the MCP client");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "MCP scenario {name} (worker: {}) failed:\n{stderr}\n{stdout}",
            self.worker
        );
        let facts = serde_json::from_str(stdout.lines().last().unwrap_or("{}"))
            .unwrap_or_else(|e| panic!("scenario {name} printed no facts ({e}): {stdout}"));
        crate::schema::validate_logs(logs.path());
        let log =
            flowrepl_task_logger::task_log_path(logs.path(), "plan-mcp", &format!("task-{name}"));
        (facts, log, logs)
    }
}
