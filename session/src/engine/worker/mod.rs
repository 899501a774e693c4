//! Worker mode: cells run in a keep-alive `flowrepl-worker` and are stopped for sure.
//!
//! The request thread writes an Execute frame, then waits on the worker's pipe with `poll`,
//! collecting Output frames until the Done frame with the same id. While it waits, other
//! threads reach the cell through [`WorkerControl`] (SIGINT to the worker, which its main
//! thread turns into `KeyboardInterrupt`). When SIGINT does not stop the cell, the
//! [`ladder`] kills the worker's process group, and a fresh worker is started at once, in
//! the background; the next cell waits for it.
//!
//! A worker that dies by itself (`os._exit`, a segfault, SIGKILL from outside, SIGXCPU) closes
//! its pipe, so the kernel sees it at once: the result is `WorkerDied` (or a limit's
//! [`Fault`](flowrepl_protocol::Fault)) with the exit code or signal, and the output received until then.
//!
//! # Lifecycle
//! [`State`]: `Absent` → `Starting` (spawned, no Ready frame yet) → `Ready` → (death, kill,
//! restart, finish) → `Absent`. Only `Ready` runs cells; a cell waits for `Starting` to
//! become `Ready`. At the end (and on `restart`) a `Ready` worker gets a Shutdown frame and
//! the kill grace period to run its cells' exit handlers before its group is killed.
//!
//! # Rooms
//! The [`Worker`] is the engine; each part of a worker's life is a type of its own:
//! - this file: [`Worker`], its start, the [`Engine`] methods and the request/reply
//!   exchanges between cells;
//! - `lifecycle.rs`: [`State`] and the worker's transitions (spawn, ready, drop, stop, a death
//!   noticed between cells);
//! - `cell.rs`: one cell, in phases (ready, send, wait under the ladder, its frames, output,
//!   death);
//! - [`process`]: one worker process (`WorkerProcess`: spawning, its guard, reaping), which
//!   holds its frame pipe (`pipe.rs`, `Pipe`: frames written and read, forged ones told
//!   apart) and its capture files (`output.rs`, `Capture`: a cell's output read from them);
//! - `control.rs`: [`WorkerControl`], what other threads reach while a cell runs;
//! - [`ladder`]: when to re-send SIGINT and when to kill.

pub mod diagnostics;
pub mod ladder;
pub mod process;

mod cell;
mod control;
mod lifecycle;
mod output;
mod pipe;
pub(crate) mod sandbox;

pub use control::WorkerControl;
pub use lifecycle::State;

use control::ControlState;

use super::{CellRun, Control, Engine, EngineError};
use crate::approvals::Approvals;
use crate::config::{Config, WorkerConfig};
use flowrepl_protocol::frame::{self, CheckpointOutcome, Frame};
use flowrepl_protocol::{
    CheckpointSummary, Mode, PythonInfo, RestartReply, RestoreReport, VariableInfo, AUTO_CHECKPOINT,
};
use pipe::Wait;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct SpawnConfig {
    /// The `flowrepl-worker` executable.
    pub exe: std::path::PathBuf,
    /// `--python` for the worker.
    pub python: std::path::PathBuf,
    /// `--python-lib` for the worker (`None`: the executor linked into it).
    pub python_lib: Option<std::path::PathBuf>,
    /// Output limit per stream and cell.
    pub max_output_bytes: u64,
    /// Limits.
    pub limits: crate::config::Limits,
    /// MCP mode: collect figures as images after each cell.
    pub images: Option<flowrepl_exec::setup::ImageLimits>,
    /// What each worker's session starts from.
    pub setup: flowrepl_exec::setup::SessionSetup,
    /// Checkpoints, when on.
    pub checkpoints: Option<flowrepl_exec::setup::CheckpointConfig>,
    /// `--sandbox`: how the worker is confined.
    pub sandbox: Option<crate::config::SandboxConfig>,
    /// `--sandbox-net=allow:…`: each worker's egress proxy.
    pub egress: Option<flowrepl_egress::proxy::ProxyConfig>,
}

