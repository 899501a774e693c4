//! The JSONL record.
//!
//! # Format (version 1)
//! One JSON object per line, UTF-8, `\n`-terminated:
//!
//! The fields are [`ExecutionRecord`]'s: its field documentation is the reference.
//! `docs/schema/v1/execution.schema.json` (JSON Schema, draft 2020-12) and the field table
//! of `docs/task-log.md` are generated from it (`schema::execution_schema`, feature `schema`); a test
//! fails when the committed copies differ (`FLOWREPL_BLESS=1` rewrites them).
//!
//! # Event records (`type: "event"`)
//! Each event of a cell is also a record of its own, written right after the cell's
//! execution record, so that a reader can follow a plan's events without parsing cells:
//! `type`, `version`, `plan_id`, `task_id`, `task_name`, `session_id`, `execution_count`, and
//! the event's `seq`, `name`, `data` (a JSON object), `timestamp`, `step` (string or null).
//!
//! # Session records (`type: "session"`)
//! A kernel writes one when it starts (`event: "start"`) and one when it ends (`event:
//! "end"`): see [`SessionRecord`]. Context records (`type: "context"`): [`ContextRecord`].
//! The JSON Schema of every record type is in `docs/schema/`.
//!
//! Compatibility rule: fields are only ever added within a version; a reader must ignore
//! fields it does not know. Removing or changing the meaning of a field bumps `version`.

use flowrepl_protocol::{Event, ExecuteResult, ImageInfo};
use serde::{Deserialize, Serialize, Serializer};
use std::borrow::Cow;

/// Texts at least this long are escaped by [`flowrepl_protocol::json::write_str`].
const FAST_TEXT_BYTES: usize = 4096;

/// Writes a cell's code or output as serde_json would, faster when it is long: serde_json
/// escapes a byte at a time (~0.4 ms per MB here); [`flowrepl_protocol::json::write_str`]
/// writes the same bytes in ~0.08 ms, and serde_json checks the literal in ~0.12 ms before
/// copying it into the record. Same output either way (see the tests).
fn text<S: Serializer>(text: &str, ser: S) -> Result<S::Ok, S::Error> {
    if text.len() < FAST_TEXT_BYTES {
        return ser.serialize_str(text);
    }
    let mut literal = Vec::with_capacity(text.len() + 2);
    flowrepl_protocol::json::write_str(&mut literal, text);
    let literal = String::from_utf8(literal).map_err(serde::ser::Error::custom)?;
    serde_json::value::RawValue::from_string(literal)
        .map_err(serde::ser::Error::custom)?
        .serialize(ser)
}

/// The current format version.
pub const FORMAT_VERSION: u32 = 1;

/// The `type` of an execution record.
pub const RECORD_TYPE_EXECUTION: &str = "execution";
/// The `type` of an event record.
pub const RECORD_TYPE_EVENT: &str = "event";

