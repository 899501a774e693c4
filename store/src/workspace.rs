//! A task's workspace files as objects: the files a cell wrote, uploaded by content hash with
//! each state, and written back beneath the workspace of a kernel that resumes the task.
//!
//! # What is taken
//! Regular files under the workspace, found without following symbolic links, up to
//! [`Limits::max_bytes`] in all and [`MAX_FILES`] files; the task's log folder and anything
//! named `.flowrepl` are left out. What is not taken is named with the reason
//! ([`Workspace::skipped`]): a symbolic link (not followed: it could lead anywhere on the
//! host), a FIFO, socket or device (reading one could hang or read a device), a name that is
//! not UTF-8, a file over the caps. Files are read through `flowrepl_os::beneath` (`openat2`
//! beneath the workspace, no link followed anywhere on the way, a regular file with one link,
//! checked on the open descriptor), so a cell swapping a file for a link or a FIFO between the
//! walk and the read, or hard-linking a host file into the workspace, gains nothing; a file's
//! hash is of the bytes read.
//!
//! # Writing back
//! Every path from the store is checked (names separated by `/`, no `.`, `..` or empty part),
//! and written through `flowrepl_os::beneath` too: its folders made beneath the workspace
//! without following a link a cell left there, the file written under a temporary name and
//! renamed into place. A file whose content is already there is left alone; files the store
//! does not name are never removed.

use crate::state::{sha256, StateError};
use flowrepl_os::beneath::Beneath;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The most files a workspace's state holds.
pub const MAX_FILES: usize = 100_000;
/// How deep the walk goes.
const MAX_DEPTH: usize = 64;
/// Names never taken (flowrepl's own folders).
const OWN: &str = flowrepl_files::OWN_FOLDER;

/// One file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceFile {
    /// Its content's SHA-256: the blob it is.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
    /// Its permission bits (`0o777` at most).
    pub mode: u32,
}

/// The workspace in a state manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workspace {
    /// Path (relative, `/`-separated) → file.
    pub files: BTreeMap<String, WorkspaceFile>,
    /// Paths not taken, with the reason.
    pub skipped: BTreeMap<String, String>,
}

/// What is taken.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The workspace folder.
    pub root: PathBuf,
    /// Folders under it never taken (the task's log folder).
    pub exclude: Vec<PathBuf>,
    /// Bytes in all.
    pub max_bytes: u64,
    /// Touched when a client changes the files
    /// ([`flowrepl_task_logger::path::workspace_marker`]): a new state is kept then, even when
    /// the checkpoint folder did not change.
    pub marker: PathBuf,
    /// Files the state this kernel started from named, which could not be brought back (a
    /// blob missing from the store, or not of its hash), with the reason: until a file is at
    /// that path again (then it is dropped from here), every state names it in
    /// [`Workspace::skipped`] (the reason starting with [`LOST`]) instead of forgetting it.
    pub lost: Lost,
}

/// The lost files of [`Limits::lost`]: shared, since the walk drops those found again.
pub type Lost = std::sync::Arc<std::sync::Mutex<BTreeMap<String, String>>>;

/// How a lost file's reason starts in [`Workspace::skipped`].
pub const LOST: &str = "lost: ";

/// The lost files a state names (its [`Workspace::skipped`] entries that start with
/// [`LOST`]), to carry into the next.
pub fn lost_of(workspace: &Workspace) -> BTreeMap<String, String> {
    workspace
        .skipped
        .iter()
        .filter(|(_, why)| why.starts_with(LOST))
        .map(|(p, why)| (p.clone(), why.clone()))
        .collect()
}

/// When a client last changed the workspace's files (the marker's modification time).
pub fn changed_at(limits: &Limits) -> Option<std::time::SystemTime> {
    std::fs::metadata(&limits.marker)
        .and_then(|m| m.modified())
        .ok()
}

/// A file seen by the walk, to read.
#[derive(Debug, Clone)]
pub struct Found {
    /// Relative path.
    pub path: String,
    /// (inode, size, mtime s, mtime ns) at the walk.
    pub id: (u64, u64, i64, i64),
}

