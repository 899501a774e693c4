//! The `file` records of a task's log: one per transfer, or per refusal.

use chrono::{SecondsFormat, Utc};
use flowrepl_task_logger::{FileRecord, TaskHead, TaskLog, RECORD_TYPE_FILE};
use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

/// The longest path a record keeps (a client can name anything up to its message limit).
const MAX_RECORDED_PATH: usize = 1024;

/// How a transfer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A JSON-RPC method of the stdio kernel.
    JsonRpc,
    /// An MCP tool.
    Mcp,
    /// An MCP `resources/read`.
    Resource,
    /// `flowrepl serve`'s `/files/` routes.
    Http,
}

impl Via {
    /// Its name in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::JsonRpc => "jsonrpc",
            Via::Mcp => "mcp",
            Via::Resource => "resource",
            Via::Http => "http",
        }
    }
}

/// What an operation is, in records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A file written.
    Upload,
    /// A file read.
    Download,
    /// A file removed.
    Delete,
}

impl Op {
    /// Its name in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Upload => "upload",
            Op::Download => "download",
            Op::Delete => "delete",
        }
    }
}

/// Writes a task's `file` records (its own handle on the task log: appends of whole lines
/// with `O_APPEND`, so the kernel's records and these never interleave).
#[derive(Debug)]
pub struct Recorder {
    log: Mutex<TaskLog>,
    plan_id: String,
    task_id: String,
    task_name: Option<String>,
    session_id: String,
}

/// One record to write.
pub(crate) struct Entry<'a> {
    pub op: Op,
    pub path: &'a str,
    pub bytes: u64,
    pub sha256: Option<&'a str>,
    pub via: Via,
    pub started: Instant,
    pub error: Option<String>,
}

impl Recorder {
    /// Records of the task `plan_id`/`task_id` into `log_file`, as `session_id` (the kernel's
    /// session, or the server's id).
    pub fn new(
        log_file: PathBuf,
        plan_id: &str,
        task_id: &str,
        task_name: Option<&str>,
        session_id: &str,
    ) -> Recorder {
        Recorder {
            log: Mutex::new(TaskLog::new(log_file)),
            plan_id: plan_id.to_owned(),
            task_id: task_id.to_owned(),
            task_name: task_name.map(str::to_owned),
            session_id: session_id.to_owned(),
        }
    }

    pub(crate) fn write(&self, e: Entry<'_>) {
        let path: String = e.path.chars().take(MAX_RECORDED_PATH).collect();
        let record = FileRecord {
            head: TaskHead::new(
                RECORD_TYPE_FILE,
                &self.plan_id,
                &self.task_id,
                self.task_name.as_deref(),
                &self.session_id,
            ),
            timestamp: Utc::now()
                .to_rfc3339_opts(SecondsFormat::Millis, true)
                .into(),
            op: Cow::Borrowed(e.op.as_str()),
            path: Cow::Owned(path),
            bytes: e.bytes,
            sha256: e.sha256.map(Cow::Borrowed),
            via: Cow::Borrowed(e.via.as_str()),
            elapsed_ms: e.started.elapsed().as_secs_f64() * 1e3,
            error: e.error.map(Cow::Owned),
        };
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = log.append(&record) {
            tracing::warn!(error = %flowrepl_os::chain(&e), "a file record was not written");
        }
    }
}
