//! The uploader: a thread of its own that copies a held task's local files to the store,
//! so that nothing on the request path waits for the store.
//!
//! Every [`TICK`] it looks (a `stat` or two) at the task log, the checkpoint folder and the
//! workspace marker ([`crate::workspace::changed_at`]). What changed goes up as one batch at
//! most every [`INTERVAL`] (at once when the last batch is older than that): the new complete
//! log lines as a segment, the new blobs (small new checkpoint segments go inside the manifest
//! instead, [`state::inline`]), the new state manifest, and then one swap of the head
//! that counts the segment and names the manifest ([`crate::lease::Lease::commit`]). A batch
//! starts only while the lease is good by this process's clock ([`Lease::good`]); past it, the
//! lease is renewed first, so a holder whose task was taken writes nothing. Between batches
//! the lease is renewed when nothing was committed for a third of it.
//!
//! When the store fails, the same work is tried again with a backoff (0.5 s doubling to 10 s)
//! and the failure is told once ([`Health::take_warning`]) and in `status` ([`Health::status`]);
//! when it answers again, everything pending goes up in order. A refused swap (another kernel
//! took the task) stops the uploader for good ([`Health::fenced`]): the kernel must stop.
//!
//! The session asks the uploader for three things ([`Mirror`]): that the lease be good before
//! it runs or answers a cell ([`Mirror::ensure_lease`]), that a record be in the store before
//! a call is answered (`--store-sync`, [`Mirror::sync`]), and, at a clean stop, that what is
//! left go up and the lease be released ([`Mirror::finish`]).
//!
//! # Parking and handover
//! A holder with no cell running for [`PARK_AFTER`] and nothing left to upload parks its
//! lease: the head is swapped to `released` (this holder still named), and nothing more is
//! sent while it stays idle. Another kernel takes a parked task at once; this kernel's next
//! call takes the lease back first (a swap against its own last version: refused when another
//! took the task, and then the call is answered "taken over" and nothing runs). A handover
//! another kernel asked for through the head ([`crate::head::Wanted`], seen at the next
//! renewal) parks the same way once the running cell has ended and [`HANDOVER_SETTLE`]
//! passed.

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
/// one batch per interval).
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How long a clean stop tries to upload what is left before it gives up.
pub const FINISH_WITHIN: Duration = Duration::from_secs(10);
/// A holder with no cell running for this long and nothing left to upload parks its lease
/// (see `Uploader::park`).
pub const PARK_AFTER: Duration = Duration::from_secs(2);
/// With a handover asked for ([`crate::head::Wanted`]): how long no cell must have run before
/// the holder lets go (its automatic checkpoint is written within milliseconds of the end of a
/// cell, and goes up first).
pub const HANDOVER_SETTLE: Duration = Duration::from_millis(300);
/// How long the session waits for a renewal before it refuses a call.
pub const RENEW_WITHIN: Duration = Duration::from_secs(10);
const BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(10));
/// Workspace files not kept that `status` names (the first, by path).
const SKIPPED_SHOWN: usize = 20;
/// The largest log segment (bigger backlogs go up in several).
const MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// Set to `1`, the session's lease check before running and answering a cell is left out:
/// for the test that shows a stale holder answering a queued call as done without it. Never
/// for use.
pub const NO_LEASE_CHECK_VARIABLE: &str = "FLOWREPL_TEST_NO_LEASE_CHECK";

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
    /// Until when the lease is good (by this process's clock); `None`: not good.
    lease_until: Mutex<Option<Instant>>,
    /// A cell runs (a handover waits for its end).
    busy: AtomicBool,
    /// When the last cell was answered (or the uploader started).
    idle_since: Mutex<Option<Instant>>,
    /// [`NO_LEASE_CHECK_VARIABLE`] was set.
    unchecked: AtomicBool,
}

#[derive(Debug, Default)]
struct HealthState {
    status: StoreStatus,
    warning: Option<String>,
    /// Said once, with the first result (the head was lost).
    notes: Vec<String>,
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