/// One `execute_code` call (`type: "execution"`): one line of the task log. Borrows its
/// strings when written (no copy of a 50 MB stdout), owns them when read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecutionRecord<'a> {
    /// `execution`; other record types are `event`, `context` and `session`: skip the types
    /// you do not know.
    #[serde(rename = "type")]
    #[cfg_attr(feature = "schema", schemars(extend("const" = "execution")))]
    pub kind: Cow<'a, str>,
    /// The format version (1, `FORMAT_VERSION`): fields are only ever added within a
    /// version.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub version: u32,
    /// `FLOW_PLAN_ID` (default `local`), as given (not the file-name form).
    pub plan_id: Cow<'a, str>,
    /// `FLOW_TASK_ID` (default `adhoc`), as given (not the file-name form).
    pub task_id: Cow<'a, str>,
    /// `FLOW_TASK_NAME`, or null.
    pub task_name: Option<Cow<'a, str>>,
    /// The kernel run (a UUID).
    pub session_id: Cow<'a, str>,
    /// 1, 2, … within the session.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub execution_count: u64,
    /// The cell's start: UTC, ISO 8601 with milliseconds and `Z`.
    #[cfg_attr(feature = "schema", schemars(extend("format" = "date-time")))]
    pub timestamp: Cow<'a, str>,
    /// The cell's wall time, ms.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub elapsed_ms: f64,
    /// The cell's source.
    #[serde(serialize_with = "text")]
    pub code: Cow<'a, str>,
    /// Its captured stdout, as in the result.
    #[serde(serialize_with = "text")]
    pub stdout: Cow<'a, str>,
    /// Its captured stderr, as in the result; ends with the traceback on error.
    #[serde(serialize_with = "text")]
    pub stderr: Cow<'a, str>,
    /// The cell ran without raising.
    pub success: bool,
    /// The exception's class name, or null.
    pub error_type: Option<Cow<'a, str>>,
    /// The exception's message, or null.
    #[serde(default)]
    pub error_message: Option<Cow<'a, str>>,
    /// The repr of the final expression's value, or null.
    #[serde(default)]
    pub result: Option<Cow<'a, str>>,
    /// The timeout stopped the cell.
    #[serde(default)]
    pub timed_out: bool,
    /// An `interrupt` request stopped the cell.
    #[serde(default)]
    pub interrupted: bool,
    /// How the cell was stopped: `interrupt` (SIGINT, the namespace kept) or `kill` (worker
    /// mode: SIGKILL after the grace period, the state lost); null when it was not.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["interrupt", "kill", null])))]
    pub stopped_by: Option<Cow<'a, str>>,
    /// Names the cell added, sorted.
    pub added_vars: Cow<'a, [String]>,
    /// Names the cell removed, sorted.
    pub removed_vars: Cow<'a, [String]>,
    /// Names the cell bound to another object, sorted (absent in records written before it
    /// existed: read as empty).
    #[serde(default)]
    pub rebound_vars: Cow<'a, [String]>,
    /// Modules the cell imported, sorted.
    pub added_imports: Cow<'a, [String]>,
    /// Where the cell ran: `in_process` or `worker`.
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["in_process", "worker"])))]
    pub mode: Cow<'a, str>,
    /// The result's warnings: what went wrong around the cell without failing it.
    #[serde(default)]
    pub warnings: Cow<'a, [String]>,
    /// The process that ran the cell: the worker in worker mode (a new pid means a new
    /// worker), else the kernel.
    #[serde(default)]
    pub pid: Option<u32>,
    /// That process's CPU time during the cell (all threads, not child processes), ms.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub cpu_ms: Option<f64>,
    /// Its peak resident memory during the cell, KiB.
    #[serde(default)]
    pub peak_rss_kb: Option<u64>,
    /// Worker mode: the worker died or was killed in this cell, and its state was lost (the
    /// next cell says what a checkpoint brought back). On the first cell after a restore:
    /// true only if names were lost.
    #[serde(default)]
    pub state_lost: bool,
    /// `flowrepl mcp` only: figures and `_repr_png_` values returned as image blocks (the
    /// image data is not logged). Absent when there were none.
    #[serde(default, skip_serializing_if = "<[ImageInfo]>::is_empty")]
    pub images: Cow<'a, [ImageInfo]>,
    /// The cell's events (`flow.event`, `flow.step`, `MCP::` lines), as in the result. Absent
    /// when there were none.
    #[serde(default, skip_serializing_if = "<[Event]>::is_empty")]
    pub events: Cow<'a, [Event]>,
    /// Only on the first cell after an automatic restore (a worker death, `--resume`): what
    /// came back from the checkpoint (docs/checkpoints.md). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<flowrepl_protocol::RestoreReport>,
}

