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
//! # Inline segments
//! A small segment not yet in the store as a blob is carried inside the manifest instead
//! ([`Segment::inline`], base64, beside its SHA-256 and size as for a blob): a cell that
//! changes a few small names then costs the log segment, the manifest and the head swap,
//! not a blob PUT more. [`inline`] chooses them: segments of at most [`INLINE_MAX`] bytes,
//! newest first, until [`INLINE_TOTAL`] bytes in all. A segment already uploaded as a blob
//! stays a blob entry (it costs nothing more). Manifests with inline entries are written as
//! format 2 ([`MANIFEST_FORMAT`]), so that a flowrepl that reads only format 1 refuses them by
//! name rather than looking for blobs that were never written; blob-only manifests are still
//! written, and read, as format 1. An inline entry is checked against its SHA-256 and size
//! like a blob before it is written locally ([`Segment::content`]).
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

/// The newest manifest format this flowrepl reads: 2 (format 1 has no inline segments).
pub const MANIFEST_FORMAT: u32 = 2;

/// The format of a manifest without inline segments (written so, readable by older readers).
pub const MANIFEST_FORMAT_BLOBS: u32 = 1;

/// The largest segment carried inline in a manifest (bytes, before base64).
pub const INLINE_MAX: u64 = 16 * 1024;

/// The most segment bytes carried inline in one manifest (before base64: the manifest grows
/// by about 4/3 of that).
pub const INLINE_TOTAL: u64 = 256 * 1024;

/// One segment file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Its content's SHA-256 (hex): the blob it is, or the hash its inline content must have.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
    /// Its content, base64 (standard alphabet, padded), when it is carried in the manifest
    /// rather than stored as a blob (absent in format 1 manifests and for blob entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
}

impl Segment {
    /// A blob entry.
    pub fn blob(sha256: String, bytes: u64) -> Segment {
        Segment {
            sha256,
            bytes,
            inline: None,
        }
    }

    /// An inline entry of `data`.
    pub fn inline(data: &[u8]) -> Segment {
        use base64::Engine as _;
        Segment {
            sha256: sha256(data),
            bytes: data.len() as u64,
            inline: Some(base64::engine::general_purpose::STANDARD.encode(data)),
        }
    }

    /// The content of an inline entry, checked: `None` for a blob entry; refused when it is
    /// not base64 or not of the entry's size and SHA-256 (as a blob not of its hash is).
    pub fn content(&self) -> Option<Result<Vec<u8>, StateError>> {
        use base64::Engine as _;
        let text = self.inline.as_ref()?;
        Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| StateError::Refused(format!("inline content is not base64: {e}")))
                .and_then(|data| {
                    if data.len() as u64 != self.bytes || sha256(&data) != self.sha256 {
                        Err(StateError::Refused(format!(
                            "inline content does not have its hash {} and size {}",
                            self.sha256, self.bytes
                        )))
                    } else {
                        Ok(data)
                    }
                }),
        )
    }

    /// Whether both name the same content (inline or as a blob).
    pub fn same(&self, other: &Segment) -> bool {
        self.sha256 == other.sha256 && self.bytes == other.bytes
    }
}

/// One checkpoint: its journal and its segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCheckpoint {
    /// The journal's complete lines.
    pub journal: String,
    /// Segment file name → blob.
    pub segments: BTreeMap<String, Segment>,
}

impl StoredCheckpoint {
    /// Whether both have the same journal and segments, whether inline or blobs.
    pub fn same(&self, other: &StoredCheckpoint) -> bool {
        self.journal == other.journal
            && self.segments.len() == other.segments.len()
            && self
                .segments
                .iter()
                .zip(&other.segments)
                .all(|((a, s), (b, t))| a == b && s.same(t))
    }
}

/// `state/<epoch>-<writer>-<seq>.json`.
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

