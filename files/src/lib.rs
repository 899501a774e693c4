//! A task's workspace files for clients: upload, download, list and delete, each confined
//! beneath the workspace, within the limits, and recorded in the task log.
//!
//! Every front uses this crate: the stdio kernel's JSON-RPC methods and MCP tools
//! (`flowrepl_protocol::files` has their params and replies), MCP `resources/read` of
//! `flowrepl://files/…`, and `flowrepl serve`'s MCP tools and streamed HTTP routes, which work
//! while the task's kernel is stopped: files are the workspace's, not the kernel's.
//!
//! # Confinement
//! Paths are resolved by [`flowrepl_os::beneath`]: `openat2` beneath the workspace's
//! descriptor with no symbolic link followed anywhere on the way, the opened file checked on
//! its descriptor (a regular file with one link; FIFOs and devices are never read). A cell can
//! plant links, FIFOs and hard links in the workspace, or swap a file for a link between two
//! calls: none of it leads a client outside. flowrepl's own folder ([`OWN_FOLDER`], which
//! holds the task log and checkpoints when the log folder is left at its default under the
//! working directory) and the log folder, when it lies inside the workspace, are not the
//! workspace's files: paths into them are refused.
//!
//! # Writes
//! An upload goes to a temporary name beside its target and is renamed over it when its last
//! byte is written (a cell never sees half a file; a failed or cut upload leaves nothing). Its
//! size is checked against [`Limits::max_file_bytes`] and the room left under
//! [`Limits::max_workspace_bytes`] as the bytes come, so an over-long stream is refused at the
//! first byte past the limit, and nothing is written.
//!
//! # Records
//! With a [`Recorder`], each operation but a listing leaves one `file` record (op, path,
//! bytes, SHA-256, via, elapsed, error): refusals too, so a task's log shows what was tried.

pub mod mime;
mod record;

pub use record::{Op, Recorder, Via};

use base64::Engine as _;
pub use flowrepl_os::beneath::shown;
use flowrepl_os::beneath::{Beneath, BeneathError, Writing};
use flowrepl_protocol::files::{
    Deleted, Downloaded, FileEntry, FileInfo, ListParams, Listing, UploadParams, LIST_PAGE,
    MAX_LIST_PAGE,
};
use record::Entry;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// flowrepl's own folder in a working directory (the default log folder is under it): never
/// one of the workspace's files.
pub const OWN_FOLDER: &str = ".flowrepl";

/// How deep the walks go.
const MAX_DEPTH: usize = 64;
/// The most files [`Workspace::walk`] looks at.
pub const MAX_WALKED: usize = 100_000;

/// The limits of transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest file uploaded or downloaded (`--max-file-bytes`).
    pub max_file_bytes: u64,
    /// The most bytes the workspace may hold after an upload (`--max-workspace-mb`); 0: no cap.
    pub max_workspace_bytes: u64,
}

