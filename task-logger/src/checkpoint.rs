//! Namespace checkpoints beside the task log, and the one reader of their format.
//!
//! # Layout
//! `<log_dir>/<plan>/<task>.checkpoints/` (mode 0700) holds one folder per checkpoint: `auto`
//! (written after successful cells) and any named ones. A checkpoint folder holds:
//! - `s-NNNNNN.bin`: segments, pickles back to back. A segment is written once and never
//!   changed; segments no line uses any more are removed.
//! - `journal.jsonl`: one [`JournalLine`] per write, appended with one `write(2)` after its
//!   segment is complete. A line with `full: true` starts over; the others change only the
//!   names they list. A kill during a write leaves the earlier lines whole, and a torn last
//!   line is ignored, so a reader always sees the previous checkpoint. Compaction and named
//!   checkpoints replace the whole journal (or folder) by a rename.
//!
//! The writer is the executor's Python code (`executor/src/checkpoint/files.py`); [`read`] folds the
//! lines into a [`Checkpoint`], which the executor restores from and `checkpoints` lists.
//!
//! # Trust
//! Restoring unpickles, which runs code. Only folders under the kernel's own checkpoint folder
//! are read, and [`open_root`] refuses one that is not a directory owned by this user with no
//! group or other permissions.

use flowrepl_protocol::CheckpointInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The journal's file name inside a checkpoint folder.
pub const JOURNAL: &str = "journal.jsonl";
/// The journal format this reader knows.
pub const CHECKPOINT_FORMAT: u32 = 1;
/// The largest journal read (a checkpoint's journal is compacted long before: a bigger one
/// was not written by the executor).
pub const MAX_JOURNAL_BYTES: u64 = 64 << 20;
/// Longest checkpoint name.
pub const MAX_NAME_LEN: usize = 64;

/// Why a checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FolderError {
    /// The name is not 1–64 of `A-Z a-z 0-9 _ . -` or starts with `.`.
    #[error("bad checkpoint name {0:?}: use 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 _ . - (not starting with '.')")]
    BadName(String),
    /// No checkpoint of that name.
    #[error("no checkpoint named {0:?} for this task")]
    Missing(String),
    /// The folder is not the kernel's own.
    #[error("{0} is not a private directory of this user (owner and mode 0700 required); refusing to load pickles from it")]
    NotPrivate(PathBuf),
    /// The task's checkpoints were written by a sandboxed session and this one has no sandbox.
    #[error("this task's checkpoints were written by a sandboxed session ({0} exists): restoring one without the sandbox would run whatever code a cell put in its pickles with this kernel's rights; start with --sandbox, or with --trust-sandboxed-checkpoints to take that risk")]
    SandboxedOrigin(PathBuf),
    /// A journal line of a newer format.
    #[error("checkpoint {name:?} was written in format {found}; this flowrepl reads format {CHECKPOINT_FORMAT}")]
    NewerFormat {
        /// The checkpoint.
        name: String,
        /// Its format.
        found: u32,
    },
    /// The file system failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FolderError + 'a {
    move |source| FolderError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The extension of a task's checkpoint folder beside its log: `<task>.checkpoints`.
pub const FOLDER_EXTENSION: &str = "checkpoints";

/// What the folder was called before 2026-11 (`<task>.snapshot`): a kernel that finds only
/// that one takes it over ([`adopt_legacy_root`]).
pub const LEGACY_FOLDER_EXTENSION: &str = "snapshot";

/// `<log_dir>/<plan>/<task>.checkpoints` for the task whose log is `log_file`.
pub fn checkpoint_root(log_file: &Path) -> PathBuf {
    log_file.with_extension(FOLDER_EXTENSION)
}

/// Renames the task's checkpoint folder of the older name (`<task>.snapshot`) to the current
/// one when only the older one exists (a real directory, not a symlink); whether it did.
pub fn adopt_legacy_root(log_file: &Path) -> std::io::Result<bool> {
    let old = log_file.with_extension(LEGACY_FOLDER_EXTENSION);
    let new = checkpoint_root(log_file);
    if !std::fs::symlink_metadata(&old).is_ok_and(|m| m.is_dir())
        || std::fs::symlink_metadata(&new).is_ok()
    {
        return Ok(false);
    }
    std::fs::rename(&old, &new)?;
    Ok(true)
}

