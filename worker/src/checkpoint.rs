//! Checkpoints of the namespace: when they are written, and the bridge to the Python code
//! that writes and restores them (`snapshot.py`, the module `_flowrepl_snapshot`).
//!
//! # When
//! With [`SnapshotPolicy::OnSuccess`] a successful cell makes the automatic checkpoint
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
//! With [`SnapshotPolicy::EveryCell`] every cell (failed ones too) makes it pending, the
//! writer does not wait for the session to be idle, and the next cell writes it first if the
//! writer has not: no cell starts before the state after the previous one is on disk.
//!
//! # Health
//! A write that fails (a full disk, a folder gone) leaves the previous checkpoint whole (the
//! journal line is appended whole or not at all). The failure is kept in a
//! [`CheckpointHealth`] that other threads read without the state lock (`status` while a
//! cell runs), said once in the next cell's `warnings`, and the next write saves every name.
//!
//! Size: one job (when a checkpoint is written, and the calls into `snapshot.py`) over about
//! 640 lines, a quarter of them the policy's docs and the writer thread's handshake, plus a
//! unit test against the journal reader; the Python side is in `snapshot.py`.

use crate::support::py_err;
use flowrepl_exec::setup::{CallError, CheckpointError, SnapshotConfig};
use flowrepl_protocol::{
    CheckpointFailure, CheckpointHealth, CheckpointSummary, RestoreReport, SnapshotPolicy,
};
use flowrepl_task_logger::snapshot::{self, Checkpoint};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
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
/// Pickles up to this size are loaded back when written, to catch ones that do not load.
const VERIFY_BYTES: u64 = 16 << 20;
/// Past this many cells' code objects kept for the next write, it saves every name instead.
const MAX_PENDING_CODES: usize = 512;

/// The names whose value in `globals` is not the object `saved` holds for them, and the names
/// `saved` holds that `globals` no longer has: two walks comparing pointers (the names' hashes
/// are cached), about 10 ns a name, where the same in Python costs ten times that.
fn rebound<'py>(
    py: Python<'py>,
    globals: &Bound<'py, PyDict>,
    saved: &Bound<'py, PyDict>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    use pyo3::ffi;
    let changed = PyList::empty(py);
    let gone = PyList::empty(py);
    for (from, against, out, want_missing) in [
        (globals, saved, &changed, false),
        (saved, globals, &gone, true),
    ] {
        let mut pos: ffi::Py_ssize_t = 0;
        let mut key: *mut ffi::PyObject = std::ptr::null_mut();
        let mut value: *mut ffi::PyObject = std::ptr::null_mut();
        let mut found = Vec::new();
        // SAFETY: the GIL is held; PyDict_Next yields borrowed pointers and runs no Python
        // code, and PyDict_GetItem (borrowed result, errors suppressed) only hashes the key,
        // whose hash a str caches; neither dict changes during the walk, since the matches
        // are collected first and appended after it.
        unsafe {
            while ffi::PyDict_Next(from.as_ptr(), &mut pos, &mut key, &mut value) != 0 {
                let other = ffi::PyDict_GetItem(against.as_ptr(), key);
                let differs = if want_missing {
                    other.is_null()
                } else {
                    other != value
                };
                if differs {
                    found.push(Bound::from_borrowed_ptr(py, key));
                }
            }
        }
        for k in found {
            out.append(k)?;
        }
    }
    Ok((changed, gone))
}

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
        config: SnapshotConfig,
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
            crate::sys::lock(&shared.state).writer = Some(t.thread().clone());
            Some(t)
        } else {
            None
        };
        Ok(Checkpointer { shared, thread })
    }

    /// How the automatic checkpoint is doing, readable while a cell holds the state.
    pub(crate) fn health(&self) -> Arc<Mutex<CheckpointHealth>> {
        Arc::clone(&crate::sys::lock(&self.shared.state).health)
    }

    /// Takes the state for a cell or call (waiting while a checkpoint is being written).
    pub(crate) fn hold(&self) -> Held<'_> {
        let guard = crate::sys::lock(&self.shared.state);
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
    crate::sys::block_sigint();
    // every-cell: at once, once the cell has let go of the state.
    let every_cell = crate::sys::lock(&s.state).config.policy == SnapshotPolicy::EveryCell;
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

