//! The bridge to the checkpoints of the namespace.

use super::Executor;
use crate::checkpoint::{Checkpointer, Checkpoints};
use flowrepl_exec::setup::CheckpointError;
use flowrepl_protocol::{CheckpointSummary, RestoreReport};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

impl Executor {
    /// Writes the pending automatic checkpoint now, if one is (the session ends, or is
    /// restarted); failures are logged (and the next write saves every name).
    pub fn write_pending_checkpoint(&mut self) {
        self.with_checkpoints(|c, py, globals| c.write_pending(py, globals));
    }

    /// How the automatic checkpoint is doing, for other threads (`None`: checkpoints off).
    pub fn checkpoint_health(
        &self,
    ) -> Option<Arc<std::sync::Mutex<flowrepl_protocol::CheckpointHealth>>> {
        self.checkpoints.as_ref().map(Checkpointer::health)
    }

    /// Writes checkpoint `name` now, with every name.
    pub fn checkpoint(&mut self, name: &str) -> Result<CheckpointSummary, CheckpointError> {
        self.with_checkpoints(|c, py, globals| c.write(py, globals, name))
            .unwrap_or(Err(CheckpointError::Off))
    }

    /// Replaces the namespace with checkpoint `name`'s: emptied first (with the startup files
    /// run again) unless `fresh` says it was just made. The task's context becomes the
    /// checkpoint's only when the task has none (the task log keeps the newest). Whatever the
    /// loading prints is discarded.
    pub fn restore(&mut self, name: &str, fresh: bool) -> Result<RestoreReport, CheckpointError> {
        let cp = match &self.checkpoints {
            None => return Err(CheckpointError::Off),
            Some(c) => c.hold().load(name)?,
        };
        if !fresh {
            self.reset_namespace()?;
        }
        let r = self
            .with_checkpoints(|c, py, globals| c.restore(py, globals, &cp))
            .unwrap_or(Err(CheckpointError::Off));
        // (`with_checkpoints` took in the modules the loading imported.)
        Python::attach(|py| self.rebaseline(py));
        flowrepl_os::flush_c_stdio();
        self.discard_output();
        r
    }

    /// Runs `f` on the checkpoint state with the namespace; `None` if checkpoints are off.
    /// Modules the checkpoint code imported (pickle, json, cloudpickle) are not the next
    /// cell's imports.
    pub(super) fn with_checkpoints<R>(
        &mut self,
        f: impl FnOnce(&mut Checkpoints, Python<'_>, &Bound<'_, PyDict>) -> R,
    ) -> Option<R> {
        self.checkpoints.as_ref()?;
        Some(self.attached(|me, py, held| {
            let held = held.expect("checkpoints are on");
            let globals = me.globals.bind(py).clone();
            let r = f(held, py, &globals);
            held.take_imported();
            me.absorb_own_imports(py);
            r
        }))
    }
}
