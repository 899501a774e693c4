//! How the executor is started, and why it may not start.

use crate::interpreter::InitError;
use flowrepl_exec::sink::OutputSink;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

/// How to start the executor.
#[derive(Clone)]
pub struct ExecutorConfig {
    /// The python to emulate: an interpreter or a venv's `bin/python` of the embedded version.
    pub python: PathBuf,
    /// Per stream and cell, output beyond this is dropped from the middle.
    pub max_output_bytes: u64,
    /// Worker mode: stream output here while cells run, instead of returning it in
    /// [`CellOutcome::stdout`](super::CellOutcome::stdout)/[`CellOutcome::stderr`](super::CellOutcome::stderr) (which then stay empty).
    pub sink: Option<Arc<dyn OutputSink>>,
    /// MCP mode: collect figures and rich values as PNG images after each cell.
    pub images: Option<ImageLimits>,
    /// What the session starts from: `sys.argv`, `sys.path[0]`, startup files.
    pub setup: SessionSetup,
    /// Where `flow.request_approval` sends its requests; `None`: nobody can be asked (it
    /// returns `None`).
    pub approver: Option<Arc<dyn crate::approval::Approver>>,
    /// Worker mode: the capture files (stdout, stderr) the kernel made and keeps.
    pub capture: Option<[Arc<OwnedFd>; 2]>,
    /// Where and when checkpoints of the namespace are written; `None`: never.
    pub snapshots: Option<crate::checkpoint::SnapshotConfig>,
}

/// What a session starts from, before its first cell (and again after an in-process
/// `restart`): names the startup files define are the baseline, not a cell's additions.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionSetup {
    /// `sys.argv`, when it is set (drop-in mode: `[SCRIPT, args...]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// A folder put first on `sys.path` (drop-in mode: the script's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path0: Option<PathBuf>,
    /// Python files run in the namespace, in order (`$PYTHONSTARTUP`, `--startup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup: Vec<PathBuf>,
    /// What `flow` starts with: the task's ids and its context.
    #[serde(default)]
    pub flow: crate::flow::FlowSetup,
}

/// Caps on the images collected after a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// At most this many images per cell; open figures past it are closed and reported in
    /// `warnings`.
    pub max_images: u32,
    /// At most this many pixels per image: figures are rendered at a lower dpi to fit, and
    /// larger `_repr_png_()` images are left out (with a warning).
    pub max_pixels: u64,
}

impl std::fmt::Debug for ExecutorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorConfig")
            .field("python", &self.python)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("sink", &self.sink.is_some())
            .field("images", &self.images)
            .field("setup", &self.setup)
            .field("snapshots", &self.snapshots)
            .finish()
    }
}

/// Why the executor could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// Python did not start.
    #[error(transparent)]
    Init(#[from] InitError),
    /// The capture files or the monitor could not be set up.
    #[error("cannot set up output capture")]
    Io(#[from] std::io::Error),
    /// The support module failed to load.
    #[error("cannot load the executor's Python support code: {0}")]
    Support(String),
}
