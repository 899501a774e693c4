//! What the executor is started with, what one cell produces, and why things fail: the
//! executor's interface in types that need no Python, so that the kernel names them without
//! linking pyo3.

use crate::sink::OutputSink;
use flowrepl_protocol::{
    ApprovalAnswer, ApprovalRequest, CellReport, CheckpointPolicy, Image, Mode,
};
use flowrepl_task_logger::checkpoint::FolderError;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How to start the executor.
#[derive(Clone)]
pub struct ExecutorConfig {
    /// The python to emulate: an interpreter or a venv's `bin/python` of the embedded version.
    pub python: PathBuf,
    /// Per stream and cell, output beyond this is dropped from the middle.
    pub max_output_bytes: u64,
    /// Worker mode: stream output here while cells run, instead of returning it in
    /// [`CellOutcome::stdout`](CellOutcome::stdout)/[`CellOutcome::stderr`](CellOutcome::stderr) (which then stay empty).
    pub sink: Option<Arc<dyn OutputSink>>,
    /// MCP mode: collect figures and rich values as PNG images after each cell.
    pub images: Option<ImageLimits>,
    /// What the session starts from: `sys.argv`, `sys.path[0]`, startup files.
    pub setup: SessionSetup,
    /// Where `flow.request_approval` sends its requests; `None`: nobody can be asked (it
    /// returns `None`).
    pub approver: Option<Arc<dyn Approver>>,
    /// Worker mode: the capture files (stdout, stderr) the kernel made and keeps.
    pub capture: Option<[Arc<OwnedFd>; 2]>,
    /// Where and when checkpoints of the namespace are written; `None`: never.
    pub checkpoints: Option<CheckpointConfig>,
    /// This process's id as the kernel knows it (`usage.pid`): its own, except in the
    /// sandbox's PID namespace.
    pub pid: u32,
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
    /// The task's package layer (`<task>.packages/current`): on `sys.path` before the
    /// interpreter's site-packages, its `.pth` files run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<PathBuf>,
    /// What `flow` starts with: the task's ids and its context.
    #[serde(default)]
    pub flow: FlowSetup,
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
            .field("checkpoints", &self.checkpoints)
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

/// Everything a cell produced: its output and images, and the [`CellReport`] of what it did.
#[derive(Debug, Clone)]
pub struct CellOutcome {
    /// fd 1 output (empty in worker mode: it was streamed to the sink).
    pub stdout: String,
    /// fd 2 output, then the traceback on error (likewise).
    pub stderr: String,
    /// Figures and rich values ([`ExecutorConfig::images`]).
    pub images: Vec<Image>,
    /// What the cell did.
    pub report: CellReport,
    /// Events the cell reported through `flow` (in-process; a worker sends them as they come).
    pub events: Vec<flowrepl_protocol::CellEvent>,
    /// The task's context after each change the cell made (in-process; likewise).
    pub contexts: Vec<String>,
    /// CPU time of the process so far, in milliseconds, read as the cell ended.
    pub cpu_total_ms: f64,
    /// How the automatic checkpoint is doing, when that changed since the last cell.
    pub checkpoint: Option<flowrepl_protocol::CheckpointHealth>,
}

impl CellOutcome {
    /// A successful cell that did and printed nothing (the start of every outcome).
    pub fn empty(mode: Mode) -> CellOutcome {
        CellOutcome {
            stdout: String::new(),
            stderr: String::new(),
            images: Vec::new(),
            report: CellReport::new(mode),
            events: Vec::new(),
            contexts: Vec::new(),
            cpu_total_ms: 0.0,
            checkpoint: None,
        }
    }
}

/// What `flow` starts with: who the session belongs to (`flow.plan_id` and the like) and the
/// task's context.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlowSetup {
    /// `FLOW_PLAN_ID`.
    pub plan_id: Option<String>,
    /// `FLOW_TASK_ID`.
    pub task_id: Option<String>,
    /// `FLOW_TASK_NAME`.
    pub task_name: Option<String>,
    /// The kernel run.
    pub session_id: Option<String>,
    /// The task's context when the session starts (a JSON object's text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

/// Where and when checkpoints are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The task's checkpoint folder (`<log_dir>/<plan>/<task>.checkpoints`).
    pub root: PathBuf,
    /// When the automatic checkpoint is written.
    pub policy: CheckpointPolicy,
    /// Names whose pickle is larger are not saved (and listed).
    pub max_bytes: u64,
    /// Restores are refused: the checkpoints were written by a sandboxed session and this
    /// one is not sandboxed ([`flowrepl_task_logger::checkpoint::sandboxed_mark`]). Nor is the
    /// automatic checkpoint written: this session's first write would replace the sandboxed
    /// session's saved names, which a sandboxed or trusting kernel can still restore.
    pub untrusted: bool,
}

impl CheckpointConfig {
    /// Whether cells make the automatic checkpoint pending (and a thread writes it).
    pub fn tracks_cells(&self) -> bool {
        matches!(
            self.policy,
            CheckpointPolicy::OnSuccess | CheckpointPolicy::EveryCell
        ) && !self.untrusted
    }
}

/// Why a checkpoint was not written or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// `FLOWREPL_CHECKPOINTS=off`, or no task log folder.
    #[error("checkpoints are off (FLOWREPL_CHECKPOINTS=off)")]
    Off,
    /// The checkpoint folder or journal.
    #[error(transparent)]
    Folder(#[from] FolderError),
    /// The Python side raised.
    #[error(transparent)]
    Python(#[from] CallError),
}

/// Why the interpreter could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// CPython refused to start.
    #[error("python initialisation failed: {0}")]
    Python(String),
    /// A path contains a NUL byte.
    #[error("path contains a NUL byte: {0}")]
    Nul(PathBuf),
}

/// Python code the executor runs for the kernel (not a cell: this support code, checkpoints)
/// raised: its `str`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CallError(pub String);

/// Carries approval requests to whoever can answer them, and their answers back.
pub trait Approver: Send + Sync {
    /// Sends the request on. An answer that comes at once (nobody can be asked) is returned
    /// by the next [`Approver::wait`].
    fn request(&self, request: &ApprovalRequest);
    /// Waits up to `wait` for the answer to `approval_id`.
    fn wait(&self, approval_id: &str, wait: Duration) -> Option<ApprovalAnswer>;
    /// The cell no longer waits for `approval_id` (answered, timed out or interrupted).
    fn ended(&self, approval_id: &str);
}

/// `__name__`-style names, left out of `variable_count`.
pub fn is_dunder(name: &str) -> bool {
    name.len() > 4 && name.starts_with("__") && name.ends_with("__")
}

/// Where the executor keeps its compiled support code, set by the kernel for a sandboxed
/// worker (whose `HOME` points inside the sandbox) so that it reads the user's cache there.
pub const SUPPORT_CACHE_ENV: &str = "FLOWREPL_SUPPORT_CACHE";

/// The folder of the compiled support code: [`SUPPORT_CACHE_ENV`], else
/// `$XDG_CACHE_HOME/flowrepl`, else `~/.cache/flowrepl`.
pub fn support_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(SUPPORT_CACHE_ENV).filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("flowrepl"))
}