/// Why an operation was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The path was refused or names nothing usable (see [`BeneathError`]).
    #[error(transparent)]
    Path(#[from] BeneathError),
    /// The path leads into flowrepl's own folder or the task log's.
    #[error(
        "{0:?} is flowrepl's own (the task log and checkpoints), not one of the workspace's files"
    )]
    Own(String),
    /// The file is larger than `--max-file-bytes`.
    #[error("{path:?}: over the limit of {limit} bytes per file (--max-file-bytes); nothing was written or sent")]
    TooBig {
        /// The path.
        path: String,
        /// The limit.
        limit: u64,
    },
    /// The file is within `--max-file-bytes` but larger than one message may carry.
    #[error("{path:?}: larger than the {limit} bytes one answer carries here; take it over HTTP instead (flowrepl serve: GET /files/<plan>/<task>/<path>)")]
    TooBigForOneMessage {
        /// The path.
        path: String,
        /// What one message carries.
        limit: u64,
    },
    /// The upload would take the workspace past its cap.
    #[error("{path:?}: the workspace holds {used} bytes and may hold {cap} (--max-workspace-mb); this file does not fit, and nothing was written")]
    WorkspaceFull {
        /// The path.
        path: String,
        /// Bytes in the workspace before the upload.
        used: u64,
        /// The cap.
        cap: u64,
    },
    /// `upload_file` without exactly one valid content.
    #[error("{0}")]
    Content(String),
    /// The task has no workspace (`flowrepl serve`: nothing was ever written for it), and the
    /// operation does not make one.
    #[error("task {task:?} of plan {plan:?} does not exist here (it has no workspace)")]
    NoTask {
        /// The plan (as messages show it).
        plan: String,
        /// The task (as messages show it).
        task: String,
    },
    /// The file system failed while the bytes moved.
    #[error("{path:?}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// What kind of failure an error is, for a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The request itself is wrong (a bad path or content).
    BadRequest,
    /// The path leads somewhere it may not (outside, through a link, a hard link, our own).
    Forbidden,
    /// Nothing is there.
    NotFound,
    /// Something other than a regular file is there.
    Conflict,
    /// Over the per-file limit.
    TooLarge,
    /// Over the workspace's cap.
    Full,
    /// The host cannot confine paths (no `openat2`).
    Unsupported,
    /// The file system failed.
    Internal,
}

impl FileError {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            FileError::Path(BeneathError::BadPath(_) | BeneathError::TooLong(_))
            | FileError::Content(_) => Kind::BadRequest,
            FileError::NoTask { .. } => Kind::NotFound,
            FileError::Path(BeneathError::Escapes(_) | BeneathError::HardLinked(_))
            | FileError::Own(_) => Kind::Forbidden,
            FileError::Path(BeneathError::NotFound(_)) => Kind::NotFound,
            FileError::Path(BeneathError::NotAFile(_)) => Kind::Conflict,
            FileError::TooBig { .. } | FileError::TooBigForOneMessage { .. } => Kind::TooLarge,
            FileError::WorkspaceFull { .. } => Kind::Full,
            FileError::Path(BeneathError::Unsupported) => Kind::Unsupported,
            FileError::Path(_) | FileError::Io { .. } => Kind::Internal,
        }
    }
}

/// A task's workspace, as clients reach it.
#[derive(Debug)]
pub struct Workspace {
    dir: Beneath,
    /// Relative paths (`/`-separated) that are not the workspace's files.
    own: Vec<String>,
    limits: Limits,
    recorder: Option<Arc<Recorder>>,
    /// Touched after every change ([`flowrepl_task_logger::path::workspace_marker`]).
    marker: Option<PathBuf>,
}

