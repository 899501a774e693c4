//! Checkpoints of the namespace: when they are written, and the bridge to the Python code
//! that writes and restores them (the Python package in the same folder, `_flowrepl_checkpoint_*`).
//!
//! # When
//! With [`CheckpointPolicy::OnSuccess`] a successful cell makes the automatic checkpoint
//! (`auto`) *pending*. A thread of the executor's own (`Checkpointer`) writes it once no
//! cell has run for [`IDLE_BEFORE_CHECKPOINT`], while the kernel and its client handle the
//! reply, so a client that sends its next cell at once does not wait for it and the request
//! path makes no extra system call; if cells keep coming, it is written between two of them
//! once [`MAX_CHECKPOINT_DELAY`] has passed (the next cell waits for it). The state is behind
//! one lock that every cell holds while it runs, so a checkpoint never sees a cell half-way.
//! A pending checkpoint is also written when the session ends.
//!
//! Writes are spaced: after one, the next waits at least [`MIN_CHECKPOINT_INTERVAL`], or
//! [`WRITE_SHARE`]` - 1` times as long as the last one took if that is longer, so that the
//! writer spends at most a tenth of the time writing (the overdue rule above still holds).
//! A person or an agent sends cells seconds apart and sees no difference; a client sending
//! cells back to back (a script, 50 clients on 10 kernels) no longer pays a write after
//! almost every cell: that was half the machine's CPU in `bench/run --serve`.
//!
//! # What
//! Incremental: the names rebound since the last write (by identity), plus the names the
//! cells since then may have changed without rebinding: every global their code names, and
//! through functions and classes defined in the session that it names, what those name in
//! turn. A cell that names `globals`, `exec`, `eval`, `vars`, `setattr` or `__import__` marks
//! every name. What this can miss: objects changed by code that does not name them — a
//! background thread, a callback a library holds, an object reached through another module.
//! An explicit `checkpoint` saves every name.
//!
//! Failed cells do not trigger a write, but their code counts for the next one.
//!
//! With [`CheckpointPolicy::EveryCell`] every cell (failed ones too) makes it pending, the
//! writer does not wait for the session to be idle, and the next cell writes it first if the
//! writer has not: no cell starts before the state after the previous one is on disk.
//!
//! # Health
//! A write that fails (a full disk, a folder gone) leaves the previous checkpoint whole (the
//! journal line is appended whole or not at all). The failure is kept in a
//! [`CheckpointHealth`] that other threads read without the state lock (`status` while a
//! cell runs), said once in the next cell's `warnings`, and the next write saves every name.
//!
//! # Layout
//! - here: the policy (when), the lock cells hold, and the writer thread;
//! - `state`: the checkpoint state of one executor and the calls into the Python package (the
//!   Python side), with the walk that finds the names rebound since the last write.

mod state;

pub(crate) use state::Checkpoints;

use flowrepl_exec::setup::CheckpointConfig;
use flowrepl_protocol::{CheckpointHealth, CheckpointPolicy};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// After a successful cell, the automatic checkpoint waits until the session has been idle
/// this long.
pub const IDLE_BEFORE_CHECKPOINT: Duration = Duration::from_millis(2);
/// ... but no longer than this: then it is written before the next cell.
pub const MAX_CHECKPOINT_DELAY: Duration = Duration::from_secs(1);
/// Automatic writes (on-success) are at least this far apart...
pub const MIN_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(50);
/// ... and the writer spends at most 1 / `WRITE_SHARE` of the time writing.
pub const WRITE_SHARE: u64 = 10;
/// The checkpoint state, behind the lock cells hold, and the thread that writes the automatic
/// checkpoint between them.
pub(crate) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    state: Mutex<Checkpoints>,
    globals: Py<PyDict>,
    /// When the clock started (the times below are microseconds since).
    epoch: Instant,
    /// A write is pending (mirrors `Checkpoints::pending`, read without the lock).
    pending: AtomicBool,
    /// When it became pending.
    pending_since: AtomicU64,
    /// When the last cell (or other call) ended.
    last_end: AtomicU64,
    /// A cell (or other call) holds the state.
    running: AtomicBool,
    /// The thread is parked until a write becomes pending.
    sleeping: AtomicBool,
    /// The executor's own code imported modules: the next cell rebaselines first.
    imported: AtomicBool,
    stop: AtomicBool,
}

impl Shared {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }
}

/// The lock on the checkpoint state that a cell or call holds; dropping it marks the end of
/// the activity (and wakes the writer if a write became pending).
pub(crate) struct Held<'a> {
    shared: &'a Shared,
    guard: std::sync::MutexGuard<'a, Checkpoints>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Checkpoints;
    fn deref(&self) -> &Checkpoints {
        &self.guard
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Checkpoints {
        &mut self.guard
    }
}

