//! Running cells in the persistent `__main__` namespace.
//!
//! One cell, on the thread that initialised Python:
//! 1. absorb a stray SIGINT that arrived while idle;
//! 2. split off a final expression ([`crate::cell`]) and compile from text (C API, no AST);
//! 3. tell the [`Monitor`] (timeout, output limit), run, take the `repr` of the value;
//! 4. flush Python and C stdio, collect fds 1 and 2 from the capture files;
//! 5. diff globals and `sys.modules` against the snapshots ([`KeySnapshot`]);
//! 6. on error, format the traceback (cell sources registered with linecache first).
//!
//! No thread, temp file or pipe is created per cell; the hot path allocates only the output
//! strings and the names that changed.

use crate::capture::{Capture, Collected};
use crate::cell::{split_last_expression, Split};
use crate::checkpoint::{CheckpointError, Checkpointer, Checkpoints, Held};
use crate::interpreter::{self, InitError};
use crate::monitor::Monitor;
use crate::sink::{OutputSink, Streamer};
use crate::snapshot::KeySnapshot;
use crate::support::CallError;
use crate::usage::UsageMeter;
use flowrepl_protocol::frame::OutputStream;
use flowrepl_protocol::{
    CellReport, CheckpointSummary, ExecError, ExecutionKind, Image, ImageInfo, Mode, PhaseTimings,
    PythonInfo, RestoreReport, VariableInfo,
};
use pyo3::exceptions::{PyKeyboardInterrupt, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::{ffi, intern};
use std::ffi::{c_int, CStr, CString};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether the compiled `code` holds other code objects (functions, lambdas, classes,
/// generator expressions): code that can run after its cell has ended, so that a later
/// traceback or `inspect.getsource` needs the cell's source.
fn holds_code(code: &Bound<'_, PyAny>) -> bool {
    let Ok(consts) = code.getattr(intern!(code.py(), "co_consts")) else {
        return true;
    };
    let Ok(consts) = consts.cast_into::<PyTuple>() else {
        return true;
    };
    // SAFETY: the GIL is held (`code` is bound); PyCode_Check only reads the object's type.
    consts
        .iter()
        .any(|c| unsafe { ffi::PyCode_Check(c.as_ptr()) } != 0)
}

/// Cells larger than this are not kept for linecache (a 50 MB data literal has no place in a
/// traceback, and would be held for the whole session).
const MAX_REGISTERED_SOURCE: usize = 1 << 20;
// Values from CPython's compile.h (not exported by pyo3-ffi).
const PYCF_SOURCE_IS_UTF8: c_int = 0x0100;
const PYCF_IGNORE_COOKIE: c_int = 0x0800;

/// How to start the executor.
#[derive(Clone)]
pub struct ExecutorConfig {
    /// The python to emulate: an interpreter or a venv's `bin/python` of the embedded version.
    pub python: PathBuf,
    /// Per stream and cell, output beyond this is dropped from the middle.
    pub max_output_bytes: u64,
    /// Worker mode: stream output here while cells run, instead of returning it in
    /// [`CellOutcome::stdout`]/[`CellOutcome::stderr`] (which then stay empty).
    pub sink: Option<Arc<dyn OutputSink>>,
    /// MCP mode: collect figures and rich values as PNG images after each cell.
    pub images: Option<ImageLimits>,
    /// What the session starts from: `sys.argv`, `sys.path[0]`, startup files.
    pub setup: SessionSetup,
    /// Where `flow.request_approval` sends its requests; `None`: nobody can be asked (it
    /// returns `None`).
    pub approver: Option<Arc<dyn crate::approval::Approver>>,
    /// Worker mode: the capture files (stdout, stderr) the kernel made and keeps.
    pub capture: Option<[Arc<OwnedFd>; 2]>,
    /// Where and when checkpoints of the namespace are written; `None`: never.
    pub snapshots: Option<crate::checkpoint::SnapshotConfig>,
}

/// What a session starts from, before its first cell (and again after an in-process
/// `restart`): names the startup files define are the baseline, not a cell's additions.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionSetup {
    /// `sys.argv`, when it is set (drop-in mode: `[SCRIPT, args...]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// A folder put first on `sys.path` (drop-in mode: the script's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path0: Option<PathBuf>,
    /// Python files run in the namespace, in order (`$PYTHONSTARTUP`, `--startup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup: Vec<PathBuf>,
    /// What `flow` starts with: the task's ids and its context.
    #[serde(default)]
    pub flow: crate::flow::FlowSetup,
}

/// Caps on the images collected after a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// At most this many images per cell; open figures past it are closed and reported in
    /// `warnings`.
    pub max_images: u32,
    /// At most this many pixels per image: figures are rendered at a lower dpi to fit, and
    /// larger `_repr_png_()` images are left out (with a warning).
    pub max_pixels: u64,
}

