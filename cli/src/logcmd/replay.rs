//! `flowrepl log replay`: rebuilds a task's state where no checkpoint can, by running its
//! successful cells again, in order, in a fresh kernel, and reports the cells whose output
//! now differs. Re-running repeats the cells' side effects (files written, requests sent), so
//! `--dry-run` lists what would run first.
//!
//! The kernel is this program started for the same plan and task (so `flow` sees the task's
//! ids and context), with the task's last interpreter unless `--python` says otherwise, and
//! `--worker` when asked. It writes no records (the replayed cells are not new history) but
//! checkpoints as usual, and is asked for a full checkpoint at the end: a kernel started
//! later with `--resume` starts from the rebuilt state.

use super::show::{read_task, Cell};
use super::{io_err, one_task, print_json, say, task_file, LogCmdError, Read, Scope};
use crate::env;
use flowrepl_os::logging::LOG_ENV;
use flowrepl_os::process::{Group, Supervision, Supervisor};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};

/// How to replay.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// List the cells, run nothing.
    pub dry_run: bool,
    /// Only cells of sessions whose id starts with this.
    pub session: Option<&'a str>,
    /// The interpreter (default: the task's last session's).
    pub python: Option<PathBuf>,
    /// Run in a worker subprocess.
    pub worker: bool,
    /// `--store`: the kernel keeps the task there.
    pub store: Option<String>,
}

/// The successful cells to replay, in order.
fn cells<'c>(all: &'c [Cell], session: Option<&str>) -> Vec<&'c Cell> {
    all.iter()
        .filter(|c| c.record.success)
        .filter(|c| session.is_none_or(|s| c.record.session_id.starts_with(s)))
        .collect()
}

fn first_line(code: &str) -> &str {
    code.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// How long the replaying kernel has to exit after `shutdown`.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// A kernel driven over JSON-RPC.
struct Replayer {
    /// A group of its own (a Ctrl-C reaches the replayer, not the kernel), SIGTERM if the
    /// replayer dies, killed and reaped if the replayer gives up on it.
    child: Supervisor,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
}

impl Replayer {
    fn start(log_dir: &Path, plan: &str, task: &str, opts: &Options<'_>) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.arg("--log-dir")
            .arg(log_dir)
            .env(flowrepl_task_logger::PLAN_ID_ENV, plan)
            .env(flowrepl_task_logger::TASK_ID_ENV, task)
            .env(env::NO_LOG, "1")
            .env_remove(env::RESUME)
            .env_remove(env::CHECKPOINTS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if std::env::var_os(LOG_ENV).is_none() {
            cmd.env(LOG_ENV, "warn");
        }
        if let Some(p) = &opts.python {
            cmd.arg("--python").arg(p);
        }
        if opts.worker {
            cmd.arg("--worker");
        }
        if let Some(url) = &opts.store {
            // The kernel takes the task in the store; the checkpoint it leaves lands there.
            cmd.env(env::STORE, url);
        }
        Supervision {
            group: Group::Own,
            death_signal: nix::sys::signal::Signal::SIGTERM,
        }
        .apply(&mut cmd);
        let mut child = cmd.spawn()?;
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped"));
        let mut r = Replayer {
            child: Supervisor::of(child),
            input,
            output,
            next_id: 0,
        };
        let ready = r.read()?;
        if ready["method"] != "ready" {
            return Err(std::io::Error::other(format!(
                "the kernel did not start: {ready}"
            )));
        }
        Ok(r)
    }

    fn read(&mut self) -> std::io::Result<Value> {
        let mut line = String::new();
        if self.output.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other(
                "the kernel exited (see its stderr above)",
            ));
        }
        serde_json::from_str(&line).map_err(std::io::Error::other)
    }

    /// Calls `method` and returns its result (or the error object).
    fn call(&mut self, method: &str, params: Value) -> std::io::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )?;
        line.push(b'\n');
        self.input.write_all(&line)?;
        loop {
            let msg = self.read()?;
            if msg["id"] == json!(id) {
                return Ok(msg
                    .get("result")
                    .cloned()
                    .unwrap_or_else(|| msg["error"].clone()));
            }
            // Notifications (`approval_requested`) are not answered: nobody is asked.
        }
    }

    /// Asks the kernel to shut down and gives it [`SHUTDOWN_GRACE`] to write its records
    /// and exit before it is killed.
    fn finish(mut self) {
        let _ = self.call("shutdown", Value::Null);
        self.child.stop(None, SHUTDOWN_GRACE);
    }
}