/// The checkpoint state of one executor.
pub(crate) struct Checkpoints {
    config: SnapshotConfig,
    /// The session id written into journal lines.
    session: Option<String>,
    /// How the automatic checkpoint is doing (read without the state lock).
    health: Arc<Mutex<CheckpointHealth>>,
    /// The health changed since [`Checkpoints::take_health_change`] last said.
    health_changed: bool,
    /// A failed automatic write, for the next cell's warnings.
    warning: Option<String>,
    /// `_flowrepl_snapshot`, once loaded.
    module: Option<Py<PyAny>>,
    /// Its `Store` for `auto`.
    store: Option<Py<PyAny>>,
    /// Code of the cells since the last automatic write.
    codes: Vec<Py<PyAny>>,
    /// Too many cells to keep their code: the next write saves every name.
    every_name: bool,
    /// A successful cell since the last automatic write: when the first one ended.
    pending: Option<Instant>,
    /// The execution count of the last cell.
    last_count: u64,
    /// The writer thread, to wake when a write becomes pending.
    writer: Option<std::thread::Thread>,
}

impl Checkpoints {
    pub(crate) fn new(config: SnapshotConfig) -> Checkpoints {
        Checkpoints {
            config,
            session: None,
            health: Arc::default(),
            health_changed: false,
            warning: None,
            module: None,
            store: None,
            codes: Vec::new(),
            every_name: false,
            pending: None,
            last_count: 0,
            writer: None,
        }
    }

    /// Whether cells' code should be kept for the next automatic write.
    fn tracks_cells(&self) -> bool {
        self.config.tracks_cells()
    }

    /// every-cell: the state after each cell is written before the next one starts.
    pub(crate) fn every_cell(&self) -> bool {
        self.config.policy == SnapshotPolicy::EveryCell
    }

    /// A failed automatic write not yet said: for the cell about to run's warnings.
    pub(crate) fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    /// The health, if it changed since the last call (worker mode sends it in Done).
    pub(crate) fn take_health_change(&mut self) -> Option<CheckpointHealth> {
        std::mem::take(&mut self.health_changed).then(|| crate::sys::lock(&self.health).clone())
    }

    /// Notes how a write of `auto` after cell `count` went.
    fn note_auto_write(&mut self, count: u64, r: &Result<CheckpointSummary, CheckpointError>) {
        let mut h = crate::sys::lock(&self.health);
        match r {
            Ok(s) => {
                h.auto_execution_count = Some(s.execution_count);
                h.failing = false;
            }
            Err(e) => {
                let error = crate::sys::chain(e);
                let newest = match h.auto_execution_count {
                    Some(n) => format!("the newest checkpoint holds the state after cell {n}"),
                    None => "no checkpoint of this session was written yet".to_owned(),
                };
                self.warning = Some(format!(
                    "the automatic checkpoint after cell {count} was not written ({error}); {newest}, which is what a crash would restore"
                ));
                h.last_error = Some(CheckpointFailure {
                    execution_count: count,
                    error,
                    time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                });
                h.failing = true;
            }
        }
        self.health_changed = true;
    }

    /// A compiled part of the running cell: kept for the next automatic write.
    pub(crate) fn note_code(&mut self, code: &Bound<'_, PyAny>) {
        if !self.tracks_cells() || self.every_name {
            return;
        }
        if self.codes.len() >= MAX_PENDING_CODES {
            self.codes.clear();
            self.every_name = true;
        } else {
            self.codes.push(code.clone().unbind());
        }
    }

    /// A cell ended (its code was [`Checkpoints::note_code`]d).
    pub(crate) fn note_cell(&mut self, success: bool, count: u64) {
        self.last_count = count;
        if self.tracks_cells() && (success || self.every_cell()) && self.pending.is_none() {
            self.pending = Some(Instant::now());
        }
    }

