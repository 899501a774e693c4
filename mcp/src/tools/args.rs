//! The tools' argument types, parsed strictly (a bad argument is -32602), and `interrupt`'s
//! result.

use crate::store::StreamName;
use flowrepl_protocol::call::MAX_TIMEOUT_MS;
use flowrepl_protocol::CheckpointParams;
use rmcp::model::JsonObject;
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Arguments of `execute_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteArgs {
    /// Python source to run in the session, as in a notebook cell.
    pub code: String,
    /// Stop the cell with KeyboardInterrupt after this many milliseconds (variables are
    /// kept). Default: the kernel's (FLOWREPL_TIMEOUT_MS, 300000).
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: Option<u64>,
    /// Answer after this many seconds if the cell is still running: `running: true`, its
    /// `cell` id and the output so far; the cell goes on and `wait_cell` collects it.
    /// Default: the server's (FLOWREPL_MCP_WAIT_S, 50).
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 86400.0))]
    pub wait_s: Option<f64>,
}

/// Arguments of `wait_cell`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitCellArgs {
    /// The cell, as a `running: true` result named it.
    pub cell: u64,
    /// Answer after this many seconds if it is still running (again `running: true`).
    /// Default: the server's (FLOWREPL_MCP_WAIT_S, 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 86400.0))]
    pub wait_s: Option<f64>,
}

/// Arguments of `interrupt`.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterruptArgs {
    /// Stop this cell (an id from a `running: true` result) rather than whichever runs now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<u64>,
}

/// Arguments as a tool call carries them (a JSON object).
pub fn arguments<T: Serialize>(args: &T) -> JsonObject {
    match serde_json::to_value(args) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => JsonObject::new(),
    }
}

/// How long a call waits: its `wait_s`, else the server's.
pub(super) fn wait_for(wait_s: Option<f64>, default: Duration) -> Result<Duration, ErrorData> {
    match wait_s {
        None => Ok(default),
        Some(s) if (0.0..=86_400.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(ErrorData::invalid_params(
            format!("wait_s must be between 0 and 86400, not {s}"),
            None,
        )),
    }
}

/// Arguments of `read_output`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadOutputArgs {
    /// The cell (`execution_count` of its result, the n of `Out[n]`).
    pub execution_count: u64,
    /// Which part: `stdout`, `stderr` or `result`.
    pub stream: StreamName,
    /// First character to return (the offset the cut marker names). Default 0.
    #[serde(default)]
    pub offset: usize,
    /// Characters to return; at most the output budget (FLOWREPL_MCP_MAX_CHARS), which is
    /// also the default.
    #[serde(default)]
    pub length: Option<usize>,
}

/// `interrupt`'s structured result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InterruptOut {
    /// True when a cell was running and was sent KeyboardInterrupt (or, given `cell`, was
    /// still queued and is dropped).
    pub interrupted: bool,
    /// What happens next.
    pub message: String,
}

/// Arguments that do not fit the tool's input schema are a JSON-RPC error (-32602), not a
/// tool result: rmcp's `Parameters` would turn them into an `isError` result.
pub(super) fn parse_args<T: serde::de::DeserializeOwned>(args: JsonObject) -> Result<T, ErrorData> {
    serde_json::from_value(serde_json::Value::Object(args))
        .map_err(|e| ErrorData::invalid_params(format!("invalid arguments: {e}"), None))
}

/// The arguments of `checkpoint` and `restore_checkpoint`; a bad name is a bad argument.
pub(super) fn checkpoint_args(args: JsonObject) -> Result<CheckpointParams, ErrorData> {
    let p: CheckpointParams = parse_args(args)?;
    if let Some(name) = &p.name {
        flowrepl_task_logger::checkpoint::check_name(name)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
    }
    Ok(p)
}
