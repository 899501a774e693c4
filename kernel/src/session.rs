//! A session: the executor, the record writer, and the counters that tie them together.

use crate::config::{Config, Identity};
use crate::records::RecordWriter;
use chrono::{SecondsFormat, Utc};
use flowrepl_protocol::{DebugInfo, ExecuteParams, ExecuteResult, Mode, StatusInfo, StoppedBy};
use flowrepl_worker::Executor;
use std::time::{Duration, Instant};

/// One kernel run. A cell's record is written after its reply, on the record writer's thread
/// (see [`crate::records`]).
pub struct Session {
    executor: Executor,
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
    /// A session around a started executor.
    pub fn new(executor: Executor, config: &Config) -> std::io::Result<Session> {
        let mode = Mode::InProcess;
        Ok(Session {
            executor,
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
    pub fn execute(&mut self, params: &ExecuteParams) -> ExecuteResult {
        self.execution_count += 1;
        let timestamp = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        let timeout = Duration::from_millis(params.timeout_ms.unwrap_or(self.default_timeout_ms));
        let started = Instant::now();
        let o = self.executor.execute(&params.code, timeout);
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
            stopped_by: (o.timed_out || o.interrupted).then_some(StoppedBy::Interrupt),
            added_vars: o.added_vars,
            removed_vars: o.removed_vars,
            added_imports: o.added_imports,
            variable_count: o.variable_count,
            timestamp,
            warnings: o.warnings,
            debug_info: DebugInfo {
                execution: o.kind,
                execution_mode: self.mode,
                elapsed_ms,
                phases_us: o.phases,
            },
        };
        self.record_this = self.records.check(&mut result.warnings);
        result
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
        let info = self.executor.info();
        StatusInfo {
            message: None,
            kernel_version: env!("CARGO_PKG_VERSION").to_owned(),
            python_version: info.version.clone(),
            python_executable: info.executable.clone(),
            python_prefix: info.prefix.clone(),
            mode: self.mode,
            pid: std::process::id(),
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

    /// Interrupts the running cell from another thread.
    pub fn interrupter(&self) -> flowrepl_worker::Interrupter {
        self.executor.interrupter()
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
