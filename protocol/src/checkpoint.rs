//! Checkpoints of the namespace: the params and replies of `checkpoint`, `restore`,
//! `checkpoints` and `restart {restore}`, and how a restore is reported.
//!
//! A checkpoint saves each variable on its own (pickled), so one that cannot be saved costs
//! only its name: such names are listed with the reason, never dropped silently. The format on
//! disk is the task logger's (`flowrepl_task_logger::checkpoint`); `docs/checkpoints.md` says what
//! is saved when, and what a checkpoint can miss.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The checkpoint written after successful cells (and by `checkpoint` without a name).
pub const AUTO_CHECKPOINT: &str = "auto";

/// Params of `checkpoint` and `restore`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CheckpointParams {
    /// The checkpoint's name: 1 to 64 of `A-Z a-z 0-9 _ . -`, not starting with `.`.
    /// Absent: the automatic checkpoint, `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl CheckpointParams {
    /// The name asked for, or [`AUTO_CHECKPOINT`].
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(AUTO_CHECKPOINT)
    }
}

/// Params of `restart`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RestartParams {
    /// Start the fresh session from the last automatic checkpoint.
    #[serde(default)]
    pub restore: bool,
}

/// What writing a checkpoint did (the answer to `checkpoint`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CheckpointSummary {
    /// Its name (`auto` for the automatic one).
    pub checkpoint: String,
    /// The session's execution count it holds the state after.
    pub execution_count: u64,
    /// Names pickled by this write (all of them for a full one).
    pub saved: Vec<String>,
    /// Names bound to modules: restored by importing them again.
    pub modules: Vec<String>,
    /// Names that could not be saved, with the reason.
    pub unsaved: BTreeMap<String, String>,
    /// Names gone since the previous write.
    pub dropped: Vec<String>,
    /// Bytes written.
    pub bytes: u64,
    /// Whether every name was saved again (not only what changed).
    pub full: bool,
    /// What pickled: `cloudpickle X.Y`, `dill X.Y` or `pickle`.
    pub pickler: String,
    /// How long it took, in milliseconds.
    pub ms: f64,
}

/// How the automatic checkpoint is doing: in `status`, the `checkpoints` listing and (worker
/// mode) the worker's Done frames. A failed write is also said once in the next cell's
/// `warnings`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CheckpointHealth {
    /// The execution count the newest automatic checkpoint written by this session holds
    /// the state after (a crash now restores that); absent before its first write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_execution_count: Option<u64>,
    /// The last write of the automatic checkpoint that failed, if any did this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<CheckpointFailure>,
    /// The last write failed (nothing was written since `last_error`).
    #[serde(default)]
    pub failing: bool,
}

/// A write of the automatic checkpoint that failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CheckpointFailure {
    /// The state after this execution count was not saved.
    pub execution_count: u64,
    /// Why (`OSError: [Errno 28] No space left on device`, ...).
    pub error: String,
    /// When (UTC, ISO 8601).
    pub time: String,
}

/// One checkpoint on disk (the answer to `checkpoints` lists them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CheckpointInfo {
    /// Its name.
    pub name: String,
    /// The execution count it holds the state after.
    pub execution_count: u64,
    /// When it was last written (UTC, ISO 8601).
    pub time: String,
    /// Bytes of pickles it uses.
    pub bytes: u64,
    /// Names it can restore (variables and modules), sorted.
    pub names: Vec<String>,
    /// Names it could not save, with the reason.
    pub unsaved: BTreeMap<String, String>,
    /// The Python `major.minor` that wrote it (only that version can load it).
    pub python: String,
    /// What pickled it.
    pub pickler: String,
    /// Its last write: how long it took, in milliseconds (pickling and writing).
    #[serde(default)]
    pub last_write_ms: Option<f64>,
    /// How many names the last write saved (the automatic checkpoint saves what changed).
    #[serde(default)]
    pub last_write_names: u64,
    /// Whether the last write saved every name.
    #[serde(default)]
    pub last_write_full: bool,
}

/// The answer to `checkpoints`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CheckpointsReply {
    /// The task's checkpoints, by name.
    pub checkpoints: Vec<CheckpointInfo>,
    /// The folder they are in (`<log_dir>/<plan>/<task>.checkpoints`).
    pub directory: String,
    /// Whether a checkpoint is written after each successful cell (`FLOWREPL_CHECKPOINTS`).
    pub policy: String,
    /// How this session's automatic checkpoint is doing (as `status` says it); absent when
    /// checkpoints are off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<CheckpointHealth>,
}

/// A namespace restored from a checkpoint: in the result of the first cell after an automatic
/// restore (a worker crash or kill, `--resume`), and in the answers to `restore` and
/// `restart {restore: true}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RestoreReport {
    /// Always true.
    #[cfg_attr(feature = "schema", schemars(extend("const" = true)))]
    pub restored: bool,
    /// The checkpoint's name.
    pub checkpoint: String,
    /// The execution count the checkpoint holds the state after: cells after it are not in
    /// the restored namespace.
    pub checkpoint_execution_count: u64,
    /// The session that wrote the checkpoint (its `execution_count`s are that session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_session_id: Option<String>,
    /// Names restored (variables and re-imported modules), sorted.
    pub restored_vars: Vec<String>,
    /// Names whose value from before the restore did not come back, with the reason: not
    /// saved or not loadable, or bound, rebound or deleted by a cell after the checkpoint
    /// (such a name may be in `restored_vars` too, with its older value).
    pub lost_vars: BTreeMap<String, String>,
    /// How long the restore took, in milliseconds.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub restore_ms: f64,
}

impl RestoreReport {
    /// The restore left nothing behind.
    pub fn complete(&self) -> bool {
        self.lost_vars.is_empty()
    }
}

/// When the automatic checkpoint is written (`FLOWREPL_CHECKPOINTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckpointPolicy {
    /// After each successful cell, once the session is idle (the default).
    OnSuccess,
    /// After every cell, before the next one starts (for clients that send cells back to
    /// back and cannot lose one).
    EveryCell,
    /// Only when asked (`checkpoint`); restores still work.
    Manual,
    /// Never; `checkpoint` and `restore` are refused.
    Off,
}

impl CheckpointPolicy {
    /// The name in `FLOWREPL_CHECKPOINTS` and on the worker's command line.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointPolicy::OnSuccess => "on-success",
            CheckpointPolicy::EveryCell => "every-cell",
            CheckpointPolicy::Manual => "manual",
            CheckpointPolicy::Off => "off",
        }
    }
}

impl std::str::FromStr for CheckpointPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on-success" => Ok(CheckpointPolicy::OnSuccess),
            "every-cell" => Ok(CheckpointPolicy::EveryCell),
            "manual" => Ok(CheckpointPolicy::Manual),
            "off" => Ok(CheckpointPolicy::Off),
            other => Err(format!(
                "unknown checkpoint policy {other:?} (want on-success, every-cell, manual or off)"
            )),
        }
    }
}

impl std::fmt::Display for CheckpointPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
