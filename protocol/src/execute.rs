//! The result of `execute_code`.
//!
//! # Wire format
//! ```json
//! {"success": true, "stdout": "hi\n", "stderr": "", "result": "2", "error": null,
//!  "timed_out": false, "interrupted": false,
//!  "added_vars": ["y"], "removed_vars": [], "rebound_vars": [], "added_imports": [],
//!  "variable_count": 2,
//!  "warnings": [], "usage": {"pid": 4242, "cpu_ms": 0.031, "peak_rss_kb": 15012},
//!  "debug_info": {"execution": "success", "execution_mode": "in_process", "elapsed_ms": 0.041,
//!                 "phases_us": {"compile": 4, "exec": 1, "capture": 1, "diff": 2}},
//!  "execution_count": 3, "elapsed_ms": 0.041, "mode": "in_process", "stopped_by": null,
//!  "timestamp": "2026-11-22T02:14:11.123Z", "state_lost": false}
//! ```
//! The fields from `result` to `debug_info` are the executor's [`CellReport`], flattened.
//! Fields may be added over time; clients must ignore unknown ones.

use serde::{Deserialize, Serialize};

/// Where cells run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Mode {
    /// Embedded CPython inside the `flowrepl` process.
    InProcess,
    /// A keep-alive `flowrepl-worker` subprocess.
    Worker,
}

impl Mode {
    /// The name used on the wire and in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::InProcess => "in_process",
            Mode::Worker => "worker",
        }
    }
}

/// What stopped a cell that did not end by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum StoppedBy {
    /// SIGINT: the cell got `KeyboardInterrupt` and the namespace was kept.
    Interrupt,
    /// SIGKILL to the worker's process group (worker mode): the namespace was lost.
    Kill,
}

impl StoppedBy {
    /// The name used on the wire and in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            StoppedBy::Interrupt => "interrupt",
            StoppedBy::Kill => "kill",
        }
    }
}

/// How a cell ended, for `debug_info.execution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ExecutionKind {
    /// Ran to the end.
    Success,
    /// Did not compile; nothing ran.
    SyntaxError,
    /// Raised (including `KeyboardInterrupt` from a timeout and `SystemExit`).
    RuntimeError,
}

impl ExecutionKind {
    /// The name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionKind::Success => "success",
            ExecutionKind::SyntaxError => "syntax_error",
            ExecutionKind::RuntimeError => "runtime_error",
        }
    }
}

/// The exception a cell raised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecError {
    /// The exception class name, e.g. `ZeroDivisionError`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `str(exception)`; for a timeout, a sentence naming the limit.
    pub message: String,
    /// The formatted traceback (also appended to `stderr`).
    pub traceback: String,
}

/// Microseconds spent in each phase of the cell, measured inside the executor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PhaseTimings {
    /// Splitting off the final expression and compiling.
    pub compile: u64,
    /// Running the code, including the `repr` of the final value.
    pub exec: u64,
    /// Flushing and collecting stdout/stderr.
    pub capture: u64,
    /// Diffing globals and `sys.modules`.
    pub diff: u64,
}

/// What the process that ran a cell used during it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ResourceUsage {
    /// The process that ran the cell: the worker in worker mode, the kernel in-process.
    pub pid: u32,
    /// User + system CPU time of that process during the cell, in milliseconds (all its
    /// threads; not its child processes).
    pub cpu_ms: f64,
    /// Peak resident set size during the cell, in KiB (the process's high-water mark is reset
    /// when the cell starts). 0 when unknown.
    pub peak_rss_kb: u64,
}

/// A figure or rich value a cell produced, as described in its result and record (the image
/// itself travels only in MCP image blocks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ImageInfo {
    /// MIME type; always `image/png` today.
    pub mime: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Size of the encoded image in bytes.
    pub bytes: u64,
    /// Where it came from: `figure N` (a matplotlib figure left open, closed after) or
    /// `result` (the final value's `_repr_png_()`).
    pub source: String,
}

/// An image with its data, base64-encoded (standard alphabet, padded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// What it is.
    #[serde(flatten)]
    pub info: ImageInfo,
    /// The encoded image, base64.
    pub data: String,
}