    /// A warning for the next cell, once per outage (and once: what the start found).
    pub fn take_warning(&self) -> Option<String> {
        let mut s = self.lock();
        let mut out: Vec<String> = std::mem::take(&mut s.notes);
        out.extend(s.warning.take());
        (!out.is_empty()).then(|| out.join("; "))
    }

    /// Adds a warning for the next cell's result (said once).
    pub fn warn(&self, warning: String) {
        self.lock().notes.push(warning);
    }

    /// Changes `status`'s `store` (what the start found: `taken_over`).
    pub fn amend(&self, change: impl FnOnce(&mut StoreStatus)) {
        change(&mut self.lock().status);
    }

    /// `status`'s `store`.
    pub fn status(&self) -> StoreStatus {
        self.lock().status.clone()
    }

    /// Whether the lease is good now by this process's clock.
    pub fn lease_good(&self) -> bool {
        let until = *self.lease_until.lock().unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|u| Instant::now() < u)
    }

    fn set_lease(&self, until: Option<Instant>) {
        *self.lease_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// How long no cell has run.
    fn idle_for(&self) -> Duration {
        if self.busy() {
            return Duration::ZERO;
        }
        self.idle_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(Duration::MAX, |t| t.elapsed())
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
        self.set_lease(None);
        self.lock().status.fenced = Some(why);
        self.fenced.store(true, Ordering::Relaxed);
    }
}

/// Why the session may not run or answer a call: the lease is not good and could not be
/// renewed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{why}")]
pub struct LeaseLost {
    /// What happened (the new holder, when the store named one).
    pub why: String,
    /// Another kernel has the task: this kernel must stop. Otherwise the store could not be
    /// reached to renew the lease: a later call may succeed.
    pub fenced: bool,
}

enum Command {
    Finish(mpsc::Sender<()>),
    /// Renew the lease now (the session found it not good).
    Renew(mpsc::Sender<Result<(), String>>),
    /// Upload the log up to this many bytes of the file now, and with `true` the
    /// checkpoint folder and workspace as they are (`--store-sync`).
    Sync(u64, bool, mpsc::Sender<Result<(), String>>),
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
    /// Starts uploading for the task `lease` holds; `notes` are said with the first result.
    pub fn start(mut lease: Lease, files: Files) -> std::io::Result<Arc<Mirror>> {
        Mirror::start_with(lease_notes(&mut lease), lease, files)
    }

