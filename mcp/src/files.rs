//! The file tools (`upload_file`, `download_file`, `list_files`, `delete_file`), the
//! `flowrepl://files/{plan}/{task}/{path}` resources, and the URIs of a cell's whole output
//! (`flowrepl://output/…`, read from [`crate::store`]). Files are a task's
//! [`flowrepl_files::Workspace`]: the kernel's MCP server calls these for its own task,
//! `flowrepl serve` for any of its tasks (with the kernel stopped too). The work is blocking
//! file I/O: callers run it off their async threads.

use crate::tools::{error_text, structured};
use base64::Engine as _;
use flowrepl_files::{mime, FileError, Via, Workspace};
use flowrepl_protocol::files::{FileInfo, ListParams, PathParams, UploadParams};
use rmcp::model::{
    CallToolResult, ContentBlock, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
};
use rmcp::ErrorData;
use serde::Serialize;

/// The tool names (each the `name` of its `#[tool]` in [`crate::tools`]).
pub const UPLOAD_FILE: &str = "upload_file";
/// See [`UPLOAD_FILE`].
pub const DOWNLOAD_FILE: &str = "download_file";
/// See [`UPLOAD_FILE`].
pub const LIST_FILES: &str = "list_files";
/// See [`UPLOAD_FILE`].
pub const DELETE_FILE: &str = "delete_file";
/// The file tools.
pub const TOOLS: [&str; 4] = [UPLOAD_FILE, DOWNLOAD_FILE, LIST_FILES, DELETE_FILE];

/// The scheme and kind of a workspace file's URI.
pub const FILES_URI: &str = "flowrepl://files/";
/// The resource template of workspace files.
pub const FILES_TEMPLATE: &str = "flowrepl://files/{plan}/{task}/{path}";

/// The scheme and kind of a cell's whole output (a stream the budget cut, or a figure past
/// `--max-images`): `flowrepl://output/{plan}/{task}/{cell}/{stdout|stderr|result|figure-N}`.
pub const OUTPUT_URI: &str = "flowrepl://output/";

/// The largest file `download_file` puts in its answer (an image, a blob, or text within the
/// output budget); larger ones are answered with a `resource_link`.
pub const INLINE_MAX_BYTES: u64 = 1 << 20;
/// The largest file a `resources/read` answers with (bigger: `serve`'s `GET /files/…`).
pub const READ_MAX_BYTES: u64 = 64 << 20;
/// Resources per `resources/list` page.
const RESOURCES_PAGE: u32 = 200;

/// A task, as resource URIs name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRef {
    /// The plan id.
    pub plan: String,
    /// The task id.
    pub task: String,
}

impl TaskRef {
    /// The URI of the workspace file at `path`.
    pub fn uri(&self, path: &str) -> String {
        let segments: Vec<String> = path.split('/').map(encode).collect();
        format!(
            "{FILES_URI}{}/{}/{}",
            encode(&self.plan),
            encode(&self.task),
            segments.join("/")
        )
    }
}

impl TaskRef {
    /// The URI of `part` (`stdout`, `stderr`, `result`, `figure-N`) of cell `cell`'s output.
    pub fn output_uri(&self, cell: u64, part: &str) -> String {
        format!(
            "{OUTPUT_URI}{}/{}/{cell}/{part}",
            encode(&self.plan),
            encode(&self.task)
        )
    }
}

/// Splits a `flowrepl://output/{plan}/{task}/{cell}/{part}` URI.
pub fn parse_output_uri(uri: &str) -> Result<(TaskRef, u64, String), ErrorData> {
    let bad = || {
        let shown: String = uri.chars().take(200).collect();
        ErrorData::invalid_params(
            format!("{shown:?} is not a flowrepl output URI ({OUTPUT_URI}{{plan}}/{{task}}/{{cell}}/{{part}})"),
            None,
        )
    };
    let rest = uri.strip_prefix(OUTPUT_URI).ok_or_else(bad)?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [plan, task, cell, part] = parts[..] else {
        return Err(bad());
    };
    Ok((
        TaskRef {
            plan: decode(plan).ok_or_else(bad)?,
            task: decode(task).ok_or_else(bad)?,
        },
        cell_number(cell).ok_or_else(bad)?,
        part.to_owned(),
    ))
}

