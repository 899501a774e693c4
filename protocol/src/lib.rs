//! Wire types of flowrepl. No processes, no Python: only what travels on the wire.
//!
//! # Layout
//! - [`jsonrpc`]: the JSON-RPC 2.0 envelope: parsing one request line into a [`jsonrpc::Request`],
//!   responses, notifications, and the standard error codes.
//! - [`approval`]: a cell's request for approval and its answer.
//! - [`call`]: the methods the kernel answers, as one enum ([`call::Call`]) with typed params,
//!   and their replies.
//! - [`execute`]: the result of `execute_code` ([`execute::ExecuteResult`]).
//! - [`files`]: files in a task's workspace: `upload_file`, `download_file`, `list_files`,
//!   `delete_file`.
//! - [`fault`]: the `error.type`s of cells that failed outside Python ([`fault::Fault`]).
//! - [`checkpoint`]: checkpoints of the namespace: `checkpoint`, `restore`, `checkpoints`, and
//!   how a restore is reported.
//! - [`status`]: the answer to `status` and the params of the `ready` notification.
//! - [`frame`]: the length-prefixed kernel ↔ worker pipe protocol (worker mode).
//! - [`limits`]: default limits, shared by the kernel's flags and the worker's.
//! - [`json`]: a fast writer for `execute_code` replies (same bytes as serde_json).
//!
//! # Wire format (front protocol)
//! One JSON object per line, UTF-8, `\n`-terminated, on stdin (requests) and stdout (replies).
//! Nothing else is ever written to stdout. The full description, with examples, lives in
//! `docs/protocol.md`; each type below documents its own fields. Objects may gain fields over
//! time; clients must ignore fields they do not know.
#![warn(missing_docs)]

pub mod approval;
pub mod call;
pub mod checkpoint;
pub mod execute;
pub mod fault;
pub mod files;
pub mod frame;
pub mod json;
pub mod jsonrpc;
pub mod limits;
pub mod packages;
pub mod sandbox;
pub mod status;

pub use approval::{ApprovalAnswer, ApprovalOutcome, ApprovalRequest};
pub use call::{
    ApproveParams, ApproveReply, Call, ExecuteMethod, ExecuteParams, InterruptReply, RestartReply,
    ShutdownReply, VariablesReply,
};
pub use checkpoint::{
    CheckpointFailure, CheckpointHealth, CheckpointInfo, CheckpointParams, CheckpointPolicy,
    CheckpointSummary, CheckpointsReply, RestartParams, RestoreReport, AUTO_CHECKPOINT,
};
pub use execute::{
    CellEvent, CellReport, DebugInfo, Event, EventData, ExecError, ExecuteResult, ExecutionKind,
    Image, ImageInfo, Mode, PhaseTimings, ResourceUsage, StoppedBy, VariableInfo,
};
pub use fault::Fault;
pub use jsonrpc::{ErrorCode, Id, Request, RpcError};
pub use status::{PythonInfo, StatusInfo, StoreStatus, TakenOver, READY_MARKER};