impl Workspace {
    /// The workspace folder `root` (which must exist). `log_dir`: the log folder, left out
    /// when it lies inside. Records go to `recorder`, if any; `marker` is touched after every
    /// upload and delete.
    pub fn open(
        root: &Path,
        log_dir: Option<&Path>,
        limits: Limits,
        recorder: Option<Arc<Recorder>>,
        marker: Option<PathBuf>,
    ) -> Result<Workspace, FileError> {
        let dir = Beneath::open(root)?;
        let mut own = vec![OWN_FOLDER.to_owned()];
        if let Some(inside) = log_dir
            .and_then(|l| l.strip_prefix(root).ok())
            .and_then(Path::to_str)
            .filter(|p| !p.is_empty())
        {
            own.push(inside.trim_end_matches('/').to_owned());
        }
        Ok(Workspace {
            dir,
            own,
            limits,
            recorder,
            marker,
        })
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Refuses a bad path, or one into flowrepl's own folders.
    fn checked(&self, path: &str) -> Result<(), FileError> {
        flowrepl_os::beneath::check(path)?;
        let own = self.own.iter().any(|o| {
            path == o
                || path
                    .strip_prefix(o.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        });
        if own {
            return Err(FileError::Own(shown(path)));
        }
        Ok(())
    }

    fn record(&self, e: Entry<'_>) {
        if let Some(r) = &self.recorder {
            r.write(e);
        }
    }

    fn refused<T>(
        &self,
        op: Op,
        path: &str,
        via: Via,
        started: Instant,
        e: FileError,
    ) -> Result<T, FileError> {
        self.record(Entry {
            op,
            path,
            bytes: 0,
            sha256: None,
            via,
            started,
            error: Some(e.to_string()),
        });
        Err(e)
    }

    /// Starts an upload to `path`; `length`, when the client said it, is checked before a
    /// byte is written.
    pub fn upload(&self, path: &str, length: Option<u64>, via: Via) -> Result<Upload, FileError> {
        let started = Instant::now();
        match self.start_upload(path, length) {
            Ok((writing, room, replaced)) => Ok(Upload {
                usage: (self.limits.max_workspace_bytes > 0)
                    .then(|| (self.root().to_path_buf(), replaced)),
                marker: self.marker.clone(),
                writing: Some(writing),
                hasher: Sha256::new(),
                head: Vec::new(),
                bytes: 0,
                room,
                limits: self.limits,
                path: path.to_owned(),
                via,
                started,
                recorder: self.recorder.clone(),
                ended: false,
            }),
            Err(e) => self.refused(Op::Upload, path, via, started, e),
        }
    }

    /// The writing, the most bytes the file may take, and the allocated bytes of the file it
    /// replaces.
    fn start_upload(
        &self,
        path: &str,
        length: Option<u64>,
    ) -> Result<(Writing, u64, u64), FileError> {
        self.checked(path)?;
        let mut room = self.limits.max_file_bytes;
        let mut replaced = 0;
        if self.limits.max_workspace_bytes > 0 {
            // The file it replaces makes room.
            replaced = self
                .dir
                .read(path)
                .ok()
                .and_then(|(f, _)| f.metadata().ok())
                .map_or(0, |m| allocated(&m));
            let cap = self.limits.max_workspace_bytes;
            let left_of = |used: u64| cap.saturating_sub(used.saturating_sub(replaced));
            let (mut used, fresh) = usage::get(self.root(), false);
            if length.is_some_and(|n| n > left_of(used)) && !fresh {
                // A miss on a kept figure: cells may have deleted files since; look again.
                used = usage::get(self.root(), true).0;
            }
            let left = left_of(used);
            if left < room {
                room = left;
                if length.is_some_and(|n| n > left) {
                    return Err(FileError::WorkspaceFull {
                        path: shown(path),
                        used,
                        cap,
                    });
                }
            }
        }
        if length.is_some_and(|n| n > self.limits.max_file_bytes) {
            return Err(FileError::TooBig {
                path: shown(path),
                limit: self.limits.max_file_bytes,
            });
        }
        Ok((self.dir.write(path)?, room, replaced))
    }

    /// `upload_file`: writes `text` or `base64` to `path`.
    pub fn upload_params(&self, p: &UploadParams, via: Via) -> Result<FileInfo, FileError> {
        let started = Instant::now();
        let bytes = match (&p.text, &p.base64) {
            (Some(t), None) => std::borrow::Cow::Borrowed(t.as_bytes()),
            (None, Some(b)) => match decode_base64(b) {
                Ok(b) => std::borrow::Cow::Owned(b),
                Err(e) => return self.refused(Op::Upload, &p.path, via, started, e),
            },
            _ => {
                let e = FileError::Content(
                    "upload_file needs the content as exactly one of `text` and `base64`".into(),
                );
                return self.refused(Op::Upload, &p.path, via, started, e);
            }
        };
        let mut up = self.upload(&p.path, Some(bytes.len() as u64), via)?;
        up.write(&bytes)?;
        up.finish()
    }

    /// Opens `path` for a download (its size checked against the limit).
    pub fn download(&self, path: &str, via: Via) -> Result<Download, FileError> {
        let started = Instant::now();
        let opened = self.checked(path).and_then(|()| Ok(self.dir.read(path)?));
        let (file, size) = match opened {
            Ok(f) => f,
            Err(e) => return self.refused(Op::Download, path, via, started, e),
        };
        if size > self.limits.max_file_bytes {
            let e = FileError::TooBig {
                path: shown(path),
                limit: self.limits.max_file_bytes,
            };
            return self.refused(Op::Download, path, via, started, e);
        }
        Ok(Download {
            file,
            size,
            want: size,
            hasher: Sha256::new(),
            read: 0,
            path: path.to_owned(),
            via,
            started,
            recorder: self.recorder.clone(),
            ended: false,
        })
    }

    /// The size and MIME type of the file at `path`, without reading it (a refusal is recorded
    /// as a download's).
    pub fn peek(&self, path: &str, via: Via) -> Result<(u64, &'static str), FileError> {
        let started = Instant::now();
        let d = match self.checked(path).and_then(|()| Ok(self.dir.read(path)?)) {
            Ok((file, size)) => (file, size),
            Err(e) => return self.refused(Op::Download, path, via, started, e),
        };
        use std::os::unix::fs::FileExt;
        let mut head = [0u8; mime::SNIFF_BYTES];
        let n = d.0.read_at(&mut head, 0).unwrap_or(0);
        Ok((d.1, mime::guess(path, &head[..n])))
    }

    /// Reads the whole file at `path` (at most `max` bytes: a larger file is [`FileError::TooBig`]
    /// with `max` as the limit) with what it is.
    pub fn read_all(
        &self,
        path: &str,
        max: u64,
        via: Via,
    ) -> Result<(FileInfo, Vec<u8>), FileError> {
        let started = Instant::now();
        let mut d = self.download(path, via)?;
        if d.size() > max {
            d.ended = true;
            let e = FileError::TooBigForOneMessage {
                path: shown(path),
                limit: max,
            };
            return self.refused(Op::Download, path, via, started, e);
        }
        let mut bytes = Vec::with_capacity(d.size() as usize);
        // A file that grows while it is read is cut at `max`.
        (&mut d)
            .take(max)
            .read_to_end(&mut bytes)
            .map_err(|source| FileError::Io {
                path: shown(path),
                source,
            })?;
        let info = d.finish();
        Ok((info, bytes))
    }

    /// `download_file` on the JSON-RPC front: the file with its content as text or base64.
    pub fn download_params(&self, path: &str, max: u64, via: Via) -> Result<Downloaded, FileError> {
        let (file, bytes) = self.read_all(path, max, via)?;
        Ok(match String::from_utf8(bytes) {
            Ok(text) => Downloaded {
                file,
                text: Some(text),
                base64: None,
            },
            Err(e) => Downloaded {
                file,
                text: None,
                base64: Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
            },
        })
    }

    /// `list_files`: a page of the folder's entries, sorted by name (flowrepl's own folders and
    /// the temporary files of uploads under way here are left out; a cell's file named like
    /// one is listed, and a name that is not UTF-8 is listed with its bytes in `name_base64`).
    pub fn list(&self, p: &ListParams) -> Result<Listing, FileError> {
        let folder = p.path.as_deref().unwrap_or("").trim_end_matches('/');
        if !folder.is_empty() {
            self.checked(folder)?;
        }
        let limit = p.limit.unwrap_or(LIST_PAGE);
        if limit == 0 || limit > MAX_LIST_PAGE {
            return Err(FileError::Content(format!(
                "limit must be between 1 and {MAX_LIST_PAGE}"
            )));
        }
        let prefix = if folder.is_empty() {
            String::new()
        } else {
            format!("{folder}/")
        };
        let mut entries = Vec::new();
        let mut next_cursor = None;
        for e in self.dir.list(folder)? {
            if p.cursor
                .as_ref()
                .is_some_and(|c| e.name.as_str() <= c.as_str())
            {
                continue;
            }
            let path = format!("{prefix}{}", e.name);
            if self.checked(&path).is_err() {
                continue;
            }
            if entries.len() == limit as usize {
                next_cursor = entries.last().map(|l: &FileEntry| l.name.clone());
                break;
            }
            entries.push(entry(path, e));
        }
        Ok(Listing {
            path: folder.to_owned(),
            entries,
            next_cursor,
        })
    }

    /// A cell ran in this workspace (it may have written files): the next upload under
    /// `--max-workspace-mb` counts the workspace again instead of using the kept figure. A
    /// kernel calls it after each cell; `serve`, whose cells run in its kernels, relies on
    /// the figure's age ([`usage`]). Nothing to do without a cap.
    pub fn cell_ran(&self) {
        if self.limits.max_workspace_bytes > 0 {
            usage::forget(self.root());
        }
    }

    /// The workspace's regular files (links and special files left out, never followed),
    /// sorted by path, a page of at most `limit` after the path `after`; with the cursor of
    /// the next page. At most [`MAX_WALKED`] files are looked at.
    pub fn walk(&self, after: Option<&str>, limit: u32) -> (Vec<FileEntry>, Option<String>) {
        let mut found = Vec::new();
        let mut folders = vec![(String::new(), 0usize)];
        while let Some((folder, depth)) = folders.pop() {
            let Ok(entries) = self.dir.list(&folder) else {
                continue;
            };
            for e in entries {
                // A name that is not UTF-8 has no URI a client could read it by.
                if e.raw_name.is_some() {
                    continue;
                }
                let path = if folder.is_empty() {
                    e.name.clone()
                } else {
                    format!("{folder}/{}", e.name)
                };
                if self.checked(&path).is_err() {
                    continue;
                }
                match e.kind {
                    "file" if found.len() < MAX_WALKED => found.push(entry(path, e)),
                    "dir" if depth < MAX_DEPTH => folders.push((path, depth + 1)),
                    _ => {}
                }
            }
        }
        found.sort_by(|a: &FileEntry, b: &FileEntry| a.path.cmp(&b.path));
        let start = after.map_or(0, |a| found.partition_point(|f| f.path.as_str() <= a));
        let mut page: Vec<FileEntry> = found.into_iter().skip(start).collect();
        let next = (page.len() > limit as usize).then(|| page[limit as usize - 1].path.clone());
        page.truncate(limit as usize);
        (page, next)
    }

    /// `delete_file`: removes the file at `path` (a folder is refused).
    pub fn delete(&self, path: &str, via: Via) -> Result<Deleted, FileError> {
        let started = Instant::now();
        match self.checked(path).and_then(|()| Ok(self.dir.remove(path)?)) {
            Ok(freed) => {
                usage::changed(self.root(), 0, freed);
                touch(self.marker.as_deref());
                self.record(Entry {
                    op: Op::Delete,
                    path,
                    bytes: 0,
                    sha256: None,
                    via,
                    started,
                    error: None,
                });
                Ok(Deleted {
                    path: path.to_owned(),
                    deleted: true,
                })
            }
            Err(e) => self.refused(Op::Delete, path, via, started, e),
        }
    }
}

/// A listing's entry.
fn entry(path: String, e: flowrepl_os::beneath::Entry) -> FileEntry {
    FileEntry {
        name_base64: e
            .raw_name
            .map(|raw| base64::engine::general_purpose::STANDARD.encode(raw)),
        name: e.name,
        path,
        kind: e.kind.to_owned(),
        bytes: e.bytes,
        mtime: chrono::DateTime::from_timestamp(e.mtime, 0)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    }
}

/// Standard base64, padding optional, whitespace ignored.
fn decode_base64(text: &str) -> Result<Vec<u8>, FileError> {
    let clean: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(clean.trim_end_matches('='))
        .map_err(|e| FileError::Content(format!("base64 does not decode: {e}")))
}

/// The disk space a file takes: its allocated blocks (a sparse file of 8 TB with no data
/// takes none), not its apparent size.
fn allocated(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.blocks().saturating_mul(512)
}

/// What each workspace holds, for `--max-workspace-mb`: the allocated bytes of its regular
/// files (found without following links), added up by one walk and then kept, moved by what
/// each upload and delete here changes, and walked again once it is older than
/// [`usage::COST_FACTOR`] times what its walk took, at most [`usage::FRESH`] (cells write files
/// too: a small workspace, walked in a fraction of a millisecond, is walked again at nearly
/// every upload; one of 200,000 files, walked in most of a second, every 30 s at most), or when
/// a kept figure would refuse an upload. Walks take at most about 1/32 of the time.
pub mod usage {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// The longest a walked figure is used (moved by uploads and deletes) before the next walk.
    pub const FRESH: Duration = Duration::from_secs(30);
    /// A walked figure is used for this many times what its walk took (at most [`FRESH`]).
    pub const COST_FACTOR: u32 = 32;
    /// Workspaces whose figure is kept (past it, the oldest figure goes).
    const KEPT: usize = 4096;

    /// A workspace's bytes, until when they are used, and when they were walked.
    type Known = HashMap<PathBuf, (u64, Instant, Instant)>;

    static KNOWN: Mutex<Option<Known>> = Mutex::new(None);

    fn known<T>(f: impl FnOnce(&mut Known) -> T) -> T {
        let mut k = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
        f(k.get_or_insert_with(HashMap::new))
    }

    /// The bytes under `root`, and whether they were just walked: the kept figure while it is
    /// fresh, unless `walk`.
    pub fn get(root: &Path, walk: bool) -> (u64, bool) {
        if !walk {
            let kept = known(|k| {
                k.get(root)
                    .filter(|(_, until, _)| Instant::now() < *until)
                    .map(|(n, _, _)| *n)
            });
            if let Some(n) = kept {
                return (n, false);
            }
        }
        let started = Instant::now();
        let n = walked(root);
        let now = Instant::now();
        let until = now + (now - started).saturating_mul(COST_FACTOR).min(FRESH);
        known(|k| {
            if k.len() >= KEPT && !k.contains_key(root) {
                let oldest = k
                    .iter()
                    .min_by_key(|(_, (_, _, at))| *at)
                    .map(|(p, _)| p.clone());
                if let Some(oldest) = oldest {
                    k.remove(&oldest);
                }
            }
            k.insert(root.to_path_buf(), (n, until, now));
        });
        (n, true)
    }

    /// Forgets the kept figure of `root`: something else (a cell) may have written there.
    pub fn forget(root: &Path) {
        known(|k| k.remove(root));
    }

    /// Moves the kept figure of `root` (if any) by what a change added and freed.
    pub fn changed(root: &Path, added: u64, freed: u64) {
        known(|k| {
            if let Some((n, _, _)) = k.get_mut(root) {
                *n = n.saturating_add(added).saturating_sub(freed);
            }
        });
    }

    /// Walks `root`: the allocated bytes of its regular files.
    pub fn walked(root: &Path) -> u64 {
        fn walk(dir: &Path, depth: usize, total: &mut u64) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let Ok(meta) = e.metadata() else { continue };
                if meta.is_file() {
                    *total += super::allocated(&meta);
                } else if meta.is_dir() && depth < super::MAX_DEPTH {
                    walk(&e.path(), depth + 1, total);
                }
            }
        }
        let mut total = 0;
        walk(root, 0, &mut total);
        total
    }
}