impl Manifest {
    /// The blobs it names (their SHA-256): its segments not carried inline and its workspace
    /// files. What collection keeps and `flowrepl store show` looks for.
    pub fn blobs(&self) -> std::collections::BTreeSet<String> {
        let segments = self
            .checkpoints
            .values()
            .flat_map(|cp| cp.segments.values())
            .filter(|s| s.inline.is_none())
            .map(|s| s.sha256.clone());
        let files = self
            .workspace
            .iter()
            .flat_map(|w| w.files.values())
            .map(|f| f.sha256.clone());
        segments.chain(files).collect()
    }

    /// Its segments carried inline: count and bytes (before base64).
    pub fn inline(&self) -> (u64, u64) {
        self.checkpoints
            .values()
            .flat_map(|cp| cp.segments.values())
            .filter(|s| s.inline.is_some())
            .fold((0, 0), |(n, b), s| (n + 1, b + s.bytes))
    }

    /// Whether both have the same checkpoints (see [`StoredCheckpoint::same`]).
    pub fn same_checkpoints(&self, other: &Manifest) -> bool {
        self.checkpoints.len() == other.checkpoints.len()
            && self
                .checkpoints
                .iter()
                .zip(&other.checkpoints)
                .all(|((a, c), (b, d))| a == b && c.same(d))
    }
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
        v: MANIFEST_FORMAT_BLOBS,
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
    Ok(Segment::blob(hex(&hasher.finalize()), bytes))
}

