//! Running cells in the persistent `__main__` namespace.
//!
//! One cell, on the thread that initialised Python (`run.rs`, [`Executor::execute`]):
//! 1. absorb a stray SIGINT that arrived while idle (`signals.rs`);
//! 2. split off a final expression ([`flowrepl_exec::cell`]) and compile from text (`compile.rs`: C
//!    API, no AST);
//! 3. tell the [`Monitor`] (timeout, output limit), run, take the `repr` of the value;
//! 4. flush Python and C stdio, collect fds 1 and 2 from the capture files, or stream them to
//!    the sink; render images (`output.rs`);
//! 5. diff globals and `sys.modules` against the keys seen after the last cell ([`KeyDiff`]), less the
//!    modules the executor's own code imported (`imports.rs`);
//! 6. on error, format the traceback, cell sources registered with linecache first
//!    (`traceback.rs`).
//!
//! This file holds the executor's lifecycle: start (Python, capture, monitor, the support
//! code, `flow`, startup files), reset, listing, finish. `checkpoints.rs` is the bridge to [`crate::checkpoint`].
//!
//! No thread, temp file or pipe is created per cell; the hot path allocates only the output
//! strings and the names that changed.

mod checkpoints;
mod compile;
mod imports;
mod output;
mod run;
mod signals;
mod traceback;

use flowrepl_exec::setup::{CellOutcome, ExecutorConfig, ExecutorError, ImageLimits};

use signals::clear_pending_signals;

use crate::checkpoint::{Checkpointer, Held};
use crate::interpreter;
use crate::key_diff::KeyDiff;
use flowrepl_exec::capture::Capture;
use flowrepl_exec::monitor::Monitor;
use flowrepl_exec::setup::CallError;
use flowrepl_exec::sink::Streamer;
use flowrepl_exec::usage::UsageMeter;
use flowrepl_protocol::{Mode, PythonInfo, VariableInfo};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::Arc;

/// The functions of the support package the executor calls: one table, each field named as its
/// Python function (a name missing from every module of the package fails the executor's start).
macro_rules! support_functions {
    ($($name:ident),* $(,)?) => {
        struct Support {
            $($name: Py<PyAny>,)*
        }

        impl Support {
            fn load(package: &crate::support::Loaded<'_>) -> PyResult<Support> {
                Ok(Support {
                    $($name: package.get(stringify!($name))?.unbind(),)*
                })
            }
        }
    };
}

support_functions!(
    flush_std,
    register_sources,
    format_exception,
    reset_namespace,
    run_startup,
    finish,
    collect_images,
    list_variables,
    layer_changed,
);

/// The embedded-Python executor. Lives on the thread that created it (Python's main thread).
pub struct Executor {
    globals: Py<PyDict>,
    modules: Py<PyDict>,
    support: Support,
    capture: Capture,
    monitor: Monitor,
    streamer: Option<Arc<Streamer>>,
    usage: UsageMeter,
    var_keys: KeyDiff,
    module_keys: KeyDiff,
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
    /// captured from here on: save the originals first ([`flowrepl_exec::stdio::take_protocol_stdio`]).
    pub fn start(config: &ExecutorConfig) -> Result<Executor, ExecutorError> {
        flowrepl_os::tune_malloc();
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
                .get("setup")
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
            let support = Support::load(&module).map_err(support_err)?;
            let mut exec = Executor {
                globals: globals.clone().unbind(),
                modules: modules.unbind(),
                support,
                capture,
                monitor,
                streamer,
                usage: UsageMeter::new(config.pid),
                var_keys: KeyDiff::default(),
                module_keys: KeyDiff::default(),
                source_buf: Vec::with_capacity(4096),
                pending_sources: Vec::new(),
                cells: 0,
                max_output_bytes: config.max_output_bytes,
                images: config.images,
                startup: config.setup.startup.clone(),
                emitter,
                _flow: flow,
                own_imports: std::collections::HashSet::new(),
                checkpoints: match &config.checkpoints {
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
            let layer = config
                .setup
                .packages
                .as_ref()
                .map(|p| p.display().to_string());
            module
                .get("apply_setup")
                .and_then(|f| f.call1((config.setup.argv.clone(), path0, layer)))
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
    pub fn interrupter(&self) -> flowrepl_exec::monitor::Interrupter {
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
            r.map(drop).map_err(crate::support::py_err)
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
            clear_pending_signals(py);
            if let Some(c) = held {
                c.namespace_reset(py);
            }
            let globals = me.globals.bind(py).clone();
            if let Err(e) = me.support.finish.bind(py).call1((globals,)) {
                tracing::warn!(error = %e, "running exit handlers failed");
            }
            me.rebaseline(py);
        });
        flowrepl_os::flush_c_stdio();
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
                .and_then(|j| j.extract())
                .map_err(crate::support::py_err)?;
            // Modules imported to list (json, reprlib) are not the next cell's imports (unless
            // it imports them itself).
            self.absorb_own_imports(py);
            serde_json::from_str(&json).map_err(|e| CallError(e.to_string()))
        })
    }

    /// The task's package layer changed: its new `.pth` files run, the import caches are
    /// dropped; returns which of `modules` are imported (between cells).
    pub fn layer_changed(&mut self, modules: &[String]) -> Result<Vec<String>, CallError> {
        let imported = Python::attach(|py| {
            let r = self
                .support
                .layer_changed
                .bind(py)
                .call1((modules.to_vec(),))
                .and_then(|l| l.extract::<Vec<String>>())
                .map_err(crate::support::py_err);
            self.absorb_own_imports(py);
            r
        });
        // What a `.pth` file printed is not the next cell's.
        self.discard_output();
        imported
    }

    /// CPU time of this process so far, in milliseconds.
    pub fn cpu_total_ms(&self) -> f64 {
        self.usage.cpu_total_ms()
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // Its thread stops first (it may be waiting for the GIL).
        self.checkpoints = None;
        Python::attach(|py| {
            self.var_keys.clear(py);
            self.module_keys.clear(py);
        });
    }
}
