//! The uploader: a thread of its own that copies a held task's local files to the store,
//! so that nothing on the request path waits for the store.
//!
//! Every [`TICK`] it looks (a `stat` or two) at:
//! - the task log: new complete lines become a segment, at most [`INTERVAL`] after the first
//!   of them was seen (and at once when the last segment is older than that);
//! - the checkpoint folder: a changed journal becomes a new state manifest (its new segments
//!   uploaded first, by hash), at most once per [`INTERVAL`]; so does a client's change of the
//!   workspace files (its marker, [`crate::workspace::changed_at`]);
//! - the lease: renewed when nothing was committed for a third of it.
//!
//! Each upload is committed by swapping the head ([`crate::lease::Lease::commit`]), in the
//! order the files changed. When the store fails, the same work is tried again with a backoff
//! (0.5 s doubling to 10 s) and the failure is told once ([`Health::take_warning`]) and in
//! `status` ([`Health::status`]); when it answers again, everything pending goes up in order.
//! A refused swap (another kernel took the task) stops the uploader for good
//! ([`Health::fenced`]): the kernel must stop. [`Mirror::finish`] uploads what is left and
//! releases the lease (a clean stop).

use crate::lease::{CommitError, Lease};
use crate::objects::StoreError;
use crate::state::{self, Hashed, Signature};
use bytes::Bytes;
use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the uploader looks at the files.
pub const TICK: Duration = Duration::from_millis(100);
/// The longest a log record or a checkpoint waits before it goes up (the store sees at most
/// one log segment and one manifest per interval).
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How long a clean stop tries to upload what is left before it gives up.
pub const FINISH_WITHIN: Duration = Duration::from_secs(10);
const BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(10));
/// Workspace files not kept that `status` names (the first, by path).
const SKIPPED_SHOWN: usize = 20;
/// The largest log segment (bigger backlogs go up in several).
const MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// What the uploader works on.
#[derive(Debug, Clone)]
pub struct Files {
    /// The task log.
    pub log_file: PathBuf,
    /// Where the uploaded part of the log ends.
    pub log_offset: u64,
    /// The task's checkpoint folder.
    pub checkpoint_root: PathBuf,
    /// Whether this session's checkpoints are a sandboxed session's.
    pub sandboxed: bool,
    /// The workspace files to keep with each state (`None`: not kept).
    pub workspace: Option<crate::workspace::Limits>,
}

pub use flowrepl_protocol::StoreStatus;

/// How the uploader is doing, for the session.
#[derive(Debug, Default)]
pub struct Health {
    fenced: AtomicBool,
    state: Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    status: StoreStatus,
    warning: Option<String>,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why this kernel may not go on (another took its task), if so.
    pub fn fenced(&self) -> Option<String> {
        if !self.fenced.load(Ordering::Relaxed) {
            return None;
        }
        self.lock().status.fenced.clone()
    }

    /// A warning for the next cell, once per outage.
    pub fn take_warning(&self) -> Option<String> {
        self.lock().warning.take()
    }

    /// `status`'s `store`.
    pub fn status(&self) -> StoreStatus {
        self.lock().status.clone()
    }

    fn failed(&self, e: &str) {
        let mut s = self.lock();
        if s.status.failing.is_none() {
            s.status.failing_since = Some(crate::head::now());
            s.warning = Some(format!(
                "the store ({}) is failing: {e}; the task's log and checkpoints are kept here and uploaded when it answers again",
                s.status.url
            ));
        }
        s.status.failing = Some(e.to_owned());
    }

    fn ok(&self, log_bytes: u64, pending: u64) {
        let mut s = self.lock();
        if s.status.failing.take().is_some() {
            tracing::info!("the store answers again");
            s.status.failing_since = None;
            s.warning = None;
        }
        s.status.log_bytes = log_bytes;
        s.status.pending_log_bytes = pending;
    }

    fn workspace(&self, files: u64, skipped: &std::collections::BTreeMap<String, String>) {
        let mut s = self.lock();
        s.status.workspace_files = files;
        let shown: std::collections::BTreeMap<String, String> = skipped
            .iter()
            .take(SKIPPED_SHOWN)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if shown != s.status.workspace_skipped {
            if !skipped.is_empty() {
                tracing::warn!(skipped = skipped.len(), first = ?shown.iter().next(), "workspace files not kept in the store");
            }
            s.status.workspace_skipped = shown;
        }
    }