    /// [`Mirror::start`] with more to say with the first result (what the start found).
    pub fn start_with(
        notes: Vec<String>,
        mut lease: Lease,
        files: Files,
    ) -> std::io::Result<Arc<Mirror>> {
        let health = Arc::new(Health::default());
        {
            let mut s = health.lock();
            s.status.url = lease.store().url().to_owned();
            s.status.epoch = lease.head().epoch;
            s.status.log_bytes = lease.head().log_bytes();
            s.notes = notes;
            s.notes.extend(lease_notes(&mut lease));
        }
        health.set_lease(Some(lease.good_until()));
        *health.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if std::env::var(NO_LEASE_CHECK_VARIABLE).is_ok_and(|v| v == "1") {
            tracing::warn!("{NO_LEASE_CHECK_VARIABLE}=1: cells run and are answered without checking the task's lease; a stale holder can answer a call as done");
            health.unchecked.store(true, Ordering::Relaxed);
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
            last_batch: None,
            state_sig: Signature::new(),
            workspace_sig: None,
            state_seq: 0,
            known: crate::workspace::Known::new(),
            staged: Vec::new(),
            marker: None,
            collector: crate::gc::Collector::default(),
            parked: false,
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

    fn ask(
        &self,
        make: impl FnOnce(mpsc::Sender<Result<(), String>>) -> Command,
    ) -> Option<mpsc::Receiver<Result<(), String>>> {
        let (done, wait) = mpsc::channel();
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.as_ref()?.send(make(done)).ok()?;
        Some(wait)
    }

    /// Before a cell runs and before it is answered: `Ok` while the lease is good by this
    /// process's clock, else once the uploader renewed it (within [`RENEW_WITHIN`]). `Err`
    /// when another kernel took the task, or the renewal did not succeed: the call must not
    /// run, or its answer must not say it succeeded.
    pub fn ensure_lease(&self) -> Result<(), LeaseLost> {
        if let Some(why) = self.health.fenced() {
            return Err(LeaseLost { why, fenced: true });
        }
        if self.health.lease_good() || self.health.unchecked.load(Ordering::Relaxed) {
            return Ok(());
        }
        tracing::info!(
            "the task's lease ran out by this kernel's clock: renewing it before going on"
        );
        let answer = self
            .ask(Command::Renew)
            .map(|w| w.recv_timeout(RENEW_WITHIN));
        if let Some(why) = self.health.fenced() {
            return Err(LeaseLost { why, fenced: true });
        }
        let why = match answer {
            Some(Ok(Ok(()))) if self.health.lease_good() => return Ok(()),
            Some(Ok(Ok(()))) => "the renewal came too late".to_owned(),
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => format!(
                "the store did not answer within {} s",
                RENEW_WITHIN.as_secs()
            ),
            None => "the uploader has stopped".to_owned(),
        };
        Err(LeaseLost {
            why: format!("this kernel's lease of its task ran out by its own clock and could not be renewed ({why}); another kernel may have taken the task over"),
            fenced: false,
        })
    }

    /// A cell starts (`true`) or was answered (`false`): a handover another kernel asked for
    /// waits for the running cell.
    pub fn set_busy(&self, busy: bool) {
        if !busy {
            *self
                .health
                .idle_since
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        self.health.busy.store(busy, Ordering::Release);
    }

    /// `--store-sync`: uploads the task log up to `log_bytes` bytes of the file now (with
    /// `state`, the checkpoints and workspace as they are too, in the same batch), and waits
    /// until the head counts them (at most `within`).
    pub fn sync(&self, log_bytes: u64, state: bool, within: Duration) -> Result<(), String> {
        let Some(wait) = self.ask(|done| Command::Sync(log_bytes, state, done)) else {
            return Err(self
                .health
                .fenced()
                .unwrap_or_else(|| "the uploader has stopped".into()));
        };
        match wait.recv_timeout(within) {
            Ok(r) => r,
            Err(_) => Err(self.health.fenced().unwrap_or_else(|| {
                format!(
                    "the store did not take the record within {} s",
                    within.as_secs()
                )
            })),
        }
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

fn lease_notes(lease: &mut Lease) -> Vec<String> {
    lease.take_lost_head().into_iter().collect()
}

struct Uploader {
    lease: Lease,
    files: Files,
    health: Arc<Health>,
    hashed: Hashed,
    /// Blobs known to be in the store.
    uploaded: BTreeSet<String>,
    last_batch: Option<Instant>,
    /// The checkpoint folder as last uploaded.
    state_sig: Signature,
    /// The workspace marker's time as last uploaded.
    workspace_sig: Option<std::time::SystemTime>,
    state_seq: u64,
    /// Workspace files read before.
    known: crate::workspace::Known,
    /// Log segments written (or tried) but not yet counted by the head: (seq, content). They
    /// are written again with the same content until a swap counts them.
    staged: Vec<(u64, Bytes)>,
    /// What this disk's marker says ([`crate::local`]).
    marker: Option<crate::local::Marker>,
    /// Collection of the blobs and manifests no state needs any more ([`crate::gc`]).
    collector: crate::gc::Collector,
    /// The lease is parked (`Uploader::park`).
    parked: bool,
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
            CommitError::Store(s) => s.into(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        match e {
            // Another writer's object under this kernel's name: nothing more is written.
            StoreError::Clash { .. } => Failure::Fenced(e.to_string()),
            e => Failure::Store(flowrepl_os::chain(&e)),
        }
    }
}

/// A batch's objects, written, to be counted and named by one swap of the head.
#[derive(Default)]
struct Batch {
    /// Segments (seq, bytes) and the log offset after them.
    segments: Vec<(u64, u64)>,
    log_offset: Option<u64>,
    /// The new manifest's key, the folder's and workspace's signatures it was made from.
    state: Option<(String, Signature, Option<std::time::SystemTime>)>,
}

impl Uploader {
    fn run(&mut self, runtime: &tokio::runtime::Runtime, rx: mpsc::Receiver<Command>) {
        let mut backoff: Option<(Instant, Duration)> = None;
        loop {
            let command = match rx.recv_timeout(TICK) {
                Ok(c) => Some(c),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let result = match command {
                Some(Command::Finish(done)) => {
                    self.finish(runtime);
                    let _ = done.send(());
                    return;
                }
                Some(Command::Renew(done)) => {
                    // A parked lease is taken back (refused if another took the task).
                    let r = runtime.block_on(self.commit(|h| h.released = false));
                    if r.is_ok() {
                        self.parked = false;
                    }
                    self.fence_now(&r);
                    let _ = done.send(r.as_ref().map_err(Failure::text).map(|_| ()));
                    r
                }
                Some(Command::Sync(upto, state, done)) => {
                    let r = if state {
                        runtime.block_on(self.step(true))
                    } else {
                        runtime.block_on(self.sync_log())
                    };
                    let r = match r {
                        Ok(()) if self.files.log_offset < upto => Err(Failure::Again),
                        r => r,
                    };
                    self.fence_now(&r);
                    let said = match &r {
                        Ok(()) => Ok(()),
                        Err(Failure::Again) => Err("the record was still being written".to_owned()),
                        Err(e) => Err(e.text()),
                    };
                    let _ = done.send(said);
                    r
                }
                None => {
                    if backoff.is_some_and(|(until, _)| Instant::now() < until) {
                        continue;
                    }
                    runtime.block_on(self.step(false))
                }
            };
            match result {
                Ok(()) => backoff = None,
                Err(Failure::Again) => {}
                Err(Failure::Fenced(why)) => {
                    tracing::error!("{why}");
                    self.health.fence(why);
                    // Nothing more is written; wait for the kernel to stop.
                    drain(rx);
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
                    self.health.set_lease(None);
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

    /// `--store-sync`: the log's new complete lines now, as a segment counted by one swap
    /// (the checkpoints and workspace go up with the next batch, as without it).
    async fn sync_log(&mut self) -> Result<(), Failure> {
        if self.parked {
            self.commit(|h| h.released = false).await?;
            self.parked = false;
        }
        if !self.lease.good() {
            self.commit(|_| {}).await?;
        }
        let mut batch = Batch::default();
        self.log(&mut batch).await?;
        if !batch.segments.is_empty() {
            // Not a batch for the interval: the checkpoint's upload is not held back by it.
            let last = self.last_batch;
            self.commit_batch(batch).await?;
            self.last_batch = last;
        }
        Ok(())
    }

    /// A refused swap is told to the session before the answer that carries it, so that the
    /// session sees the kernel must stop.
    fn fence_now(&self, r: &Result<(), Failure>) {
        if let Err(Failure::Fenced(why)) = r {
            self.health.fence(why.clone());
        }
    }

    /// Swaps the head through the lease; the lease's good time goes to the session.
    async fn commit(&mut self, change: impl FnOnce(&mut crate::head::Head)) -> Result<(), Failure> {
        self.lease.commit(change).await?;
        self.health.set_lease(Some(self.lease.good_until()));
        Ok(())
    }

    /// One batch if something is due (`all`: whatever changed, now), then a renewal if
    /// nothing was committed for a third of the lease.
    async fn step(&mut self, all: bool) -> Result<(), Failure> {
        if self.parked {
            if !self.changed() {
                return Ok(());
            }
            // Something to upload (a client's file, a record): the lease is taken back
            // first (refused if another kernel took the task meanwhile).
            self.commit(|h| h.released = false).await?;
            self.parked = false;
        }
        if !self.lease.good() {
            // Past the lease by this clock: another may hold the task. Nothing is written
            // before a swap says it does not.
            self.commit(|_| {}).await?;
        }
        let due = all || self.last_batch.is_none_or(|t| t.elapsed() >= INTERVAL);
        let mut batch = Batch::default();
        if due {
            self.log(&mut batch).await?;
            self.state(&mut batch).await?;
        } else {
            let size = std::fs::metadata(&self.files.log_file).map_or(0, |m| m.len());
            self.health.ok(
                self.lease.head().log_bytes(),
                size.saturating_sub(self.files.log_offset),
            );
        }
        if !batch.segments.is_empty() || batch.state.is_some() {
            self.commit_batch(batch).await?;
        }
        let head = self.lease.head();
        let now = crate::local::Marker {
            epoch: head.epoch,
            state: head.state.clone(),
            log_bytes: head.log_bytes(),
        };
        if self.marker.as_ref() != Some(&now) && self.staged.is_empty() {
            now.write(&self.files.log_file);
            self.marker = Some(now);
        }
        // Idle with everything uploaded: parked after a while, or soon when another kernel
        // asked for the task (its handover: the cell it waited for ended, its checkpoint is
        // written within milliseconds and went up with this batch).
        let settle = if self.lease.wanted().is_some() {
            HANDOVER_SETTLE
        } else {
            PARK_AFTER
        };
        if !all && self.health.idle_for() >= settle && self.staged.is_empty() && !self.changed() {
            if let Some(w) = self.lease.wanted() {
                tracing::info!(by = %w.by, "handing the task over, as asked");
            }
            return self.park().await;
        }
        if self.lease.committed().elapsed() >= self.lease_third() {
            self.commit(|_| {}).await?;
        }
        Ok(())
    }

    /// Idle, with everything in the store: the head is swapped to `released` (this holder
    /// still named in it), and no renewal follows. Another kernel may take the task at once
    /// (a failback or a balancer's move takes no lease time); this kernel's next call takes
    /// the lease back first (a swap against its own version, refused when another took the
    /// task: that call is answered "taken over" and nothing runs). An idle task costs no
    /// request.
    async fn park(&mut self) -> Result<(), Failure> {
        self.health.set_lease(None);
        self.lease.release().await?;
        self.parked = true;
        tracing::debug!("idle with everything in the store: lease parked");
        Ok(())
    }

    /// Whether anything is left to upload: log lines, the checkpoint folder, the workspace.
    fn changed(&self) -> bool {
        let size = std::fs::metadata(&self.files.log_file).map_or(0, |m| m.len());
        size != self.files.log_offset
            || state::signature(&self.files.checkpoint_root) != self.state_sig
            || self
                .files
                .workspace
                .as_ref()
                .and_then(crate::workspace::changed_at)
                != self.workspace_sig
    }

    fn lease_third(&self) -> Duration {
        Duration::from_millis(self.lease.head().lease_ms / 3)
    }

    /// The batch's one swap: the segments counted, the manifest named; then the manifest
    /// it replaced removed.
    async fn commit_batch(&mut self, batch: Batch) -> Result<(), Failure> {
        let previous = self.lease.head().state.clone();
        let segments = batch.segments.clone();
        let state = batch.state.as_ref().map(|(k, _, _)| k.clone());
        self.commit(|h| {
            for (seq, n) in &segments {
                let run = h.run_mut();
                run.segments = *seq;
                run.bytes += n;
            }
            if let Some(k) = state {
                h.state = Some(k);
            }
        })
        .await?;
        self.staged.clear();
        if let Some(offset) = batch.log_offset {
            self.files.log_offset = offset;
        }
        self.last_batch = Some(Instant::now());
        if let Some((key, sig, workspace_sig)) = batch.state {
            self.state_sig = sig;
            self.workspace_sig = workspace_sig;
            // The manifest it replaced, and the blobs no kept state names, are removed once
            // the grace period is over (a reader may still be fetching them): `crate::gc`.
            let _ = (previous, key);
            self.collector
                .after_state(
                    self.lease.store(),
                    self.lease.keys(),
                    self.lease.head(),
                    &mut self.uploaded,
                )
                .await;
        }
        let size = std::fs::metadata(&self.files.log_file).map_or(0, |m| m.len());
        self.health.ok(
            self.lease.head().log_bytes(),
            size.saturating_sub(self.files.log_offset),
        );
        Ok(())
    }

    /// New complete log lines as segments, written (not yet counted).
    async fn log(&mut self, batch: &mut Batch) -> Result<(), Failure> {
        let size = std::fs::metadata(&self.files.log_file).map_or(0, |m| m.len());
        if size < self.files.log_offset {
            // The file was started again (deleted and re-created): its lines are new.
            tracing::warn!("the task log is shorter than what was uploaded; uploading it from its start as new records");
            self.files.log_offset = 0;
            self.staged.clear();
        }
        let epoch = self.lease.head().epoch;
        let writer = self.lease.writer();
        let mut seq = self
            .lease
            .head()
            .log
            .last()
            .filter(|r| r.epoch == epoch && r.writer.as_deref() == Some(writer.as_str()))
            .map_or(0, |r| r.segments);
        let mut offset = self.files.log_offset;
        // Segments staged by a batch whose swap failed go again, unchanged.
        for (s, bytes) in self.staged.clone() {
            seq = s;
            self.put_segment(s, bytes.clone()).await?;
            offset += bytes.len() as u64;
            batch.segments.push((s, bytes.len() as u64));
        }
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
            seq += 1;
            let bytes = Bytes::from(buf);
            self.staged.push((seq, bytes.clone()));
            self.put_segment(seq, bytes).await?;
            offset += n;
            batch.segments.push((seq, n));
        }
        if !batch.segments.is_empty() {
            batch.log_offset = Some(offset);
        }
        Ok(())
    }

    async fn put_segment(&self, seq: u64, bytes: Bytes) -> Result<(), Failure> {
        let run = crate::head::LogRun {
            epoch: self.lease.head().epoch,
            segments: seq,
            bytes: 0,
            writer: Some(self.lease.writer()),
        };
        let key = self
            .lease
            .store()
            .key(&self.lease.keys().segment(&run, seq));
        self.lease.store().put_new(&key, bytes).await?;
        Ok(())
    }

    /// A changed checkpoint folder (or workspace) as a new manifest, written with its new
    /// blobs (not yet named by the head).
    async fn state(&mut self, batch: &mut Batch) -> Result<(), Failure> {
        let sig = state::signature(&self.files.checkpoint_root);
        let workspace_sig = self
            .files
            .workspace
            .as_ref()
            .and_then(crate::workspace::changed_at);
        if sig == self.state_sig && workspace_sig == self.workspace_sig {
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
        // Small new segments go inside the manifest: no blob PUT for them.
        let uploaded = &self.uploaded;
        match state::inline(&mut manifest, &self.files.checkpoint_root, |sha| {
            uploaded.contains(sha)
        }) {
            Ok(()) => {}
            Err(state::StateError::Changed(_)) => {
                self.hashed.clear();
                return Err(Failure::Again);
            }
            Err(e) => return Err(Failure::Store(e.to_string())),
        }
        let blobs = manifest.blobs();
        for (segment, path) in files {
            if self.uploaded.contains(&segment.sha256) || !blobs.contains(&segment.sha256) {
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
            self.keep_lease().await?;
        }
        if let Some(limits) = self.files.workspace.clone() {
            manifest.workspace = Some(self.workspace(&limits).await?);
        }
        self.state_seq += 1;
        let epoch = self.lease.head().epoch;
        let name = self
            .lease
            .keys()
            .state(epoch, &self.lease.writer(), self.state_seq);
        let key = self.lease.store().key(&name);
        let body = serde_json::to_vec(&manifest).expect("a manifest serializes");
        self.lease.store().put_new(&key, Bytes::from(body)).await?;
        batch.state = Some((name, sig, workspace_sig));
        Ok(())
    }

    /// During a long upload: renews the lease when a third of it passed since the last swap.
    async fn keep_lease(&mut self) -> Result<(), Failure> {
        if self.lease.committed().elapsed() >= self.lease_third() {
            self.commit(|_| {}).await?;
        }
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
                        self.keep_lease().await?;
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

impl Failure {
    fn text(&self) -> String {
        match self {
            Failure::Fenced(w) | Failure::Store(w) => w.clone(),
            Failure::Again => "the local files changed while they were read".into(),
        }
    }
}

/// After a fence: every request the session still sends is answered (dropped senders say
/// "stopped"), until the session lets go.
fn drain(rx: mpsc::Receiver<Command>) {
    while let Ok(c) = rx.recv() {
        match c {
            Command::Finish(done) => {
                let _ = done.send(());
                return;
            }
            Command::Renew(done) | Command::Sync(_, _, done) => drop(done),
        }
    }
}