/// Says a client changed the workspace's files: the marker's modification time moves.
fn touch(marker: Option<&Path>) {
    let Some(m) = marker else { return };
    let now = chrono::Utc::now().to_rfc3339();
    if let Err(e) = std::fs::write(m, now) {
        tracing::warn!(marker = %m.display(), error = %e, "the workspace's change marker was not written (--store keeps the change with the next checkpoint)");
    }
}

/// Lower-case hex (of a digest).
pub fn hex(digest: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(digest.len() * 2);
    for b in digest {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// An upload under way: bytes go to a temporary file until [`Upload::finish`] renames it into
/// place. Dropped unfinished (the client went away), nothing is written and the refusal is
/// recorded.
#[derive(Debug)]
pub struct Upload {
    /// With a workspace cap: the workspace's folder and the allocated bytes of the file this
    /// one replaces (the kept usage moves by the difference when it is put in place).
    usage: Option<(PathBuf, u64)>,
    writing: Option<Writing>,
    hasher: Sha256,
    head: Vec<u8>,
    bytes: u64,
    /// The most bytes this file may have.
    room: u64,
    limits: Limits,
    path: String,
    via: Via,
    started: Instant,
    recorder: Option<Arc<Recorder>>,
    marker: Option<PathBuf>,
    ended: bool,
}

impl Upload {
    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Writes the next bytes; past a limit, the upload ends refused (nothing is written).
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), FileError> {
        let bytes = self.bytes + chunk.len() as u64;
        if bytes > self.room {
            let e = if bytes > self.limits.max_file_bytes {
                FileError::TooBig {
                    path: self.path.clone(),
                    limit: self.limits.max_file_bytes,
                }
            } else {
                FileError::WorkspaceFull {
                    path: self.path.clone(),
                    used: self.limits.max_workspace_bytes - self.room,
                    cap: self.limits.max_workspace_bytes,
                }
            };
            return Err(self.fail(e));
        }
        let Some(w) = self.writing.as_mut() else {
            return Err(FileError::Content("the upload has ended".into()));
        };
        if let Err(source) = w.file().write_all(chunk) {
            let e = FileError::Io {
                path: self.path.clone(),
                source,
            };
            return Err(self.fail(e));
        }
        if self.head.len() < mime::SNIFF_BYTES {
            let n = (mime::SNIFF_BYTES - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..n]);
        }
        self.hasher.update(chunk);
        self.bytes = bytes;
        Ok(())
    }

    /// Ends the upload refused: the temporary file goes, the refusal is recorded.
    fn fail(&mut self, e: FileError) -> FileError {
        self.writing = None;
        self.end(Some(e.to_string()), None);
        e
    }

    fn end(&mut self, error: Option<String>, sha256: Option<&str>) {
        if self.ended {
            return;
        }
        self.ended = true;
        if let Some(r) = &self.recorder {
            r.write(Entry {
                op: Op::Upload,
                path: &self.path,
                bytes: if error.is_none() { self.bytes } else { 0 },
                sha256,
                via: self.via,
                started: self.started,
                error,
            });
        }
    }

    /// Puts the file in place (after its data reached the disk's cache; readers see it whole).
    pub fn finish(mut self) -> Result<FileInfo, FileError> {
        let Some(mut w) = self.writing.take() else {
            return Err(FileError::Content("the upload has ended".into()));
        };
        let added = w.file().metadata().map_or(self.bytes, |m| allocated(&m));
        if let Err(e) = w.commit() {
            return Err(self.fail(e.into()));
        }
        if let Some((root, replaced)) = &self.usage {
            usage::changed(root, added, *replaced);
        }
        touch(self.marker.as_deref());
        let sha256 = hex(&std::mem::take(&mut self.hasher).finalize());
        self.end(None, Some(&sha256));
        Ok(FileInfo {
            mime_type: mime::guess(&self.path, &self.head).to_owned(),
            path: std::mem::take(&mut self.path),
            bytes: self.bytes,
            sha256,
        })
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.ended {
            self.end(
                Some(format!(
                    "cut short after {} bytes (the client stopped sending): nothing was written",
                    self.bytes
                )),
                None,
            );
        }
    }
}