/// A cell number as links write it: ASCII digits, no sign, no leading zero (`0` alone is
/// a number; `01`, `+1`, ` 1` are not: one cell has one link).
fn cell_number(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// Splits a `flowrepl://files/{plan}/{task}/{path}` URI (percent-decoded).
pub fn parse_uri(uri: &str) -> Result<(TaskRef, String), ErrorData> {
    let bad = |why: &str| {
        let shown: String = uri.chars().take(200).collect();
        ErrorData::invalid_params(format!("{shown:?}: {why} (want {FILES_TEMPLATE})"), None)
    };
    let rest = uri
        .strip_prefix(FILES_URI)
        .ok_or_else(|| bad("not a flowrepl file URI"))?;
    let mut parts = rest.splitn(3, '/');
    let (Some(plan), Some(task), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("no path after the plan and task"));
    };
    let decode = |s: &str| decode(s).ok_or_else(|| bad("bad percent-encoding"));
    let path = path
        .split('/')
        .map(decode)
        .collect::<Result<Vec<_>, _>>()?
        .join("/");
    Ok((
        TaskRef {
            plan: decode(plan)?,
            task: decode(task)?,
        },
        path,
    ))
}

/// Percent-encodes all but unreserved characters (RFC 3986).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A refused operation as a tool result (the kernel and the workspace stay as they were).
pub fn refused(e: &FileError) -> CallToolResult {
    error_text(e.to_string())
}

/// `upload_file`.
pub fn upload(ws: &Workspace, args: &UploadParams) -> CallToolResult {
    match ws.upload_params(args, Via::Mcp) {
        Ok(info) => {
            let text = format!(
                "wrote {} ({} bytes, {}, sha256 {})",
                info.path, info.bytes, info.mime_type, info.sha256
            );
            structured(text, &info, false)
        }
        Err(e) => refused(&e),
    }
}

/// `download_file`'s structured result.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DownloadOut {
    /// The file (`sha256` is empty when the answer is a link: the bytes were not read).
    #[serde(flatten)]
    pub file: FileInfo,
    /// How the content is given: `text`, `image`, `blob` (an embedded resource) or `link`
    /// (a `resource_link` to read with `resources/read`).
    pub delivered: String,
    /// The file's resource URI.
    pub uri: String,
}

/// `download_file`: small text within `max_chars`, images and other files up to
/// [`INLINE_MAX_BYTES`] in the answer; anything else as a `resource_link`.
pub fn download(
    ws: &Workspace,
    task: &TaskRef,
    args: &PathParams,
    max_chars: usize,
) -> CallToolResult {
    let uri = task.uri(&args.path);
    let (size, mime) = match ws.peek(&args.path, Via::Mcp) {
        Ok(p) => p,
        Err(e) => return refused(&e),
    };
    let text_fits = mime::is_text(mime) && size <= max_chars as u64;
    if size <= INLINE_MAX_BYTES && (text_fits || !mime::is_text(mime)) {
        let (file, bytes) = match ws.read_all(&args.path, INLINE_MAX_BYTES, Via::Mcp) {
            Ok(r) => r,
            Err(e) => return refused(&e),
        };
        let head = format!(
            "{} ({} bytes, {}, sha256 {})",
            file.path, file.bytes, file.mime_type, file.sha256
        );
        let (delivered, content) = match String::from_utf8(bytes) {
            Ok(text) if text_fits && text.chars().count() <= max_chars => {
                ("text", vec![ContentBlock::text(format!("{head}:\n{text}"))])
            }
            Ok(text) => (
                "blob",
                vec![
                    ContentBlock::text(head),
                    ContentBlock::resource(
                        ResourceContents::text(text, uri.clone()).with_mime_type(mime),
                    ),
                ],
            ),
            Err(e) => {
                let data = base64::engine::general_purpose::STANDARD.encode(e.as_bytes());
                if mime::is_image(mime) {
                    (
                        "image",
                        vec![ContentBlock::text(head), ContentBlock::image(data, mime)],
                    )
                } else {
                    (
                        "blob",
                        vec![
                            ContentBlock::text(head),
                            ContentBlock::resource(
                                ResourceContents::blob(data, uri.clone()).with_mime_type(mime),
                            ),
                        ],
                    )
                }
            }
        };
        let out = DownloadOut {
            file,
            delivered: delivered.into(),
            uri,
        };
        let mut r = CallToolResult::success(content);
        r.structured_content = serde_json::to_value(&out).ok();
        r.is_error = Some(false);
        return r;
    }
    let name = args
        .path
        .rsplit('/')
        .next()
        .unwrap_or(&args.path)
        .to_owned();
    let mut link = Resource::new(uri.clone(), name);
    link.mime_type = Some(mime.to_owned());
    link.size = Some(size);
    let out = DownloadOut {
        file: FileInfo {
            path: args.path.clone(),
            bytes: size,
            sha256: String::new(),
            mime_type: mime.to_owned(),
        },
        delivered: "link".into(),
        uri: uri.clone(),
    };
    let text = format!(
        "{} is {size} bytes ({mime}): too large to put in this answer. Read it with resources/read {uri}{}.",
        args.path,
        if size > READ_MAX_BYTES {
            " (up to 64 MiB) or over HTTP from flowrepl serve (GET /files/<plan>/<task>/<path>)"
        } else {
            ""
        }
    );
    let mut r = CallToolResult::success(vec![
        ContentBlock::text(text),
        ContentBlock::resource_link(link),
    ]);
    r.structured_content = serde_json::to_value(&out).ok();
    r.is_error = Some(false);
    r
}

