//! Files in a task's workspace, for clients: the params and replies of `upload_file`,
//! `download_file`, `list_files` and `delete_file` (JSON-RPC methods and MCP tools of the same
//! names), and what the task log's `file` record says of a transfer.
//!
//! Paths are relative to the task's workspace (the sandbox's `--workspace`, or the kernel's
//! working directory unsandboxed): names separated by `/`, without `.`, `..`, empty parts or
//! NUL. The kernel resolves them beneath the workspace at open time (`flowrepl_os::beneath`):
//! nothing a cell plants there (a symbolic or hard link, a FIFO) leads outside. `docs/files.md`
//! has the whole story.

use serde::{Deserialize, Serialize};

/// Params of `upload_file`: the file's content as `text` (UTF-8) or `base64`, exactly one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UploadParams {
    /// Where, relative to the workspace (`data/input.csv`); missing folders are made. A file
    /// there is replaced whole (readers see the old or the new file, never half of one).
    pub path: String,
    /// The content as text (written as UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The content as base64 (standard alphabet, padding optional), for binary files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// Params of `download_file` and `delete_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PathParams {
    /// The file, relative to the workspace.
    pub path: String,
}

/// Params of `list_files`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ListParams {
    /// The folder, relative to the workspace; absent or empty: the workspace itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Where to go on: the `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Entries per page (1 to [`MAX_LIST_PAGE`], default [`LIST_PAGE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Entries in a `list_files` page when the call gives no `limit`.
pub const LIST_PAGE: u32 = 200;
/// The largest `limit` of `list_files`.
pub const MAX_LIST_PAGE: u32 = 1000;

/// A file written (`upload_file`) or read (`download_file`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FileInfo {
    /// The path, relative to the workspace.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// The SHA-256 of its content, lowercase hex.
    pub sha256: String,
    /// Its MIME type, guessed from its first bytes and its name.
    pub mime_type: String,
}

/// The answer to `download_file` on the JSON-RPC front: the file and its content, as `text`
/// when it is UTF-8, else as `base64`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downloaded {
    /// What was read.
    #[serde(flatten)]
    pub file: FileInfo,
    /// The content, when it is valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The content as base64 (standard alphabet, padded), when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// One entry of a `list_files` page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FileEntry {
    /// Its name. A name that is not UTF-8 (a cell can make one) is given readable, each byte
    /// outside a UTF-8 character as `\xNN`, and exactly in `name_base64`.
    pub name: String,
    /// The name's bytes, standard base64, present only when the name is not UTF-8 (`name` and
    /// `path` are then a readable form, not a path a request can name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_base64: Option<String>,
    /// Its path, relative to the workspace.
    pub path: String,
    /// `file`, `dir`, `symlink` (listed, never followed) or `other` (a FIFO, socket or
    /// device: never read).
    pub kind: String,
    /// Its size in bytes (a link's: the length of its target's name).
    pub bytes: u64,
    /// When it last changed, UTC ISO 8601 with seconds and `Z`.
    pub mtime: String,
}

/// The answer to `list_files`: one page of a folder's entries, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Listing {
    /// The folder listed (`""`: the workspace).
    pub path: String,
    /// The page's entries.
    pub entries: Vec<FileEntry>,
    /// The cursor of the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The answer to `delete_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Deleted {
    /// The path removed.
    pub path: String,
    /// Always true (a file that is not there is an error).
    pub deleted: bool,
}
