//! The answer to `status` and the params of the `ready` notification.

use crate::execute::Mode;
use serde::{Deserialize, Serialize};

/// The text older clients wait for on stdout before they send anything.
pub const READY_MARKER: &str = "__READY__";

/// The interpreter cells run in, as it describes itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PythonInfo {
    /// `sys.version`.
    pub python_version: String,
    /// `sys.executable`: the interpreter (or venv python) the session emulates.
    pub python_executable: String,
    /// `sys.prefix`: the venv when one is used.
    pub python_prefix: String,
}

/// What the kernel is: sent as the result of `status`/`ping` and, with
/// `"message": "__READY__"`, as the params of the `ready` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusInfo {
    /// `__READY__` in the `ready` notification; absent in `status` replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The flowrepl version.
    pub kernel_version: String,
    /// The interpreter (its fields sit at the top level).
    #[serde(flatten)]
    pub python: PythonInfo,
    /// Why this interpreter: `flag` (`--python`/`FLOWREPL_PYTHON`), `virtual_env`
    /// (`$VIRTUAL_ENV`), `own_venv` (the venv flowrepl is installed in), `path` (the `python3`
    /// on `PATH`), `build` (the interpreter flowrepl was built against).
    #[serde(default)]
    pub python_source: String,
    /// Where cells run.
    pub mode: Mode,
    /// The kernel's process id.
    pub pid: u32,
    /// Worker mode: the current worker's process id. Absent in-process, and while no worker
    /// runs (between a crash and the respawn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_pid: Option<u32>,
    /// How many `execute_code` calls the session has started.
    pub execution_count: u64,
    /// True while a cell runs (a `status` sent during a cell is answered at once).
    #[serde(default)]
    pub busy: bool,
    /// `FLOW_PLAN_ID`, or `local`.
    pub plan_id: String,
    /// `FLOW_TASK_ID`, or `adhoc`.
    pub task_id: String,
    /// `FLOW_TASK_NAME`, if set.
    pub task_name: Option<String>,
    /// Unique id of this kernel run; every log record carries it.
    pub session_id: String,
    /// The JSONL file this session appends to.
    pub log_file: String,
    /// Default cell timeout in milliseconds.
    pub default_timeout_ms: u64,
    /// How the automatic checkpoint is doing, as the kernel last heard (worker mode: as of
    /// the worker's last reply); absent when checkpoints are off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::CheckpointHealth>,
    /// Worker mode with `--sandbox`: what the worker's sandbox enforces, layer by layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<crate::sandbox::SandboxReport>,
    /// With `--store`: how the task's uploads to the object store are doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreStatus>,
}

/// The object store's side of `status` (`--store`; docs/store.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StoreStatus {
    /// The store's URL.
    pub url: String,
    /// This kernel's epoch: the how-manyth holder of the task it is.
    pub epoch: u64,
    /// Bytes of the task log in the store.
    pub log_bytes: u64,
    /// Bytes of the task log written here and not yet in the store.
    pub pending_log_bytes: u64,
    /// The last upload failed: the store's error (uploads are retried with a backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing: Option<String>,
    /// Since when the uploads fail: UTC, ISO 8601.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<String>,
    /// Another kernel took the task over: why this one stopped writing (and stops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
    /// Workspace files kept with the last state uploaded.
    #[serde(default)]
    pub workspace_files: u64,
    /// Workspace files not kept, with the reason (a link, a FIFO, over the cap; the first 20
    /// by path).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub workspace_skipped: std::collections::BTreeMap<String, String>,
    /// This kernel took the task from a holder that had not released it (it died, or lost
    /// the store): what may have been lost (docs/store.md, "What a loss says").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_over: Option<TakenOver>,
}

/// A task taken from a holder that did not release it: calls it answered after its last
/// commit to the store may be lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TakenOver {
    /// The previous holder, as its head named it (`kernel <id> (pid N on HOST)`).
    pub holder: String,
    /// Its epoch.
    pub epoch: u64,
    /// When it last committed to the store (its own clock, as the head says): UTC, ISO 8601.
    pub last_committed: String,
    /// The last record of the task log in the store (type, session, cell, time), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record: Option<String>,
    /// Log segments the head counts that the store does not have.
    #[serde(default)]
    pub missing_segments: u64,
    /// Records this disk held that the store never got, kept beside the log in this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unstored_records: Option<String>,
    /// The warning the first result carried.
    pub message: String,
}
