//! Bringing a task's state from the store onto this machine's disk, before its kernel starts:
//! the log (the segments the head counts, in order) and the checkpoint folder (from the newest
//! manifest). The local copies are what the kernel works with, as without a store; the store
//! is the truth when they differ.

use crate::head::{Head, TaskKeys};
use crate::objects::{Store, StoreError};
use crate::state::{self, Manifest, StateError};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why the task's state could not be brought here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The checkpoints could not be read or written, or were refused.
    #[error(transparent)]
    State(#[from] StateError),
    /// A local file could not be written.
    #[error("{what} {path}: {source}")]
    Local {
        /// What.
        what: &'static str,
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn local<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FetchError + 'a {
    move |source| FetchError::Local {
        what,
        path: path.display().to_string(),
        source,
    }
}

fn private_dir(dir: &Path) -> Result<(), FetchError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(local("cannot create", dir))
}

/// What the log fetch found.
#[derive(Debug, Clone)]
pub struct LogFetched {
    /// The local log's length afterwards: the uploader starts there.
    pub bytes: u64,
    /// Whether the local log was written from the store (it differed).
    pub rewritten: bool,
    /// Segments the head counts that the store does not have (lost with a dead holder).
    pub missing: u64,
    /// Records the local log held that the store's does not (a holder on this disk died
    /// before they reached the store, and another holder wrote since): kept beside the log
    /// in this file, with how many lines, instead of being overwritten.
    pub kept_aside: Option<(PathBuf, u64)>,
}

/// The name of the file beside `log_file` that keeps the records of epoch `epoch` the store
/// never got: `<task>.jsonl.unstored-<epoch>` (`-2`, `-3`, … when that exists).
pub fn unstored_path(log_file: &Path, epoch: u64, n: u32) -> PathBuf {
    let mut name = log_file.as_os_str().to_owned();
    name.push(format!(".unstored-{epoch}"));
    if n > 1 {
        name.push(format!("-{n}"));
    }
    PathBuf::from(name)
}

fn line_hash(line: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    line.hash(&mut h);
    h.finish()
}