    fn fence(&self, why: String) {
        self.lock().status.fenced = Some(why);
        self.fenced.store(true, Ordering::Relaxed);
    }
}

enum Command {
    Finish(mpsc::Sender<()>),
}

/// The running uploader.
pub struct Mirror {
    tx: Mutex<Option<mpsc::Sender<Command>>>,
    health: Arc<Health>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("health", &self.health)
            .finish()
    }
}

impl Mirror {
    /// Starts uploading for the task `lease` holds.
    pub fn start(lease: Lease, files: Files) -> std::io::Result<Arc<Mirror>> {
        let health = Arc::new(Health::default());
        {
            let mut s = health.lock();
            s.status.url = lease.store().url().to_owned();
            s.status.epoch = lease.head().epoch;
            s.status.log_bytes = lease.head().log_bytes();
        }
        let (tx, rx) = mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut worker = Uploader {
            lease,
            files,
            health: Arc::clone(&health),
            hashed: Hashed::new(),
            uploaded: BTreeSet::new(),
            last_log: None,
            last_state: None,
            state_sig: Signature::new(),
            workspace_sig: None,
            state_seq: 0,
            known: crate::workspace::Known::new(),
            claimed: None,
            marker: None,
        };
        std::thread::Builder::new()
            .name("flowrepl-store".into())
            .spawn(move || {
                // Process-directed SIGINT belongs to the cell's thread.
                flowrepl_os::block_sigint();
                worker.run(&runtime, rx)
            })?;
        Ok(Arc::new(Mirror {
            tx: Mutex::new(Some(tx)),
            health,
        }))
    }

    /// How it is doing.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Uploads what is left and releases the lease, within [`FINISH_WITHIN`]; once.
    pub fn finish(&self) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(tx) = tx else { return };
        let (done, wait) = mpsc::channel();
        if tx.send(Command::Finish(done)).is_ok() {
            let _ = wait.recv_timeout(FINISH_WITHIN + Duration::from_secs(5));
        }
    }
}

struct Uploader {
    lease: Lease,
    files: Files,
    health: Arc<Health>,
    hashed: Hashed,
    /// Blobs known to be in the store.
    uploaded: BTreeSet<String>,
    last_log: Option<Instant>,
    last_state: Option<Instant>,
    /// The checkpoint folder as last uploaded.
    state_sig: Signature,
    /// The workspace marker's time as last uploaded.
    workspace_sig: Option<std::time::SystemTime>,
    state_seq: u64,
    /// Workspace files read before.
    known: crate::workspace::Known,
    /// A log segment the head counts whose put has not succeeded yet.
    claimed: Option<(u64, Bytes)>,
    /// What this disk's marker says ([`crate::local`]).
    marker: Option<crate::local::Marker>,
}

enum Failure {
    Fenced(String),
    Store(String),
    /// The local files changed under the reader: look again next tick.
    Again,
}

impl From<CommitError> for Failure {
    fn from(e: CommitError) -> Failure {
        match e {
            CommitError::Fenced { .. } => Failure::Fenced(e.to_string()),
            CommitError::Store(s) => Failure::Store(flowrepl_os::chain(&s)),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(flowrepl_os::chain(&e))
    }
}

impl Uploader {
    fn run(&mut self, runtime: &tokio::runtime::Runtime, rx: mpsc::Receiver<Command>) {
        let mut backoff: Option<(Instant, Duration)> = None;
        loop {
            let finish = match rx.recv_timeout(TICK) {
                Ok(Command::Finish(done)) => Some(done),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            if let Some(done) = finish {
                self.finish(runtime);
                let _ = done.send(());
                return;
            }
            if backoff.is_some_and(|(until, _)| Instant::now() < until) {
                continue;
            }
            match runtime.block_on(self.step(false)) {
                Ok(()) => backoff = None,
                Err(Failure::Again) => {}
                Err(Failure::Fenced(why)) => {
                    tracing::error!("{why}");
                    self.health.fence(why);
                    // Nothing more is written; wait for the kernel to stop.
                    let _ = rx.recv();
                    return;
                }
                Err(Failure::Store(e)) => {
                    let delay = backoff.map_or(BACKOFF.0, |(_, d)| (d * 2).min(BACKOFF.1));
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "store upload failed");
                    self.health.failed(&e);
                    backoff = Some((Instant::now() + delay, delay));
                }
            }
        }
    }