/// One name of the session's namespace, as `list_variables` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VariableInfo {
    /// The name.
    pub name: String,
    /// The value's type: `int`, `DataFrame`, `module`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The module that defines the type, when it is not `builtins`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// `repr()` cut to 120 characters (with `…` when cut).
    pub repr: String,
    /// `len()` for sized values (strings, containers, frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u64>,
    /// `.shape` for arrays and frames, when it is a tuple of integers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
}

/// Compatibility block for clients of the original Python `json_repl_session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DebugInfo {
    /// How the cell ended.
    pub execution: ExecutionKind,
    /// Same as the result's `mode`.
    pub execution_mode: Mode,
    /// Same as the result's `elapsed_ms`.
    pub elapsed_ms: f64,
    /// Where the time went.
    #[serde(default)]
    pub phases_us: PhaseTimings,
}

/// An event's data: a JSON object, kept as the text it was written as (not parsed again).
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct EventData(pub Box<serde_json::value::RawValue>);

impl<'de> Deserialize<'de> for EventData {
    /// Through a `Value`, so that it also reads inside flattened records (where serde
    /// buffers the input and a `RawValue` cannot borrow its text).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<EventData, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        EventData::from_json(v.to_string()).map_err(serde::de::Error::custom)
    }
}

impl EventData {
    /// Data from JSON text (which must be valid JSON).
    pub fn from_json(json: String) -> Result<EventData, serde_json::Error> {
        serde_json::value::RawValue::from_string(json).map(EventData)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for EventData {
    fn eq(&self, other: &EventData) -> bool {
        self.get() == other.get()
    }
}

/// A structured event a cell reported: `flow.event(name, **data)`, a `flow.step` boundary or
/// log line, or an `MCP::<name> {json}` line the cell printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Event {
    /// 1, 2, … in the order the cell reported them.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub seq: u64,
    /// The event's name (`step_start`, `step_end`, `step_log` for steps).
    pub name: String,
    /// Its data: a JSON object.
    #[cfg_attr(
        feature = "schema",
        schemars(with = "serde_json::Map<String, serde_json::Value>")
    )]
    pub data: EventData,
    /// When it was reported: UTC, ISO 8601 with milliseconds and `Z` (for an `MCP::` line,
    /// when the cell's output was collected).
    #[cfg_attr(feature = "schema", schemars(extend("format" = "date-time")))]
    pub timestamp: String,
    /// The innermost `flow.step` open when it was reported, if any.
    pub step: Option<String>,
}

/// An event as the executor reports it, before the kernel numbers it among the `MCP::` lines
/// of the cell's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellEvent {
    /// The event's name.
    pub name: String,
    /// Its data, a JSON object.
    pub data: EventData,
    /// When it was reported.
    pub timestamp: String,
    /// The innermost open step.
    pub step: Option<String>,
    /// Bytes of the cell's stdout written before it (orders it among `MCP::` lines).
    pub offset: u64,
}

/// What a cell did, apart from its output and images: the executor's answer. Its fields are
/// written once, here: the executor fills it, the worker's Done frame carries it, and
/// [`ExecuteResult`] embeds it (flattened, so its fields sit at the top level of the result
/// on the wire).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CellReport {
    /// `repr()` of the value of a final expression statement (as Jupyter's execute_result);
    /// null when the cell does not end in an expression or the value is `None`.
    pub result: Option<String>,
    /// The exception, when `success` is false.
    pub error: Option<ExecError>,
    /// True when the cell was stopped because `timeout_ms` passed.
    pub timed_out: bool,
    /// True when the cell was stopped by an `interrupt` request.
    #[serde(default)]
    pub interrupted: bool,
    /// Names bound in the namespace by this cell that were not there before, sorted.
    pub added_vars: Vec<String>,
    /// Names that were in the namespace before this cell and are gone after it, sorted.
    pub removed_vars: Vec<String>,
    /// Names that were in the namespace before this cell and are bound to another object
    /// after it (assigned again, by the cell or code it called), sorted; `__dunder__` names
    /// left out. What the cell changed in place (`data.append(1)`) is not a rebinding.
    #[serde(default)]
    pub rebound_vars: Vec<String>,
    /// Modules that entered `sys.modules` during this cell, sorted (submodules included).
    pub added_imports: Vec<String>,
    /// Names in the namespace after the cell, not counting `__dunder__` names.
    pub variable_count: usize,
    /// Things the caller should know that did not fail the cell (log write failed, output
    /// was not UTF-8, …). Empty when all went well.
    pub warnings: Vec<String>,
    /// The process that ran the cell, its CPU time and peak RSS during the cell.
    #[serde(default)]
    pub usage: ResourceUsage,
    /// Compatibility and timing details.
    pub debug_info: DebugInfo,
}

