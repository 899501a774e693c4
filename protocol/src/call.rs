//! The methods the kernel answers, as one enum with typed params.
//!
//! | method | params | result |
//! | --- | --- | --- |
//! | `execute_code` (alias `execute`) | [`ExecuteParams`] | [`crate::ExecuteResult`] |
//! | `status` (alias `ping`) | none | [`crate::StatusInfo`] |
//! | `interrupt` | none | `{"interrupted": bool}`: true if a running cell was sent SIGINT |
//! | `restart` | [`RestartParams`] (optional) | [`RestartReply`]: a fresh worker (worker mode) or a cleared namespace (in-process); with `restore: true` started from the automatic checkpoint |
//! | `list_variables` | none | `{"variables": [`[`crate::VariableInfo`]`], "count": int}`: the namespace's names, sorted |
//! | `shutdown` | none | `{"shutting_down": true}`, then the kernel exits 0 |
//! | `approve` | [`ApproveParams`] | [`ApproveReply`]: answers an `approval_requested` notification |
//! | `checkpoint` | [`CheckpointParams`] (optional) | [`CheckpointSummary`]: saves every name now |
//! | `restore` | [`CheckpointParams`] (optional) | [`RestoreReport`]: replaces the namespace with a checkpoint's |
//! | `checkpoints` | none | [`CheckpointsReply`]: the task's checkpoints |
//! | `upload_file` | [`UploadParams`] | [`FileInfo`]: a file written into the task's workspace |
//! | `download_file` | [`PathParams`] | [`Downloaded`]: a workspace file and its content |
//! | `list_files` | [`ListParams`] (optional) | [`Listing`]: a page of a workspace folder |
//! | `delete_file` | [`PathParams`] | [`Deleted`] |
//! | `install` | [`InstallParams`] | [`InstallReply`]: packages installed into the task's layer; the next cell imports them |
//!
//! `status`, `interrupt` and `approve` are answered at once even while a cell runs;
//! everything else is answered in order.

pub use crate::approval::{ApproveParams, ApproveReply};
use crate::checkpoint::{CheckpointParams, RestartParams, RestoreReport};
#[cfg(doc)]
use crate::checkpoint::{CheckpointSummary, CheckpointsReply};
#[cfg(doc)]
use crate::files::{Deleted, Downloaded, FileInfo, Listing};
use crate::files::{ListParams, PathParams, UploadParams};
use crate::jsonrpc::{ErrorCode, Request, RpcError};
use crate::packages::InstallParams;
#[cfg(doc)]
use crate::packages::InstallReply;
use serde::{Deserialize, Serialize};

/// A cell's timeout when neither the call nor the kernel's flags give one: 5 minutes.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;

/// Largest accepted `timeout_ms`: 7 days. Larger values get -32602.
pub const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;

/// Params of `execute_code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteParams {
    /// Python source of the cell. Runs in the session's persistent `__main__` namespace.
    pub code: String,
    /// Wall-clock limit for the cell, in milliseconds (1 ..= [`MAX_TIMEOUT_MS`]). When it
    /// passes, the cell gets `KeyboardInterrupt` and the result says `timed_out: true`.
    /// Absent: the kernel's default (`FLOWREPL_TIMEOUT_MS`, else 300000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The name an execute request used. Clients of the original `json_repl_session.py` call
/// `execute` and, in compatibility mode, get a failing cell as a JSON-RPC error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecuteMethod {
    /// `execute_code`.
    ExecuteCode,
    /// `execute` (the original REPL's name).
    Execute,
}

/// One request, typed: what to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `execute_code` / `execute`: run a cell.
    Execute(ExecuteParams, ExecuteMethod),
    /// `status` / `ping`: describe the kernel.
    Status,
    /// `interrupt`: stop the running cell with `KeyboardInterrupt`.
    Interrupt,
    /// `restart`: drop all state. Worker mode: kill the worker's process group and start a
    /// fresh worker. In-process: clear the `__main__` namespace (loaded modules stay).
    /// With `restore`, the fresh session starts from the automatic checkpoint.
    Restart(RestartParams),
    /// `list_variables`: the namespace's names with type, short repr and size.
    ListVariables,
    /// `shutdown`: reply, flush, exit 0.
    Shutdown,
    /// `approve`: a person's answer to a cell's `flow.request_approval`.
    Approve(ApproveParams),
    /// `checkpoint`: save every name now (to `auto`, or a named checkpoint).
    Checkpoint(CheckpointParams),
    /// `restore`: replace the namespace with a checkpoint's.
    Restore(CheckpointParams),
    /// `checkpoints`: list the task's checkpoints.
    Checkpoints,
    /// `upload_file`: write a file into the task's workspace.
    UploadFile(UploadParams),
    /// `download_file`: read a file of the task's workspace.
    DownloadFile(PathParams),
    /// `list_files`: a page of a folder of the task's workspace.
    ListFiles(ListParams),
    /// `delete_file`: remove a file of the task's workspace.
    DeleteFile(PathParams),
    /// `install`: install packages into the task's package layer.
    Install(InstallParams),
}