impl<'a> ExecutionRecord<'a> {
    /// The record of cell `code` whose result is `r`, for the task and session in `head`
    /// (its `type` is set here), borrowing everything: the one place a result becomes a
    /// record.
    pub fn of(head: TaskHead<'a>, code: &'a str, r: &'a ExecuteResult) -> ExecutionRecord<'a> {
        let error = r.report.error.as_ref();
        ExecutionRecord {
            kind: Cow::Borrowed(RECORD_TYPE_EXECUTION),
            version: head.version,
            plan_id: head.plan_id,
            task_id: head.task_id,
            task_name: head.task_name,
            session_id: head.session_id,
            execution_count: r.execution_count,
            timestamp: Cow::Borrowed(&r.timestamp),
            elapsed_ms: r.elapsed_ms,
            code: Cow::Borrowed(code),
            stdout: Cow::Borrowed(&r.stdout),
            stderr: Cow::Borrowed(&r.stderr),
            success: r.success,
            error_type: error.map(|e| Cow::Borrowed(e.kind.as_str())),
            error_message: error.map(|e| Cow::Borrowed(e.message.as_str())),
            result: r.report.result.as_deref().map(Cow::Borrowed),
            timed_out: r.report.timed_out,
            interrupted: r.report.interrupted,
            stopped_by: r.stopped_by.map(|s| Cow::Borrowed(s.as_str())),
            added_vars: Cow::Borrowed(&r.report.added_vars),
            removed_vars: Cow::Borrowed(&r.report.removed_vars),
            rebound_vars: Cow::Borrowed(&r.report.rebound_vars),
            added_imports: Cow::Borrowed(&r.report.added_imports),
            mode: Cow::Borrowed(r.mode.as_str()),
            warnings: Cow::Borrowed(&r.report.warnings),
            pid: Some(r.report.usage.pid),
            cpu_ms: Some(r.report.usage.cpu_ms),
            peak_rss_kb: Some(r.report.usage.peak_rss_kb),
            state_lost: r.state_lost,
            images: Cow::Borrowed(&r.images),
            events: Cow::Borrowed(&r.events),
            restored: r.restored.clone(),
        }
    }
}

/// The fields every record starts with: its type and version, and whose it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskHead<'a> {
    /// The record's type.
    #[serde(rename = "type")]
    pub kind: Cow<'a, str>,
    /// [`FORMAT_VERSION`] when written.
    pub version: u32,
    /// The Flow plan id.
    pub plan_id: Cow<'a, str>,
    /// The Flow task id.
    pub task_id: Cow<'a, str>,
    /// The Flow task name, if given.
    pub task_name: Option<Cow<'a, str>>,
    /// Unique id of the kernel run.
    pub session_id: Cow<'a, str>,
}

impl<'a> TaskHead<'a> {
    /// The head of a record of type `kind` (this format version) of a task's session.
    pub fn new(
        kind: &'static str,
        plan_id: &'a str,
        task_id: &'a str,
        task_name: Option<&'a str>,
        session_id: &'a str,
    ) -> TaskHead<'a> {
        TaskHead {
            kind: Cow::Borrowed(kind),
            version: FORMAT_VERSION,
            plan_id: Cow::Borrowed(plan_id),
            task_id: Cow::Borrowed(task_id),
            task_name: task_name.map(Cow::Borrowed),
            session_id: Cow::Borrowed(session_id),
        }
    }
}

/// The fields every record of a cell starts with. The execution record spells them out
/// itself instead of flattening this: a flattened struct is buffered whole when read, and
/// execution records can hold megabytes of output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordHead<'a> {
    /// The type, version, plan, task and session.
    #[serde(flatten)]
    pub task: TaskHead<'a>,
    /// The cell the record is about.
    pub execution_count: u64,
}

/// One event of a cell, as a record of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord<'a> {
    /// `type: "event"` and the cell.
    #[serde(flatten)]
    pub head: RecordHead<'a>,
    /// The event (its fields at the top level).
    #[serde(flatten)]
    pub event: Cow<'a, Event>,
}

/// The `type` of a context record.
pub const RECORD_TYPE_CONTEXT: &str = "context";
/// The `type` of a session record.
pub const RECORD_TYPE_SESSION: &str = "session";

/// A kernel's start (`event: "start"`) or end (`event: "end"`): what ran the task's cells.
/// A kernel that ran no cell still leaves both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord<'a> {
    /// `type: "session"`, the version, plan, task and session.
    #[serde(flatten)]
    pub head: TaskHead<'a>,
    /// `start` or `end`.
    pub event: Cow<'a, str>,
    /// When, UTC ISO 8601 with milliseconds and `Z`.
    pub timestamp: Cow<'a, str>,
    /// The flowrepl version.
    pub kernel_version: Cow<'a, str>,
    /// `sys.version` of the session's Python.
    pub python_version: Cow<'a, str>,
    /// `sys.executable`.
    pub python_executable: Cow<'a, str>,
    /// Why that interpreter (`flag`, `virtual_env`, `own_venv`, `path`, `build`).
    pub python_source: Cow<'a, str>,
    /// `in_process` or `worker`.
    pub mode: Cow<'a, str>,
    /// `jsonrpc`, `mcp` or `dropin`.
    pub front: Cow<'a, str>,
    /// The kernel's process id.
    pub pid: u32,
    /// Worker mode: the worker's process id at that moment.
    #[serde(default)]
    pub worker_pid: Option<u32>,
    /// The limits in force.
    pub limits: SessionLimits,
    /// At the end: `eof` (stdin closed), `shutdown`, `signal` (SIGTERM/SIGHUP), `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Cow<'a, str>>,
    /// At the end: cells run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cells: Option<u64>,
    /// At the end: cells that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    /// At the end: how long the kernel ran, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// `--sandbox`: what the worker's sandbox enforces, layer by layer (docs/sandbox.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<flowrepl_protocol::sandbox::SandboxReport>,
}