    fn module<'py>(&mut self, py: Python<'py>) -> Result<Bound<'py, PyAny>, CallError> {
        if let Some(m) = &self.module {
            return Ok(m.bind(py).clone());
        }
        let load = || -> PyResult<Bound<'py, PyAny>> {
            let m = crate::support::load_source(py, &crate::support::SNAPSHOT)?.into_any();
            // Its by-value pickler: private to it, never in sys.modules.
            let cp = crate::support::load_source(py, &crate::support::CLOUDPICKLE)?;
            cp.setattr("__version__", crate::support::CLOUDPICKLE_VERSION)?;
            m.setattr("_cloudpickle", cp)?;
            Ok(m)
        };
        let m = load().map_err(py_err)?;
        self.module = Some(m.clone().unbind());
        Ok(m)
    }

    fn store<'py>(
        &mut self,
        py: Python<'py>,
        globals: &Bound<'py, PyDict>,
    ) -> Result<Bound<'py, PyAny>, CheckpointError> {
        // Every time: a folder deleted during the session is made again, private.
        let root = snapshot::open_root(&self.config.root)?;
        if let Some(s) = &self.store {
            return Ok(s.bind(py).clone());
        }
        let store = self.new_store(py, globals, &root.join(flowrepl_protocol::AUTO_CHECKPOINT))?;
        store
            .setattr("session", self.session.as_deref())
            .map_err(py_err)?;
        self.store = Some(store.clone().unbind());
        Ok(store)
    }

    /// A `Store` of the checkpoint folder `dir` on the namespace `globals`.
    fn new_store<'py>(
        &mut self,
        py: Python<'py>,
        globals: &Bound<'py, PyDict>,
        dir: &std::path::Path,
    ) -> Result<Bound<'py, PyAny>, CallError> {
        let (max, verify) = (self.config.max_bytes, VERIFY_BYTES);
        self.module(py)?
            .getattr("Store")
            .and_then(|store| store.call1((globals, dir.display().to_string(), max, verify)))
            .map_err(py_err)
    }

    /// Writes the pending automatic checkpoint (nothing if none is pending).
    /// Logs what happened; after a failure the next write saves every name.
    pub(crate) fn write_pending(&mut self, py: Python<'_>, globals: &Bound<'_, PyDict>) {
        if self.pending.take().is_none() {
            return;
        }
        let full = std::mem::take(&mut self.every_name);
        let written = self.write_auto(py, globals, full);
        self.note_auto_write(self.last_count, &written);
        match written {
            Ok(s) => {
                tracing::debug!(
                    execution_count = s.execution_count,
                    saved = s.saved.len(),
                    bytes = s.bytes,
                    ms = s.ms,
                    "checkpoint written"
                );
                for (name, why) in &s.unsaved {
                    tracing::info!(%name, %why, "a variable was not checkpointed");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the automatic checkpoint was not written");
                self.namespace_reset(py);
            }
        }
    }

    fn write_auto(
        &mut self,
        py: Python<'_>,
        globals: &Bound<'_, PyDict>,
        full: bool,
    ) -> Result<CheckpointSummary, CheckpointError> {
        let codes = PyList::new(py, self.codes.drain(..)).map_err(py_err)?;
        let store = self.store(py, globals)?;
        let ctx = self.module(py)?.call_method0("context").map_err(py_err)?;
        let saved = store
            .getattr("saved")
            .and_then(|s| Ok(s.cast_into::<PyDict>()?))
            .map_err(py_err)?;
        let (rebound, removed) = rebound(py, globals, &saved).map_err(py_err)?;
        let json: String = store
            .call_method1(
                "checkpoint_json",
                (codes, full, self.last_count, ctx, rebound, removed),
            )
            .and_then(|j| j.extract())
            .map_err(py_err)?;
        Ok(serde_json::from_str(&json).map_err(|e| CallError(e.to_string()))?)
    }

    /// Writes checkpoint `name` now, with every name (`auto` continues incrementally after it).
    pub(crate) fn write(
        &mut self,
        py: Python<'_>,
        globals: &Bound<'_, PyDict>,
        name: &str,
    ) -> Result<CheckpointSummary, CheckpointError> {
        if self.config.policy == SnapshotPolicy::Off {
            return Err(CheckpointError::Off);
        }
        snapshot::check_name(name)?;
        if name == flowrepl_protocol::AUTO_CHECKPOINT {
            self.pending = None;
            self.every_name = false;
            let written = self.write_auto(py, globals, true);
            self.note_auto_write(self.last_count, &written);
            if written.is_err() {
                // Said in the call's own error.
                self.warning = None;
                self.namespace_reset(py);
            }
            return written;
        }
        let root = snapshot::open_root(&self.config.root)?;
        let module = self.module(py)?;
        let ctx = module.call_method0("context").map_err(py_err)?;
        let json: String = module
            .call_method1(
                "save_named_json",
                (
                    globals,
                    root.join(name).display().to_string(),
                    self.config.max_bytes,
                    VERIFY_BYTES,
                    self.last_count,
                    ctx,
                    self.session.as_deref(),
                ),
            )
            .and_then(|j| j.extract())
            .map_err(py_err)?;
        Ok(serde_json::from_str(&json).map_err(|e| CallError(e.to_string()))?)
    }

    /// Reads checkpoint `name` (checking its name, its folder and that it exists), before
    /// anything of the session is dropped for it.
    pub(crate) fn load(&self, name: &str) -> Result<Checkpoint, CheckpointError> {
        if self.config.policy == SnapshotPolicy::Off {
            return Err(CheckpointError::Off);
        }
        if self.config.untrusted {
            return Err(
                snapshot::SnapshotError::SandboxedOrigin(snapshot::sandboxed_mark(
                    &self.config.root,
                ))
                .into(),
            );
        }
        Ok(snapshot::load(&self.config.root, name)?)
    }

    /// Loads checkpoint `cp` into `globals` (emptied by the caller).
    pub(crate) fn restore(
        &mut self,
        py: Python<'_>,
        globals: &Bound<'_, PyDict>,
        cp: &Checkpoint,
    ) -> Result<RestoreReport, CheckpointError> {
        let t0 = Instant::now();
        let name = cp.name.as_str();
        let dir = self.config.root.join(name);
        let state = serde_json::to_string(cp).map_err(|e| CallError(e.to_string()))?;
        let target = if name == flowrepl_protocol::AUTO_CHECKPOINT {
            self.store(py, globals)?
        } else {
            // A named checkpoint loads through a store of its own; `auto` is unchanged.
            self.new_store(py, globals, &dir)?
        };
        let (restored, lost): (Vec<String>, std::collections::BTreeMap<String, String>) = target
            .call_method1("restore_json", (state, dir.display().to_string()))
            .and_then(|r| r.extract())
            .map_err(py_err)?;
        // What the next automatic write compares against is what was just loaded.
        self.codes.clear();
        self.pending = None;
        self.every_name = name != flowrepl_protocol::AUTO_CHECKPOINT;
        if self.every_name {
            self.pending = Some(Instant::now()).filter(|_| self.tracks_cells());
        }
        Ok(RestoreReport {
            restored: true,
            checkpoint: name.to_owned(),
            checkpoint_execution_count: cp.execution_count,
            checkpoint_session_id: cp.session.clone(),
            restored_vars: restored,
            lost_vars: lost,
            restore_ms: t0.elapsed().as_secs_f64() * 1000.0,
        })
    }

    /// The namespace was emptied (`restart` in-process) or the session ends: the objects
    /// held to see what was rebound are let go, and the next write saves every name.
    pub(crate) fn namespace_reset(&mut self, py: Python<'_>) {
        self.codes.clear();
        self.every_name = true;
        if let Some(store) = &self.store {
            if let Err(e) = store.bind(py).call_method0("release") {
                tracing::warn!(error = %e, "releasing the checkpoint's objects failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use flowrepl_task_logger::snapshot::JournalLine;
    use pyo3::prelude::*;

    /// `snapshot.py` writes journal lines in one function; the Rust reader reads what it
    /// writes, field for field.
    #[test]
    fn the_reader_reads_what_the_writer_writes() {
        crate::interpreter::test_python();
        Python::attach(|py| {
            let m = crate::support::load_source(py, &crate::support::SNAPSHOT).unwrap();
            let group = m
                .getattr("_Group")
                .unwrap()
                .call1((vec!["a", "b"], "s1.pkl", 10, 20, vec!["c"], py.None()))
                .unwrap();
            let modules = pyo3::types::PyDict::new(py);
            modules.set_item("np", "numpy").unwrap();
            let unsaved = pyo3::types::PyDict::new(py);
            unsaved.set_item("g", "a generator").unwrap();
            let text: String = m
                .getattr("journal_line")
                .unwrap()
                .call1((
                    false,
                    7,
                    "cloudpickle 3.1 (flowrepl)",
                    "sess-1",
                    vec![group],
                    modules,
                    unsaved,
                    vec!["old"],
                    "{\"k\":1}",
                    1.5,
                ))
                .unwrap()
                .extract()
                .unwrap();
            assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
            let line: JournalLine = serde_json::from_str(&text).unwrap();
            assert_eq!(line.v, flowrepl_task_logger::snapshot::SNAPSHOT_FORMAT);
            assert!(!line.full);
            assert_eq!(line.execution_count, 7);
            assert_eq!(line.pickler, "cloudpickle 3.1 (flowrepl)");
            assert_eq!(line.session.as_deref(), Some("sess-1"));
            assert_eq!(line.put.len(), 1);
            assert_eq!(line.put[0].names, ["a", "b"]);
            assert_eq!((line.put[0].off, line.put[0].len), (10, 20));
            assert_eq!(line.put[0].refs, ["c"]);
            assert_eq!(line.modules["np"], "numpy");
            assert_eq!(line.unsaved["g"], "a generator");
            assert_eq!(line.drop, ["old"]);
            assert_eq!(line.context.as_deref(), Some("{\"k\":1}"));
            assert_eq!(line.ms, Some(1.5));
            assert!(line.time.ends_with('Z'), "{}", line.time);
            // Every field written is one the reader knows.
            let keys: Vec<String> =
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text)
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect();
            for k in &keys {
                assert!(
                    [
                        "v",
                        "full",
                        "execution_count",
                        "time",
                        "python",
                        "pickler",
                        "session",
                        "put",
                        "modules",
                        "unsaved",
                        "drop",
                        "context",
                        "ms"
                    ]
                    .contains(&k.as_str()),
                    "{k} is not read by JournalLine"
                );
            }
        });
    }
}