/// The journal of checkpoint `name` in the checkpoint folder `root`: it exists once the
/// checkpoint was written.
pub fn journal_path(root: &Path, name: &str) -> PathBuf {
    root.join(name).join(JOURNAL)
}

/// The mark a sandboxed session leaves beside the task's checkpoint folder (`<task>.sandboxed`,
/// in the log folder, out of a cell's reach): its checkpoints hold pickles a sandboxed cell
/// made, and unpickling runs code, so a kernel without the sandbox does not restore them
/// unless told to (`--trust-sandboxed-checkpoints`).
pub fn sandboxed_mark(root: &Path) -> PathBuf {
    root.with_extension("sandboxed")
}

/// Checks a checkpoint name (see [`FolderError::BadName`]).
pub fn check_name(name: &str) -> Result<(), FolderError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && !name.ends_with(".tmp")
        && !name.ends_with(".old")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(FolderError::BadName(name.to_owned()))
    }
}

/// The checkpoint folder, made (0700) if missing, and checked to be this user's private
/// directory before anything in it is read.
pub fn open_root(root: &Path) -> Result<PathBuf, FolderError> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("cannot create", root)(e)),
    }
    let meta = fs::symlink_metadata(root).map_err(io_err("cannot inspect", root))?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
        return Err(FolderError::NotPrivate(root.to_owned()));
    }
    Ok(root.to_owned())
}

/// One group of names pickled together, as a journal line and a [`Checkpoint`] hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// The names (the pickle is a dict of them).
    pub names: Vec<String>,
    /// The segment file.
    pub seg: String,
    /// Where the pickle starts in it.
    pub off: u64,
    /// Its length.
    pub len: u64,
    /// Other names it refers to (restored first).
    #[serde(default)]
    pub refs: Vec<String>,
}

/// One line of `journal.jsonl`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JournalLine {
    /// Format ([`CHECKPOINT_FORMAT`]).
    pub v: u32,
    /// Starts over: names not in this line are gone.
    pub full: bool,
    /// The session's execution count after which it was written.
    pub execution_count: u64,
    /// When (UTC, ISO 8601).
    pub time: String,
    /// The writer's Python, `major.minor`.
    pub python: String,
    /// `cloudpickle X.Y (flowrepl)`, or what wrote older lines (`cloudpickle X.Y`, `dill
    /// X.Y`, `pickle`).
    pub pickler: String,
    /// The session that wrote it (absent in lines written before 0.1.1).
    #[serde(default)]
    pub session: Option<String>,
    /// Groups written by this line.
    #[serde(default)]
    pub put: Vec<Group>,
    /// Names bound to modules: name → module.
    #[serde(default)]
    pub modules: BTreeMap<String, String>,
    /// Names that could not be saved: name → reason.
    #[serde(default)]
    pub unsaved: BTreeMap<String, String>,
    /// Names gone.
    #[serde(default)]
    pub drop: Vec<String>,
    /// The task's `flow.context` (a JSON object's text), if any.
    #[serde(default)]
    pub context: Option<String>,
    /// How long the write took before this line, in milliseconds.
    #[serde(default)]
    pub ms: Option<f64>,
}

/// What one name is in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Group(usize),
    Module(String),
    Unsaved(String),
}

/// A checkpoint folded from its journal: what the executor restores.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Checkpoint {
    /// Its name.
    pub name: String,
    /// The execution count it holds the state after.
    pub execution_count: u64,
    /// When it was last written.
    pub time: String,
    /// The writer's Python, `major.minor`.
    pub python: String,
    /// What pickled it.
    pub pickler: String,
    /// The session that wrote its last line, if the line says.
    pub session: Option<String>,
    /// The groups that hold at least one live name (with only those names).
    pub groups: Vec<Group>,
    /// Names bound to modules: name → module.
    pub modules: BTreeMap<String, String>,
    /// Names that could not be saved: name → reason.
    pub unsaved: BTreeMap<String, String>,
    /// The task's context when it was written.
    pub context: Option<String>,
    /// The last write: how long it took (ms), how many names it saved, whether it saved all.
    #[serde(skip)]
    pub last_write: (Option<f64>, u64, bool),
}

