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
use flowrepl_store::head::{Head, Holder};
use flowrepl_store::lease::{Lease, TakeError};
use flowrepl_store::mirror::{Files, Mirror};
use flowrepl_store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// The exit code of a kernel whose task another kernel holds (EX_TEMPFAIL): `serve` tells it
/// from a failed start.
pub const EXIT_HELD: u8 = 75;

/// The longest a start waits for the task's lease, whatever the holder's lease says (a dead
/// holder's lease is waited out as its head says, up to 600 s).
const TAKE_WITHIN: Duration = Duration::from_secs(620);

/// How long a start waits for a live holder to hand the task over (it lets its running cell
/// end first) when neither `FLOWREPL_HANDOVER_WAIT_S` nor the MCP front's `--wait-s` says.
const HANDOVER_WAIT: Duration = Duration::from_secs(30);

/// The variable that sets how long a start waits for a live holder to hand the task over
/// (seconds); else the MCP front's `--wait-s`, else 30 s.
pub const HANDOVER_WAIT_VARIABLE: &str = "FLOWREPL_HANDOVER_WAIT_S";

fn handover_wait(config: &Config) -> Duration {
    if let Some(s) = std::env::var(HANDOVER_WAIT_VARIABLE)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
    {
        return Duration::from_secs_f64(s.min(86_400.0));
    }
    config
        .mcp
        .as_ref()
        .map_or(HANDOVER_WAIT, |m| Duration::from_secs(m.wait_s))
}

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
    /// The task's state could not be brought here. The lease taken for it was released
    /// (or, when the store did not answer, lapses by itself); `recover` says what to do.
    #[error("the task's state could not be fetched from the store: {error}; {recover}")]
    Fetch {
        /// Why.
        error: FetchError,
        /// What was done about the lease, and how to recover.
        recover: String,
    },
    /// A runtime or thread could not be started.
    #[error("the store's thread could not start: {0}")]
    Thread(#[from] std::io::Error),
}

impl AttachError {
    /// Whether another kernel holds the task (as opposed to a broken store or setup).
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            AttachError::Take(TakeError::Held { .. } | TakeError::Busy { .. })
        )
    }
}