impl Held<'_> {
    /// Whether the writer imported modules since the last call (then clears it). Asked while
    /// held, so that the writer cannot import more between the answer and the cell.
    pub(crate) fn take_imported(&self) -> bool {
        self.shared.imported.swap(false, Ordering::AcqRel)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let s = self.shared;
        let pending = self.guard.pending.is_some();
        s.pending.store(pending, Ordering::Release);
        if let Some(since) = self.guard.pending {
            s.pending_since.store(
                since.duration_since(s.epoch).as_micros() as u64,
                Ordering::Relaxed,
            );
        }
        s.last_end.store(s.now(), Ordering::Release);
        s.running.store(false, Ordering::Release);
        if pending && s.sleeping.load(Ordering::Acquire) {
            if let Some(t) = &self.guard.writer {
                t.unpark();
            }
        }
    }
}

impl Checkpointer {
    /// The state for `config` on the namespace `globals`, and (with on-success) its writer
    /// thread.
    /// `session`: the session id written into the journal.
    pub(crate) fn start(
        config: CheckpointConfig,
        globals: Py<PyDict>,
        session: Option<String>,
    ) -> std::io::Result<Self> {
        let writes_itself = config.tracks_cells();
        let mut state = Checkpoints::new(config);
        state.session = session;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            globals,
            epoch: Instant::now(),
            pending: AtomicBool::new(false),
            pending_since: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            running: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            imported: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let thread = if writes_itself {
            let s = Arc::clone(&shared);
            let t = std::thread::Builder::new()
                .name("flowrepl-checkpoint".into())
                .spawn(move || write_when_idle(&s))?;
            flowrepl_os::lock(&shared.state).writer = Some(t.thread().clone());
            Some(t)
        } else {
            None
        };
        Ok(Checkpointer { shared, thread })
    }

    /// How the automatic checkpoint is doing, readable while a cell holds the state.
    pub(crate) fn health(&self) -> Arc<Mutex<CheckpointHealth>> {
        Arc::clone(&flowrepl_os::lock(&self.shared.state).health)
    }

    /// Takes the state for a cell or call (waiting while a checkpoint is being written).
    pub(crate) fn hold(&self) -> Held<'_> {
        let guard = flowrepl_os::lock(&self.shared.state);
        self.shared.running.store(true, Ordering::Release);
        Held {
            shared: &self.shared,
            guard,
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// The writer thread: parked until a write is pending, then it waits until no cell has run
/// for [`IDLE_BEFORE_CHECKPOINT`] and the last write is far enough behind
/// ([`MIN_CHECKPOINT_INTERVAL`]), or the write is [`MAX_CHECKPOINT_DELAY`] old and no cell
/// runs, and writes it.
fn write_when_idle(s: &Shared) {
    flowrepl_os::block_sigint();
    // every-cell: at once, once the cell has let go of the state.
    let every_cell = flowrepl_os::lock(&s.state).config.policy == CheckpointPolicy::EveryCell;
    let idle = if every_cell {
        0
    } else {
        IDLE_BEFORE_CHECKPOINT.as_micros() as u64
    };
    let overdue = MAX_CHECKPOINT_DELAY.as_micros() as u64;
    // When the next automatic write may start (see MIN_CHECKPOINT_INTERVAL); every-cell
    // writes are never held back.
    let mut next_write = 0u64;
    while !s.stop.load(Ordering::Acquire) {
        if !s.pending.load(Ordering::Acquire) {
            s.sleeping.store(true, Ordering::Release);
            // Checked again after announcing the sleep: a cell that ended meanwhile either
            // saw `sleeping` (and unparks) or stored `pending` before this load.
            if !s.pending.load(Ordering::Acquire) && !s.stop.load(Ordering::Acquire) {
                std::thread::park();
            }
            s.sleeping.store(false, Ordering::Release);
            continue;
        }
        let now = s.now();
        let quiet = now.saturating_sub(s.last_end.load(Ordering::Acquire));
        let age = now.saturating_sub(s.pending_since.load(Ordering::Relaxed));
        if s.running.load(Ordering::Acquire) {
            // A cell runs: look again in IDLE (not sooner: a long cell would wake this
            // thread thousands of times a second).
            std::thread::park_timeout(IDLE_BEFORE_CHECKPOINT);
            continue;
        }
        if (quiet < idle || now < next_write) && age < overdue {
            let wait = idle
                .saturating_sub(quiet)
                .max(next_write.saturating_sub(now))
                .min(overdue - age)
                .max(200);
            std::thread::park_timeout(Duration::from_micros(wait));
            continue;
        }
        // A cell that starts now waits for this write; one that got here first is let be.
        let Ok(mut st) = s.state.try_lock() else {
            std::thread::park_timeout(Duration::from_micros(idle));
            continue;
        };
        let started = s.now();
        Python::attach(|py| st.write_pending(py, s.globals.bind(py)));
        s.pending.store(st.pending.is_some(), Ordering::Release);
        if !every_cell {
            let ended = s.now();
            let took = ended.saturating_sub(started);
            let floor = MIN_CHECKPOINT_INTERVAL.as_micros() as u64;
            next_write = ended + floor.max(took * (WRITE_SHARE - 1));
        }
        // Before the lock goes: the next cell, which takes it, must see this.
        s.imported.store(true, Ordering::Release);
    }
}
