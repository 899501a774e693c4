//! The checkpoint state of one executor, and the bridge to the Python code that writes and
//! restores checkpoints (the Python package in the same folder, `_flowrepl_checkpoint_*`).

use crate::support::py_err;
use flowrepl_exec::setup::{CallError, CheckpointConfig, CheckpointError};
use flowrepl_protocol::{
    CheckpointFailure, CheckpointHealth, CheckpointPolicy, CheckpointSummary, RestoreReport,
};
use flowrepl_task_logger::checkpoint::{self, Checkpoint};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Pickles up to this size are loaded back when written, to catch ones that do not load.
const VERIFY_BYTES: u64 = 16 << 20;
/// Past this many cells' code objects kept for the next write, it saves every name instead.
const MAX_PENDING_CODES: usize = 512;

/// The names whose value in `globals` is not the object `saved` holds for them, and the names
/// `saved` holds that `globals` no longer has: two walks comparing pointers (the names' hashes
/// are cached), about 10 ns a name, where the same in Python costs ten times that.
///
/// Not [`crate::key_diff::KeyDiff`], which answers "what did this cell change": its baseline
/// is the previous cell and it remembers values by address without holding them (a deleted
/// object is freed as usual), so an object freed and another made at its address would pass
/// for the same. This baseline is the last write, cells ago, and `saved` holds its objects, so
/// no address is reused while they are compared.
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

/// Said in the first cell's warnings (and as the error of an explicit write of `auto`) when
/// the task's checkpoints were written by a sandboxed session and this one is not sandboxed.
const UNTRUSTED_NO_AUTO: &str = "automatic checkpoints are off in this session: the task's checkpoints were written by a sandboxed session, and this session's would replace them (they are kept for a sandboxed or --trust-sandboxed-checkpoints kernel); name a checkpoint to save this session's variables";

/// The checkpoint state of one executor.
pub(crate) struct Checkpoints {
    pub(super) config: CheckpointConfig,
    /// The session id written into journal lines.
    pub(super) session: Option<String>,
    /// How the automatic checkpoint is doing (read without the state lock).
    pub(super) health: Arc<Mutex<CheckpointHealth>>,
    /// The health changed since [`Checkpoints::take_health_change`] last said.
    health_changed: bool,
    /// A failed automatic write, for the next cell's warnings.
    warning: Option<String>,
    /// `_flowrepl_checkpoint_store`, once loaded.
    module: Option<Py<PyAny>>,
    /// Its `Store` for `auto`.
    store: Option<Py<PyAny>>,
    /// Code of the cells since the last automatic write.
    codes: Vec<Py<PyAny>>,
    /// Too many cells to keep their code: the next write saves every name.
    every_name: bool,
    /// A successful cell since the last automatic write: when the first one ended.
    pub(super) pending: Option<Instant>,
    /// The execution count of the last cell.
    last_count: u64,
    /// The writer thread, to wake when a write becomes pending.
    pub(super) writer: Option<std::thread::Thread>,
}

impl Checkpoints {
    pub(crate) fn new(config: CheckpointConfig) -> Checkpoints {
        let warning = config.untrusted.then(|| UNTRUSTED_NO_AUTO.to_owned());
        Checkpoints {
            config,
            session: None,
            health: Arc::default(),
            health_changed: false,
            warning,
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
        self.config.policy == CheckpointPolicy::EveryCell
    }

    /// A failed automatic write not yet said: for the cell about to run's warnings.
    pub(crate) fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    /// The health, if it changed since the last call (worker mode sends it in Done).
    pub(crate) fn take_health_change(&mut self) -> Option<CheckpointHealth> {
        std::mem::take(&mut self.health_changed).then(|| flowrepl_os::lock(&self.health).clone())
    }

    /// Notes how a write of `auto` after cell `count` went.
    fn note_auto_write(&mut self, count: u64, r: &Result<CheckpointSummary, CheckpointError>) {
        let mut h = flowrepl_os::lock(&self.health);
        match r {
            Ok(s) => {
                h.auto_execution_count = Some(s.execution_count);
                h.failing = false;
            }
            Err(e) => {
                let error = flowrepl_os::chain(e);
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
        let m = crate::support::load_checkpoint(py)
            .map_err(py_err)?
            .into_any();
        self.module = Some(m.clone().unbind());
        Ok(m)
    }

    fn store<'py>(
        &mut self,
        py: Python<'py>,
        globals: &Bound<'py, PyDict>,
    ) -> Result<Bound<'py, PyAny>, CheckpointError> {
        // Every time: a folder deleted during the session is made again, private.
        let root = checkpoint::open_root(&self.config.root)?;
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
        if self.config.policy == CheckpointPolicy::Off {
            return Err(CheckpointError::Off);
        }
        checkpoint::check_name(name)?;
        if name == flowrepl_protocol::AUTO_CHECKPOINT && self.config.untrusted {
            return Err(CallError(UNTRUSTED_NO_AUTO.to_owned()).into());
        }
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
        let root = checkpoint::open_root(&self.config.root)?;
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
        if self.config.policy == CheckpointPolicy::Off {
            return Err(CheckpointError::Off);
        }
        if self.config.untrusted {
            return Err(
                checkpoint::FolderError::SandboxedOrigin(checkpoint::sandboxed_mark(
                    &self.config.root,
                ))
                .into(),
            );
        }
        Ok(checkpoint::load(&self.config.root, name)?)
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
    use flowrepl_task_logger::checkpoint::JournalLine;
    use pyo3::prelude::*;

    /// `files.py` writes journal lines in one function; the Rust reader reads what it
    /// writes, field for field.
    #[test]
    fn the_reader_reads_what_the_writer_writes() {
        crate::interpreter::test_python();
        Python::attach(|py| {
            let m = crate::support::load_checkpoint(py)
                .unwrap()
                .getattr("files")
                .unwrap();
            let group = m
                .getattr("Group")
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
            assert_eq!(line.v, flowrepl_task_logger::checkpoint::CHECKPOINT_FORMAT);
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