    fn finish(&mut self, runtime: &tokio::runtime::Runtime) {
        let deadline = Instant::now() + FINISH_WITHIN;
        let mut delay = BACKOFF.0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = runtime.block_on(async {
                tokio::time::timeout(left, async {
                    self.step(true).await?;
                    self.lease.release().await?;
                    Ok::<(), Failure>(())
                })
                .await
            });
            match attempt {
                Ok(Ok(())) => {
                    tracing::info!("the task's state is in the store; lease released");
                    return;
                }
                Ok(Err(Failure::Fenced(why))) => {
                    tracing::error!("{why}");
                    self.health.fence(why);
                    return;
                }
                Ok(Err(Failure::Again)) => {}
                Ok(Err(Failure::Store(e))) => {
                    self.health.failed(&e);
                    tracing::warn!(error = %e, "store upload at stop failed");
                }
                Err(_) => {}
            }
            if Instant::now() + delay >= deadline {
                tracing::error!(
                    "the task's last records or checkpoint could not be uploaded before stopping; they are on this machine's disk, and the lease lapses by itself"
                );
                return;
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(BACKOFF.1);
        }
    }

    async fn step(&mut self, all: bool) -> Result<(), Failure> {
        self.log(all).await?;
        self.state(all).await?;
        let head = self.lease.head();
        let now = crate::local::Marker {
            epoch: head.epoch,
            state: head.state.clone(),
            log_bytes: head.log_bytes(),
        };
        if self.marker.as_ref() != Some(&now) && self.claimed.is_none() {
            now.write(&self.files.log_file);
            self.marker = Some(now);
        }
        if self.lease.committed().elapsed() >= self.lease_third() {
            self.lease.commit(|_| {}).await?;
        }
        Ok(())
    }

    fn lease_third(&self) -> Duration {
        Duration::from_millis(self.lease.head().lease_ms / 3)
    }

    /// New complete log lines as a segment.
    async fn log(&mut self, all: bool) -> Result<(), Failure> {
        // A segment the head already counts goes up first (its earlier put failed).
        if let Some((seq, bytes)) = self.claimed.take() {
            let key = self.segment_key(seq);
            if let Err(e) = self.lease.store().put_new(&key, bytes.clone()).await {
                self.claimed = Some((seq, bytes));
                return Err(e.into());
            }
        }
        let size = std::fs::metadata(&self.files.log_file).map_or(0, |m| m.len());
        if size < self.files.log_offset {
            // The file was started again (deleted and re-created): its lines are new.
            tracing::warn!("the task log is shorter than what was uploaded; uploading it from its start as new records");
            self.files.log_offset = 0;
        }
        let pending = size - self.files.log_offset;
        if pending > 0 && !all && self.last_log.is_some_and(|t| t.elapsed() < INTERVAL) {
            self.health.ok(self.lease.head().log_bytes(), pending);
            return Ok(());
        }
        let mut offset = self.files.log_offset;
        while offset < size {
            let want = (size - offset).min(MAX_SEGMENT_BYTES);
            let mut buf = vec![0u8; want as usize];
            let mut f = std::fs::File::open(&self.files.log_file)
                .map_err(|e| Failure::Store(format!("cannot read the task log: {e}")))?;
            f.seek(SeekFrom::Start(offset))
                .and_then(|_| f.read_exact(&mut buf))
                .map_err(|_| Failure::Again)?;
            // Whole lines only; a record still being written waits.
            let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
                break;
            };
            buf.truncate(end + 1);
            let n = buf.len() as u64;
            let epoch = self.lease.head().epoch;
            let seq = self
                .lease
                .head()
                .log
                .last()
                .filter(|r| r.epoch == epoch)
                .map_or(0, |r| r.segments)
                + 1;
            // The head counts the segment before it is written: a holder whose lease was
            // taken is refused here and writes nothing. A kill between the two loses this
            // segment only (readers skip a counted segment that is missing).
            self.lease
                .commit(|h| {
                    let run = h.run_mut();
                    run.segments = seq;
                    run.bytes += n;
                })
                .await?;
            offset += n;
            self.files.log_offset = offset;
            self.last_log = Some(Instant::now());
            let bytes = Bytes::from(buf);
            let key = self.segment_key(seq);
            if let Err(e) = self.lease.store().put_new(&key, bytes.clone()).await {
                self.claimed = Some((seq, bytes));
                return Err(e.into());
            }
        }
        self.health
            .ok(self.lease.head().log_bytes(), size - self.files.log_offset);
        Ok(())
    }