/// The limits of a session, as configured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionLimits {
    /// Default cell timeout, ms.
    pub timeout_ms: u64,
    /// Output kept per stream and cell, bytes.
    pub max_output_bytes: u64,
    /// Longest request line, bytes.
    pub max_request_bytes: u64,
    /// Time a cell has to stop after SIGINT, ms.
    pub kill_grace_ms: u64,
    /// Worker mode: address-space limit, MB.
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// Worker mode: CPU seconds per cell.
    #[serde(default)]
    pub cpu_seconds: Option<u64>,
    /// Worker mode: RLIMIT_NPROC.
    #[serde(default)]
    pub max_procs: Option<u64>,
}

/// The task's context after a change (`flow.context.update`): the whole new context. A kernel
/// started later for the same task starts from the last one. `type` is its first field, so
/// that a backward scan can find these lines by their start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextRecord<'a> {
    /// `type: "context"` and the cell that changed it.
    #[serde(flatten)]
    pub head: RecordHead<'a>,
    /// That cell's start, UTC ISO 8601 with milliseconds and `Z`.
    pub timestamp: Cow<'a, str>,
    /// The whole context: a JSON object.
    pub context: flowrepl_protocol::EventData,
}

/// The `type` of a file record.
pub const RECORD_TYPE_FILE: &str = "file";

/// The `type` of an install record.
pub const RECORD_TYPE_INSTALL: &str = "install";

/// The `type` of an egress record.
pub const RECORD_TYPE_EGRESS: &str = "egress";

/// A client's transfer of a workspace file (`upload_file`, `download_file`, `delete_file`, over
/// JSON-RPC, MCP, a resource read or `serve`'s HTTP routes), or its refusal. Written by whoever
/// served it: the kernel, or `flowrepl serve` for a task whose kernel is stopped (its
/// `session_id` is then the server's id). See `docs/files.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord<'a> {
    /// `type: "file"`, the version, plan, task and session.
    #[serde(flatten)]
    pub head: TaskHead<'a>,
    /// When it ended, UTC ISO 8601 with milliseconds and `Z`.
    pub timestamp: Cow<'a, str>,
    /// `upload`, `download` or `delete`.
    pub op: Cow<'a, str>,
    /// The path the client named, relative to the workspace (at most 1024 characters kept).
    pub path: Cow<'a, str>,
    /// Bytes written or read (0 for a delete or a refusal).
    pub bytes: u64,
    /// SHA-256 of the bytes written or read, lowercase hex; absent for a delete or a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Cow<'a, str>>,
    /// How it came: `jsonrpc`, `mcp`, `resource` (an MCP `resources/read`) or `http`.
    pub via: Cow<'a, str>,
    /// How long it took, ms.
    pub elapsed_ms: f64,
    /// Why it was refused or failed; absent when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Cow<'a, str>>,
}

