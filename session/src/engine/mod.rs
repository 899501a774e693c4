//! The engine seam: where cells run, behind one interface.
//!
//! Every front (JSON-RPC, MCP) reaches Python through the session, and the session through
//! [`Engine`]: run a cell, list variables, restart, describe the
//! interpreter, finish. Two implementations sit behind it:
//! - [`in_process::InProcess`]: embedded CPython on the calling thread (Python's main thread).
//! - [`worker::Worker`]: a keep-alive `flowrepl-worker` subprocess, with its lifecycle, the
//!   stop ladder and crash recovery.
//!
//! While a cell runs, other threads reach it through a [`Control`] (interrupt, its output so
//! far, whether it ignores SIGINT). Failures around a cell are typed
//! [`Fault`](flowrepl_protocol::Fault)s in the cell's report; the engine never fails a cell
//! any other way. Nothing here knows about fronts, requests or the task log.

pub mod in_process;
pub mod worker;

use crate::approvals::Approvals;
use crate::config::Config;
use flowrepl_exec::setup::CellOutcome;
use flowrepl_exec::tail::OutputTail;
use flowrepl_protocol::{
    CheckpointSummary, Mode, PythonInfo, RestartReply, RestoreReport, StoppedBy, VariableInfo,
};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrepl_cli::choice::Executor;
use flowrepl_exec::python::library::LoadError;
use flowrepl_exec::python::PythonBuild;

mod linked;

/// The executor that serves a version ([`flowrepl_cli::choice::serving`]): the kernel's one
/// way into the pyo3 crate ([`flowrepl_exec::python`]). A library is mapped for good when
/// loaded (once per process: the in-process engine starts once).
pub fn python(executor: &Executor) -> Result<&'static PythonBuild, LoadError> {
    match executor {
        Executor::Library(path) => flowrepl_exec::python::library::load(path),
        Executor::Linked => linked::linked(),
    }
}

/// A cell as an engine reports it.
#[derive(Debug)]
pub struct CellRun {
    /// What the executor saw (or the fault, when it could not say).
    pub outcome: CellOutcome,
    /// How it was stopped, if it was.
    pub stopped_by: Option<StoppedBy>,
    /// The worker died or was killed: all state is gone.
    pub state_lost: bool,
}

impl CellRun {
    /// A cell that ended in its executor: stopped by SIGINT if it timed out or was
    /// interrupted, state kept.
    pub fn ended(outcome: CellOutcome) -> CellRun {
        let r = &outcome.report;
        CellRun {
            stopped_by: (r.timed_out || r.interrupted).then_some(StoppedBy::Interrupt),
            outcome,
            state_lost: false,
        }
    }
}