/// A task taken from the store, its state on this disk, its uploader not yet started.
pub struct Attached {
    lease: Lease,
    log_offset: u64,
    /// For the first result: a loss, files that could not be brought back.
    warnings: Vec<String>,
    /// For `status.store.taken_over`.
    taken_over: Option<flowrepl_protocol::TakenOver>,
    /// Workspace files the state named that could not be brought back.
    lost_files: std::collections::BTreeMap<String, String>,
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The head as it is now, if there is one that parses (what the take will replace).
async fn peek(store: &Store, plan: &str, task: &str) -> Option<Head> {
    let keys = flowrepl_store::head::TaskKeys::new(plan, task);
    let (bytes, _) = store.get(&store.key(&keys.head())).await.ok()??;
    serde_json::from_slice(&bytes).ok()
}

/// The last record of the log file, described for people: type, session, cell, time.
fn last_record(log_file: &std::path::Path, bytes: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(log_file).ok()?;
    let from = bytes.saturating_sub(1 << 20);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::new();
    f.take(bytes - from).read_to_end(&mut buf).ok()?;
    let line = buf
        .split(|&b| b == b'\n')
        .rev()
        .find(|l| !l.iter().all(u8::is_ascii_whitespace))?;
    let r: serde_json::Value = serde_json::from_slice(line).ok()?;
    let text = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
    let mut out = format!("the {} record", text("type"));
    if let Some(n) = r.get("execution_count").and_then(|v| v.as_u64()) {
        out.push_str(&format!(" of cell {n}"));
    }
    out.push_str(&format!(" of session {}", text("session_id")));
    if let Some(t) = r.get("timestamp").and_then(|v| v.as_str()) {
        out.push_str(&format!(", at {t}"));
    }
    Some(out)
}

/// What to tell about a task taken from a holder that did not release it.
fn taken_over(
    previous: &Head,
    log: &fetch::LogFetched,
    log_file: &std::path::Path,
    kept_in: Option<String>,
) -> flowrepl_protocol::TakenOver {
    let last_record = last_record(log_file, log.bytes);
    let mut message = format!(
        "this kernel took the task from {} (epoch {}), which had not released it (it died or lost the store); it last committed to the store at {}; the last record in the store is {}; calls it answered after that may be lost",
        previous.holder,
        previous.epoch,
        previous.renewed_at,
        last_record.as_deref().unwrap_or("none (the store has no log)"),
    );
    if log.missing > 0 {
        message.push_str(&format!(
            "; {} log segment(s) it counted are missing from the store",
            log.missing
        ));
    }
    if let (Some((_, lines)), Some(kept_in)) = (&log.kept_aside, &kept_in) {
        message.push_str(&format!(
            "; this disk held {lines} record(s) the store never got, kept in {kept_in}"
        ));
    }
    // The same disk taking its task back: its log, longer than the store's, is kept.
    let here = std::fs::metadata(log_file).map_or(0, |m| m.len());
    if !log.rewritten && here > log.bytes {
        message.push_str(&format!(
            "; this disk's log holds {} more byte(s) of records written here, which are kept and uploaded now",
            here - log.bytes
        ));
    }
    flowrepl_protocol::TakenOver {
        holder: previous.holder.to_string(),
        epoch: previous.epoch,
        last_committed: previous.renewed_at.clone(),
        last_record,
        missing_segments: log.missing,
        unstored_records: log
            .kept_aside
            .as_ref()
            .map(|(p, _)| p.display().to_string()),
        message,
    }
}

/// Takes the task of `config` from its store (`None` without `--store`) and brings its log
/// and checkpoints onto this disk.
///
/// A start that fails after the task was taken (a refused manifest or blob, a store that
/// stopped answering) releases the lease it took, and its error says how to recover.
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
        let me = Holder::me_in(&id, &config.identity.session_id);
        let (plan, task) = (&config.identity.plan_id, &config.identity.task_id);
        let before = peek(&store, plan, task).await;
        // A live holder is asked to hand the task over (it lets its running cell end).
        let waits = flowrepl_store::lease::Waits {
            lapse: TAKE_WITHIN,
            handover: Some(handover_wait(config)),
        };
        let mut lease = Lease::take_asking(&store, plan, task, me, settings.lease, waits).await?;
        let head = lease.head().clone();
        // The head this take replaced, when its holder had not let go.
        // (The head the take itself replaced: a holder that handed the task over or parked
        // its idle lease released it, though it was held when `before` was read.)
        let unreleased = lease
            .replaced()
            .cloned()
            .or(before)
            .filter(|b| b.epoch + 1 == head.epoch && !b.released);
        match fetch_state(&store, &lease, &head, config, settings.workspace_max_bytes).await {
            Ok((log, lost_files, mut warnings)) => {
                // Records only this disk had go up too, beside the log the head counts.
                let mut recovered = None;
                if let Some((path, _)) = &log.kept_aside {
                    let from = path
                        .to_string_lossy()
                        .rsplit(".unstored-")
                        .next()
                        .and_then(|e| e.split('-').next()?.parse().ok())
                        .unwrap_or(0);
                    match fetch::upload_recovered(
                        &store,
                        lease.keys(),
                        head.epoch,
                        &lease.writer(),
                        from,
                        path,
                    )
                    .await
                    {
                        Ok(key) => recovered = Some(key),
                        Err(e) => {
                            tracing::warn!(error = %e, "the recovered records were not uploaded")
                        }
                    }
                }
                let kept_in = |path: &std::path::Path| match &recovered {
                    Some(key) => format!(
                        "{} (and in the store as {key}, beside the task's log)",
                        path.display()
                    ),
                    None => path.display().to_string(),
                };
                let taken_over = unreleased.map(|p| {
                    taken_over(&p, &log, &config.log_file, log.kept_aside.as_ref().map(|(p, _)| kept_in(p)))
                });
                if let Some(t) = &taken_over {
                    tracing::warn!("{}", t.message);
                    warnings.insert(0, t.message.clone());
                } else if let Some((path, lines)) = &log.kept_aside {
                    let w = format!(
                        "this disk held {lines} record(s) of the task the store never got (a holder here stopped before they were uploaded); the store's log replaced it, and they are kept in {}",
                        kept_in(path)
                    );
                    tracing::warn!("{w}");
                    warnings.insert(0, w);
                }
                Ok(Some(Attached {
                    lease,
                    log_offset: log.bytes,
                    warnings,
                    taken_over,
                    lost_files,
                }))
            }
            Err(error) => {
                let released = lease.release().await;
                let url = &settings.url;
                let lease_said = match released {
                    Ok(()) => format!("the lease this kernel took (epoch {}) was released", head.epoch),
                    Err(e) => format!(
                        "the lease this kernel took (epoch {}) could not be released ({e}) and lapses by itself",
                        head.epoch
                    ),
                };
                let recover = match &error {
                    FetchError::State(_) => format!(
                        "{lease_said}. The task's stored checkpoints are refused; to recover, look at them with `flowrepl store show --store {url} --plan {plan} --task {task}`, then either repair the object named, or start the task without them: `flowrepl store release --store {url} --plan {plan} --task {task} --drop-state` (the log stays; `flowrepl log replay --store {url} --plan {plan} --task {task}` runs its cells again)"
                    ),
                    _ => format!("{lease_said}; start the task again once the store answers"),
                };
                Err(AttachError::Fetch { error, recover })
            }
        }
    })
}