impl Checkpoint {
    /// Bytes of pickles it uses.
    pub fn bytes(&self) -> u64 {
        self.groups.iter().map(|g| g.len).sum()
    }

    /// Names it can restore, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .groups
            .iter()
            .flat_map(|g| g.names.iter().cloned())
            .chain(self.modules.keys().cloned())
            .collect();
        names.sort();
        names
    }

    /// Its description for `checkpoints`.
    pub fn info(&self) -> CheckpointInfo {
        CheckpointInfo {
            name: self.name.clone(),
            execution_count: self.execution_count,
            time: self.time.clone(),
            bytes: self.bytes(),
            names: self.names(),
            unsaved: self.unsaved.clone(),
            python: self.python.clone(),
            pickler: self.pickler.clone(),
            last_write_ms: self.last_write.0,
            last_write_names: self.last_write.1,
            last_write_full: self.last_write.2,
        }
    }
}

/// Folds the journal of checkpoint `name` in the checkpoint folder `root`. `Ok(None)`: no
/// checkpoint there (no journal, or no whole line in it).
///
/// The folder is writable from inside the sandbox, so the journal is opened as untrusted
/// input ([`crate::untrusted`]): no symlink followed, a regular file only, at most
/// [`MAX_JOURNAL_BYTES`] read.
pub fn read(root: &Path, name: &str) -> Result<Option<Checkpoint>, FolderError> {
    let path = journal_path(root, name);
    let file = match crate::untrusted::open_beneath(root, name, JOURNAL) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) => return Err(io_err("cannot open", &path)(e)),
    };
    let bytes = crate::untrusted::read_bounded(file, MAX_JOURNAL_BYTES, &path)
        .map_err(io_err("cannot read", &path))?;
    let mut groups: Vec<Group> = Vec::new();
    let mut names: BTreeMap<String, Entry> = BTreeMap::new();
    let mut cp: Option<Checkpoint> = None;
    for line in bytes.split(|&b| b == b'\n') {
        // A line without its newline was torn by a kill: `split` yields it last; serde
        // rejects a cut object, and a cut that still parses cannot happen (the object's
        // closing brace is its last byte).
        let Ok(l) = serde_json::from_slice::<JournalLine>(line) else {
            continue;
        };
        if l.v > CHECKPOINT_FORMAT {
            return Err(FolderError::NewerFormat {
                name: name.to_owned(),
                found: l.v,
            });
        }
        if l.full {
            groups.clear();
            names.clear();
        }
        for n in &l.drop {
            names.remove(n);
        }
        let saved = l.put.iter().map(|g| g.names.len() as u64).sum::<u64>();
        for g in l.put {
            let i = groups.len();
            for n in &g.names {
                names.insert(n.clone(), Entry::Group(i));
            }
            groups.push(g);
        }
        for (n, m) in l.modules {
            names.insert(n, Entry::Module(m));
        }
        for (n, why) in l.unsaved {
            names.insert(n, Entry::Unsaved(why));
        }
        cp = Some(Checkpoint {
            last_write: (l.ms, saved, l.full),
            name: name.to_owned(),
            execution_count: l.execution_count,
            time: l.time,
            python: l.python,
            pickler: l.pickler,
            session: l.session,
            context: l.context,
            ..Checkpoint::default()
        });
    }
    let Some(mut cp) = cp else { return Ok(None) };
    let mut live: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (n, e) in names {
        match e {
            Entry::Group(i) => live.entry(i).or_default().push(n),
            Entry::Module(m) => {
                cp.modules.insert(n, m);
            }
            Entry::Unsaved(why) => {
                cp.unsaved.insert(n, why);
            }
        }
    }
    cp.groups = live
        .into_iter()
        .map(|(i, names)| Group {
            names,
            ..groups[i].clone()
        })
        .collect();
    Ok(Some(cp))
}

/// The checkpoint `name` of the task whose checkpoint folder is `root`.
pub fn load(root: &Path, name: &str) -> Result<Checkpoint, FolderError> {
    check_name(name)?;
    let root = open_root(root)?;
    read(&root, name)?.ok_or_else(|| FolderError::Missing(name.to_owned()))
}

