//! Errors as tracebacks, with the cells' sources in linecache.

use super::Executor;
use flowrepl_protocol::ExecError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// Cells larger than this are not kept for linecache (a 50 MB data literal has no place in a
/// traceback, and would be held for the whole session).
pub(super) const MAX_REGISTERED_SOURCE: usize = 1 << 20;

impl Executor {
    pub(super) fn describe(&self, py: Python<'_>, err: PyErr) -> ExecError {
        let exc = err.into_value(py);
        let described = self
            .support
            .format_exception
            .bind(py)
            .call1((exc.bind(py),))
            .and_then(|t| t.extract::<(String, String, String)>());
        match described {
            Ok((kind, message, traceback)) => ExecError {
                kind,
                message,
                traceback,
            },
            Err(e) => {
                let kind = exc
                    .bind(py)
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "Exception".into());
                ExecError {
                    traceback: format!("{kind}: (traceback unavailable: {e})\n"),
                    message: String::new(),
                    kind,
                }
            }
        }
    }

    /// Hands cell sources to linecache: always when `force` (a traceback is about to be
    /// formatted), else only once something has imported linecache (so `inspect.getsource`
    /// and warnings see them) — never importing it on the hot path.
    pub(super) fn register_sources(&mut self, py: Python<'_>, force: bool) {
        if self.pending_sources.is_empty() {
            return;
        }
        if !force
            && !self
                .modules
                .bind(py)
                .contains(intern!(py, "linecache"))
                .unwrap_or(false)
        {
            return;
        }
        let items: Vec<Bound<'_, PyTuple>> = self
            .pending_sources
            .drain(..)
            .filter_map(|(n, s)| PyTuple::new(py, [n, s]).ok())
            .collect();
        let Ok(list) = PyList::new(py, items) else {
            return;
        };
        if let Err(e) = self.support.register_sources.bind(py).call1((list,)) {
            tracing::warn!(error = %e, "registering cell sources with linecache failed");
        }
    }
}