    fn segment_key(&self, seq: u64) -> object_store::path::Path {
        let epoch = self.lease.head().epoch;
        self.lease
            .store()
            .key(&self.lease.keys().log_segment(epoch, seq))
    }

    /// A changed checkpoint folder as a new manifest.
    async fn state(&mut self, all: bool) -> Result<(), Failure> {
        let sig = state::signature(&self.files.checkpoint_root);
        let workspace_sig = self
            .files
            .workspace
            .as_ref()
            .and_then(crate::workspace::changed_at);
        if (sig == self.state_sig && workspace_sig == self.workspace_sig)
            || (!all && self.last_state.is_some_and(|t| t.elapsed() < INTERVAL))
        {
            return Ok(());
        }
        let (mut manifest, files) = match state::read(
            &self.files.checkpoint_root,
            self.files.sandboxed,
            &mut self.hashed,
        ) {
            Ok(m) => m,
            Err(state::StateError::Changed(_)) => return Err(Failure::Again),
            Err(e) => return Err(Failure::Store(e.to_string())),
        };
        // The fence before any object is written: a holder whose lease was taken stops here.
        self.lease.commit(|_| {}).await?;
        for (segment, path) in files {
            if self.uploaded.contains(&segment.sha256) {
                continue;
            }
            let data = std::fs::read(&path).map_err(|_| Failure::Again)?;
            if state::sha256(&data) != segment.sha256 {
                // Replaced under the reader: read the folder again.
                self.hashed.clear();
                return Err(Failure::Again);
            }
            let key = self
                .lease
                .store()
                .key(&self.lease.keys().blob(&segment.sha256));
            self.lease.store().put_new(&key, Bytes::from(data)).await?;
            self.uploaded.insert(segment.sha256);
        }
        if let Some(limits) = self.files.workspace.clone() {
            manifest.workspace = Some(self.workspace(&limits).await?);
        }
        self.state_seq += 1;
        let epoch = self.lease.head().epoch;
        let name = self.lease.keys().state(epoch, self.state_seq);
        let key = self.lease.store().key(&name);
        let body = serde_json::to_vec(&manifest).expect("a manifest serializes");
        self.lease.store().put_new(&key, Bytes::from(body)).await?;
        let previous = self.lease.head().state.clone();
        self.lease.commit(|h| h.state = Some(name)).await?;
        // The manifest it replaced is no state any more (its blobs may still be).
        if let Some(old) = previous {
            let _ = self
                .lease
                .store()
                .remove(&self.lease.store().key(&old))
                .await;
        }
        self.state_sig = sig;
        self.workspace_sig = workspace_sig;
        self.last_state = Some(Instant::now());
        Ok(())
    }

    /// The workspace's files, those changed since they were last read uploaded first.
    async fn workspace(
        &mut self,
        limits: &crate::workspace::Limits,
    ) -> Result<crate::workspace::Workspace, Failure> {
        use crate::workspace;
        let (found, mut skipped) = workspace::walk(limits);
        let mut files = std::collections::BTreeMap::new();
        let beneath = flowrepl_os::beneath::Beneath::open(&limits.root)
            .map_err(|e| Failure::Store(format!("the workspace: {e}")))?;
        for f in found {
            if let Some((id, entry)) = self.known.get(&f.path) {
                if *id == f.id {
                    files.insert(f.path, entry.clone());
                    continue;
                }
            }
            match workspace::read(&beneath, &f.path) {
                Ok((data, entry)) => {
                    if !self.uploaded.contains(&entry.sha256) {
                        let key = self
                            .lease
                            .store()
                            .key(&self.lease.keys().blob(&entry.sha256));
                        self.lease.store().put_new(&key, Bytes::from(data)).await?;
                        self.uploaded.insert(entry.sha256.clone());
                    }
                    self.known.insert(f.path.clone(), (f.id, entry.clone()));
                    files.insert(f.path, entry);
                }
                Err(why) => {
                    skipped.insert(f.path, why);
                }
            }
        }
        self.known.retain(|p, _| files.contains_key(p));
        self.health.workspace(files.len() as u64, &skipped);
        Ok(workspace::Workspace { files, skipped })
    }
}