impl std::fmt::Debug for ExecutorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorConfig")
            .field("python", &self.python)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("sink", &self.sink.is_some())
            .field("images", &self.images)
            .field("setup", &self.setup)
            .field("snapshots", &self.snapshots)
            .finish()
    }
}

/// Why the executor could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// Python did not start.
    #[error(transparent)]
    Init(#[from] InitError),
    /// The capture files or the monitor could not be set up.
    #[error("cannot set up output capture")]
    Io(#[from] std::io::Error),
    /// The support module failed to load.
    #[error("cannot load the executor's Python support code: {0}")]
    Support(String),
}

/// Everything a cell produced: its output and images, and the [`CellReport`] of what it did.
#[derive(Debug, Clone)]
pub struct CellOutcome {
    /// fd 1 output (empty in worker mode: it was streamed to the sink).
    pub stdout: String,
    /// fd 2 output, then the traceback on error (likewise).
    pub stderr: String,
    /// Figures and rich values ([`ExecutorConfig::images`]).
    pub images: Vec<Image>,
    /// What the cell did.
    pub report: CellReport,
    /// Events the cell reported through `flow` (in-process; a worker sends them as they come).
    pub events: Vec<flowrepl_protocol::CellEvent>,
    /// The task's context after each change the cell made (in-process; likewise).
    pub contexts: Vec<String>,
    /// CPU time of the process so far, in milliseconds, read as the cell ended.
    pub cpu_total_ms: f64,
    /// How the automatic checkpoint is doing, when that changed since the last cell.
    pub checkpoint: Option<flowrepl_protocol::CheckpointHealth>,
}

impl CellOutcome {
    /// A successful cell that did and printed nothing (the start of every outcome).
    pub fn empty(mode: Mode) -> CellOutcome {
        CellOutcome {
            stdout: String::new(),
            stderr: String::new(),
            images: Vec::new(),
            report: CellReport::new(mode),
            events: Vec::new(),
            contexts: Vec::new(),
            cpu_total_ms: 0.0,
            checkpoint: None,
        }
    }
}

struct Support {
    flush_std: Py<PyAny>,
    register_sources: Py<PyAny>,
    format_exception: Py<PyAny>,
    reset_namespace: Py<PyAny>,
    run_startup: Py<PyAny>,
    finish: Py<PyAny>,
    collect_images: Py<PyAny>,
    list_variables: Py<PyAny>,
}

/// The embedded-Python executor. Lives on the thread that created it (Python's main thread).
pub struct Executor {
    globals: Py<PyDict>,
    modules: Py<PyDict>,
    support: Support,
    capture: Capture,
    monitor: Monitor,
    streamer: Option<Arc<Streamer>>,
    usage: UsageMeter,
    var_snapshot: KeySnapshot,
    module_snapshot: KeySnapshot,
    /// NUL-terminated source handed to the compiler; reused.
    source_buf: Vec<u8>,
    /// Cells whose source is not yet in linecache: (filename, source).
    pending_sources: Vec<(String, String)>,
    cells: u64,
    max_output_bytes: u64,
    images: Option<ImageLimits>,
    /// Startup files, run again after `restart`.
    startup: Vec<PathBuf>,
    /// Receives the events cells report through `flow`.
    emitter: Arc<crate::events::Emitter>,
    /// The `flow` object cells see.
    _flow: Py<PyAny>,
    /// In-process, or worker mode (output goes to a sink).
    mode: Mode,
    /// Checkpoints of the namespace, when they are on.
    checkpoints: Option<Checkpointer>,
    /// Modules the checkpoint code imported that no cell has claimed yet
    /// ([`Executor::claim_own_imports`]).
    own_imports: std::collections::HashSet<String>,
    feature_version: c_int,
    info: PythonInfo,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Executor {
    /// Starts Python on the calling thread and prepares the namespace. Fds 1 and 2 are
    /// captured from here on: save the originals first ([`crate::stdio::take_protocol_stdio`]).
    pub fn start(config: &ExecutorConfig) -> Result<Executor, ExecutorError> {
        crate::sys::tune_malloc();
        let given = match &config.capture {
            Some([o, e]) => Some([o.try_clone()?, e.try_clone()?]),
            None => None,
        };
        let capture = Capture::install(given)?;
        interpreter::initialize(&config.python)?;
        let streamer = config.sink.clone().map(|sink| {
            Arc::new(Streamer::new(
                sink,
                [capture.stdout.memfd(), capture.stderr.memfd()],
                config.max_output_bytes,
                // The kernel made these files and reads each cell's output from them.
                config.capture.is_some(),
            ))
        });
        let monitor = Monitor::start(
            vec![capture.stdout.memfd(), capture.stderr.memfd()],
            config.max_output_bytes,
            streamer.clone(),
        )?;
        Python::attach(|py| {
            let support_err = |e: PyErr| ExecutorError::Support(e.to_string());
            let module = crate::support::load(py).map_err(support_err)?;
            let globals = module
                .getattr("setup")
                .and_then(|f| f.call0())
                .and_then(|g| Ok(g.cast_into::<PyDict>()?))
                .map_err(support_err)?;
            let sys = py.import("sys").map_err(support_err)?;
            let modules = sys
                .getattr("modules")
                .and_then(|m| Ok(m.cast_into::<PyDict>()?))
                .map_err(support_err)?;
            let attr = |name: &str| -> Result<String, ExecutorError> {
                Ok(sys
                    .getattr(name)
                    .map_err(support_err)?
                    .str()
                    .map_err(support_err)?
                    .to_string_lossy()
                    .into_owned())
            };
            let info = PythonInfo {
                python_version: attr("version")?,
                python_executable: attr("executable")?,
                python_prefix: attr("prefix")?,
            };
            let emitter = Arc::new(crate::events::Emitter::new(
                capture.stdout.memfd(),
                config.sink.clone(),
            ));
            let approvals = crate::approval::Approvals::new(
                config.approver.clone(),
                Arc::clone(&emitter),
                monitor.clock(),
            );
            let flow = crate::flow::install_flow(
                py,
                &module,
                Arc::clone(&emitter),
                approvals,
                &config.setup.flow,
            )
            .map_err(support_err)?;
            let get = |name: &str| module.getattr(name).map(Bound::unbind).map_err(support_err);
            let support = Support {
                flush_std: get("flush_std")?,
                register_sources: get("register_sources")?,
                format_exception: get("format_exception")?,
                reset_namespace: get("reset_namespace")?,
                run_startup: get("run_startup")?,
                finish: get("finish")?,
                collect_images: get("collect_images")?,
                list_variables: get("list_variables")?,
            };
            let mut exec = Executor {
                globals: globals.clone().unbind(),
                modules: modules.unbind(),
                support,
                capture,
                monitor,
                streamer,
                usage: UsageMeter::new(),
                var_snapshot: KeySnapshot::default(),
                module_snapshot: KeySnapshot::default(),
                source_buf: Vec::with_capacity(4096),
                pending_sources: Vec::new(),
                cells: 0,
                max_output_bytes: config.max_output_bytes,
                images: config.images,
                startup: config.setup.startup.clone(),
                emitter,
                _flow: flow,
                own_imports: std::collections::HashSet::new(),
                checkpoints: match &config.snapshots {
                    Some(c) => Some(
                        Checkpointer::start(
                            c.clone(),
                            globals.clone().unbind(),
                            config.setup.flow.session_id.clone(),
                        )
                        .map_err(ExecutorError::Io)?,
                    ),
                    None => None,
                },
                mode: if config.sink.is_some() {
                    Mode::Worker
                } else {
                    Mode::InProcess
                },
                feature_version: py.version_info().minor as c_int,
                info,
                _not_send: std::marker::PhantomData,
            };
            let path0 = config.setup.path0.as_ref().map(|p| p.display().to_string());
            module
                .getattr("apply_setup")
                .and_then(|f| f.call1((config.setup.argv.clone(), path0)))
                .map_err(support_err)?;
            exec.run_startup(py);
            exec.rebaseline(py);
            // Output written while starting (site, .pth files, startup files) is not a cell's.
            exec.discard_output();
            exec.monitor
                .idle_from(&[exec.capture.stdout.cursor(), exec.capture.stderr.cursor()]);
            Ok(exec)
        })
    }

    /// Where the next cell's stdout and stderr start in the capture files.
    pub fn capture_cursors(&self) -> [u64; 2] {
        self.capture.cursors()
    }

    /// A handle other threads use to interrupt the running cell.
    pub fn interrupter(&self) -> crate::monitor::Interrupter {
        self.monitor.interrupter()
    }

    /// The interpreter's identity.
    pub fn info(&self) -> &PythonInfo {
        &self.info
    }

    /// Empties the `__main__` namespace (`restart` in-process); loaded modules stay.
    pub fn reset_namespace(&mut self) -> Result<(), CallError> {
        self.attached(|me, py, held| {
            let globals = me.globals.bind(py).clone();
            let r = me.support.reset_namespace.bind(py).call1((globals,));
            if r.is_ok() {
                me.run_startup(py);
            }
            if let Some(c) = held {
                c.namespace_reset(py);
            }
            me.rebaseline(py);
            me.discard_output();
            r.map(drop).map_err(CallError::from)
        })
    }

    /// Runs `f` with the checkpoint state held (when checkpoints are on), then the GIL: the
    /// order the checkpoint writer takes them in, everywhere.
    fn attached<R>(
        &mut self,
        f: impl FnOnce(&mut Self, Python<'_>, Option<&mut Held<'_>>) -> R,
    ) -> R {
        let checkpoints = self.checkpoints.take();
        let mut held = checkpoints.as_ref().map(Checkpointer::hold);
        let r = Python::attach(|py| f(self, py, held.as_mut()));
        drop(held);
        self.checkpoints = checkpoints;
        r
    }

    /// Runs the startup files in the namespace; their errors go to the diagnostics (stderr),
    /// as the interactive interpreter shows them, and the session starts all the same.
    fn run_startup(&mut self, py: Python<'_>) {
        if self.startup.is_empty() {
            return;
        }
        let globals = self.globals.bind(py).clone();
        let files: Vec<String> = self
            .startup
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        match self
            .support
            .run_startup
            .bind(py)
            .call1((globals, files))
            .and_then(|e| e.extract::<Vec<String>>())
        {
            Ok(errors) => errors.iter().for_each(|e| tracing::warn!("{e}")),
            Err(e) => tracing::warn!(error = %e, "running the startup files failed"),
        }
    }

    /// The session ends: runs the `atexit` handlers cells registered, then drops the
    /// namespace (files left open are flushed and closed by their finalizers) and flushes
    /// stdio, as a Python process does when it exits. Whatever that prints is discarded.
    /// The executor stays usable (with an empty namespace).
    pub fn finish(&mut self) {
        self.attached(|me, py, held| {
            clear_pending_signals();
            if let Some(c) = held {
                c.namespace_reset(py);
            }
            let globals = me.globals.bind(py).clone();
            if let Err(e) = me.support.finish.bind(py).call1((globals,)) {
                tracing::warn!(error = %e, "running exit handlers failed");
            }
            me.rebaseline(py);
        });
        // SAFETY: fflush(NULL) flushes every C stdio stream; no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        self.discard_output();
    }

    /// The namespace's names (not `__dunder__` ones), sorted, with type, short repr and size.
    /// Runs Python code (`repr`, `len`) of the user's objects; call it between cells.
    pub fn list_variables(&mut self) -> Result<Vec<VariableInfo>, CallError> {
        Python::attach(|py| {
            let globals = self.globals.bind(py).clone();
            let json: String = self
                .support
                .list_variables
                .bind(py)
                .call1((globals,))
                .and_then(|j| j.extract())?;
            // Modules imported to list (json, reprlib) are not the next cell's imports (unless
            // it imports them itself).
            self.absorb_own_imports(py);
            serde_json::from_str(&json).map_err(|e| CallError(e.to_string()))
        })
    }

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
        // SAFETY: fflush(NULL) flushes every C stdio stream; no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        self.discard_output();
        r
    }

    /// Runs `f` on the checkpoint state with the namespace; `None` if checkpoints are off.
    /// Modules the checkpoint code imported (pickle, json, cloudpickle) are not the next
    /// cell's imports.
    fn with_checkpoints<R>(
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

    /// CPU time of this process so far, in milliseconds.
    pub fn cpu_total_ms(&self) -> f64 {
        self.usage.cpu_total_ms()
    }

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

    fn execute_attached(
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
        clear_pending_signals();
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
                    absorb_pending_signals();
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
        self.var_snapshot.update(
            py,
            &globals,
            &mut out.report.added_vars,
            &mut out.report.removed_vars,
            Some(&mut out.report.rebound_vars),
        );
        let mut gone = Vec::new();
        self.module_snapshot
            .update(py, &modules, &mut out.report.added_imports, &mut gone, None);
        self.claim_own_imports(code, &mut out.report.added_imports);
        out.report.variable_count = self.var_snapshot.non_dunder_len();
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
                        crate::capture::append_traceback(&mut out.stderr, &err.traceback);
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

    /// Compiles `code` into an optional `exec` part and an optional `eval` part.
    #[allow(clippy::type_complexity)]
    fn compile<'py>(
        &mut self,
        py: Python<'py>,
        code: &str,
        name: &CStr,
    ) -> PyResult<(Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>)> {
        if code.contains('\0') {
            return Err(PyValueError::new_err(
                "source code string cannot contain null bytes",
            ));
        }
        if let Some(split) = split_last_expression(code) {
            if let Ok(eval) = self.compile_tail(py, &split, name) {
                if split.head.trim().is_empty() {
                    return Ok((None, Some(eval)));
                }
                if let Ok(head) = self.compile_text(py, split.head, name, ffi::Py_file_input) {
                    return Ok((Some(head), Some(eval)));
                }
            }
            // Not an expression after all, or the head does not compile alone: compile the
            // whole cell so that errors read as they would for the cell as written.
            // SAFETY: GIL held; discards the failed attempt's exception.
            unsafe { ffi::PyErr_Clear() };
        }
        Ok((
            Some(self.compile_text(py, code, name, ffi::Py_file_input)?),
            None,
        ))
    }

    /// Compiles a split-off final statement as an expression, placed at its original line and
    /// column so that tracebacks point at the right characters. Eval mode rejects indentation
    /// after leading newlines, so a tail that starts mid-line (after `;`) is wrapped in
    /// parentheses, where indentation does not count.
    fn compile_tail<'py>(
        &mut self,
        py: Python<'py>,
        split: &Split<'_>,
        name: &CStr,
    ) -> PyResult<Bound<'py, PyAny>> {
        let plain = self.compile_tail_as(py, split, name, split.tail_col > 0);
        // Eval mode rejects a bare starred tuple (`*a, b`), which is a valid expression
        // statement; in parentheses it means the same. (Not with `:=`, which parentheses
        // would turn from a syntax error into an assignment.)
        if plain.is_err()
            && split.tail_col == 0
            && split.tail.contains('*')
            && !split.tail.contains(":=")
        {
            // SAFETY: GIL held; drops the first attempt's exception.
            unsafe { ffi::PyErr_Clear() };
            return self.compile_tail_as(py, split, name, true);
        }
        plain
    }

    fn compile_tail_as<'py>(
        &mut self,
        py: Python<'py>,
        split: &Split<'_>,
        name: &CStr,
        parenthesized: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let buf = &mut self.source_buf;
        buf.clear();
        if !parenthesized {
            buf.resize(split.tail_line - 1, b'\n');
            buf.extend_from_slice(split.tail.as_bytes());
        } else {
            buf.push(b'(');
            let spaces = if split.tail_line == 1 {
                split.tail_col.saturating_sub(1)
            } else {
                split.tail_col
            };
            buf.resize(buf.len() + split.tail_line - 1, b'\n');
            buf.resize(buf.len() + spaces, b' ');
            buf.extend_from_slice(split.tail.as_bytes());
            buf.extend_from_slice(b"\n)");
        }
        self.compile_buf(py, name, ffi::Py_eval_input)
    }

    fn compile_text<'py>(
        &mut self,
        py: Python<'py>,
        src: &str,
        name: &CStr,
        mode: c_int,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.source_buf.clear();
        self.source_buf.extend_from_slice(src.as_bytes());
        self.compile_buf(py, name, mode)
    }

    /// Compiles `source_buf` (NUL appended here).
    fn compile_buf<'py>(
        &mut self,
        py: Python<'py>,
        name: &CStr,
        mode: c_int,
    ) -> PyResult<Bound<'py, PyAny>> {
        let buf = &mut self.source_buf;
        buf.push(0);
        let mut flags = ffi::PyCompilerFlags {
            cf_flags: PYCF_SOURCE_IS_UTF8 | PYCF_IGNORE_COOKIE,
            cf_feature_version: self.feature_version,
        };
        // SAFETY: `buf` is NUL-terminated UTF-8 without interior NUL (checked by the caller),
        // `name` is a C string, the GIL is held.
        unsafe {
            let ptr = ffi::Py_CompileStringExFlags(
                buf.as_ptr().cast(),
                name.as_ptr(),
                mode,
                &mut flags,
                -1,
            );
            Bound::from_owned_ptr_or_err(py, ptr)
        }
    }

    fn collect_output(&mut self, py: Python<'_>, out: &mut CellOutcome) {
        if !flush_std_streams(py) {
            // Closed, replaced by something without flush(), or None: the support code
            // puts fresh streams on fds 1 and 2.
            if let Err(e) = self.support.flush_std.bind(py).call0() {
                out.report
                    .warnings
                    .push(format!("flushing sys.stdout/sys.stderr failed: {e}"));
            }
        }
        // SAFETY: fflush(NULL) flushes every C stdio stream; no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        if let Some(streamer) = self.streamer.clone() {
            return self.stream_output(&streamer, out);
        }
        for (stream, target, label) in [
            (&mut self.capture.stdout, &mut out.stdout, "stdout"),
            (&mut self.capture.stderr, &mut out.stderr, "stderr"),
        ] {
            let mut bytes = Vec::new();
            match stream.collect(&mut bytes, self.max_output_bytes) {
                Ok(Collected {
                    dropped,
                    restored_fd,
                }) => {
                    if dropped > 0 {
                        out.report.warnings.push(format!(
                            "{label}: {dropped} bytes were dropped from the middle (output limit per cell)"
                        ));
                    }
                    if restored_fd {
                        out.report.warnings.push(format!(
                            "the cell closed or redirected fd {}; it was pointed back at the {label} capture",
                            if label == "stdout" { 1 } else { 2 }
                        ));
                    }
                }
                Err(e) => out
                    .report
                    .warnings
                    .push(format!("reading captured {label} failed: {e}")),
            }
            *target = crate::capture::decode_output(bytes, label, &mut out.report.warnings);
        }
    }

    /// Worker mode: sends the rest of the cell's output to the sink.
    fn stream_output(&mut self, streamer: &Streamer, out: &mut CellOutcome) {
        let mut sizes = [0; 2];
        let streams = [&mut self.capture.stdout, &mut self.capture.stderr];
        for (i, (stream, label)) in streams.into_iter().zip(["stdout", "stderr"]).enumerate() {
            match stream.settle() {
                Ok((size, restored)) => {
                    sizes[i] = size;
                    if restored {
                        out.report.warnings.push(format!(
                            "the cell closed or redirected fd {}; it was pointed back at the {label} capture",
                            i + 1
                        ));
                    }
                }
                Err(e) => {
                    sizes[i] = stream.cursor();
                    out.report
                        .warnings
                        .push(format!("reading captured {label} failed: {e}"));
                }
            }
        }
        let finished = streamer.finish(sizes);
        for (f, label) in finished.iter().zip(["stdout", "stderr"]) {
            if f.dropped > 0 {
                out.report.warnings.push(format!(
                    "{label}: {} bytes were dropped from the middle (output limit per cell)",
                    f.dropped
                ));
            }
        }
        self.capture.stdout.advance(sizes[0]);
        self.capture.stderr.advance(sizes[1]);
    }

    /// Renders open matplotlib figures (then closes them) and a final value's
    /// `_repr_png_()`. Costs one dict lookup unless pyplot is loaded or the value has
    /// something to render.
    fn collect_images(
        &mut self,
        py: Python<'_>,
        value: Option<&Bound<'_, PyAny>>,
        limits: ImageLimits,
        out: &mut CellOutcome,
    ) {
        let value = value.filter(|v| {
            let t = v.get_type();
            t.hasattr(intern!(py, "_repr_png_")).unwrap_or(false)
                || t.hasattr(intern!(py, "savefig")).unwrap_or(false)
        });
        let pyplot = self
            .modules
            .bind(py)
            .contains(intern!(py, "matplotlib.pyplot"))
            .unwrap_or(false);
        if value.is_none() && !pyplot {
            return;
        }
        let collected = self
            .support
            .collect_images
            .bind(py)
            .call1((value, limits.max_images, limits.max_pixels))
            .and_then(|r| r.extract::<(Vec<(String, String, u32, u32, u64)>, Vec<String>)>());
        match collected {
            Ok((images, notes)) => {
                out.images = images
                    .into_iter()
                    .map(|(source, data, width, height, bytes)| Image {
                        info: ImageInfo {
                            mime: "image/png".into(),
                            width,
                            height,
                            bytes,
                            source,
                        },
                        data,
                    })
                    .collect();
                out.report.warnings.extend(notes);
            }
            Err(e) => out
                .report
                .warnings
                .push(format!("collecting figures failed: {e}")),
        }
    }

    fn describe(&self, py: Python<'_>, err: PyErr) -> ExecError {
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
    fn register_sources(&mut self, py: Python<'_>, force: bool) {
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

    fn rebaseline(&mut self, py: Python<'_>) {
        let mut scratch = (Vec::new(), Vec::new());
        let globals = self.globals.bind(py).clone();
        self.var_snapshot
            .update(py, &globals, &mut scratch.0, &mut scratch.1, None);
        self.rebaseline_modules(py);
    }

    /// Modules the executor's own code imported (pickle, json, cloudpickle and what it needs;
    /// what unpickling needed) join the baseline, and are remembered: a later cell whose
    /// `import` statement names one still reports it in `added_imports`.
    fn absorb_own_imports(&mut self, py: Python<'_>) {
        let mut added = Vec::new();
        let modules = self.modules.bind(py).clone();
        self.module_snapshot
            .update(py, &modules, &mut added, &mut Vec::new(), None);
        self.own_imports.extend(added);
    }

    /// Adds to `added_imports` the modules the cell's `import` statements name that the
    /// executor's own code had imported first (so that the diff of `sys.modules` misses them).
    fn claim_own_imports(&mut self, code: &str, added: &mut Vec<String>) {
        if self.own_imports.is_empty() || !code.contains("import") {
            return;
        }
        for name in crate::cell::imported_modules(code) {
            let mut end = name.len();
            loop {
                let module = &name[..end];
                if self.own_imports.remove(module) && !added.iter().any(|a| a == module) {
                    added.push(module.to_owned());
                }
                match module.rfind('.') {
                    Some(dot) => end = dot,
                    None => break,
                }
            }
        }
        added.sort();
    }

    fn rebaseline_modules(&mut self, py: Python<'_>) {
        let mut scratch = (Vec::new(), Vec::new());
        let modules = self.modules.bind(py).clone();
        self.module_snapshot
            .update(py, &modules, &mut scratch.0, &mut scratch.1, None);
    }

    fn discard_output(&mut self) {
        let mut sink = Vec::new();
        let _ = self.capture.stdout.collect(&mut sink, u64::MAX);
        let _ = self.capture.stderr.collect(&mut sink, u64::MAX);
        if !sink.is_empty() {
            tracing::debug!(
                bytes = sink.len(),
                "discarded output written during start-up"
            );
        }
    }
}

/// A final value's repr, and the value itself when asked for (for its images).
type FinalValue<'py> = (Option<String>, Option<Bound<'py, PyAny>>);