/// How long a starting worker may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `list_variables` may take (it runs the reprs of the user's objects).
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `checkpoint` may take (pickling and writing every name).
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// Why the worker could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The executable could not be started.
    #[error("cannot start {exe}")]
    Spawn {
        /// The executable.
        exe: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `--sandbox=strict`, and the host does not enforce every layer (the worker said which
    /// on stderr).
    #[error("the worker's sandbox is missing a layer (--sandbox=strict)")]
    SandboxRefused,
    /// It died or spoke nonsense before it was ready.
    #[error("the worker {0} before it was ready (see the kernel's stderr)")]
    DiedAtStart(String),
    /// It did not become ready in time.
    #[error("the worker was not ready after {0:?}")]
    NotReady(Duration),
    /// The pipe failed.
    #[error("worker pipe")]
    Io(#[from] io::Error),
}

/// The kernel's side of worker mode.
pub struct Worker {
    spawn: SpawnConfig,
    diagnostics: File,
    grace: Duration,
    state: State,
    /// The interpreter of the last worker that was ready (kept while a new one starts).
    python: PythonInfo,
    control: Arc<WorkerControl>,
    last_cpu_total_ms: f64,
    /// Where the cells' approval requests go.
    approvals: Arc<Approvals>,
    /// The automatic checkpoint's journal, when checkpoints are on: a fresh worker after a
    /// death restores from it if it exists.
    auto_journal: Option<std::path::PathBuf>,
    /// What the last worker started with `--restore` restored (or why not), until reported.
    restored: Option<Result<RestoreReport, String>>,
}

impl Worker {
    /// Starts a worker and waits until it is ready. Fds 1 and 2 of the kernel are pointed at
    /// `/dev/null` first: no Python runs here, and a stray write must not reach stdout.
    pub fn start(
        config: &Config,
        worker: &WorkerConfig,
        diagnostics: File,
        approvals: Arc<Approvals>,
    ) -> Result<Worker, super::StartError> {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map_err(super::StartError::Stdio)?;
        for fd in [1, 2] {
            flowrepl_exec::stdio::dup2(null.as_fd(), fd).map_err(super::StartError::Stdio)?;
        }
        let mut w = Worker {
            spawn: SpawnConfig {
                exe: worker.exe.clone(),
                python: config.python.clone(),
                python_lib: config.executor.library().map(Into::into),
                max_output_bytes: config.max_output_bytes,
                limits: worker.limits,
                images: config.image_limits(),
                setup: config.setup.clone(),
                checkpoints: config.checkpoints.clone(),
                sandbox: worker.sandbox.clone(),
                egress: worker
                    .sandbox
                    .as_ref()
                    .and_then(|sb| sb.network.rules())
                    .map(|rules| config.egress_proxy(Arc::clone(rules))),
            },
            diagnostics,
            grace: config.kill_grace,
            state: State::Absent,
            python: PythonInfo::default(),
            control: Arc::new(WorkerControl {
                state: Mutex::new(ControlState {
                    checkpoint: config
                        .checkpoints
                        .as_ref()
                        .map(|_| flowrepl_protocol::CheckpointHealth::default()),
                    ..ControlState::default()
                }),
            }),
            last_cpu_total_ms: 0.0,
            approvals,
            auto_journal: super::auto_journal(config),
            restored: None,
        };
        w.spawn_worker(super::resumes(config).then_some(AUTO_CHECKPOINT))?;
        w.ensure_ready()?;
        Ok(w)
    }
}

impl Worker {
    /// Sends a request frame (`request` with a fresh id) between cells and waits up to
    /// `timeout` for the frame `pick` accepts; frames it does not are ignored. A worker that
    /// dies meanwhile is replaced (from the last checkpoint, if there is one).
    fn ask<'r, T>(
        &mut self,
        request: impl FnOnce(u64) -> Frame<'r>,
        timeout: Duration,
        during: &'static str,
        mut pick: impl FnMut(Frame<'_>, u64) -> Option<T>,
    ) -> Result<T, EngineError> {
        if let Some(w) = self.check_idle_worker() {
            tracing::warn!("{w}");
        }
        self.ensure_ready()?;
        let proc = self
            .state
            .process_mut()
            .expect("ensure_ready left a worker");
        let (id, sent) = proc.pipe.send(request);
        sent.map_err(WorkerError::Io)?;
        let until = std::time::Instant::now() + timeout;
        loop {
            let proc = self
                .state
                .process_mut()
                .expect("a worker is dropped only below");
            while let Some(payload) = proc
                .pipe
                .next_buffered()
                .map_err(io::Error::other)
                .map_err(WorkerError::Io)?
            {
                match frame::decode(&payload) {
                    Ok(f) if proc.forged(&f, 0) => {
                        // Stopped: the loop below sees its end and starts a fresh worker.
                        continue;
                    }
                    Ok(f) => {
                        let shown = format!("{f:?}");
                        match pick(f, id) {
                            Some(v) => return Ok(v),
                            None => {
                                tracing::warn!(frame = %shown, "unexpected frame from the worker ignored")
                            }
                        }
                    }
                    Err(e) => return Err(WorkerError::Io(io::Error::other(e)).into()),
                }
            }
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(EngineError::Timeout(timeout));
            }
            match proc.pipe.read(left).map_err(WorkerError::Io)? {
                Wait::Frames | Wait::Timeout => {}
                Wait::Eof => {
                    let ended = self.drop_worker();
                    let how = ended.map(|e| e.describe()).unwrap_or_default();
                    if let Err(e) = self.spawn_worker(self.after_death()) {
                        tracing::error!(error = %flowrepl_os::chain(&e), "a new worker could not be started");
                    }
                    return Err(EngineError::WorkerDied { how, during });
                }
            }
        }
    }
}

impl Engine for Worker {
    fn mode(&self) -> Mode {
        Mode::Worker
    }

    fn python(&self) -> PythonInfo {
        self.python.clone()
    }

    fn sandbox(&self) -> Option<flowrepl_protocol::sandbox::SandboxReport> {
        match &self.state {
            State::Ready { hello, .. } => hello.sandbox.clone().map(|mut report| {
                // The worker does not know the rules; the kernel's proxy holds them.
                if let Some(e) = &self.spawn.egress {
                    report.rules = e.rules.to_strings();
                }
                report
            }),
            _ => None,
        }
    }

    fn control(&self) -> Arc<dyn Control> {
        self.control.clone()
    }

    fn run(&mut self, code: &str, timeout: Duration, execution_count: u64) -> CellRun {
        self.run_cell(code, timeout, execution_count)
    }

    fn list_variables(&mut self) -> Result<Vec<VariableInfo>, EngineError> {
        let report = self.ask(
            |id| Frame::Variables { id },
            LIST_TIMEOUT,
            "while listing variables",
            |frame, id| match frame {
                Frame::VariablesReply { id: got, report } if got == id => Some(report.into_owned()),
                _ => None,
            },
        )?;
        match report.error {
            None => Ok(report.variables),
            Some(e) => Err(flowrepl_exec::setup::CallError(e).into()),
        }
    }

    fn layer_changed(&mut self, modules: &[String]) -> Result<Vec<String>, EngineError> {
        let list = modules.to_vec();
        self.ask(
            |id| Frame::Packages {
                id,
                modules: std::borrow::Cow::Borrowed(&list),
            },
            LIST_TIMEOUT,
            "while taking in the package layer",
            |frame, id| match frame {
                Frame::PackagesReply { id: got, imported } if got == id => {
                    Some(imported.into_owned())
                }
                _ => None,
            },
        )
    }

    fn refresh_checkpoint_health(&mut self) {
        if self.control.lock().checkpoint.is_none() {
            return; // checkpoints are off
        }
        let asked = self.ask(
            |id| Frame::Health { id },
            LIST_TIMEOUT,
            "while saying how the checkpoint is doing",
            |frame, id| match frame {
                Frame::HealthReply { id: got, health } if got == id => Some(health.into_owned()),
                _ => None,
            },
        );
        match asked {
            Ok(h) => self.control.lock().checkpoint = Some(h),
            // What the last Done said stands.
            Err(e) => {
                tracing::debug!(error = %e, "the worker did not say how the checkpoint is doing")
            }
        }
    }

    fn restart(&mut self, restore: bool) -> Result<RestartReply, EngineError> {
        self.stop_worker();
        self.restored = None;
        let from = if restore {
            if self.auto_journal.is_none() {
                return Err(flowrepl_exec::setup::CheckpointError::Off.into());
            }
            Some(self.after_death().ok_or_else(|| {
                EngineError::NotRestored(
                    "the task has no automatic checkpoint yet; a fresh worker was not started"
                        .into(),
                )
            })?)
        } else {
            None
        };
        self.spawn_worker(from)?;
        self.ensure_ready()?;
        let mut reply = RestartReply {
            restarted: true,
            pid: self.control.worker_pid().unwrap_or(0),
            state_lost: true,
            message: "a fresh worker process was started; every variable and import was dropped"
                .into(),
            restored: None,
        };
        match self.restored.take() {
            Some(Ok(r)) => {
                reply.state_lost = !r.complete();
                reply.message = format!(
                    "a fresh worker process was started; {}",
                    super::restored_message(&r)
                );
                reply.restored = Some(r);
            }
            Some(Err(e)) => return Err(EngineError::NotRestored(e)),
            None => {}
        }
        Ok(reply)
    }

    fn checkpoint(&mut self, name: &str) -> Result<CheckpointSummary, EngineError> {
        if self.auto_journal.is_none() {
            return Err(flowrepl_exec::setup::CheckpointError::Off.into());
        }
        let outcome = self.ask(
            |id| Frame::Checkpoint { id, name },
            CHECKPOINT_TIMEOUT,
            "while writing a checkpoint",
            |frame, id| match frame {
                Frame::CheckpointReply { id: got, outcome } if got == id => {
                    Some(outcome.into_owned())
                }
                _ => None,
            },
        )?;
        match outcome {
            CheckpointOutcome::Written(s) => Ok(s),
            CheckpointOutcome::Failed(e) => Err(EngineError::Worker(WorkerError::Io(
                io::Error::other(format!("the checkpoint was not written: {e}")),
            ))),
        }
    }

    fn restore(&mut self, name: &str) -> Result<RestoreReport, EngineError> {
        let Some(checkpoints) = &self.spawn.checkpoints else {
            return Err(flowrepl_exec::setup::CheckpointError::Off.into());
        };
        // Read before the worker is replaced: a bad name, a missing checkpoint or a folder
        // that is not private keeps it.
        flowrepl_task_logger::checkpoint::load(&checkpoints.root, name)
            .map_err(flowrepl_exec::setup::CheckpointError::from)?;
        self.stop_worker();
        self.restored = None;
        self.spawn_worker(Some(name))?;
        self.ensure_ready()?;
        match self.restored.take() {
            Some(Ok(r)) => Ok(r),
            Some(Err(e)) => Err(EngineError::NotRestored(format!(
                "{e}; the fresh worker starts empty"
            ))),
            None => Err(EngineError::NotRestored(
                "the worker did not report a restore; it starts empty".into(),
            )),
        }
    }

    fn take_restored(&mut self) -> Option<Result<RestoreReport, String>> {
        self.restored.take()
    }

    fn finish(&mut self) {
        self.stop_worker();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.drop_worker();
    }
}