/// An installation into the task's package layer (`install_packages`, JSON-RPC `install`), or
/// the layer rebuilt from the last one (a kernel starting where the layer is missing), or its
/// refusal or failure. `type` is its first field, so that a backward scan finds the last one
/// by its start: a kernel on a fresh machine rebuilds the layer from it. See
/// `docs/packages.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstallRecord<'a> {
    /// `type: "install"`, the version, plan, task and session.
    #[serde(flatten)]
    pub head: TaskHead<'a>,
    /// When it ended, UTC ISO 8601 with milliseconds and `Z`.
    pub timestamp: Cow<'a, str>,
    /// `call` (a client asked) or `rebuild` (the kernel rebuilt a missing or different layer
    /// from the task's last install as it started).
    pub trigger: Cow<'a, str>,
    /// The requirements the call named (a rebuild: the layer's).
    pub requested: Vec<String>,
    /// The layer after it, `name==version` sorted by name (on a failure: the layer as it
    /// stayed). Every requirement the task asked for so far is resolved in it, apart from
    /// what the task's venv already had.
    pub resolved: Vec<String>,
    /// Of [`Self::resolved`], what this install added or changed.
    pub added: Vec<String>,
    /// Every requirement the task asked for so far (the layer is resolved from these).
    pub requirements: Vec<String>,
    /// The index the operator set (`--index-url`); absent: the installer's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<Cow<'a, str>>,
    /// `uv` or `pip`.
    pub installer: Cow<'a, str>,
    /// `cache`: resolved and installed from the shared cache alone, no index asked;
    /// `index`: the index was asked; `none`: nothing was resolved (a refusal).
    pub source: Cow<'a, str>,
    /// Imported modules the install replaced: they stay as imported until a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_needed: Vec<String>,
    /// How long it took, ms.
    pub elapsed_ms: f64,
    /// Why it was refused or failed; absent when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Cow<'a, str>>,
}

/// One connection a sandboxed cell asked the kernel's egress proxy for (`--sandbox-net=allow:…`),
/// allowed or refused, written when it ends; or, `via: "summary"`, the proxy's last record
/// when it ends, not a connection: the count of refused connections not recorded one by one
/// (`unrecorded`). See `docs/sandbox.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EgressRecord<'a> {
    /// `type: "egress"`, the version, plan, task and session.
    #[serde(flatten)]
    pub head: TaskHead<'a>,
    /// When the connection was accepted, UTC ISO 8601 with milliseconds and `Z`.
    pub timestamp: Cow<'a, str>,
    /// The name the cell asked for (lowercase; an address as written), at most 253
    /// characters; empty when no request arrived.
    pub host: Cow<'a, str>,
    /// The port it asked for (0 when no request arrived).
    pub port: u16,
    /// `connect` (an HTTP CONNECT tunnel: HTTPS, or anything else over TCP), `http` (a plain
    /// HTTP request the proxy forwarded), or `summary` (not a connection: the count of those
    /// not recorded, when the proxy ends).
    pub via: Cow<'a, str>,
    /// Whether the proxy let it through to the host (a refusal, a failed resolution or
    /// connection: false).
    pub allowed: bool,
    /// The rule that allowed it, as the rules in force write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<Cow<'a, str>>,
    /// The address the proxy connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Cow<'a, str>>,
    /// Bytes sent to the host from the cell's side: a plain HTTP request's head as the
    /// proxy forwarded it and its body (a tunnel: all of them).
    pub bytes_up: u64,
    /// Bytes from the host to the cell.
    pub bytes_down: u64,
    /// From accept to close, ms.
    pub duration_ms: f64,
    /// Why it was refused, or how it failed or was cut; absent when it ended normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Cow<'a, str>>,
    /// Connections since the previous egress record that were not recorded one by one (past
    /// the record budget, `docs/sandbox.md`); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unrecorded: u64,
    /// Bytes the cell sent past its plain HTTP request (the proxy forwards one request per
    /// connection), read and not forwarded; absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use crate::writer::tests_support::record_with;

    #[test]
    fn long_texts_are_written_as_serde_json_writes_them() {
        let long = format!(
            "{}\"quoted\" back\\slash\ttab\u{1}ctl 한국어 🐍\n",
            "line of output\n".repeat(400)
        );
        for stdout in ["", "short \"one\"\n", &long, &long[..4096]] {
            let mut rec = record_with(7, stdout);
            rec.stderr = long.as_str().into();
            rec.code = stdout.into();
            let fast = serde_json::to_string(&rec).unwrap();
            // Through a Value, every string is escaped by serde_json itself.
            let slow = serde_json::to_string(&serde_json::to_value(&rec).unwrap()).unwrap();
            assert_eq!(fast, slow);
            let back: crate::ExecutionRecord<'_> = serde_json::from_str(&fast).unwrap();
            assert_eq!(back, rec);
        }
    }
}
