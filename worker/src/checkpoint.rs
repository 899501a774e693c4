//! Checkpoints of the namespace: when they are written, and the bridge to the Python code
//! that writes and restores them (`snapshot.py`, the module `_flowrepl_snapshot`).
//!
//! # When
//! With [`SnapshotPolicy::OnSuccess`] a successful cell makes the automatic checkpoint
//! (`auto`) *pending*; it is written once the session has been idle for
//! [`IDLE_BEFORE_CHECKPOINT`] (no request waiting), so a client that sends its next cell at
//! once never waits for it; if requests keep coming, it is written before the next cell once
//! [`MAX_CHECKPOINT_DELAY`] has passed. Worker mode writes it in the worker while the kernel
//! and the client handle the reply; in-process the kernel's request loop does, between
//! requests.
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

use crate::executor::CallError;
use flowrepl_protocol::{CheckpointSummary, RestoreReport, SnapshotPolicy};
use flowrepl_task_logger::snapshot::{self, Checkpoint, SnapshotError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// After a successful cell, the automatic checkpoint waits until the session has been idle
/// this long.
pub const IDLE_BEFORE_CHECKPOINT: Duration = Duration::from_millis(2);
/// ... but no longer than this: then it is written before the next cell.
pub const MAX_CHECKPOINT_DELAY: Duration = Duration::from_secs(1);
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

/// Where and when checkpoints are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// The task's snapshot folder (`<log_dir>/<plan>/<task>.snapshot`).
    pub root: PathBuf,
    /// When the automatic checkpoint is written.
    pub policy: SnapshotPolicy,
    /// Names whose pickle is larger are not saved (and listed).
    pub max_bytes: u64,
}

/// Why a checkpoint was not written or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// `FLOWREPL_SNAPSHOT=off`, or no task log folder.
    #[error("checkpoints are off (FLOWREPL_SNAPSHOT=off)")]
    Off,
    /// The checkpoint folder or journal.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The Python side raised.
    #[error("{0}")]
    Python(#[from] CallError),
}

/// The checkpoint state of one executor.
pub(crate) struct Checkpoints {
    config: SnapshotConfig,
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
}

impl Checkpoints {
    pub(crate) fn new(config: SnapshotConfig) -> Checkpoints {
        Checkpoints {
            config,
            module: None,
            store: None,
            codes: Vec::new(),
            every_name: false,
            pending: None,
            last_count: 0,
        }
    }

    /// Whether cells' code should be kept for the next automatic write.
    pub(crate) fn tracks_cells(&self) -> bool {
        self.config.policy == SnapshotPolicy::OnSuccess
    }

    /// A cell ran (`codes`: its compiled parts).
    pub(crate) fn note_cell(&mut self, codes: Vec<Py<PyAny>>, success: bool, count: u64) {
        self.last_count = count;
        if !self.tracks_cells() {
            return;
        }
        if self.codes.len() + codes.len() > MAX_PENDING_CODES {
            self.codes.clear();
            self.every_name = true;
        } else if !self.every_name {
            self.codes.extend(codes);
        }
        if success && self.pending.is_none() {
            self.pending = Some(Instant::now());
        }
    }

    /// When the pending automatic write became pending, if one is.
    pub(crate) fn pending(&self) -> Option<Instant> {
        self.pending
    }

    fn module<'py>(&mut self, py: Python<'py>) -> Result<Bound<'py, PyAny>, CallError> {
        if let Some(m) = &self.module {
            return Ok(m.bind(py).clone());
        }
        let m = crate::support::load_source(py, &crate::support::SNAPSHOT)?.into_any();
        self.module = Some(m.clone().unbind());
        Ok(m)
    }

    fn store<'py>(
        &mut self,
        py: Python<'py>,
        globals: &Bound<'py, PyDict>,
    ) -> Result<Bound<'py, PyAny>, CheckpointError> {
        if let Some(s) = &self.store {
            return Ok(s.bind(py).clone());
        }
        let root = snapshot::open_root(&self.config.root)?;
        let dir = root.join(flowrepl_protocol::AUTO_CHECKPOINT);
        let store = self
            .module(py)?
            .getattr("Store")
            .and_then(|s| {
                s.call1((
                    globals,
                    dir.display().to_string(),
                    self.config.max_bytes,
                    VERIFY_BYTES,
                ))
            })
            .map_err(CallError::from)?;
        self.store = Some(store.clone().unbind());
        Ok(store)
    }

    /// Writes the pending automatic checkpoint (nothing if none is pending).
    pub(crate) fn write_pending(
        &mut self,
        py: Python<'_>,
        globals: &Bound<'_, PyDict>,
    ) -> Option<Result<CheckpointSummary, CheckpointError>> {
        self.pending.take()?;
        let full = std::mem::take(&mut self.every_name);
        Some(self.write_auto(py, globals, full))
    }

    fn write_auto(
        &mut self,
        py: Python<'_>,
        globals: &Bound<'_, PyDict>,
        full: bool,
    ) -> Result<CheckpointSummary, CheckpointError> {
        let codes = PyList::new(py, self.codes.drain(..)).map_err(CallError::from)?;
        let store = self.store(py, globals)?;
        let ctx = self
            .module(py)?
            .call_method0("context")
            .map_err(CallError::from)?;
        let saved = store
            .getattr("saved")
            .and_then(|s| Ok(s.cast_into::<PyDict>()?))
            .map_err(CallError::from)?;
        let (rebound, removed) = rebound(py, globals, &saved).map_err(CallError::from)?;
        let json: String = store
            .call_method1(
                "checkpoint_json",
                (codes, full, self.last_count, ctx, rebound, removed),
            )
            .and_then(|j| j.extract())
            .map_err(CallError::from)?;
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
            return self.write_auto(py, globals, true);
        }
        let root = snapshot::open_root(&self.config.root)?;
        let module = self.module(py)?;
        let ctx = module.call_method0("context").map_err(CallError::from)?;
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
                ),
            )
            .and_then(|j| j.extract())
            .map_err(CallError::from)?;
        Ok(serde_json::from_str(&json).map_err(|e| CallError(e.to_string()))?)
    }

    /// Reads checkpoint `name` (checking its name, its folder and that it exists), before
    /// anything of the session is dropped for it.
    pub(crate) fn load(&self, name: &str) -> Result<Checkpoint, CheckpointError> {
        if self.config.policy == SnapshotPolicy::Off {
            return Err(CheckpointError::Off);
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
            self.module(py)?
                .getattr("Store")
                .and_then(|s| {
                    s.call1((
                        globals,
                        dir.display().to_string(),
                        self.config.max_bytes,
                        VERIFY_BYTES,
                    ))
                })
                .map_err(CallError::from)?
        };
        let (restored, lost): (Vec<String>, std::collections::BTreeMap<String, String>) = target
            .call_method1("restore_json", (state, dir.display().to_string()))
            .and_then(|r| r.extract())
            .map_err(CallError::from)?;
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
