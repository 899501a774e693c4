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

/// Segments already copied, per task's log file.
type Copied = HashMap<PathBuf, BTreeSet<(u64, u64)>>;

async fn copy(
    store: &Store,
    scope: &Scope,
    dir: &Path,
    copied: &mut Copied,
) -> Result<(), flowrepl_store::fetch::FetchError> {
    let heads = fetch::heads(store, scope.plan.as_deref(), scope.task.as_deref()).await?;
    for (keys, head) in heads {
        let file = flowrepl_task_logger::task_log_path(dir, &head.plan_id, &head.task_id);
        let done = copied.entry(file.clone()).or_default();
        fetch::append_log(store, &keys, &head, &file, done).await?;
    }
    Ok(())
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
    runtime
        .block_on(copy(&store, scope, dir.path(), &mut copied))
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
                        if let Err(e) = runtime.block_on(copy(&store, &scope, &path, &mut copied)) {
                            eprintln!("flowrepl log: reading the store {url}: {e}");
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
        stop,
        follower,
    })
}
