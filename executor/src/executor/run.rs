//! One cell: run it, and gather what it did into a [`CellOutcome`].

use super::compile::holds_code;
use super::signals::{absorb_pending_signals, clear_pending_signals};
use super::traceback::MAX_REGISTERED_SOURCE;
use super::Executor;
use crate::checkpoint::Checkpoints;
use flowrepl_exec::setup::CellOutcome;
use flowrepl_protocol::frame::OutputStream;
use flowrepl_protocol::{ExecutionKind, PhaseTimings};
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ffi::CString;
use std::time::{Duration, Instant};

impl Executor {
    /// Runs one cell with a wall-clock `timeout`.
    /// `execution_count` is the session's number for the cell (`flow.execution_count`).
    pub fn execute(&mut self, code: &str, timeout: Duration, execution_count: u64) -> CellOutcome {
        self.cells += 1;
        let name = format!("<cell-{}>", self.cells);
        self.emitter
            .begin(execution_count, self.capture.stdout.cursor());
        // The checkpoint state is held for the whole cell: the writer thread waits.
        let mut out = self.attached(|me, py, held| {
            if held.as_ref().is_some_and(|c| c.take_imported()) {
                me.absorb_own_imports(py);
            }
            let checkpoints = held.map(|h| &mut **h);
            me.execute_attached(py, code, name, timeout, execution_count, checkpoints)
        });
        self.emitter.end();
        (out.events, out.contexts) = self.emitter.take();
        out
    }

