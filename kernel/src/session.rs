//! A session: where cells run (in-process or a worker), the record writer, and the counters
//! that tie them together.

use crate::config::{Config, Identity};
use crate::records::RecordWriter;
use crate::worker_client::{WorkerClient, WorkerControl};
use chrono::{SecondsFormat, Utc};
use flowrepl_protocol::{DebugInfo, ExecuteParams, ExecuteResult, Mode, StatusInfo, StoppedBy};
use flowrepl_protocol::{Image, VariableInfo};
use flowrepl_worker::{CellOutcome, Executor, Interrupter, OutputTail};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where cells run.
// One per process, never moved after start: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Engine {
    /// Embedded CPython on the request thread.
    InProcess(Executor),
    /// A keep-alive `flowrepl-worker` subprocess.
    Worker(WorkerClient),
}

/// A cell as an engine reports it.
#[derive(Debug)]
pub struct CellRun {
    /// What the executor saw.
    pub outcome: CellOutcome,
    /// How it was stopped, if it was.
    pub stopped_by: Option<StoppedBy>,
    /// The worker died or was killed: all state is gone.
    pub state_lost: bool,
}

/// Reaches the running cell from the front's watcher thread.
#[derive(Debug, Clone)]
pub enum CellControl {
    /// In-process: the monitor's interrupter.
    InProcess(Interrupter),
    /// Worker mode: SIGINT to the worker.
    Worker(Arc<WorkerControl>),
}

impl CellControl {
    /// Interrupts the running cell; false if none runs.
    pub fn interrupt(&self) -> bool {
        match self {
            CellControl::InProcess(i) => i.interrupt(),
            CellControl::Worker(w) => w.interrupt(),
        }
    }

    /// In-process: when the running cell was first sent SIGINT, if it was. (Worker mode
    /// escalates to SIGKILL instead, in the worker client.)
    pub fn sigint_since(&self) -> Option<Instant> {
        match self {
            CellControl::InProcess(i) => i.sigint_since(),
            CellControl::Worker(_) => None,
        }
    }

    /// While a cell runs: what it has written so far (for progress reports).
    pub fn output_tail(&self) -> Option<OutputTail> {
        match self {
            CellControl::InProcess(i) => i.output_tail(),
            CellControl::Worker(w) => w.output_tail(),
        }
    }

    /// The worker's pid (worker mode).
    pub fn worker_pid(&self) -> Option<u32> {
        match self {
            CellControl::InProcess(_) => None,
            CellControl::Worker(w) => w.worker_pid(),
        }
    }
}

/// The answer to `restart`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RestartReply {
    /// True when state was dropped.
    pub restarted: bool,
    /// The process that will run the next cell.
    pub pid: u32,
    /// Always true: variables (and in worker mode imports) are gone.
    pub state_lost: bool,
    /// What happened, for people.
    pub message: String,
}

/// One kernel run. A cell's record is written after its reply, on the record writer's thread
/// (see [`crate::records`]).
pub struct Session {
    engine: Engine,
    records: RecordWriter,
    identity: Identity,
    log_file: String,
    default_timeout_ms: u64,
    execution_count: u64,
    mode: Mode,
    /// Whether the record of the cell being answered can be written.
    record_this: bool,
}

impl Session {
    /// A session around a started engine.
    pub fn new(engine: Engine, config: &Config) -> std::io::Result<Session> {
        let mode = match engine {
            Engine::InProcess(_) => Mode::InProcess,
            Engine::Worker(_) => Mode::Worker,
        };
        Ok(Session {
            engine,
            records: RecordWriter::start(config.log_file.clone(), config.identity.clone(), mode)?,
            identity: config.identity.clone(),
            log_file: config.log_file.display().to_string(),
            default_timeout_ms: config.default_timeout_ms,
            execution_count: 0,
            mode,
            record_this: false,
        })
    }

    /// Runs a cell and returns its result; hand it to [`Session::record`] after replying.
    /// Never fails: errors of the cell are in the result, failures of the log in `warnings`.
    /// (Images are only collected in MCP mode: see [`Session::execute_with_images`].)
    pub fn execute(&mut self, params: &ExecuteParams) -> ExecuteResult {
        self.execute_with_images(params).0
    }

