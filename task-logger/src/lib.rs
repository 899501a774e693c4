//! The per-task execution log of flowrepl.
//!
//! Every `execute_code` call appends one JSON line to
//! `<log_dir>/<plan_id>/<task_id>.jsonl` (see [`path`] for how ids become safe names).
//! The log is meant to be read by people with jq, pandas or DuckDB, and by [`reader`].
//!
//! # Layout
//! - [`record`]: [`ExecutionRecord`], its fields and the format version.
//! - `schema` (feature `schema`): the records' JSON Schemas, generated from their types.
//! - [`path`]: ids → file names that cannot escape `log_dir` or collide.
//! - [`writer`]: [`TaskLog`], one `write(2)` of one whole line per record, O_APPEND, 0600;
//!   failures are returned, never panicked on, and the file is reopened on the next record.
//! - [`reader`]: reads a log, skipping lines that are torn or not records.
//! - [`checkpoint`]: namespace checkpoints beside the log (`<task>.checkpoints/`), and the one
//!   reader of their journal.
//! - [`untrusted`]: opening files in folders a cell can write (no symlinks, regular files,
//!   bounded reads).
#![warn(missing_docs)]

pub mod checkpoint;
mod name_watch;
pub mod path;
pub mod reader;
pub mod record;
#[cfg(feature = "schema")]
pub mod schema;
pub mod untrusted;
pub mod writer;

pub use path::{safe_component, task_log_path, PLAN_ID_ENV, TASK_ID_ENV, TASK_NAME_ENV};
pub use reader::{
    context_path, for_each_line, last_context, last_line, load_context, parse_line, read_records,
    save_context, ReadOutcome, Record, SkippedLine,
};
pub use record::{
    ContextRecord, EgressRecord, EventRecord, ExecutionRecord, FileRecord, InstallRecord,
    RecordHead, SessionLimits, SessionRecord, TaskHead, FORMAT_VERSION, RECORD_TYPE_CONTEXT,
    RECORD_TYPE_EGRESS, RECORD_TYPE_EVENT, RECORD_TYPE_EXECUTION, RECORD_TYPE_FILE,
    RECORD_TYPE_INSTALL, RECORD_TYPE_SESSION,
};
pub use writer::{LogError, TaskLog};