impl CellReport {
    /// A cell that did nothing yet, in `mode`: the start of every report.
    pub fn new(mode: Mode) -> CellReport {
        CellReport {
            result: None,
            error: None,
            timed_out: false,
            interrupted: false,
            added_vars: Vec::new(),
            removed_vars: Vec::new(),
            rebound_vars: Vec::new(),
            added_imports: Vec::new(),
            variable_count: 0,
            warnings: Vec::new(),
            usage: ResourceUsage::default(),
            debug_info: DebugInfo {
                execution: ExecutionKind::Success,
                execution_mode: mode,
                elapsed_ms: 0.0,
                phases_us: PhaseTimings::default(),
            },
        }
    }

    /// The cell was stopped by an `interrupt` request: says so, in its error too.
    pub fn mark_interrupted(&mut self) {
        self.interrupted = true;
        if let Some(e) = &mut self.error {
            e.message = "cell interrupted on request (KeyboardInterrupt)".to_owned();
        }
    }

    /// The cell was stopped by its timeout: says so, in its error too.
    pub fn mark_timed_out(&mut self, timeout_ms: u128) {
        self.timed_out = true;
        if let Some(e) = &mut self.error {
            e.message = format!(
                "cell timed out after {timeout_ms} ms and was interrupted (KeyboardInterrupt)"
            );
        }
    }

    /// A cell that failed outside Python (it did not run, its worker died, it was answered
    /// before it ended): `kind: message` is its error, and its traceback.
    pub fn failed(mode: Mode, kind: &str, message: String) -> CellReport {
        let mut r = CellReport::new(mode);
        r.debug_info.execution = ExecutionKind::RuntimeError;
        r.error = Some(ExecError {
            traceback: format!("{kind}: {message}\n"),
            kind: kind.to_owned(),
            message,
        });
        r
    }
}

/// The result of `execute_code`. A cell that raises is still a result (`success: false`),
/// never a JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecuteResult {
    /// True when the cell ran to the end without raising.
    pub success: bool,
    /// Everything written to fd 1 during the cell (print, `os.write(1, …)`, C stdio, child
    /// processes), in order. Bytes that are not UTF-8 are replaced with U+FFFD.
    pub stdout: String,
    /// Everything written to fd 2, in order, then the traceback if the cell raised.
    pub stderr: String,
    /// What the cell did: its fields appear at the top level of the result.
    #[serde(flatten)]
    pub report: CellReport,
    /// 1 for the first `execute_code` call of the session, counting every call.
    pub execution_count: u64,
    /// Wall time of the cell in milliseconds (compile, run, capture, diff).
    pub elapsed_ms: f64,
    /// Where the cell ran.
    pub mode: Mode,
    /// How a timed-out or interrupted cell was stopped; null otherwise.
    #[serde(default)]
    pub stopped_by: Option<StoppedBy>,
    /// When the cell started: UTC, ISO 8601 with milliseconds and `Z`.
    pub timestamp: String,
    /// True when the worker died or was killed during this cell (or before it, with a
    /// `restart`): its variables and imports were lost and a fresh worker runs the next cell.
    /// When that worker starts from a checkpoint, the next cell's `restored` fields say what
    /// came back; on that cell `state_lost` is true only if some names were lost.
    #[serde(default)]
    pub state_lost: bool,
    /// Figures and rich values the cell produced (MCP mode only; absent when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageInfo>,
    /// Events the cell reported, in order (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
    /// The first cell after an automatic restore (a worker crash or kill, `--resume`): the
    /// namespace it ran in came from a checkpoint. Its fields (`restored: true`,
    /// `checkpoint`, `checkpoint_execution_count`, `restored_vars`, `lost_vars`,
    /// `restore_ms`) appear at the top level; absent otherwise.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<crate::checkpoint::RestoreReport>,
}