    /// [`Session::execute`], also returning the images the cell produced (MCP mode); the
    /// result's `images` describes them.
    pub fn execute_with_images(&mut self, params: &ExecuteParams) -> (ExecuteResult, Vec<Image>) {
        self.execution_count += 1;
        let timestamp = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        let timeout = Duration::from_millis(params.timeout_ms.unwrap_or(self.default_timeout_ms));
        let started = Instant::now();
        let run = match &mut self.engine {
            Engine::InProcess(e) => {
                let outcome = e.execute(&params.code, timeout);
                CellRun {
                    stopped_by: (outcome.timed_out || outcome.interrupted)
                        .then_some(StoppedBy::Interrupt),
                    outcome,
                    state_lost: false,
                }
            }
            Engine::Worker(w) => w.execute(&params.code, timeout),
        };
        let mut o = run.outcome;
        let images = std::mem::take(&mut o.images);
        let elapsed_ms = (started.elapsed().as_micros() as f64) / 1000.0;
        let mut result = ExecuteResult {
            success: o.error.is_none(),
            stdout: o.stdout,
            stderr: o.stderr,
            result: o.result,
            error: o.error,
            execution_count: self.execution_count,
            elapsed_ms,
            mode: self.mode,
            timed_out: o.timed_out,
            interrupted: o.interrupted,
            stopped_by: run.stopped_by,
            added_vars: o.added_vars,
            removed_vars: o.removed_vars,
            added_imports: o.added_imports,
            variable_count: o.variable_count,
            timestamp,
            warnings: o.warnings,
            usage: o.usage,
            state_lost: run.state_lost,
            images: images.iter().map(|i| i.info.clone()).collect(),
            debug_info: DebugInfo {
                execution: o.kind,
                execution_mode: self.mode,
                elapsed_ms,
                phases_us: o.phases,
            },
        };
        self.record_this = self.records.check(&mut result.warnings);
        (result, images)
    }

    /// `list_variables`: the namespace's names with type, short repr and size. Between cells.
    pub fn list_variables(&mut self) -> Result<Vec<VariableInfo>, String> {
        match &mut self.engine {
            Engine::InProcess(e) => e.list_variables(),
            Engine::Worker(w) => w.list_variables(),
        }
    }

    /// Queues the record of the cell just answered (see [`crate::records`]).
    pub fn record(&mut self, params: ExecuteParams, result: ExecuteResult) {
        if std::mem::take(&mut self.record_this) {
            self.records.submit(params, result);
        }
    }

    /// The fixed part of the `status` answer ([`crate::front::Front::status`] adds the
    /// counters).
    pub fn status_template(&self) -> StatusInfo {
        let (version, executable, prefix) = match &self.engine {
            Engine::InProcess(e) => {
                let i = e.info();
                (i.version.clone(), i.executable.clone(), i.prefix.clone())
            }
            Engine::Worker(w) => w
                .hello()
                .map(|h| {
                    (
                        h.python_version.clone(),
                        h.python_executable.clone(),
                        h.python_prefix.clone(),
                    )
                })
                .unwrap_or_default(),
        };
        StatusInfo {
            message: None,
            kernel_version: env!("CARGO_PKG_VERSION").to_owned(),
            python_version: version,
            python_executable: executable,
            python_prefix: prefix,
            mode: self.mode,
            pid: std::process::id(),
            worker_pid: None,
            execution_count: self.execution_count,
            busy: false,
            plan_id: self.identity.plan_id.clone(),
            task_id: self.identity.task_id.clone(),
            task_name: self.identity.task_name.clone(),
            session_id: self.identity.session_id.clone(),
            log_file: self.log_file.clone(),
            default_timeout_ms: self.default_timeout_ms,
        }
    }

    /// Reaches the running cell from another thread.
    pub fn control(&self) -> CellControl {
        match &self.engine {
            Engine::InProcess(e) => CellControl::InProcess(e.interrupter()),
            Engine::Worker(w) => CellControl::Worker(w.control()),
        }
    }

    /// `restart`: a fresh worker, or an empty namespace in-process.
    pub fn restart(&mut self) -> Result<RestartReply, String> {
        match &mut self.engine {
            Engine::InProcess(e) => {
                e.reset_namespace()?;
                Ok(RestartReply {
                    restarted: true,
                    pid: std::process::id(),
                    state_lost: true,
                    message: "the namespace was cleared; modules already imported stay loaded in-process (use worker mode for a fresh interpreter)".into(),
                })
            }
            Engine::Worker(w) => {
                let pid = w.restart().map_err(|e| e.to_string())?;
                Ok(RestartReply {
                    restarted: true,
                    pid,
                    state_lost: true,
                    message:
                        "a fresh worker process was started; every variable and import was dropped"
                            .into(),
                })
            }
        }
    }

    /// Waits for pending records from another thread.
    pub fn flusher(&self) -> crate::records::Flusher {
        self.records.flusher()
    }

    /// Waits for pending records and returns how many were written.
    pub fn finish(&self) -> u64 {
        self.records.flush();
        self.records.written()
    }
}
