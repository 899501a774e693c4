//! A session: the executor, the task log, and the counters that tie them together.

use crate::config::{Config, Identity};
use chrono::{SecondsFormat, Utc};
use flowrepl_protocol::{DebugInfo, ExecuteParams, ExecuteResult, Mode, StatusInfo};
use flowrepl_task_logger::{ExecutionRecord, TaskLog, FORMAT_VERSION, RECORD_TYPE_EXECUTION};
use flowrepl_worker::Executor;
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// One kernel run.
///
/// A cell's record is written right *after* its reply is sent ([`Session::write_record`]),
/// so the log never delays a result: a 1 MB record costs ~0.7 ms of `write(2)` and as much
/// again of JSON escaping. Any later reply therefore means every earlier record is on disk
/// (in the page cache). An unusable log location is found before the reply and reported in
/// that cell's `warnings`; a write that fails afterwards (disk full) is reported on stderr at
/// once and in the `warnings` of the next result.
pub struct Session {
    executor: Executor,
    log: TaskLog,
    /// The log could be opened for the cell being answered.
    log_ready: bool,
    /// Warnings about records that failed after their reply went out.
    deferred_warnings: Vec<String>,
    identity: Identity,
    default_timeout_ms: u64,
    execution_count: u64,
    mode: Mode,
}

impl Session {
    /// A session around a started executor. Opens the log early so that an unusable log
    /// location is reported at start (cells run regardless).
    pub fn new(executor: Executor, config: &Config) -> Session {
        let mut log = TaskLog::new(config.log_file.clone());
        if let Err(e) = log.open() {
            tracing::warn!(error = %chain(&e), "task log unavailable; cells will run and logging will be retried");
        }
        Session {
            executor,
            log,
            log_ready: false,
            deferred_warnings: Vec::new(),
            identity: config.identity.clone(),
            default_timeout_ms: config.default_timeout_ms,
            execution_count: 0,
            mode: Mode::InProcess,
        }
    }

    /// Runs a cell and returns its result; call [`Session::write_record`] after replying.
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
        result.warnings.append(&mut self.deferred_warnings);
        self.log_ready = match self.log.open() {
            Ok(()) => true,
            Err(e) => {
                let msg = chain(&e);
                tracing::warn!(error = %msg, execution_count = self.execution_count, "task log record not written");
                result.warnings.push(format!(
                    "task log: {msg}; this cell's record is not written"
                ));
                false
            }
        };
        result
    }

    /// Appends the record of the cell just answered. Failures are reported on stderr now and
    /// in the next result's `warnings`.
    pub fn write_record(&mut self, params: &ExecuteParams, result: &ExecuteResult) {
        if !self.log_ready {
            return; // already reported in the result
        }
        if let Err(e) = self
            .log
            .append(&record(&self.identity, self.mode, params, result))
        {
            let msg = chain(&e);
            tracing::warn!(error = %msg, execution_count = result.execution_count, "task log record not written");
            self.deferred_warnings.push(format!(
                "task log: the record of execution {} was not written: {msg}",
                result.execution_count
            ));
        }
    }

    /// What `status` answers.
    pub fn status(&self) -> StatusInfo {
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
            plan_id: self.identity.plan_id.clone(),
            task_id: self.identity.task_id.clone(),
            task_name: self.identity.task_name.clone(),
            session_id: self.identity.session_id.clone(),
            log_file: self.log.path().display().to_string(),
            default_timeout_ms: self.default_timeout_ms,
        }
    }

    /// Records written so far.
    pub fn records_written(&self) -> u64 {
        self.log.records_written()
    }
}

/// The log record of a result, borrowing everything.
fn record<'a>(
    id: &'a Identity,
    mode: Mode,
    params: &'a ExecuteParams,
    r: &'a ExecuteResult,
) -> ExecutionRecord<'a> {
    ExecutionRecord {
        kind: Cow::Borrowed(RECORD_TYPE_EXECUTION),
        version: FORMAT_VERSION,
        plan_id: Cow::Borrowed(&id.plan_id),
        task_id: Cow::Borrowed(&id.task_id),
        task_name: id.task_name.as_deref().map(Cow::Borrowed),
        session_id: Cow::Borrowed(&id.session_id),
        execution_count: r.execution_count,
        timestamp: Cow::Borrowed(&r.timestamp),
        elapsed_ms: r.elapsed_ms,
        code: Cow::Borrowed(&params.code),
        stdout: Cow::Borrowed(&r.stdout),
        stderr: Cow::Borrowed(&r.stderr),
        success: r.success,
        error_type: r.error.as_ref().map(|e| Cow::Borrowed(e.kind.as_str())),
        error_message: r.error.as_ref().map(|e| Cow::Borrowed(e.message.as_str())),
        result: r.result.as_deref().map(Cow::Borrowed),
        timed_out: r.timed_out,
        added_vars: Cow::Borrowed(&r.added_vars),
        removed_vars: Cow::Borrowed(&r.removed_vars),
        added_imports: Cow::Borrowed(&r.added_imports),
        mode: Cow::Borrowed(mode.as_str()),
        warnings: Cow::Borrowed(&r.warnings),
    }
}

/// An error and its sources, joined with `: `.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