/// What replaying one cell gave.
fn compare(cell: &Cell, now: &Value) -> Value {
    let r = &cell.record;
    let mut differs = Vec::new();
    if now["success"] != true {
        differs.push("success");
    }
    if now["stdout"].as_str() != Some(&*r.stdout) {
        differs.push("stdout");
    }
    if now["result"].as_str() != r.result.as_deref() {
        differs.push("result");
    }
    json!({
        "execution_count": r.execution_count,
        "session_id": r.session_id,
        "first_line": first_line(&r.code),
        "success": now["success"],
        "error": now["error"],
        "differs": differs,
        "stdout_then": r.stdout,
        "stdout_now": now["stdout"],
    })
}

/// Runs `flowrepl log replay`.
pub fn run(log_dir: &Path, scope: &Scope, opts: &Options<'_>) -> Result<Read, LogCmdError> {
    let (plan, task) = one_task(scope);
    let file = task_file(log_dir, &plan, &task)?;
    let log = read_task(&file);
    let todo = cells(&log.cells, opts.session);
    let warning = "re-running cells repeats their side effects (files written, requests sent, messages posted)";
    if opts.dry_run {
        if scope.json {
            let list: Vec<Value> = todo
                .iter()
                .map(|c| json!({"execution_count": c.record.execution_count, "session_id": c.record.session_id, "code": c.record.code}))
                .collect();
            print_json(&json!({"plan": plan, "task": task, "cells": list, "warning": warning}))?;
        } else {
            say(format!(
                "{} successful cells of plan {plan:?}, task {task:?} would run again, in order ({warning}):",
                todo.len()
            ))?;
            for c in &todo {
                say(format!(
                    "  In[{}] ({}) {}",
                    c.record.execution_count,
                    super::short_id(&c.record.session_id),
                    first_line(&c.record.code)
                ))?;
            }
        }
        return Ok(Read::from_count(todo.len()));
    }
    if todo.is_empty() {
        say(format!(
            "plan {plan:?}, task {task:?}: no successful cells to replay"
        ))?;
        return Ok(Read::Nothing);
    }
    if !scope.json {
        eprintln!("flowrepl log replay: warning: {warning}");
    }
    let python = opts.python.clone().or_else(|| {
        log.sessions
            .last()
            .map(|s| PathBuf::from(&*s.python_executable))
            .filter(|p| p.exists())
    });
    let opts = Options {
        python,
        ..opts.clone()
    };
    let started = std::time::Instant::now();
    let mut kernel =
        Replayer::start(log_dir, &plan, &task, &opts).map_err(io_err("starting a kernel"))?;
    let mut report = Vec::new();
    for c in &todo {
        let now = kernel
            .call("execute_code", json!({"code": c.record.code}))
            .map_err(io_err("replaying"))?;
        let cmp = compare(c, &now);
        if !scope.json {
            let status = match cmp["differs"].as_array().map(Vec::len) {
                Some(0) => "same".to_owned(),
                _ if now["success"] != true => format!(
                    "FAILED now: {}: {}",
                    now["error"]["type"].as_str().unwrap_or("?"),
                    now["error"]["message"].as_str().unwrap_or("")
                ),
                _ => format!("differs: {}", cmp["differs"]),
            };
            say(format!(
                "In[{}] {}  {}",
                c.record.execution_count,
                status,
                first_line(&c.record.code)
            ))?;
        }
        report.push(cmp);
    }
    let checkpoint = kernel
        .call("checkpoint", Value::Null)
        .map_err(io_err("checkpointing"))?;
    kernel.finish();
    let failed = report.iter().filter(|r| r["success"] != true).count();
    let differ = report
        .iter()
        .filter(|r| r["differs"].as_array().is_some_and(|d| !d.is_empty()))
        .count();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if scope.json {
        print_json(&json!({
            "plan": plan, "task": task, "cells": report, "replayed": report.len(),
            "differ": differ, "failed": failed, "ms": ms, "checkpoint": checkpoint,
            "warning": warning,
        }))?;
    } else {
        say(format!(
            "replayed {} cells in {ms:.0} ms: {} with the same output, {differ} differ ({failed} failed now); {}",
            report.len(),
            report.len() - differ,
            match checkpoint["checkpoint"].as_str() {
                Some(name) => format!("the state was saved as checkpoint {name:?} (start a kernel with --resume to continue from it)"),
                None => format!("no checkpoint was written: {}", checkpoint["message"]),
            }
        ))?;
    }
    Ok(if failed > 0 {
        Read::Nothing
    } else {
        Read::Something
    })
}