/// Walks the workspace: the regular files to take, and what is not taken.
pub fn walk(limits: &Limits) -> (Vec<Found>, BTreeMap<String, String>) {
    let mut found = Vec::new();
    let mut skipped = BTreeMap::new();
    let mut total = 0u64;
    let mut stack = vec![(limits.root.clone(), String::new(), 0usize)];
    while let Some((dir, rel, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                skipped.insert(
                    format!("{rel}{}", name.to_string_lossy()),
                    "its name is not UTF-8".into(),
                );
                continue;
            };
            let path = format!("{rel}{name}");
            let full = entry.path();
            if name == OWN || limits.exclude.iter().any(|x| full.starts_with(x)) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&full) else {
                continue;
            };
            let kind = meta.file_type();
            if kind.is_dir() {
                if depth + 1 >= MAX_DEPTH {
                    skipped.insert(path, format!("deeper than {MAX_DEPTH} folders"));
                } else {
                    stack.push((full, format!("{path}/"), depth + 1));
                }
            } else if kind.is_symlink() {
                skipped.insert(path, "a symbolic link: not followed".into());
            } else if !kind.is_file() {
                skipped.insert(path, "not a regular file (a FIFO, socket or device)".into());
            } else if found.len() >= MAX_FILES {
                skipped.insert(path, format!("more than {MAX_FILES} files"));
            } else if total + meta.size() > limits.max_bytes {
                skipped.insert(
                    path,
                    format!(
                        "over the workspace cap of {} MB (--store-workspace-mb)",
                        limits.max_bytes >> 20
                    ),
                );
            } else {
                total += meta.size();
                found.push(Found {
                    path,
                    id: (meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec()),
                });
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    // Files lost at the restore stay named until the workspace has a file there again.
    let mut lost = limits.lost.lock().unwrap_or_else(|p| p.into_inner());
    lost.retain(|path, _| {
        found
            .binary_search_by(|f| f.path.as_str().cmp(path))
            .is_err()
    });
    for (path, why) in lost.iter() {
        skipped.entry(path.clone()).or_insert_with(|| why.clone());
    }
    drop(lost);
    (found, skipped)
}

/// Reads a file the walk found, beneath the workspace (`flowrepl_os::beneath`: no link
/// followed on the way, a regular file with one link, checked on the open descriptor); its
/// content and entry.
pub fn read(root: &Beneath, path: &str) -> Result<(Vec<u8>, WorkspaceFile), String> {
    let (mut file, size) = root.read(path).map_err(|e| e.to_string())?;
    let mode = file.metadata().map_err(|e| e.to_string())?.mode() & 0o777;
    let mut data = Vec::with_capacity(size as usize);
    file.read_to_end(&mut data)
        .map_err(|e| format!("cannot be read: {e}"))?;
    let entry = WorkspaceFile {
        sha256: sha256(&data),
        bytes: data.len() as u64,
        mode,
    };
    Ok((data, entry))
}

/// Entries of files read before, by path, with the identity they had: a file whose identity
/// is unchanged is not read again.
pub type Known = HashMap<String, ((u64, u64, i64, i64), WorkspaceFile)>;

/// Checks a path from the store: names separated by `/`, none empty, `.` or `..`, no NUL.
pub fn check_path(path: &str) -> Result<Vec<&str>, StateError> {
    flowrepl_os::beneath::check(path).map_err(|e| StateError::Refused(e.to_string()))
}

/// Why a file was not written back.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}")]
pub struct NotWritten {
    /// The file.
    pub path: String,
    /// Why.
    pub why: String,
}

/// Writes `data` (the content of `entry`) at `path` beneath the workspace, unless it is
/// there; whether it was written.
pub fn write_back(
    root: &Beneath,
    path: &str,
    entry: &WorkspaceFile,
    data: &[u8],
) -> Result<bool, NotWritten> {
    use std::io::Write;
    let not = |why: String| NotWritten {
        path: path.to_owned(),
        why,
    };
    check_path(path).map_err(|e| not(e.to_string()))?;
    if read(root, path).is_ok_and(|(_, e)| e.sha256 == entry.sha256) {
        return Ok(false);
    }
    let mut w = root.write(path).map_err(|e| not(e.to_string()))?;
    w.file()
        .write_all(data)
        .and_then(|()| {
            w.file()
                .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(
                    entry.mode & 0o777,
                ))
        })
        .map_err(|e| not(e.to_string()))?;
    w.commit().map_err(|e| not(e.to_string()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(data: &[u8]) -> WorkspaceFile {
        WorkspaceFile {
            sha256: sha256(data),
            bytes: data.len() as u64,
            mode: 0o600,
        }
    }

    #[test]
    fn a_link_planted_in_the_workspace_does_not_take_a_write_outside() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("sub")).unwrap();
        let b = Beneath::open(root.path()).unwrap();
        let e = write_back(&b, "sub/note.txt", &entry(b"hi"), b"hi").unwrap_err();
        assert!(e.why.contains("outside the workspace"), "{e}");
        assert!(!outside.path().join("note.txt").exists());
        // The same write by path, without the component-by-component O_NOFOLLOW: it lands
        // outside.
        std::fs::write(root.path().join("sub/note.txt"), b"hi").unwrap();
        assert!(outside.path().join("note.txt").exists());
        // A link as the file itself is replaced, never written through.
        let target = outside.path().join("target");
        std::fs::write(&target, b"theirs").unwrap();
        std::os::unix::fs::symlink(&target, root.path().join("file")).unwrap();
        assert!(write_back(&b, "file", &entry(b"mine"), b"mine").unwrap());
        assert_eq!(std::fs::read(&target).unwrap(), b"theirs");
        assert_eq!(std::fs::read(root.path().join("file")).unwrap(), b"mine");
    }

    #[test]
    fn paths_that_leave_the_workspace_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/.",
            "a\0b",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_path("a/b.csv").unwrap(), ["a", "b.csv"]);
    }

    #[test]
    fn links_fifos_and_files_over_the_cap_are_named_not_taken() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        std::fs::write(p.join("small"), b"12345").unwrap();
        std::fs::write(p.join("zbig"), vec![0u8; 2048]).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", p.join("leak")).unwrap();
        nix::unistd::mkfifo(&p.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::create_dir_all(p.join("logs/plan")).unwrap();
        std::fs::write(p.join("logs/plan/t.jsonl"), b"{}\n").unwrap();
        std::fs::create_dir_all(p.join(".flowrepl")).unwrap();
        std::fs::write(p.join(".flowrepl/x"), b"x").unwrap();
        let limits = Limits {
            root: p.to_path_buf(),
            exclude: vec![p.join("logs")],
            max_bytes: 1024,
            marker: p.join("logs/plan/t.files"),
            lost: Lost::new(std::sync::Mutex::new(BTreeMap::from([
                ("small".to_owned(), format!("{LOST}its blob is missing")),
                ("gone.csv".to_owned(), format!("{LOST}its blob is missing")),
            ]))),
        };
        let (found, skipped) = walk(&limits);
        let names: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["small"]);
        assert!(skipped["leak"].contains("symbolic link"));
        assert!(skipped["pipe"].contains("FIFO"));
        assert!(skipped["zbig"].contains("cap"));
        // A file lost at the restore stays named while it is not there, and is taken again
        // once it is.
        assert!(skipped["gone.csv"].starts_with(LOST), "{skipped:?}");
        assert!(!skipped.contains_key("small"), "{skipped:?}");
        assert_eq!(skipped.len(), 4, "{skipped:?}");
        // Found again, it is no longer lost: removed later, it is simply gone.
        assert_eq!(limits.lost.lock().unwrap().len(), 1);
        // A FIFO swapped in after the walk is refused at open time, without blocking.
        std::fs::remove_file(p.join("small")).unwrap();
        nix::unistd::mkfifo(&p.join("small"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let b = Beneath::open(p).unwrap();
        assert!(read(&b, "small").unwrap_err().contains("FIFO"));
        // A hard link to a file elsewhere is not read either.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("host"), b"host").unwrap();
        std::fs::hard_link(elsewhere.path().join("host"), p.join("linked")).unwrap();
        assert!(read(&b, "linked").unwrap_err().contains("hard link"));
    }
}