impl Call {
    /// Types a parsed request. Unknown methods get -32601, bad params -32602.
    pub fn from_request(req: &Request<'_>) -> Result<Call, RpcError> {
        match &*req.method {
            "execute_code" | "execute" => {
                let raw = req.params.ok_or_else(|| {
                    RpcError::new(
                        ErrorCode::InvalidParams,
                        "invalid params: `execute_code` needs params {\"code\": string}",
                    )
                })?;
                if !raw.get().starts_with('{') {
                    return Err(RpcError::new(
                        ErrorCode::InvalidParams,
                        "invalid params: `execute_code` params must be an object {\"code\": string}",
                    ));
                }
                let params: ExecuteParams = serde_json::from_str(raw.get()).map_err(|e| {
                    RpcError::new(
                        ErrorCode::InvalidParams,
                        format!("invalid params for `{}`: {e}", req.method),
                    )
                })?;
                if let Some(t) = params.timeout_ms {
                    if t == 0 || t > MAX_TIMEOUT_MS {
                        return Err(RpcError::new(
                            ErrorCode::InvalidParams,
                            format!("invalid params: timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, got {t}"),
                        ));
                    }
                }
                let method = if req.method == "execute" {
                    ExecuteMethod::Execute
                } else {
                    ExecuteMethod::ExecuteCode
                };
                Ok(Call::Execute(params, method))
            }
            "status" | "ping" => no_params(req, Call::Status),
            "shutdown" => no_params(req, Call::Shutdown),
            "interrupt" => no_params(req, Call::Interrupt),
            "restart" => optional_params(req, "{\"restore\"?: bool}").map(Call::Restart),
            "checkpoint" => optional_params(req, "{\"name\"?: string}").map(Call::Checkpoint),
            "restore" => optional_params(req, "{\"name\"?: string}").map(Call::Restore),
            "checkpoints" => no_params(req, Call::Checkpoints),
            "list_variables" => no_params(req, Call::ListVariables),
            "upload_file" => {
                required_params(req, "{\"path\": string, \"text\"?: string, \"base64\"?: string}")
                    .map(Call::UploadFile)
            }
            "download_file" => required_params(req, "{\"path\": string}").map(Call::DownloadFile),
            "delete_file" => required_params(req, "{\"path\": string}").map(Call::DeleteFile),
            "install" => required_params(req, "{\"packages\": [string]}").map(Call::Install),
            "list_files" => optional_params(
                req,
                "{\"path\"?: string, \"cursor\"?: string, \"limit\"?: int}",
            )
            .map(Call::ListFiles),
            "approve" => {
                let raw = req.params.map(|p| p.get()).unwrap_or("null");
                serde_json::from_str(raw).map(Call::Approve).map_err(|e| {
                    RpcError::new(
                        ErrorCode::InvalidParams,
                        format!("invalid params for `approve` (want {{\"approval_id\": string, \"approved\": bool, \"comment\"?: string}}): {e}"),
                    )
                })
            }
            other => Err(RpcError::new(
                ErrorCode::MethodNotFound,
                format!(
                    "method not found: {other:?} (methods: execute_code, execute, status, ping, interrupt, restart, list_variables, shutdown, approve, checkpoint, restore, checkpoints, upload_file, download_file, list_files, delete_file, install)"
                ),
            )),
        }
    }
}

/// The answer to `interrupt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptReply {
    /// A running cell was sent SIGINT.
    pub interrupted: bool,
}

/// The answer to `restart`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RestartReply {
    /// True when state was dropped.
    pub restarted: bool,
    /// The process that will run the next cell.
    pub pid: u32,
    /// True unless the namespace was restored whole (`restore: true`).
    pub state_lost: bool,
    /// What happened, for people.
    pub message: String,
    /// With `restore: true`: what came back (`restored`, `restored_vars`, `lost_vars`, ...).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<RestoreReport>,
}

/// The answer to `list_variables`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VariablesReply {
    /// How many.
    pub count: usize,
    /// Names in the session, sorted, without `__dunder__` names.
    pub variables: Vec<crate::VariableInfo>,
}