/// `list_files`.
pub fn list(ws: &Workspace, args: &ListParams) -> CallToolResult {
    match ws.list(args) {
        Ok(page) => {
            let mut text = format!(
                "{} ({} entries{}):",
                if page.path.is_empty() {
                    "the workspace"
                } else {
                    &page.path
                },
                page.entries.len(),
                if page.next_cursor.is_some() {
                    ", more with next_cursor"
                } else {
                    ""
                }
            );
            for e in &page.entries {
                text.push_str(&format!(
                    "\n{} {} {} bytes {}",
                    e.kind, e.path, e.bytes, e.mtime
                ));
            }
            structured(text, &page, false)
        }
        Err(e) => refused(&e),
    }
}

/// `list_files` of a task that has no workspace yet (`serve`, before anything was written for
/// it): the workspace is empty; a folder in it does not exist (`e` says why).
pub fn list_empty(path: Option<&str>, e: &FileError) -> CallToolResult {
    let folder = path.unwrap_or("").trim_end_matches('/');
    if !folder.is_empty() {
        return refused(e);
    }
    let page = flowrepl_protocol::files::Listing {
        path: String::new(),
        entries: Vec::new(),
        next_cursor: None,
    };
    structured("the workspace (0 entries):".into(), &page, false)
}

/// `delete_file`.
pub fn delete(ws: &Workspace, args: &PathParams) -> CallToolResult {
    match ws.delete(&args.path, Via::Mcp) {
        Ok(d) => structured(format!("deleted {}", d.path), &d, false),
        Err(e) => refused(&e),
    }
}