/// Runs the compiled parts; returns the repr of the final value unless it is `None`, and the
/// value when `keep_value`.
fn run<'py>(
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

/// Flushes `sys.stdout` and `sys.stderr` through the C API (no Python frame on the hot path).
/// False if either is missing or its `flush()` raised.
fn flush_std_streams(py: Python<'_>) -> bool {
    let mut ok = true;
    for name in [c"stdout", c"stderr"] {
        // SAFETY: GIL held; PySys_GetObject returns a borrowed reference or NULL.
        let stream = unsafe { ffi::PySys_GetObject(name.as_ptr()) };
        if stream.is_null() || stream == py.None().as_ptr() {
            ok = false;
            continue;
        }
        // SAFETY: `stream` is alive (owned by sys) while we hold the GIL.
        let stream = unsafe { Bound::from_borrowed_ptr(py, stream) };
        if stream.call_method0(intern!(py, "flush")).is_err() {
            ok = false;
        }
    }
    ok
}

/// Runs Python's handlers for signals already delivered and drops the `KeyboardInterrupt`
/// they raise. Needs the GIL.
fn clear_pending_signals() {
    // SAFETY: the callers hold the GIL.
    unsafe {
        if ffi::PyErr_CheckSignals() != 0 {
            ffi::PyErr_Clear();
        }
    }
}

/// Lets a SIGINT still in flight be delivered (any syscall does), then clears it.
fn absorb_pending_signals() {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::syscall(libc::SYS_getpid) };
    clear_pending_signals();
}

impl Drop for Executor {
    fn drop(&mut self) {
        // Its thread stops first (it may be waiting for the GIL).
        self.checkpoints = None;
        Python::attach(|py| {
            self.var_snapshot.clear(py);
            self.module_snapshot.clear(py);
        });
    }
}