impl VariablesReply {
    /// The reply listing `variables`.
    pub fn new(variables: Vec<crate::VariableInfo>) -> VariablesReply {
        VariablesReply {
            count: variables.len(),
            variables,
        }
    }
}

/// The answer to `shutdown`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownReply {
    /// Always true: the kernel exits after this reply.
    pub shutting_down: bool,
}

/// Methods without params accept none, `null`, `{}` or `[]`.
fn no_params(req: &Request<'_>, call: Call) -> Result<Call, RpcError> {
    match req.params.map(|p| p.get().trim()) {
        None | Some("null") | Some("{}") | Some("[]") => Ok(call),
        Some(_) => Err(RpcError::new(
            ErrorCode::InvalidParams,
            format!("invalid params: `{}` takes no params", req.method),
        )),
    }
}

/// Params that may be absent (`null`, `{}`) or an object of type `T`.
fn optional_params<T: serde::de::DeserializeOwned + Default>(
    req: &Request<'_>,
    want: &str,
) -> Result<T, RpcError> {
    match req.params.map(|p| p.get().trim()) {
        None | Some("null") | Some("[]") => Ok(T::default()),
        Some(raw) => serde_json::from_str(raw).map_err(|e| {
            RpcError::new(
                ErrorCode::InvalidParams,
                format!("invalid params for `{}` (want {want}): {e}", req.method),
            )
        }),
    }
}

/// Params that must be an object of type `T`.
fn required_params<T: serde::de::DeserializeOwned>(
    req: &Request<'_>,
    want: &str,
) -> Result<T, RpcError> {
    let raw = req.params.map(|p| p.get().trim()).unwrap_or("null");
    serde_json::from_str(raw).map_err(|e| {
        RpcError::new(
            ErrorCode::InvalidParams,
            format!("invalid params for `{}` (want {want}): {e}", req.method),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(line: &str) -> Result<Call, RpcError> {
        Call::from_request(&Request::parse(line.as_bytes()).unwrap())
    }

    #[test]
    fn execute_and_alias() {
        let params = ExecuteParams {
            code: "x = 1".into(),
            timeout_ms: None,
        };
        assert_eq!(
            call(r#"{"id":1,"method":"execute_code","params":{"code":"x = 1"}}"#).unwrap(),
            Call::Execute(params.clone(), ExecuteMethod::ExecuteCode)
        );
        assert_eq!(
            call(r#"{"id":1,"method":"execute","params":{"code":"x = 1"}}"#).unwrap(),
            Call::Execute(params, ExecuteMethod::Execute)
        );
    }

    #[test]
    fn bad_params() {
        for line in [
            r#"{"id":1,"method":"execute_code"}"#,
            r#"{"id":1,"method":"execute_code","params":{"code":5}}"#,
            r#"{"id":1,"method":"execute_code","params":["x"]}"#,
            r#"{"id":1,"method":"execute_code","params":{"code":"x","timeout_ms":0}}"#,
            r#"{"id":1,"method":"execute_code","params":{"code":"x","timeout_ms":-5}}"#,
            r#"{"id":1,"method":"status","params":{"verbose":true}}"#,
            r#"{"id":1,"method":"approve"}"#,
            r#"{"id":1,"method":"approve","params":{"approval_id":"1-1"}}"#,
            r#"{"id":1,"method":"approve","params":{"approval_id":"1-1","approved":"yes"}}"#,
        ] {
            assert_eq!(
                call(line).unwrap_err().code,
                ErrorCode::InvalidParams,
                "{line}"
            );
        }
    }

    #[test]
    fn approve() {
        assert_eq!(
            call(r#"{"id":1,"method":"approve","params":{"approval_id":"2-1","approved":true}}"#)
                .unwrap(),
            Call::Approve(ApproveParams {
                approval_id: "2-1".into(),
                approved: true,
                comment: None
            })
        );
    }

    #[test]
    fn unknown_method() {
        let err = call(r#"{"id":1,"method":"exec"}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MethodNotFound);
    }

    #[test]
    fn status_aliases() {
        assert_eq!(call(r#"{"id":1,"method":"ping"}"#).unwrap(), Call::Status);
        assert_eq!(
            call(r#"{"id":1,"method":"status","params":{}}"#).unwrap(),
            Call::Status
        );
        assert_eq!(
            call(r#"{"id":1,"method":"shutdown","params":null}"#).unwrap(),
            Call::Shutdown
        );
    }
}