/// `resources/read` of a workspace file: text, or a blob with its MIME type.
pub fn read(ws: &Workspace, uri: &str, path: &str) -> Result<ReadResourceResult, ErrorData> {
    let (file, bytes) = ws
        .read_all(path, READ_MAX_BYTES, Via::Resource)
        .map_err(|e| resource_error(&e))?;
    let mut meta = rmcp::model::JsonObject::new();
    meta.insert("size".into(), file.bytes.into());
    meta.insert("sha256".into(), file.sha256.clone().into());
    let meta = rmcp::model::MetaObject(meta);
    let contents = match String::from_utf8(bytes) {
        Ok(text) if mime::is_text(&file.mime_type) || file.mime_type == "text/plain" => {
            ResourceContents::TextResourceContents {
                uri: uri.to_owned(),
                mime_type: Some(file.mime_type.clone()),
                text,
                meta: Some(meta),
            }
        }
        Ok(text) => ResourceContents::BlobResourceContents {
            uri: uri.to_owned(),
            mime_type: Some(file.mime_type.clone()),
            blob: base64::engine::general_purpose::STANDARD.encode(text.as_bytes()),
            meta: Some(meta),
        },
        Err(e) => ResourceContents::BlobResourceContents {
            uri: uri.to_owned(),
            mime_type: Some(file.mime_type.clone()),
            blob: base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
            meta: Some(meta),
        },
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

/// A refused read as an MCP error: -32002 (resource not found) for nothing there, -32602 for
/// the rest.
pub fn resource_error(e: &FileError) -> ErrorData {
    match e.kind() {
        flowrepl_files::Kind::NotFound => ErrorData::resource_not_found(e.to_string(), None),
        flowrepl_files::Kind::Internal | flowrepl_files::Kind::Unsupported => {
            ErrorData::internal_error(e.to_string(), None)
        }
        _ => ErrorData::invalid_params(e.to_string(), None),
    }
}

/// `resources/list`: the task's workspace files, a page at a time (cursor: the last path).
pub fn resources(
    ws: &Workspace,
    task: &TaskRef,
    cursor: Option<&str>,
) -> (Vec<Resource>, Option<String>) {
    let (files, next) = ws.walk(cursor, RESOURCES_PAGE);
    let listed = files
        .into_iter()
        .map(|f| {
            let name = f.path.rsplit('/').next().unwrap_or(&f.path).to_owned();
            let mut r = Resource::new(task.uri(&f.path), name);
            r.title = Some(f.path.clone());
            r.mime_type = Some(mime::guess(&f.path, &[]).to_owned());
            r.size = Some(f.bytes);
            r
        })
        .collect();
    (listed, next)
}

/// `resources/templates/list`: the template of workspace files.
pub fn templates() -> rmcp::model::ListResourceTemplatesResult {
    rmcp::model::ListResourceTemplatesResult::with_all_items(vec![template()])
}

/// The resource template of workspace files.
pub fn template() -> ResourceTemplate {
    let mut t = ResourceTemplate::new(FILES_TEMPLATE, "workspace-file");
    t.title = Some("A file in a task's workspace".into());
    t.description = Some("Any file of a task's workspace, by plan id, task id and path relative to the workspace (each percent-encoded; '/' between the path's names). Text files are read as text, others as a blob with their MIME type; _meta holds size and sha256.".into());
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip() {
        let t = TaskRef {
            plan: "p 1/x".into(),
            task: "t%".into(),
        };
        let uri = t.uri("data/a b.csv");
        assert_eq!(uri, "flowrepl://files/p%201%2Fx/t%25/data/a%20b.csv");
        assert_eq!(
            parse_uri(&uri).unwrap(),
            (t.clone(), "data/a b.csv".to_owned())
        );
        assert!(parse_uri("flowrepl://files/p/t").is_err());
        assert!(parse_uri("file:///etc/passwd").is_err());
        assert!(parse_uri("flowrepl://files/p/t/%zz").is_err());
        let out = t.output_uri(7, "stdout");
        assert_eq!(parse_output_uri(&out).unwrap(), (t, 7, "stdout".to_owned()));
        assert!(parse_output_uri("flowrepl://output/p/t/x/stdout").is_err());
        // One cell, one spelling: no sign, no leading zero, digits only.
        for bad in [
            "01",
            "+1",
            "-1",
            " 1",
            "1 ",
            "",
            "١",
            "0x1",
            "18446744073709551616",
        ] {
            let uri = format!("flowrepl://output/p/t/{bad}/stdout");
            assert!(
                parse_output_uri(&uri).is_err(),
                "{bad:?} was read as a cell"
            );
            // What the plain parse accepted (the check left out).
            if bad == "01" || bad == "+1" {
                assert_eq!(bad.parse::<u64>().unwrap(), 1);
            }
        }
        for (good, n) in [("0", 0), ("1", 1), ("10", 10), ("907", 907)] {
            let uri = format!("flowrepl://output/p/t/{good}/stdout");
            assert_eq!(parse_output_uri(&uri).unwrap().1, n);
        }
    }
}