/// Carries small segments of `manifest` (read from the checkpoint folder `root` by [`read`])
/// inline: those of at most [`INLINE_MAX`] bytes that `stored` does not say are already blobs,
/// the newest (highest segment number) first, while the inline bytes stay within
/// [`INLINE_TOTAL`]. Each is read again and must still have the hash [`read`] found, else
/// [`StateError::Changed`]. Sets the manifest's format to 2 when it has any inline entry.
/// The segments left as blob entries are [`Manifest::blobs`].
pub fn inline(
    manifest: &mut Manifest,
    root: &Path,
    stored: impl Fn(&str) -> bool,
) -> Result<(), StateError> {
    let number = |seg: &str| -> u64 {
        seg.trim_start_matches("s-")
            .trim_end_matches(".bin")
            .parse()
            .unwrap_or(0)
    };
    let mut candidates: Vec<(u64, String, String, u64)> = manifest
        .checkpoints
        .iter()
        .flat_map(|(name, cp)| {
            cp.segments
                .iter()
                .map(move |(seg, s)| (name.clone(), seg.clone(), s))
        })
        .filter(|(_, _, s)| s.inline.is_none() && s.bytes <= INLINE_MAX && !stored(&s.sha256))
        .map(|(name, seg, s)| (number(&seg), name, seg, s.bytes))
        .collect();
    // Newest first; a tie by checkpoint name, for one order.
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut total = 0u64;
    for (_, name, seg, bytes) in candidates {
        if total + bytes > INLINE_TOTAL {
            continue;
        }
        let path = root.join(&name).join(&seg);
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StateError::Changed(path.display().to_string()))
            }
            Err(e) => return Err(io("cannot read", &path)(e)),
        };
        let entry = manifest
            .checkpoints
            .get_mut(&name)
            .and_then(|cp| cp.segments.get_mut(&seg))
            .expect("a candidate is in the manifest");
        let segment = Segment::inline(&data);
        if !segment.same(entry) {
            // Replaced under the reader.
            return Err(StateError::Changed(path.display().to_string()));
        }
        *entry = segment;
        total += bytes;
    }
    if manifest.inline().0 > 0 {
        manifest.v = MANIFEST_FORMAT;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::{Head, TaskKeys};
    use crate::objects::Store;
    use bytes::Bytes;
    use std::time::Duration;

    use crate::test_runtime as rt;

    fn content(n: u8, size: usize) -> Vec<u8> {
        (0..size).map(|i| (i as u8).wrapping_mul(7) ^ n).collect()
    }

    /// A checkpoint folder `auto` with a small segment (s-1, 100 bytes) and one too big to go
    /// inline (s-2, [`INLINE_MAX`] + 1); its journal names both.
    fn folder(root: &Path) {
        let cp = root.join("auto");
        std::fs::create_dir_all(&cp).unwrap();
        std::fs::write(cp.join("s-1.bin"), content(1, 100)).unwrap();
        std::fs::write(cp.join("s-2.bin"), content(2, INLINE_MAX as usize + 1)).unwrap();
        std::fs::write(
            cp.join(flowrepl_task_logger::checkpoint::JOURNAL),
            "{\"put\":[{\"name\":\"a\",\"seg\":\"s-1.bin\"}]}\n\
             {\"put\":[{\"name\":\"b\",\"seg\":\"s-2.bin\"}]}\n",
        )
        .unwrap();
    }

    /// What the uploader writes: the blobs of the manifest's blob entries, the manifest, and
    /// a head naming it.
    async fn upload(store: &Store, keys: &TaskKeys, root: &Path, m: &Manifest, seq: u64) -> Head {
        for (name, cp) in &m.checkpoints {
            for (seg, s) in &cp.segments {
                if s.inline.is_none() {
                    let data = std::fs::read(root.join(name).join(seg)).unwrap();
                    store
                        .put_new(&store.key(&keys.blob(&s.sha256)), Bytes::from(data))
                        .await
                        .unwrap();
                }
            }
        }
        let key = keys.state(1, "w", seq);
        store
            .put_new(
                &store.key(&key),
                Bytes::from(serde_json::to_vec(m).unwrap()),
            )
            .await
            .unwrap();
        Head {
            v: 2,
            plan_id: "p".into(),
            task_id: "t".into(),
            epoch: 1,
            state: Some(key),
            ..Default::default()
        }
    }

    async fn fetch(
        store: &Store,
        keys: &TaskKeys,
        head: &Head,
        into: &Path,
    ) -> Result<StateFetchedNames, crate::fetch::FetchError> {
        crate::fetch::checkpoints(
            store,
            keys,
            head,
            &into.join("checkpoints"),
            &into.join("mark"),
            false,
        )
        .await
        .map(|f| f.checkpoints)
    }

    type StateFetchedNames = Vec<String>;

    fn same_files(a: &Path, b: &Path) {
        for f in [
            "s-1.bin",
            "s-2.bin",
            flowrepl_task_logger::checkpoint::JOURNAL,
        ] {
            assert_eq!(
                std::fs::read(a.join("auto").join(f)).unwrap(),
                std::fs::read(b.join("checkpoints/auto").join(f)).unwrap(),
                "{f}"
            );
        }
    }

    /// The small segment goes inline and the big one stays a blob (format 2); the manifest
    /// fetched elsewhere makes the same folder. A blob-only manifest (format 1, as older
    /// flowrepls write it: no `inline` field) reads the same way.
    #[test]
    fn inline_and_blob_entries_round_trip_and_old_manifests_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("local");
        folder(&root);
        let (mut m, files) = read(&root, false, &mut Hashed::new()).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(m.v, MANIFEST_FORMAT_BLOBS);
        let old = m.clone();
        inline(&mut m, &root, |_| false).unwrap();
        assert_eq!(m.v, 2);
        let cp = &m.checkpoints["auto"];
        assert!(cp.segments["s-1.bin"].inline.is_some());
        assert!(cp.segments["s-2.bin"].inline.is_none());
        assert_eq!(m.inline(), (1, 100));
        assert_eq!(m.blobs(), [cp.segments["s-2.bin"].sha256.clone()].into());
        assert!(m.same_checkpoints(&old) && !m.checkpoints.is_empty());
        // The old format's text has no `inline` at all.
        let text = serde_json::to_string(&old).unwrap();
        assert!(
            !text.contains("inline") && text.contains("\"v\":1"),
            "{text}"
        );
        let store_dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
        let keys = TaskKeys::new("p", "t");
        rt().block_on(async {
            let head = upload(&store, &keys, &root, &m, 1).await;
            // The inline segment was never a blob.
            let s1 = &m.checkpoints["auto"].segments["s-1.bin"].sha256;
            assert!(store
                .get(&store.key(&keys.blob(s1)))
                .await
                .unwrap()
                .is_none());
            let there = tempfile::tempdir().unwrap();
            assert_eq!(
                fetch(&store, &keys, &head, there.path()).await.unwrap(),
                ["auto"]
            );
            same_files(&root, there.path());
            // Format 1 (both blobs), read from its JSON text.
            let old: Manifest = serde_json::from_str(&text).unwrap();
            let head = upload(&store, &keys, &root, &old, 2).await;
            let there = tempfile::tempdir().unwrap();
            fetch(&store, &keys, &head, there.path()).await.unwrap();
            same_files(&root, there.path());
        });
    }

    /// An inline entry whose content is not what its hash says is refused, as a blob not of
    /// its hash is, and nothing is written; the untampered manifest (the control) is fetched.
    #[test]
    fn a_tampered_inline_entry_is_refused_like_a_wrong_blob() {
        use base64::Engine as _;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("local");
        folder(&root);
        let (mut m, _) = read(&root, false, &mut Hashed::new()).unwrap();
        inline(&mut m, &root, |_| false).unwrap();
        let store_dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
        let keys = TaskKeys::new("p", "t");
        rt().block_on(async {
            let head = upload(&store, &keys, &root, &m, 1).await;
            let there = tempfile::tempdir().unwrap();
            fetch(&store, &keys, &head, there.path()).await.unwrap();
            // Other bytes of the same size, the hash and size left as they were.
            let mut bad = m.clone();
            let entry = bad
                .checkpoints
                .get_mut("auto")
                .unwrap()
                .segments
                .get_mut("s-1.bin")
                .unwrap();
            entry.inline = Some(base64::engine::general_purpose::STANDARD.encode(content(9, 100)));
            let head = upload(&store, &keys, &root, &bad, 2).await;
            let there = tempfile::tempdir().unwrap();
            let e = fetch(&store, &keys, &head, there.path()).await.unwrap_err();
            assert!(
                matches!(&e, crate::fetch::FetchError::State(StateError::Refused(why)) if why.contains("s-1.bin") && why.contains("hash")),
                "{e}"
            );
            assert!(!there.path().join("checkpoints").exists());
            // Not base64 at all.
            let entry = bad.checkpoints.get_mut("auto").unwrap().segments.get_mut("s-1.bin").unwrap();
            entry.inline = Some("*not base64*".into());
            let head = upload(&store, &keys, &root, &bad, 3).await;
            let e = fetch(&store, &keys, &head, there.path()).await.unwrap_err();
            assert!(matches!(&e, crate::fetch::FetchError::State(StateError::Refused(_))), "{e}");
            // The same tampering of a blob: refused the same way.
            let s2 = m.checkpoints["auto"].segments["s-2.bin"].sha256.clone();
            replace(&store, &keys.blob(&s2), content(9, INLINE_MAX as usize + 1)).await;
            let e = fetch(&store, &keys, &head_of(&keys, 1), there.path()).await.unwrap_err();
            assert!(
                matches!(&e, crate::fetch::FetchError::State(StateError::Refused(why)) if why.contains("s-2.bin") && why.contains("hash")),
                "{e}"
            );
            assert!(!there.path().join("checkpoints").exists());
        });
    }

    async fn replace(store: &Store, key: &str, data: Vec<u8>) {
        let _ = store.remove(&store.key(key)).await;
        store
            .put_new(&store.key(key), Bytes::from(data))
            .await
            .unwrap();
    }

    fn head_of(keys: &TaskKeys, seq: u64) -> Head {
        Head {
            v: 2,
            plan_id: "p".into(),
            task_id: "t".into(),
            epoch: 1,
            state: Some(keys.state(1, "w", seq)),
            ..Default::default()
        }
    }

    /// Collection keeps the blobs a live manifest names, not those of its inline entries (a
    /// blob of the same content left by an older state goes, and so does an orphan); the
    /// state is still fetched whole after it.
    #[test]
    fn collection_keeps_the_blobs_an_inline_manifest_still_names() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("local");
        folder(&root);
        let (blob_only, _) = read(&root, false, &mut Hashed::new()).unwrap();
        let mut m = blob_only.clone();
        inline(&mut m, &root, |_| false).unwrap();
        let store_dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
        let keys = TaskKeys::new("p", "t");
        let cp = &m.checkpoints["auto"];
        let (s1, s2) = (
            cp.segments["s-1.bin"].sha256.clone(),
            cp.segments["s-2.bin"].sha256.clone(),
        );
        rt().block_on(async {
            // An older state with both as blobs, then an orphan blob, then the inline state.
            upload(&store, &keys, &root, &blob_only, 1).await;
            let orphan = content(5, 10);
            store
                .put_new(
                    &store.key(&keys.blob(&sha256(&orphan))),
                    Bytes::from(orphan.clone()),
                )
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            let head = upload(&store, &keys, &root, &m, 2).await;
            let plan = crate::gc::plan(&store, &keys, &head, chrono::Utc::now(), Duration::ZERO)
                .await
                .unwrap();
            let mut removed: Vec<String> = plan
                .removed_blobs
                .iter()
                .map(|(k, _)| k.rsplit('/').next().unwrap().to_owned())
                .collect();
            removed.sort();
            let mut expected = vec![s1.clone(), sha256(&orphan)];
            expected.sort();
            assert_eq!(removed, expected, "{plan:?}");
            assert_eq!(plan.kept_blobs.0, 1, "{plan:?}");
            crate::gc::apply(&store, &plan).await.unwrap();
            assert!(store
                .get(&store.key(&keys.blob(&s2)))
                .await
                .unwrap()
                .is_some());
            let there = tempfile::tempdir().unwrap();
            fetch(&store, &keys, &head, there.path()).await.unwrap();
            same_files(&root, there.path());
            // The control: the older, blob-only state needs the blob of s-1 that went.
            let there = tempfile::tempdir().unwrap();
            replace(
                &store,
                &keys.state(1, "w", 1),
                serde_json::to_vec(&blob_only).unwrap(),
            )
            .await;
            assert!(fetch(&store, &keys, &head_of(&keys, 1), there.path())
                .await
                .is_err());
        });
    }

    /// At most [`INLINE_TOTAL`] bytes go inline, newest segments first; a segment already
    /// stored as a blob stays a blob entry, and so does one over [`INLINE_MAX`].
    #[test]
    fn inline_keeps_to_its_bounds_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let cp = dir.path().join("auto");
        std::fs::create_dir_all(&cp).unwrap();
        let mut journal = String::new();
        for i in 1..=20u8 {
            std::fs::write(
                cp.join(format!("s-{i}.bin")),
                content(i, INLINE_MAX as usize),
            )
            .unwrap();
            journal.push_str(&format!("{{\"put\":[{{\"seg\":\"s-{i}.bin\"}}]}}\n"));
        }
        std::fs::write(cp.join(flowrepl_task_logger::checkpoint::JOURNAL), journal).unwrap();
        let (mut m, _) = read(dir.path(), false, &mut Hashed::new()).unwrap();
        let stored = sha256(&content(20, INLINE_MAX as usize));
        inline(&mut m, dir.path(), |sha| sha == stored).unwrap();
        let segs = &m.checkpoints["auto"].segments;
        let inline: Vec<u8> = (1..=20u8)
            .filter(|i| segs[&format!("s-{i}.bin")].inline.is_some())
            .collect();
        assert_eq!(inline, (4..=19).collect::<Vec<u8>>());
        assert_eq!(m.inline(), (16, INLINE_TOTAL));
        assert_eq!(m.blobs().len(), 4);
    }
}