/// Writes the lines of `local` that `stored` does not hold into a new file beside
/// `log_file` (never over an existing one); the file and how many lines, or `None` when the
/// store holds them all.
fn keep_aside(
    here: &Path,
    stored: &Path,
    log_file: &Path,
    epoch: u64,
) -> Result<Option<(PathBuf, u64)>, FetchError> {
    use std::io::BufRead;
    let Ok(file) = std::fs::File::open(here) else {
        return Ok(None);
    };
    let mut known = std::collections::HashSet::new();
    let theirs = std::fs::File::open(stored).map_err(local("cannot read", stored))?;
    for line in std::io::BufReader::new(theirs).split(b'\n') {
        known.insert(line_hash(&line.map_err(local("cannot read", stored))?));
    }
    let mut extra = Vec::new();
    let mut lines = 0u64;
    for line in std::io::BufReader::new(file).split(b'\n') {
        let line = line.map_err(local("cannot read", here))?;
        if line.is_empty() || known.contains(&line_hash(&line)) {
            continue;
        }
        extra.extend_from_slice(&line);
        extra.push(b'\n');
        lines += 1;
    }
    if lines == 0 {
        return Ok(None);
    }
    for n in 1..=1000 {
        let path = unstored_path(log_file, epoch, n);
        match std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(&extra)
                    .and_then(|()| f.sync_all())
                    .map_err(local("cannot write", &path))?;
                return Ok(Some((path, lines)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(local("cannot create", &path)(e)),
        }
    }
    Err(FetchError::Local {
        what: "no free name for the unstored records beside",
        path: log_file.display().to_string(),
        source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
    })
}

/// Makes `log_file` the task's log as the store has it, unless it already is as long, or this
/// disk wrote the store's log last (`ours`) and has at least as much: then the local file is
/// kept, and what it has beyond the store's is uploaded next.
///
/// A local log that is replaced never loses a record: its lines the store's log does not hold
/// (a holder on this disk that died before they were uploaded, while another holder wrote
/// since) are first written beside it, to [`unstored_path`] with `epoch` (the epoch of the
/// holder that wrote them, as far as this disk knows), and named in
/// [`LogFetched::kept_aside`]. They are never mixed into the store's order.
pub async fn log(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    log_file: &Path,
    ours: bool,
    epoch: u64,
) -> Result<LogFetched, FetchError> {
    let want = head.log_bytes();
    let have = std::fs::metadata(log_file).map_or(0, |m| m.len());
    if have == want || (ours && have > want) {
        return Ok(LogFetched {
            bytes: want,
            rewritten: false,
            missing: 0,
            kept_aside: None,
        });
    }
    let dir = log_file.parent().unwrap_or(Path::new("."));
    private_dir(dir)?;
    let tmp = log_file.with_extension(format!("jsonl.fetch-{}", uuid::Uuid::new_v4()));
    let result = async {
        let mut out = create_private(&tmp)?;
        let mut bytes = 0u64;
        let mut missing = 0u64;
        for run in &head.log {
            for seq in 1..=run.segments {
                match store.get(&store.key(&keys.segment(run, seq))).await? {
                    Some((data, _)) => {
                        out.write_all(&data).map_err(local("cannot write", &tmp))?;
                        bytes += data.len() as u64;
                    }
                    None => missing += 1,
                }
            }
        }
        drop(out);
        let kept_aside = if have > 0 {
            keep_aside(log_file, &tmp, log_file, epoch)?
        } else {
            None
        };
        std::fs::rename(&tmp, log_file).map_err(local("cannot replace", log_file))?;
        Ok(LogFetched {
            bytes,
            rewritten: true,
            missing,
            kept_aside,
        })
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The key of records recovered from a disk ([`LogFetched::kept_aside`]) uploaded by the
/// holder of `epoch` whose writer id is `writer`: `recovered/<epoch>-<writer>-<from>.jsonl`,
/// `from` being the epoch of the holder that wrote them. Never part of the log the head counts
/// (another holder's order); `flowrepl store show` lists them.
pub fn recovered_key(keys: &TaskKeys, epoch: u64, writer: &str, from: u64) -> String {
    let base = keys.prefix();
    format!("{base}/recovered/{epoch:010}-{writer}-{from:010}.jsonl")
}

/// Uploads the records kept beside the log at `path` as recovered records (see
/// [`recovered_key`]); the key.
pub async fn upload_recovered(
    store: &Store,
    keys: &TaskKeys,
    epoch: u64,
    writer: &str,
    from: u64,
    path: &Path,
) -> Result<String, FetchError> {
    let data = std::fs::read(path).map_err(local("cannot read", path))?;
    let key = recovered_key(keys, epoch, writer, from);
    store
        .put_new(&store.key(&key), bytes::Bytes::from(data))
        .await?;
    Ok(key)
}

/// A log segment the head counts that the store does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingSegment {
    /// Its key under the store's prefix.
    pub key: String,
    /// Its holder's epoch.
    pub epoch: u64,
    /// Its number in that epoch.
    pub seq: u64,
    /// Whether it may still come: the newest segment of a format-1 holder (which counts a
    /// segment just before it writes it) that has not released the task, as opposed to one
    /// followed by later segments or holders, or of a holder that writes its segments before
    /// counting them, which never will.
    pub may_come: bool,
}

/// What [`append_log`] did.
#[derive(Debug, Clone, Default)]
pub struct Appended {
    /// Bytes appended.
    pub bytes: u64,
    /// Segments the head counts that are not in the store (each said once: it is added to
    /// `done` too, unless it may still come).
    pub missing: Vec<MissingSegment>,
}

/// Appends to `file` the log segments of `head` not in `done` (each `(epoch, seq)` appended
/// is added to it), in order.
///
/// A segment the head counts that the store does not have never stops the copy: the
/// segments after it are appended (each segment is whole JSONL lines, so the records after a
/// gap are whole records, each naming its plan, task, session and cell), and it is named in
/// [`Appended::missing`]. A format-1 holder counts a segment in the head before it writes
/// it, so its newest segment may still be on its way while it holds the task: with
/// `wait_for_newest` it is left for the next call (followers: `tail -f`); without, it is
/// named as missing with [`MissingSegment::may_come`] (readers that read once). Every other
/// missing segment is final (its holder died between counting and writing it) and is marked
/// done, so that it is named once.
pub async fn append_log(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    file: &Path,
    done: &mut std::collections::BTreeSet<(u64, u64)>,
    wait_for_newest: bool,
) -> Result<Appended, FetchError> {
    let mut appended = Appended::default();
    let mut out: Option<std::fs::File> = None;
    let runs = head.log.len();
    for (i, run) in head.log.iter().enumerate() {
        for seq in 1..=run.segments {
            if done.contains(&(run.epoch, seq)) {
                continue;
            }
            let key = keys.segment(run, seq);
            let Some((data, _)) = store.get(&store.key(&key)).await? else {
                // Only a format-1 run counts a segment before writing it; a run with a
                // writer id writes it first.
                let may_come =
                    run.writer.is_none() && i + 1 == runs && seq == run.segments && !head.released;
                if may_come && wait_for_newest {
                    return Ok(appended);
                }
                if !may_come {
                    done.insert((run.epoch, seq));
                }
                appended.missing.push(MissingSegment {
                    key,
                    epoch: run.epoch,
                    seq,
                    may_come,
                });
                continue;
            };
            if out.is_none() {
                if let Some(dir) = file.parent() {
                    private_dir(dir)?;
                }
                out = Some(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .mode(0o600)
                        .open(file)
                        .map_err(local("cannot open", file))?,
                );
            }
            if let Some(f) = out.as_mut() {
                f.write_all(&data).map_err(local("cannot write", file))?;
            }
            appended.bytes += data.len() as u64;
            done.insert((run.epoch, seq));
        }
    }
    Ok(appended)
}

/// The folders of the store's tasks: every task of `plan` (every plan when `None`), or the
/// one task named.
pub async fn task_folders(
    store: &Store,
    plan: Option<&str>,
    task: Option<&str>,
) -> Result<Vec<TaskKeys>, StoreError> {
    use flowrepl_task_logger::path::safe_component;
    let plans = match plan {
        Some(p) => vec![safe_component(p)],
        None => store.children(crate::head::TASKS).await?,
    };
    let mut out = Vec::new();
    for p in plans {
        let tasks = match task {
            Some(t) => vec![safe_component(t)],
            None => {
                store
                    .children(&format!("{}/{p}", crate::head::TASKS))
                    .await?
            }
        };
        out.extend(tasks.iter().map(|t| TaskKeys::of_folder(&p, t)));
    }
    Ok(out)
}

/// The heads of the store's tasks ([`task_folders`]). Heads that do not parse are skipped
/// (and said).
pub async fn heads(
    store: &Store,
    plan: Option<&str>,
    task: Option<&str>,
) -> Result<Vec<(TaskKeys, Head)>, StoreError> {
    let mut out = Vec::new();
    for keys in task_folders(store, plan, task).await? {
        let Some((bytes, _)) = store.get(&store.key(&keys.head())).await? else {
            continue;
        };
        match serde_json::from_slice::<Head>(&bytes) {
            Ok(head) => out.push((keys, head)),
            Err(e) => {
                tracing::warn!(key = %keys.head(), error = %e, "a task's head does not parse; skipped")
            }
        }
    }
    Ok(out)
}

/// What the checkpoint fetch found.
#[derive(Debug, Clone, Default)]
pub struct StateFetched {
    /// The checkpoints the store has, by name.
    pub checkpoints: Vec<String>,
    /// Whether the local folder was written from the store (it differed).
    pub rewritten: bool,
    /// The workspace files of the same state, if it has them.
    pub workspace: Option<crate::workspace::Workspace>,
}

/// Makes the checkpoint folder `root` hold the checkpoints of the head's newest manifest
/// (and the sandboxed mark when they came from a sandboxed session), unless this disk wrote
/// that manifest (`ours`) and still has a checkpoint folder: its own is at least as new.
pub async fn checkpoints(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    root: &Path,
    mark: &Path,
    ours: bool,
) -> Result<StateFetched, FetchError> {
    let Some(key) = &head.state else {
        return Ok(StateFetched::default());
    };
    if ours && std::fs::read_dir(root).is_ok_and(|mut d| d.next().is_some()) {
        return Ok(StateFetched::default());
    }
    let Some((bytes, _)) = store.get(&store.key(key)).await? else {
        return Err(StateError::Refused(format!("the head names {key}, which is missing")).into());
    };
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| StateError::Refused(format!("{key}: {e}")))?;
    state::check(&manifest)?;
    let names = manifest.checkpoints.keys().cloned().collect();
    let workspace = manifest.workspace.clone();
    if manifest.sandboxed {
        // Before the folder: a crash in between must not leave sandboxed pickles unmarked.
        if let Some(dir) = mark.parent() {
            private_dir(dir)?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(mark)
            .map_err(local("cannot create", mark))?;
    }
    let mut hashed = state::Hashed::new();
    if let Ok((here, _)) = state::read(root, manifest.sandboxed, &mut hashed) {
        if here.same_checkpoints(&manifest) {
            return Ok(StateFetched {
                checkpoints: names,
                rewritten: false,
                workspace,
            });
        }
    }
    let parent = root.parent().unwrap_or(Path::new("."));
    private_dir(parent)?;
    let tmp = root.with_extension(format!("fetch-{}", uuid::Uuid::new_v4()));
    let result = async {
        private_dir(&tmp)?;
        for (name, cp) in &manifest.checkpoints {
            let folder = tmp.join(name);
            private_dir(&folder)?;
            for (seg, s) in &cp.segments {
                if let Some(content) = s.content() {
                    // Carried in the manifest: checked against its hash as a blob is.
                    let data = content.map_err(|e| match e {
                        StateError::Refused(why) => {
                            StateError::Refused(format!("checkpoint {name:?}: {seg}: {why}"))
                        }
                        e => e,
                    })?;
                    write_new(&folder.join(seg), &data)?;
                    continue;
                }
                let Some((data, _)) = store.get(&store.key(&keys.blob(&s.sha256))).await? else {
                    return Err(StateError::Refused(format!(
                        "checkpoint {name:?}: blob {} of {seg} is missing",
                        s.sha256
                    ))
                    .into());
                };
                if state::sha256(&data) != s.sha256 {
                    return Err(StateError::Refused(format!(
                        "checkpoint {name:?}: blob {} of {seg} does not have that hash",
                        s.sha256
                    ))
                    .into());
                }
                write_new(&folder.join(seg), &data)?;
            }
            write_new(
                &folder.join(flowrepl_task_logger::checkpoint::JOURNAL),
                cp.journal.as_bytes(),
            )?;
        }
        // The old folder aside, the new one in its place, the old one gone.
        let old = root.with_extension(format!("old-{}", uuid::Uuid::new_v4()));
        let had = std::fs::symlink_metadata(root).is_ok();
        if had {
            std::fs::rename(root, &old).map_err(local("cannot move aside", root))?;
        }
        std::fs::rename(&tmp, root).map_err(local("cannot replace", root))?;
        if had {
            let _ = std::fs::remove_dir_all(&old);
        }
        Ok(StateFetched {
            checkpoints: names,
            rewritten: true,
            workspace,
        })
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// What the workspace fetch did.
#[derive(Debug, Default)]
pub struct WorkspaceFetched {
    /// Files written (their content was not there).
    pub written: u64,
    /// Files already there.
    pub kept: u64,
    /// Files not written: path and why (a symbolic link in the way, a blob missing or not of
    /// its hash).
    pub not_written: Vec<(String, String)>,
    /// Of those, the files whose content the store lost (a blob missing or not of its hash):
    /// path and reason, the reason starting with [`crate::workspace::LOST`], to keep naming
    /// them in the next state ([`crate::workspace::Limits::lost`]).
    pub lost: std::collections::BTreeMap<String, String>,
}

/// Writes the files of `workspace` beneath `root` (see [`crate::workspace`]). A file whose
/// blob is missing or not of its hash is not written, and named in
/// [`WorkspaceFetched::not_written`] and [`WorkspaceFetched::lost`]; so are files the state
/// already named as lost.
pub async fn workspace(
    store: &Store,
    keys: &TaskKeys,
    workspace: &crate::workspace::Workspace,
    root: &Path,
) -> Result<WorkspaceFetched, FetchError> {
    use crate::workspace::LOST;
    let mut done = WorkspaceFetched {
        lost: crate::workspace::lost_of(workspace),
        ..Default::default()
    };
    for (path, why) in &done.lost {
        done.not_written.push((path.clone(), why.clone()));
    }
    let beneath = flowrepl_os::beneath::Beneath::open(root).map_err(|e| FetchError::Local {
        what: "cannot open the workspace",
        path: root.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    for (path, entry) in &workspace.files {
        let target = root.join(path);
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.len() == entry.bytes)
            && crate::workspace::read(&beneath, path).is_ok_and(|(_, e)| e.sha256 == entry.sha256)
        {
            done.kept += 1;
            continue;
        }
        let why = match store.get(&store.key(&keys.blob(&entry.sha256))).await? {
            None => format!(
                "{LOST}its content (blob {}) is missing from the store",
                entry.sha256
            ),
            Some((data, _)) if state::sha256(&data) != entry.sha256 => format!(
                "{LOST}its content in the store (blob {}) does not have that hash",
                entry.sha256
            ),
            Some((data, _)) => {
                match crate::workspace::write_back(&beneath, path, entry, &data) {
                    Ok(true) => done.written += 1,
                    Ok(false) => done.kept += 1,
                    Err(e) => done.not_written.push((path.clone(), e.why)),
                }
                continue;
            }
        };
        done.not_written.push((path.clone(), why.clone()));
        done.lost.insert(path.clone(), why);
    }
    Ok(done)
}

/// A new file only this user can read (it must not exist).
fn create_private(path: &Path) -> Result<std::fs::File, FetchError> {
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(local("cannot create", path))
}

fn write_new(path: &Path, data: &[u8]) -> Result<(), FetchError> {
    create_private(path)?
        .write_all(data)
        .map_err(local("cannot write", path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::LogRun;
    use bytes::Bytes;

    use crate::test_runtime as rt;

    fn head_with(runs: Vec<LogRun>, released: bool) -> Head {
        Head {
            v: 2,
            plan_id: "p".into(),
            task_id: "t".into(),
            epoch: runs.last().map_or(1, |r| r.epoch),
            released,
            log: runs,
            ..Default::default()
        }
    }

    /// A counted segment that is missing does not stop the copy: the ones after it are
    /// appended, and it is named; the newest segment of a live holder may still come.
    #[test]
    fn a_missing_segment_is_named_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let keys = TaskKeys::new("p", "t");
        let run1 = LogRun {
            epoch: 1,
            segments: 3,
            bytes: 6,
            writer: None,
        };
        let run2 = LogRun {
            epoch: 2,
            segments: 2,
            bytes: 4,
            writer: None,
        };
        rt().block_on(async {
            for (run, seq, body) in [(&run1, 1, "a\n"), (&run1, 3, "c\n"), (&run2, 1, "d\n")] {
                store
                    .put_new(
                        &store.key(&keys.segment(run, seq)),
                        Bytes::from_static(body.as_bytes()),
                    )
                    .await
                    .unwrap();
            }
            let head = head_with(vec![run1.clone(), run2.clone()], false);
            let out = tempfile::tempdir().unwrap();
            let file = out.path().join("t.jsonl");
            let mut done = std::collections::BTreeSet::new();
            // A follower: segment 2 of epoch 1 is gone for good; epoch 2's newest may come.
            let got = append_log(&store, &keys, &head, &file, &mut done, true)
                .await
                .unwrap();
            assert_eq!(std::fs::read_to_string(&file).unwrap(), "a\nc\nd\n");
            assert_eq!(got.missing.len(), 1, "{got:?}");
            assert_eq!((got.missing[0].epoch, got.missing[0].seq), (1, 2));
            assert!(!got.missing[0].may_come);
            // Said once.
            let again = append_log(&store, &keys, &head, &file, &mut done, true)
                .await
                .unwrap();
            assert!(again.missing.is_empty() && again.bytes == 0, "{again:?}");
            // A one-shot reader names the newest as possibly coming.
            let got = append_log(&store, &keys, &head, &file, &mut done, false)
                .await
                .unwrap();
            assert_eq!(got.missing.len(), 1);
            assert!(got.missing[0].may_come, "{got:?}");
            // A holder that writes its segments before counting them (a writer id): its
            // newest missing segment is gone for good, said to a follower at once.
            let run3 = LogRun {
                epoch: 3,
                segments: 1,
                bytes: 2,
                writer: Some("w".into()),
            };
            let head3 = head_with(vec![run1.clone(), run2.clone(), run3], false);
            let got = append_log(&store, &keys, &head3, &file, &mut done, true)
                .await
                .unwrap();
            // (Epoch 2's newest, followed by another holder now, is final too.)
            assert_eq!(got.missing.len(), 2, "{got:?}");
            assert!(got.missing.iter().all(|m| !m.may_come), "{got:?}");
            assert_eq!((got.missing[1].epoch, got.missing[1].seq), (3, 1));
            // The kernel's fetch reads past the gaps too.
            let log_file = out.path().join("k.jsonl");
            let fetched = log(&store, &keys, &head, &log_file, false, 1)
                .await
                .unwrap();
            assert_eq!(std::fs::read_to_string(&log_file).unwrap(), "a\nc\nd\n");
            assert_eq!(fetched.missing, 2);
        });
    }

    /// A local log the store's replaces keeps its records the store does not have beside it,
    /// never over an earlier such file.
    #[test]
    fn records_the_store_never_got_are_kept_beside_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let keys = TaskKeys::new("p", "t");
        let run = LogRun {
            epoch: 2,
            segments: 1,
            bytes: 4,
            writer: Some("w".into()),
        };
        rt().block_on(async {
            store
                .put_new(
                    &store.key(&keys.segment(&run, 1)),
                    Bytes::from_static(b"a\nd\n"),
                )
                .await
                .unwrap();
            let head = head_with(vec![run], true);
            let out = tempfile::tempdir().unwrap();
            let file = out.path().join("t.jsonl");
            for round in 1..=2 {
                std::fs::write(&file, "a\nb\nc\n").unwrap();
                let got = log(&store, &keys, &head, &file, false, 1).await.unwrap();
                assert_eq!(std::fs::read_to_string(&file).unwrap(), "a\nd\n");
                let (aside, lines) = got.kept_aside.expect("kept aside");
                assert_eq!(lines, 2);
                assert_eq!(aside, unstored_path(&file, 1, round));
                assert_eq!(std::fs::read_to_string(&aside).unwrap(), "b\nc\n");
            }
            assert_eq!(
                std::fs::read_to_string(unstored_path(&file, 1, 1)).unwrap(),
                "b\nc\n"
            );
            // A local log the store holds whole is replaced without a file beside it.
            std::fs::write(&file, "a\n").unwrap();
            let got = log(&store, &keys, &head, &file, false, 1).await.unwrap();
            assert!(got.kept_aside.is_none());
        });
    }
}
