//! Bringing a task's state from the store onto this machine's disk, before its kernel starts:
//! the log (the segments the head counts, in order) and the checkpoint folder (from the newest
//! manifest). The local copies are what the kernel works with, as without a store; the store
//! is the truth when they differ.

use crate::head::{Head, TaskKeys};
use crate::objects::{Store, StoreError};
use crate::state::{self, Manifest, StateError};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

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
#[derive(Debug, Clone, Copy)]
pub struct LogFetched {
    /// The local log's length afterwards: the uploader starts there.
    pub bytes: u64,
    /// Whether the local log was written from the store (it differed).
    pub rewritten: bool,
    /// Segments the head counts that the store does not have (lost with a dead holder).
    pub missing: u64,
}

/// Makes `log_file` the task's log as the store has it, unless it already is as long, or this
/// disk wrote the store's log last (`ours`) and has at least as much: then the local file is
/// kept, and what it has beyond the store's is uploaded next.
pub async fn log(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    log_file: &Path,
    ours: bool,
) -> Result<LogFetched, FetchError> {
    let want = head.log_bytes();
    let have = std::fs::metadata(log_file).map_or(0, |m| m.len());
    if have == want || (ours && have > want) {
        return Ok(LogFetched {
            bytes: want,
            rewritten: false,
            missing: 0,
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
                match store
                    .get(&store.key(&keys.log_segment(run.epoch, seq)))
                    .await?
                {
                    Some((data, _)) => {
                        out.write_all(&data).map_err(local("cannot write", &tmp))?;
                        bytes += data.len() as u64;
                    }
                    None => missing += 1,
                }
            }
        }
        std::fs::rename(&tmp, log_file).map_err(local("cannot replace", log_file))?;
        Ok(LogFetched {
            bytes,
            rewritten: true,
            missing,
        })
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Appends to `file` the log segments of `head` not in `done` (each `(epoch, seq)` appended
/// is added to it), in order; a segment the store does not have yet is left for the next
/// call. For readers that follow a task (`flowrepl log tail -f --store`).
pub async fn append_log(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    file: &Path,
    done: &mut std::collections::BTreeSet<(u64, u64)>,
) -> Result<u64, FetchError> {
    let mut appended = 0u64;
    let mut out: Option<std::fs::File> = None;
    for run in &head.log {
        for seq in 1..=run.segments {
            if done.contains(&(run.epoch, seq)) {
                continue;
            }
            let Some((data, _)) = store
                .get(&store.key(&keys.log_segment(run.epoch, seq)))
                .await?
            else {
                return Ok(appended);
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
            appended += data.len() as u64;
            done.insert((run.epoch, seq));
        }
    }
    Ok(appended)
}

/// The heads of the store's tasks: every task of `plan` (every plan when `None`), or the one
/// task named. Heads that do not parse are skipped (and said).
pub async fn heads(
    store: &Store,
    plan: Option<&str>,
    task: Option<&str>,
) -> Result<Vec<(TaskKeys, Head)>, StoreError> {
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
        for t in tasks {
            let keys = TaskKeys::of_folder(&p, &t);
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
        if here.checkpoints == manifest.checkpoints {
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
    /// Files not written, and why (a symbolic link in the way, a missing blob).
    pub not_written: Vec<String>,
}

/// Writes the files of `workspace` beneath `root` (see [`crate::workspace`]).
pub async fn workspace(
    store: &Store,
    keys: &TaskKeys,
    workspace: &crate::workspace::Workspace,
    root: &Path,
) -> Result<WorkspaceFetched, FetchError> {
    let mut done = WorkspaceFetched::default();
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
        let Some((data, _)) = store.get(&store.key(&keys.blob(&entry.sha256))).await? else {
            done.not_written
                .push(format!("{path}: its blob {} is missing", entry.sha256));
            continue;
        };
        if state::sha256(&data) != entry.sha256 {
            done.not_written
                .push(format!("{path}: its blob does not have that hash"));
            continue;
        }
        match crate::workspace::write_back(&beneath, path, entry, &data) {
            Ok(true) => done.written += 1,
            Ok(false) => done.kept += 1,
            Err(e) => done.not_written.push(e.to_string()),
        }
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