    pub(super) fn execute_attached(
        &mut self,
        py: Python<'_>,
        code: &str,
        name: String,
        timeout: Duration,
        execution_count: u64,
        mut checkpoints: Option<&mut Checkpoints>,
    ) -> CellOutcome {
        let t0 = Instant::now();
        // A SIGINT that arrived while idle must not interrupt this cell. (A signal not yet
        // delivered cannot be pending: delivery happens on the way back from any syscall.)
        clear_pending_signals(py);
        let mark = self.usage.begin();
        if let Some(s) = &self.streamer {
            s.begin([self.capture.stdout.cursor(), self.capture.stderr.cursor()]);
        }
        let mut out = CellOutcome::empty(self.mode);
        if let Some(c) = checkpoints.as_deref_mut() {
            if c.every_cell() {
                // The state after the previous cell, if the writer has not saved it yet.
                c.write_pending(py, &self.globals.bind(py).clone());
            }
            out.report.warnings.extend(c.take_warning());
            out.checkpoint = c.take_health_change();
        }
        let name_c = CString::new(name.as_str()).expect("cell names have no NUL");
        let compiled = self.compile(py, code, &name_c);
        let t_compiled = Instant::now();
        let globals = self.globals.bind(py).clone();
        let mut error = None;
        let mut stopped_by = None;
        let mut defines_code = false;
        match compiled {
            Err(e) => {
                out.report.debug_info.execution = ExecutionKind::SyntaxError;
                error = Some(e);
            }
            Ok((exec_part, eval_part)) => {
                defines_code = exec_part.iter().chain(&eval_part).any(holds_code);
                if let Some(c) = checkpoints.as_deref_mut() {
                    exec_part
                        .iter()
                        .chain(&eval_part)
                        .for_each(|p| c.note_code(p));
                }
                let starts = [self.capture.stdout.cursor(), self.capture.stderr.cursor()];
                self.monitor.begin(timeout, &starts);
                let r = run(py, exec_part, eval_part, &globals, self.images.is_some());
                // Figures are rendered inside the cell's time limit, even after an error (a
                // plot then a failure), but not after a stop.
                if let Some(limits) = self.images {
                    let value = r.as_ref().ok().and_then(|(_, v)| v.as_ref());
                    let stopped =
                        matches!(&r, Err(e) if e.is_instance_of::<PyKeyboardInterrupt>(py));
                    if !stopped {
                        self.collect_images(py, value, limits, &mut out);
                    }
                }
                let stopped = self.monitor.end();
                if stopped.any() {
                    // The SIGINT may still be on its way; take it here, not in the next cell.
                    absorb_pending_signals(py);
                }
                match r {
                    Ok((repr, _)) => out.report.result = repr,
                    Err(e) => {
                        out.report.debug_info.execution = ExecutionKind::RuntimeError;
                        if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                            stopped_by = Some(stopped);
                        }
                        error = Some(e);
                    }
                }
            }
        }
        let t_exec = Instant::now();
        self.collect_output(py, &mut out);
        self.monitor
            .idle_from(&[self.capture.stdout.cursor(), self.capture.stderr.cursor()]);
        let t_capture = Instant::now();
        let modules = self.modules.bind(py).clone();
        self.var_keys.update(
            py,
            &globals,
            &mut out.report.added_vars,
            &mut out.report.removed_vars,
            Some(&mut out.report.rebound_vars),
        );
        let mut gone = Vec::new();
        self.module_keys
            .update(py, &modules, &mut out.report.added_imports, &mut gone, None);
        self.claim_own_imports(code, &mut out.report.added_imports);
        out.report.variable_count = self.var_keys.non_dunder_len();
        let t_diff = Instant::now();
        // Kept for tracebacks and `inspect` only if the cell made code that can run after it
        // ends, or failed (its traceback is formatted now): otherwise every `x = 1` of a long
        // session would stay in linecache (~0.4 KB each, 400 MB per million cells).
        if code.len() <= MAX_REGISTERED_SOURCE && (defines_code || error.is_some()) {
            self.pending_sources.push((name, code.to_owned()));
        }
        match error {
            Some(e) => {
                self.register_sources(py, true);
                out.report.error = Some(self.describe(py, e));
                match stopped_by {
                    Some(s) if s.timeout => out.report.mark_timed_out(timeout.as_millis()),
                    Some(s) if s.interrupt => out.report.mark_interrupted(),
                    _ => {}
                }
                let err = out.report.error.as_ref().expect("set above");
                match &self.streamer {
                    Some(s) => s.send_text(OutputStream::Stderr, &err.traceback),
                    None => {
                        flowrepl_exec::capture::append_traceback(&mut out.stderr, &err.traceback);
                    }
                }
                // Formatting may import traceback/linecache: not the cell's imports.
                self.absorb_own_imports(py);
            }
            None => self.register_sources(py, false),
        }
        if let Some(c) = checkpoints {
            c.note_cell(out.report.error.is_none(), execution_count);
        }
        (out.report.usage, out.cpu_total_ms) = self.usage.end(mark);
        let us = |a: Instant, b: Instant| b.duration_since(a).as_micros() as u64;
        out.report.debug_info.phases_us = PhaseTimings {
            compile: us(t0, t_compiled),
            exec: us(t_compiled, t_exec),
            capture: us(t_exec, t_capture),
            diff: us(t_capture, t_diff),
        };
        out
    }
}

/// A final value's repr, and the value itself when asked for (for its images).
type FinalValue<'py> = (Option<String>, Option<Bound<'py, PyAny>>);

/// Runs the compiled parts; returns the repr of the final value unless it is `None`, and the
/// value when `keep_value`.
pub(super) fn run<'py>(
    py: Python<'py>,
    exec_part: Option<Bound<'py, PyAny>>,
    eval_part: Option<Bound<'py, PyAny>>,
    globals: &Bound<'py, PyDict>,
    keep_value: bool,
) -> PyResult<FinalValue<'py>> {
    let g = globals.as_ptr();
    if let Some(code) = exec_part {
        // SAFETY: `code` is a code object, `g` a dict with __builtins__, GIL held.
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyEval_EvalCode(code.as_ptr(), g, g))? };
    }
    let Some(code) = eval_part else {
        return Ok((None, None));
    };
    // SAFETY: as above.
    let value =
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyEval_EvalCode(code.as_ptr(), g, g))? };
    if value.is_none() {
        return Ok((None, None));
    }
    let repr = value.repr()?.to_string_lossy().into_owned();
    Ok((Some(repr), keep_value.then_some(value)))
}