/// Why an engine could not do what was asked (between cells; a cell's own failures are in
/// its report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The executor's Python code raised.
    #[error(transparent)]
    Python(#[from] flowrepl_exec::setup::CallError),
    /// Worker mode: the worker could not be started or used.
    #[error(transparent)]
    Worker(#[from] worker::WorkerError),
    /// Worker mode: the worker died while doing it; a fresh one is starting.
    #[error("the worker {how} {during}; its state was lost and a fresh worker is starting")]
    WorkerDied {
        /// "exited with code 3", "was killed by signal 9 (SIGKILL)".
        how: String,
        /// What it was doing.
        during: &'static str,
    },
    /// Worker mode: no answer in time.
    #[error("the worker did not answer within {0:?} (a slow repr?)")]
    Timeout(Duration),
    /// A checkpoint was not written or restored.
    #[error(transparent)]
    Checkpoint(#[from] flowrepl_exec::setup::CheckpointError),
    /// Worker mode: the worker restarted but could not restore the checkpoint.
    #[error("the checkpoint was not restored: {0}")]
    NotRestored(String),
}

/// Where cells run. One per kernel, driven from one thread (Python's main thread
/// in-process).
pub trait Engine {
    /// In-process or worker.
    fn mode(&self) -> Mode;
    /// The interpreter cells run in.
    fn python(&self) -> PythonInfo;
    /// What the worker's sandbox enforces (`--sandbox`; `None` otherwise).
    fn sandbox(&self) -> Option<flowrepl_protocol::sandbox::SandboxReport> {
        None
    }
    /// A handle for other threads to reach the running cell.
    fn control(&self) -> Arc<dyn Control>;
    /// Runs a cell with a wall-clock `timeout`; `execution_count` is the session's number
    /// for it. Never fails: what went wrong is in the report (an exception, or a
    /// [`Fault`](flowrepl_protocol::Fault)); events the cell reported before a crash are kept.
    fn run(&mut self, code: &str, timeout: Duration, execution_count: u64) -> CellRun;
    /// The namespace's names with type, short repr and size (between cells).
    fn list_variables(&mut self) -> Result<Vec<VariableInfo>, EngineError>;
    /// The task's package layer changed (between cells): which of `modules` (the top-level
    /// modules the install added or changed) are imported, and so stay as they are until a
    /// restart.
    fn layer_changed(&mut self, modules: &[String]) -> Result<Vec<String>, EngineError>;
    /// Drops all state: a fresh worker, or an empty namespace in-process; with `restore`,
    /// the fresh session starts from the automatic checkpoint.
    fn restart(&mut self, restore: bool) -> Result<RestartReply, EngineError>;
    /// Writes checkpoint `name` now, with every name (between cells).
    fn checkpoint(&mut self, name: &str) -> Result<CheckpointSummary, EngineError>;
    /// Replaces the namespace with checkpoint `name`'s (worker mode: in a fresh worker).
    fn restore(&mut self, name: &str) -> Result<RestoreReport, EngineError>;
    /// Brings what [`Control::checkpoint_health`] says up to date (worker mode asks the
    /// worker; between cells).
    fn refresh_checkpoint_health(&mut self) {}
    /// A restore the engine did by itself (a fresh worker after a death, `--resume`), or
    /// why it failed: reported once, with the next cell.
    fn take_restored(&mut self) -> Option<Result<RestoreReport, String>>;

    /// The session ends: the cells' `atexit` handlers run and open files are flushed (worker
    /// mode: within the kill grace period, then the worker's group is killed).
    fn finish(&mut self);
}

/// Reaches the running cell from another thread (the JSON-RPC watcher, MCP handlers).
pub trait Control: Send + Sync + Debug {
    /// Sends SIGINT to the running cell; false if none runs. Never reaches a later cell.
    fn interrupt(&self) -> bool;
    /// In-process: when the running cell was first sent SIGINT, if it was and is still
    /// running. Worker mode kills such cells, so it answers `None`.
    fn unstoppable_since(&self) -> Option<Instant>;
    /// While a cell runs: what it has written so far (for progress reports), with the last
    /// `recent` bytes of each stream (`execute_code` answering before the cell ends).
    fn output_tail(&self, recent: usize) -> Option<OutputTail>;
    /// Worker mode: the current worker's pid.
    fn worker_pid(&self) -> Option<u32>;
    /// How the automatic checkpoint is doing (`None`: checkpoints are off). Worker mode: as
    /// of the worker's last reply.
    fn checkpoint_health(&self) -> Option<flowrepl_protocol::CheckpointHealth>;
}

/// Starts the engine the configuration asks for (waiting until a worker is ready); the
/// cells' approval requests go to `approvals`.
pub fn start(
    config: &Config,
    diagnostics: std::fs::File,
    approvals: Arc<Approvals>,
) -> Result<Box<dyn Engine>, StartError> {
    match &config.worker {
        None => Ok(Box::new(in_process::InProcess::start(
            config,
            diagnostics,
            approvals,
        )?)),
        Some(w) => Ok(Box::new(worker::Worker::start(
            config,
            w,
            diagnostics,
            approvals,
        )?)),
    }
}

/// Whether the session starts from the automatic checkpoint: `--resume`, and the task has
/// one.
pub fn resumes(config: &Config) -> bool {
    config.resume && auto_journal(config).is_some_and(|j| j.is_file())
}

/// The automatic checkpoint's journal, when checkpoints are on.
pub fn auto_journal(config: &Config) -> Option<std::path::PathBuf> {
    config.checkpoints.as_ref().map(|s| {
        flowrepl_task_logger::checkpoint::journal_path(&s.root, flowrepl_protocol::AUTO_CHECKPOINT)
    })
}

/// What a restart or restore that restored says, for people.
pub fn restored_message(r: &RestoreReport) -> String {
    let mut m = format!(
        "restored {} names from checkpoint {:?} (after cell {})",
        r.restored_vars.len(),
        r.checkpoint,
        r.checkpoint_execution_count
    );
    if !r.lost_vars.is_empty() {
        let lost: Vec<&str> = r.lost_vars.keys().map(String::as_str).collect();
        m.push_str(&format!("; lost: {}", lost.join(", ")));
    }
    m
}

/// Why no engine could be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The Python library of the interpreter's version cannot be used.
    #[error(transparent)]
    Library(#[from] flowrepl_exec::python::library::LoadError),
    /// Embedded Python did not start.
    #[error(transparent)]
    Executor(#[from] flowrepl_exec::setup::ExecutorError),
    /// The worker did not start.
    #[error(transparent)]
    Worker(#[from] worker::WorkerError),
    /// Fds 1 and 2 could not be pointed away from the protocol channel.
    #[error("cannot redirect fds 1 and 2")]
    Stdio(#[source] std::io::Error),
}
