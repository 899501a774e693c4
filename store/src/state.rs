//! A task's checkpoints as objects: the manifest that names them, made from the local
//! checkpoint folder, and the folder made again from it on another machine.
//!
//! A checkpoint folder is a journal and the segment files its lines name (see
//! `flowrepl_task_logger::checkpoint`). Segments are written once and never changed, so each
//! is uploaded once, as a blob named by its SHA-256; the manifest holds each checkpoint's
//! journal (its complete lines) and which blob each segment is. Only segments a journal line
//! names are taken: one being written for a line not yet in the journal is not part of any
//! checkpoint.
//!
//! # Trust
//! What is read back is checked before it is written into the folder a restore unpickles
//! from: checkpoint names as the checkpoint reader takes them, segment names `s-<digits>.bin`,
//! every blob's hash. The mark of a sandboxed origin travels with the manifest, so a kernel
//! without the sandbox does not restore a sandboxed task's pickles elsewhere either.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The manifest's format.
pub const MANIFEST_FORMAT: u32 = 1;

/// One segment file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Its content's SHA-256 (hex): the blob it is.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
}

/// One checkpoint: its journal and its segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCheckpoint {
    /// The journal's complete lines.
    pub journal: String,
    /// Segment file name → blob.
    pub segments: BTreeMap<String, Segment>,
}

/// `state/<epoch>-<seq>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub v: u32,
    /// The checkpoints were written by a sandboxed session.
    pub sandboxed: bool,
    /// Checkpoint name → checkpoint.
    pub checkpoints: BTreeMap<String, StoredCheckpoint>,
    /// The workspace's files, when they are kept (absent in manifests without them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::workspace::Workspace>,
}

/// What a local folder looks like to the uploader: each journal's identity, so that an
/// unchanged folder is not read again.
pub type Signature = Vec<(String, u64, u64, i64, i64)>;

/// The signature of the checkpoint folder `root` (empty when there is none).
pub fn signature(root: &Path) -> Signature {
    let mut sig = Vec::new();
    let Ok(dir) = std::fs::read_dir(root) else {
        return sig;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let journal = entry.path().join(flowrepl_task_logger::checkpoint::JOURNAL);
        if let Ok(m) = std::fs::symlink_metadata(&journal) {
            sig.push((name, m.ino(), m.size(), m.mtime(), m.mtime_nsec()));
        }
    }
    sig.sort();
    sig
}

/// Hashes of segment files already known, by (folder, name, inode, size): a segment never
/// changes, so it is read once.
pub type Hashed = BTreeMap<(String, String, u64, u64), Segment>;

/// Why a folder could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A file changed under the reader (a compaction removed a segment): try again.
    #[error("the checkpoint folder changed while it was read ({0}); read again")]
    Changed(String),
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What.
        what: &'static str,
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// What the store holds is not a manifest this flowrepl wrote.
    #[error("the stored checkpoints are refused: {0}")]
    Refused(String),
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StateError + 'a {
    move |source| StateError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// A segment's file name: `s-<digits>.bin`.
pub fn is_segment_name(name: &str) -> bool {
    name.strip_prefix("s-")
        .and_then(|r| r.strip_suffix(".bin"))
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// Reads the checkpoint folder `root` into a manifest, hashing segments not in `hashed`;
/// the files of each segment to upload come back beside it (name → path).
pub fn read(
    root: &Path,
    sandboxed: bool,
    hashed: &mut Hashed,
) -> Result<(Manifest, Vec<(Segment, std::path::PathBuf)>), StateError> {
    let mut manifest = Manifest {
        v: MANIFEST_FORMAT,
        sandboxed,
        checkpoints: BTreeMap::new(),
        workspace: None,
    };
    let mut files = Vec::new();
    let Ok(dir) = std::fs::read_dir(root) else {
        return Ok((manifest, files));
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if flowrepl_task_logger::checkpoint::check_name(&name).is_err() {
            continue;
        }
        let folder = entry.path();
        let journal_path = folder.join(flowrepl_task_logger::checkpoint::JOURNAL);
        let journal = match std::fs::read(&journal_path) {
            Ok(j) => j,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("cannot read", &journal_path)(e)),
        };
        // Complete lines only: a torn last line is not part of the checkpoint.
        let end = journal
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let journal = String::from_utf8_lossy(&journal[..end]).into_owned();
        let mut segments = BTreeMap::new();
        for line in journal.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some(put) = value.get("put").and_then(|p| p.as_array()) else {
                continue;
            };
            for seg in put
                .iter()
                .filter_map(|p| p.get("seg").and_then(|s| s.as_str()))
            {
                if !is_segment_name(seg) || segments.contains_key(seg) {
                    continue;
                }
                let path = folder.join(seg);
                let meta = match std::fs::symlink_metadata(&path) {
                    Ok(m) => m,
                    // Removed by a compaction that made the journal line above dead.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(StateError::Changed(path.display().to_string()))
                    }
                    Err(e) => return Err(io("cannot read", &path)(e)),
                };
                let id = (name.clone(), seg.to_owned(), meta.ino(), meta.size());
                let segment = match hashed.get(&id) {
                    Some(s) => s.clone(),
                    None => {
                        let s = hash_file(&path)?;
                        hashed.insert(id, s.clone());
                        s
                    }
                };
                files.push((segment.clone(), path));
                segments.insert(seg.to_owned(), segment);
            }
        }
        manifest
            .checkpoints
            .insert(name, StoredCheckpoint { journal, segments });
    }
    Ok((manifest, files))
}

/// The SHA-256 and size of a file.
pub fn hash_file(path: &Path) -> Result<Segment, StateError> {
    let mut file = std::fs::File::open(path).map_err(io("cannot read", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io("cannot read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(Segment {
        sha256: hex(&hasher.finalize()),
        bytes,
    })
}

pub use flowrepl_files::hex;

/// Checks a manifest read from the store before anything of it is written locally.
pub fn check(manifest: &Manifest) -> Result<(), StateError> {
    if manifest.v > MANIFEST_FORMAT {
        return Err(StateError::Refused(format!(
            "format {} (this flowrepl reads {MANIFEST_FORMAT})",
            manifest.v
        )));
    }
    for (name, cp) in &manifest.checkpoints {
        flowrepl_task_logger::checkpoint::check_name(name)
            .map_err(|e| StateError::Refused(e.to_string()))?;
        for (seg, s) in &cp.segments {
            if !is_segment_name(seg) {
                return Err(StateError::Refused(format!("segment name {seg:?}")));
            }
            check_hash(&s.sha256)?;
        }
    }
    for (path, f) in manifest.workspace.iter().flat_map(|w| &w.files) {
        crate::workspace::check_path(path)?;
        check_hash(&f.sha256)?;
    }
    Ok(())
}

fn check_hash(sha: &str) -> Result<(), StateError> {
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(StateError::Refused(format!("blob name {sha:?}")));
    }
    Ok(())
}

/// The SHA-256 of `bytes`, hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}