/// A download under way: read it to the end, then [`Download::finish`] records it with the
/// hash of the bytes read. Dropped unfinished (the client went away), the cut is recorded.
#[derive(Debug)]
pub struct Download {
    file: std::fs::File,
    size: u64,
    /// The bytes to send: the file's size, or a range's length.
    want: u64,
    hasher: Sha256,
    read: u64,
    path: String,
    via: Via,
    started: Instant,
    recorder: Option<Arc<Recorder>>,
    ended: bool,
}

impl Download {
    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file's MIME type, from its name and first bytes (read without moving the download).
    pub fn mime_type(&self) -> &'static str {
        use std::os::unix::fs::FileExt;
        let mut head = [0u8; mime::SNIFF_BYTES];
        let n = self.file.read_at(&mut head, 0).unwrap_or(0);
        mime::guess(&self.path, &head[..n])
    }

    /// Only `len` bytes of the file will be sent (a range).
    pub fn range(&mut self, len: u64) {
        self.want = len;
    }

    /// Ends the download without a record: nothing was to be sent (a `HEAD`).
    pub fn discard(mut self) {
        self.ended = true;
    }

    /// Ends the download refused, recorded with `why` (an unsatisfiable range).
    pub fn refuse(mut self, why: String) {
        self.ended = true;
        self.record_error(why);
    }

    /// Ends the download cut because the file changed while it was read (a cell rewrote it):
    /// recorded with the bytes sent, the bytes promised and the file's size now.
    pub fn changed(mut self, now: u64) {
        self.ended = true;
        let why = format!(
            "the file changed while it was read (a cell wrote it): {} of {} bytes sent before the change was seen, and no more; it is now {now} bytes",
            self.read, self.want
        );
        self.record_error(why);
    }

    fn record_error(&mut self, why: String) {
        if let Some(r) = &self.recorder {
            r.write(Entry {
                op: Op::Download,
                path: &self.path,
                bytes: self.read,
                sha256: None,
                via: self.via,
                started: self.started,
                error: Some(why),
            });
        }
    }

    /// Records the download (bytes read and their hash) and says what was sent.
    pub fn finish(mut self) -> FileInfo {
        let sha256 = hex(&std::mem::take(&mut self.hasher).finalize());
        self.ended = true;
        if let Some(r) = &self.recorder {
            r.write(Entry {
                op: Op::Download,
                path: &self.path,
                bytes: self.read,
                sha256: Some(&sha256),
                via: self.via,
                started: self.started,
                error: None,
            });
        }
        FileInfo {
            mime_type: self.mime_type().to_owned(),
            path: std::mem::take(&mut self.path),
            bytes: self.read,
            sha256,
        }
    }
}

impl Download {
    /// A second handle on the open file, for a thread that reads while this one hashes
    /// ([`read_into`] there, [`Download::hash`] here, every byte in order).
    pub fn reader(&self) -> std::io::Result<std::fs::File> {
        self.file.try_clone()
    }

    /// Counts and hashes bytes read through [`Download::reader`].
    pub fn hash(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.read += bytes.len() as u64;
    }
}

/// Reads up to `max` bytes of `file` onto the end of `buf`, straight into its spare room (no
/// zeroing pass first).
pub fn read_into(
    file: &std::fs::File,
    buf: &mut bytes::BytesMut,
    max: usize,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let len = spare.len().min(max);
    // SAFETY: read(2) writes at most `len` bytes into the spare room, which `reserve` made at
    // least that long; it never reads from it.
    let n = unsafe { libc::read(file.as_raw_fd(), spare.as_mut_ptr().cast(), len) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the first `n` bytes of the spare room were just written by read(2).
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

impl Read for Download {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

impl Drop for Download {
    fn drop(&mut self) {
        if !self.ended {
            let why = format!(
                "cut short after {} of {} bytes (the client went away)",
                self.read, self.want
            );
            self.record_error(why);
        }
    }
}