/// Every checkpoint of the task whose checkpoint folder is `root`, by name; folders that hold
/// none (or cannot be read) are left out.
pub fn list(root: &Path) -> Result<Vec<CheckpointInfo>, FolderError> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let root = open_root(root)?;
    let mut out = Vec::new();
    for entry in fs::read_dir(&root).map_err(io_err("cannot list", &root))? {
        let Ok(entry) = entry else { continue };
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if check_name(&name).is_err() {
            continue;
        }
        // An empty folder, or one that cannot be read (a newer format), is not listed.
        if let Ok(Some(cp)) = read(&root, &name) {
            out.push(cp.info());
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(full: bool, count: u64, put: &str, extra: &str) -> String {
        format!(
            r#"{{"v":1,"full":{full},"execution_count":{count},"time":"t{count}","python":"3.12","pickler":"pickle","put":[{put}]{extra}}}"#
        )
    }

    #[test]
    fn folds_lines_and_ignores_a_torn_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let g = |names: &str, seg: &str| {
            format!(r#"{{"names":{names},"seg":"{seg}","off":0,"len":10,"refs":[]}}"#)
        };
        let text = [
            line(
                true,
                1,
                &g(r#"["a","b"]"#, "s-1"),
                r#","modules":{"np":"numpy"},"unsaved":{"gen":"a generator"}"#,
            ),
            line(false, 2, &g(r#"["a"]"#, "s-2"), r#","drop":["gen"]"#),
            line(false, 3, &g(r#"["c"]"#, "s-3"), r#","drop":["np"]"#),
        ];
        let mut body = format!("{}\n{}\n", text[0], text[1]);
        // The third line was cut by a kill.
        body.push_str(&text[2][..text[2].len() - 5]);
        fs::create_dir(dir.path().join("auto")).unwrap();
        fs::write(journal_path(dir.path(), "auto"), body).unwrap();
        let cp = read(dir.path(), "auto").unwrap().unwrap();
        assert_eq!(cp.execution_count, 2);
        assert_eq!(cp.names(), ["a", "b", "np"]);
        assert!(cp.unsaved.is_empty());
        let segs: Vec<(&str, &[String])> = cp
            .groups
            .iter()
            .map(|g| (g.seg.as_str(), g.names.as_slice()))
            .collect();
        assert_eq!(
            segs,
            [
                ("s-1", &["b".to_owned()][..]),
                ("s-2", &["a".to_owned()][..])
            ]
        );
        // A full line starts over.
        fs::write(
            journal_path(dir.path(), "auto"),
            format!(
                "{}\n{}\n",
                text[0],
                line(true, 5, &g(r#"["z"]"#, "s-9"), "")
            ),
        )
        .unwrap();
        let cp = read(dir.path(), "auto").unwrap().unwrap();
        assert_eq!((cp.execution_count, cp.names()), (5, vec!["z".to_owned()]));
    }

    /// What a cell may plant in the folder: a FIFO, links to a device and to a file outside,
    /// a checkpoint folder that is a link, a journal over the limit. Each is an error at once.
    #[test]
    fn planted_journals_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["fifo", "zero", "outside", "big"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        nix::unistd::mkfifo(&journal_path(root, "fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("/dev/zero", journal_path(root, "zero")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", journal_path(root, "outside")).unwrap();
        std::os::unix::fs::symlink(root.join("big"), root.join("linked")).unwrap();
        let big = fs::File::create(journal_path(root, "big")).unwrap();
        big.set_len(MAX_JOURNAL_BYTES + 1).unwrap();
        for name in ["fifo", "zero", "outside", "big"] {
            assert!(read(root, name).is_err(), "{name}");
        }
        assert!(read(root, "linked").is_err());
        assert!(read(root, "missing").unwrap().is_none());
    }

    #[test]
    fn names_are_checked_and_folders_must_be_private() {
        for bad in ["", ".x", "a/b", "..", "x.tmp", &"a".repeat(65), "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["auto", "before-merge", "v1.2_final"] {
            check_name(good).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("t.checkpoints");
        open_root(&root).unwrap();
        assert_eq!(
            fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            load(&root, "auto"),
            Err(FolderError::NotPrivate(_))
        ));
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(load(&root, "auto"), Err(FolderError::Missing(_))));
        assert_eq!(list(&root).unwrap(), vec![]);
    }
}
