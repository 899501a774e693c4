//! `flowrepl log … --store URL`: the task logs read from the object store instead of the log
//! folder. The tasks the command's scope names (their plan, their task, or every one) have
//! their log segments, in order, copied into a private temporary folder laid out as a log
//! folder, which the subcommand then reads as it reads any; `tail -f` keeps appending the
//! segments that arrive (a task's uploader writes one at most every second). `replay` runs
//! its kernel with the same store, so its checkpoint lands there.

use super::{LogCmdError, Scope};
use flowrepl_store::fetch;
use flowrepl_store::Store;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often `tail -f --store` looks at the store for new segments.
pub const POLL: Duration = Duration::from_secs(1);

/// The store's logs on this disk, for as long as it lives.
pub struct StoredLogs {
    dir: tempfile::TempDir,
    /// The log segments the tasks' heads count that the store does not have, one line each
    /// (said on stderr; the command then exits with [`EXIT_GAPS`]).
    pub missing: Vec<String>,
    stop: Arc<AtomicBool>,
    follower: Option<std::thread::JoinHandle<()>>,
}

impl StoredLogs {
    /// The log folder to read.
    pub fn log_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for StoredLogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.follower.take() {
            let _ = t.join();
        }
    }
}

fn failed(url: &str) -> impl Fn(String) -> LogCmdError + '_ {
    move |e| LogCmdError::Io {
        what: format!("reading the store {url}"),
        source: std::io::Error::other(e),
    }
}

/// The exit code of a `flowrepl log … --store` that showed what the store has, but the
/// store lacks log segments its heads count (a holder killed between counting a segment and
/// writing it): every record that exists was read, and each missing segment is named on
/// stderr.
pub const EXIT_GAPS: u8 = 3;

/// Segments already copied, per task's log file.
type Copied = HashMap<PathBuf, BTreeSet<(u64, u64)>>;

/// How long a one-shot read waits for the newest segment of a live holder, which counts a
/// segment in the head just before it writes it.
const NEWEST_WAIT: Duration = Duration::from_secs(3);

/// One line naming a missing segment.
fn say_missing(plan: &str, task: &str, m: &fetch::MissingSegment) -> String {
    if m.may_come {
        format!(
            "task {plan}/{task}: log segment {} (epoch {}, #{}) is counted but not in the store yet: its holder is writing it, or died before it could; the records before and after it are shown",
            m.key, m.epoch, m.seq
        )
    } else {
        format!(
            "task {plan}/{task}: log segment {} (epoch {}, #{}) is missing from the store: its holder counted it and died (or lost the store) before writing it, so its records are lost; the records before and after it are shown",
            m.key, m.epoch, m.seq
        )
    }
}

/// Copies the segments of the scope's tasks not copied yet; the missing ones, said.
async fn copy(
    store: &Store,
    scope: &Scope,
    dir: &Path,
    copied: &mut Copied,
    wait_for_newest: bool,
) -> Result<(Vec<String>, bool), flowrepl_store::fetch::FetchError> {
    let heads = fetch::heads(store, scope.plan.as_deref(), scope.task.as_deref()).await?;
    let mut missing = Vec::new();
    let mut waiting = false;
    for (keys, head) in heads {
        let file = flowrepl_task_logger::task_log_path(dir, &head.plan_id, &head.task_id);
        let done = copied.entry(file.clone()).or_default();
        let got = fetch::append_log(store, &keys, &head, &file, done, wait_for_newest).await?;
        for m in &got.missing {
            missing.push(say_missing(&head.plan_id, &head.task_id, m));
        }
        let counted: u64 = head.log.iter().map(|r| r.segments).sum();
        waiting |= (done.len() as u64) < counted && wait_for_newest;
    }
    Ok((missing, waiting))
}

/// A one-shot copy: the newest segment of a live holder is waited for a moment, then named
/// as missing if it still is not there.
async fn copy_once(
    store: &Store,
    scope: &Scope,
    dir: &Path,
    copied: &mut Copied,
) -> Result<Vec<String>, flowrepl_store::fetch::FetchError> {
    let started = std::time::Instant::now();
    let mut missing = Vec::new();
    loop {
        let last = started.elapsed() >= NEWEST_WAIT;
        let (m, waiting) = copy(store, scope, dir, copied, !last).await?;
        missing.extend(m);
        if !waiting || last {
            return Ok(missing);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Copies the logs of `scope` from the store at `url`; with `follow`, keeps copying new
/// segments until dropped.
pub fn fetch(url: &str, scope: &Scope, follow: bool) -> Result<StoredLogs, LogCmdError> {
    let store = Store::open(url).map_err(|e| failed(url)(e.to_string()))?;
    let dir = tempfile::Builder::new()
        .prefix("flowrepl-log-store-")
        .tempdir()
        .map_err(|source| LogCmdError::Io {
            what: "making a temporary folder".into(),
            source,
        })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| LogCmdError::Io {
            what: "starting the store's runtime".into(),
            source,
        })?;
    let mut copied = Copied::new();
    let missing = runtime
        .block_on(copy_once(&store, scope, dir.path(), &mut copied))
        .map_err(|e| failed(url)(e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let follower = if follow {
        let (stop, scope, path) = (Arc::clone(&stop), scope.clone(), dir.path().to_owned());
        let url = url.to_owned();
        Some(
            std::thread::Builder::new()
                .name("flowrepl-log-store".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(POLL);
                        match runtime.block_on(copy(&store, &scope, &path, &mut copied, true)) {
                            Ok((missing, _)) => {
                                for m in missing {
                                    eprintln!("flowrepl log: {m}");
                                }
                            }
                            Err(e) => eprintln!("flowrepl log: reading the store {url}: {e}"),
                        }
                    }
                })
                .map_err(|source| LogCmdError::Io {
                    what: "starting the store's reader".into(),
                    source,
                })?,
        )
    } else {
        None
    };
    Ok(StoredLogs {
        dir,
        missing,
        stop,
        follower,
    })
}
