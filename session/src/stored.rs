//! The task's state in the object store (`--store`): the task taken and brought onto this
//! disk before the kernel starts, uploaded while it runs, let go when it stops.
//!
//! Start-up with a store, in order: the store is opened and probed (a missing bucket or bad
//! credentials end the start with one line, exit 2); the task's lease is taken (waiting for a
//! holder that died to lapse; giving up at once when the holder is alive); the task's log and
//! checkpoints are made on this disk what the store has; then the kernel starts as without a
//! store, and the uploader ([`flowrepl_store::mirror`]) runs beside it.

use crate::config::Config;
use flowrepl_store::fetch::{self, FetchError};
use flowrepl_store::head::Holder;
use flowrepl_store::lease::{Lease, TakeError};
use flowrepl_store::mirror::{Files, Mirror};
use flowrepl_store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// The exit code of a kernel whose task another kernel holds (EX_TEMPFAIL): `serve` tells it
/// from a failed start.
pub const EXIT_HELD: u8 = 75;

/// The longest a start waits for the task's lease, whatever the holder's lease says.
const TAKE_WITHIN: Duration = Duration::from_secs(620);

/// Why the task could not be taken from the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The URL is wrong, or the store does not let this kernel read and write.
    #[error("the store {url} cannot be used: {error}")]
    Store {
        /// The URL.
        url: String,
        /// Why (its message holds its causes).
        error: StoreError,
    },
    /// Another kernel holds the task.
    #[error(transparent)]
    Take(#[from] TakeError),
    /// The task's state could not be brought here.
    #[error("the task's state could not be fetched from the store: {0}")]
    Fetch(#[from] FetchError),
    /// A runtime or thread could not be started.
    #[error("the store's thread could not start: {0}")]
    Thread(#[from] std::io::Error),
}

impl AttachError {
    /// Whether another kernel holds the task (as opposed to a broken store or setup).
    pub fn is_held(&self) -> bool {
        matches!(self, AttachError::Take(TakeError::Held { .. }))
    }
}

/// A task taken from the store, its state on this disk, its uploader not yet started.
pub struct Attached {
    lease: Lease,
    log_offset: u64,
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Takes the task of `config` from its store (`None` without `--store`) and brings its log
/// and checkpoints onto this disk.
pub fn attach(config: &Config) -> Result<Option<Attached>, AttachError> {
    let Some(settings) = &config.store else {
        return Ok(None);
    };
    let bad = |error| AttachError::Store {
        url: settings.url.clone(),
        error,
    };
    let store = Store::open(&settings.url).map_err(bad)?;
    let rt = runtime()?;
    rt.block_on(async {
        store.probe().await.map_err(bad)?;
        let id = std::env::var(flowrepl_cli::env::STORE_HOLDER)
            .unwrap_or_else(|_| config.identity.session_id.clone());
        let me = Holder::me(&id);
        let lease = Lease::take(
            &store,
            &config.identity.plan_id,
            &config.identity.task_id,
            me,
            settings.lease,
            TAKE_WITHIN,
        )
        .await?;
        let head = lease.head().clone();
        // This disk's files are at least as new as the store's when it wrote the store's
        // newest state and log itself (the same disk taking the task again).
        let marker = flowrepl_store::local::Marker::read(&config.log_file);
        let ours_log = marker
            .as_ref()
            .is_some_and(|m| m.log_bytes == head.log_bytes());
        let ours_state = marker
            .as_ref()
            .is_some_and(|m| m.state.is_some() && m.state == head.state);
        let log = fetch::log(&store, lease.keys(), &head, &config.log_file, ours_log).await?;
        let mark = flowrepl_task_logger::checkpoint::sandboxed_mark(&config.checkpoint_root);
        let state = fetch::checkpoints(
            &store,
            lease.keys(),
            &head,
            &config.checkpoint_root,
            &mark,
            ours_state,
        )
        .await?;
        // A state this disk committed came from this disk's workspace, which may have changed
        // since (a client's upload while the kernel was stopped): it is kept as it is.
        let files = match (&state.workspace, settings.workspace_max_bytes) {
            (Some(w), max) if max > 0 && !ours_state => {
                let done = fetch::workspace(&store, lease.keys(), w, &config.workspace).await?;
                for e in &done.not_written {
                    tracing::warn!("workspace file not written back: {e}");
                }
                done.written
            }
            _ => 0,
        };
        tracing::info!(
            store = %settings.url,
            epoch = head.epoch,
            workspace_files_written = files,
            log_bytes = log.bytes,
            log_from_store = log.rewritten,
            log_segments_missing = log.missing,
            checkpoints = ?state.checkpoints,
            checkpoints_from_store = state.rewritten,
            "the task's state is on this disk"
        );
        Ok(Some(Attached {
            lease,
            log_offset: log.bytes,
        }))
    })
}

impl Attached {
    /// Starts uploading the task's files as they change.
    pub fn start(self, config: &Config) -> std::io::Result<Arc<Mirror>> {
        Mirror::start(
            self.lease,
            Files {
                log_file: config.log_file.clone(),
                log_offset: self.log_offset,
                checkpoint_root: config.checkpoint_root.clone(),
                sandboxed: config.worker.as_ref().is_some_and(|w| w.sandbox.is_some()),
                workspace: config.store.as_ref().and_then(|s| {
                    (s.workspace_max_bytes > 0).then(|| flowrepl_store::workspace::Limits {
                        root: config.workspace.clone(),
                        // The task's log folder (and its checkpoints) when it is inside.
                        exclude: flowrepl_task_logger::path::log_dir_of(&config.log_file)
                            .map(std::path::Path::to_path_buf)
                            .into_iter()
                            .collect(),
                        max_bytes: s.workspace_max_bytes,
                        marker: flowrepl_task_logger::path::workspace_marker(&config.log_file),
                    })
                }),
            },
        )
    }

    /// Lets the task go without having run (the kernel could not start).
    pub fn release(mut self) {
        if let Ok(rt) = runtime() {
            if let Err(e) = rt.block_on(self.lease.release()) {
                tracing::warn!(error = %e, "the task's lease could not be released; it lapses by itself");
            }
        }
    }
}
