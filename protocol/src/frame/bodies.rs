//! The bodies frames carry as JSON, and the stream byte of Output frames.

use crate::execute::{CellReport, Image, VariableInfo};
use serde::{Deserialize, Serialize};

/// Which captured stream an Output frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// fd 1.
    Stdout = 1,
    /// fd 2.
    Stderr = 2,
}

/// Sent once by a worker when its interpreter is ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHello {
    /// The worker's process id, as the kernel knows it (the process it started; in the
    /// sandbox's PID namespace, the Python process has another).
    pub pid: u32,
    /// Its interpreter (fields at the top level).
    #[serde(flatten)]
    pub python: crate::PythonInfo,
    /// Where the first cell's stdout and stderr start in the capture files the kernel handed
    /// over (see [`DoneReport::capture_ends`]).
    #[serde(default)]
    pub capture_starts: [u64; 2],
    /// Started with `--restore`: what came back from the checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<crate::RestoreReport>,
    /// Started with `--restore`, and the checkpoint could not be restored at all: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_error: Option<String>,
    /// Started with `--sandbox`: what its sandbox enforces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<crate::sandbox::SandboxReport>,
}

/// The answer to a Checkpoint frame: the summary, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CheckpointOutcome {
    /// Written.
    #[serde(rename = "written")]
    Written(crate::CheckpointSummary),
    /// Not written: why.
    #[serde(rename = "failed")]
    Failed(String),
}

/// A cell's end as the worker reports it: everything but stdout and stderr, which came as
/// Output frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoneReport {
    /// What the cell did.
    pub report: CellReport,
    /// The worker's CPU time since it started, at the end of the cell (so that the kernel can
    /// tell what a cell that killed the worker used).
    pub cpu_total_ms: f64,
    /// Figures and rich values (only when the worker collects them: `--max-images` > 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
    /// Where the next cell's stdout and stderr start in the capture files: if the worker dies
    /// during that cell, the kernel reads what it had not yet received from there.
    #[serde(default)]
    pub capture_ends: [u64; 2],
    /// The worker sent none of the cell's output (nor the traceback): the kernel reads it from
    /// the capture files it handed over, up to `capture_ends`, and appends the traceback.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_in_capture: bool,
    /// How the automatic checkpoint is doing, when that changed since the worker last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::CheckpointHealth>,
}

/// The answer to a Variables frame.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VariablesReport {
    /// The namespace's names, sorted, without `__dunder__` names.
    #[serde(default)]
    pub variables: Vec<VariableInfo>,
    /// Why listing failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