/// Brings the log, the checkpoints and the workspace files of `head` onto this disk; the
/// log fetched, the workspace files lost, and warnings for the first result.
async fn fetch_state(
    store: &Store,
    lease: &Lease,
    head: &Head,
    config: &Config,
    workspace_max_bytes: u64,
) -> Result<
    (
        fetch::LogFetched,
        std::collections::BTreeMap<String, String>,
        Vec<String>,
    ),
    FetchError,
> {
    // This disk's files are at least as new as the store's when it wrote the store's newest
    // state and log itself (the same disk taking the task again).
    let marker = flowrepl_store::local::Marker::read(&config.log_file);
    let ours_log = marker
        .as_ref()
        .is_some_and(|m| m.log_bytes == head.log_bytes());
    let ours_state = marker
        .as_ref()
        .is_some_and(|m| m.state.is_some() && m.state == head.state);
    // Records on this disk the store does not have were written by the holder this disk
    // last was (its marker), else by the one before this kernel.
    let local_epoch = marker
        .as_ref()
        .map_or(head.epoch.saturating_sub(1), |m| m.epoch);
    let log = fetch::log(
        store,
        lease.keys(),
        head,
        &config.log_file,
        ours_log,
        local_epoch,
    )
    .await?;
    let mark = flowrepl_task_logger::checkpoint::sandboxed_mark(&config.checkpoint_root);
    let state = fetch::checkpoints(
        store,
        lease.keys(),
        head,
        &config.checkpoint_root,
        &mark,
        ours_state,
    )
    .await?;
    let mut warnings = Vec::new();
    let mut lost = std::collections::BTreeMap::new();
    // A state this disk committed came from this disk's workspace, which may have changed
    // since (a client's upload while the kernel was stopped): it is kept as it is.
    let files = match (&state.workspace, workspace_max_bytes) {
        (Some(w), max) if max > 0 && !ours_state => {
            let done = fetch::workspace(store, lease.keys(), w, &config.workspace).await?;
            for (path, why) in &done.not_written {
                tracing::warn!("workspace file not written back: {path}: {why}");
                warnings.push(format!(
                    "the workspace file {path} was not brought back from the store: {}",
                    why.strip_prefix(flowrepl_store::workspace::LOST)
                        .unwrap_or(why)
                ));
            }
            lost = done.lost;
            done.written
        }
        _ => 0,
    };
    tracing::info!(
        store = %store.url(),
        epoch = head.epoch,
        workspace_files_written = files,
        log_bytes = log.bytes,
        log_from_store = log.rewritten,
        log_segments_missing = log.missing,
        log_kept_aside = ?log.kept_aside,
        checkpoints = ?state.checkpoints,
        checkpoints_from_store = state.rewritten,
        "the task's state is on this disk"
    );
    Ok((log, lost, warnings))
}

impl Attached {
    /// Starts uploading the task's files as they change.
    pub fn start(self, config: &Config) -> std::io::Result<Arc<Mirror>> {
        let mirror = Mirror::start_with(
            self.warnings,
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
                        lost: std::sync::Arc::new(std::sync::Mutex::new(self.lost_files.clone())),
                    })
                }),
            },
        )?;
        if let Some(t) = self.taken_over {
            mirror.health().amend(|s| s.taken_over = Some(t));
        }
        Ok(mirror)
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
