//! The seam between the kernel and the Python executor: what the kernel's in-process engine
//! and the worker binary need from a build of the executor against one CPython, as a table
//! ([`PythonBuild`]) and a trait ([`PythonExecutor`]) in types without Python.
//!
//! The kernel is built once, without Python; each CPython version's executor is a shared
//! library (`libflowrepl_pylib.so`, the `pylib` crate) that exports its [`PythonBuild`] with
//! [`export_python!`](crate::export_python), and the kernel loads the one the session's interpreter needs
//! ([`library::load`]). A `pip install` links the one version it serves into the kernel
//! instead (the kernel's `static-python` feature); both reach the executor through this seam
//! only. docs/design.md, "Every Python version", has the layout and the figures.

pub mod library;

use crate::monitor::Interrupter;
use crate::setup::{CallError, CellOutcome, CheckpointError, ExecutorConfig, ExecutorError};
use crate::worker_args::WorkerArgs;
use flowrepl_protocol::{
    CheckpointHealth, CheckpointSummary, PythonInfo, RestoreReport, VariableInfo,
};
use std::fs::File;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The embedded executor, as the in-process engine drives it. It lives on the thread that
/// started it (Python's main thread), which runs every call.
pub trait PythonExecutor {
    /// The interpreter cells run in.
    fn info(&self) -> &PythonInfo;
    /// Reaches the running cell from other threads (interrupt, output so far).
    fn interrupter(&self) -> Interrupter;
    /// How the automatic checkpoint is doing, for other threads (`None`: checkpoints off).
    fn checkpoint_health(&self) -> Option<Arc<Mutex<CheckpointHealth>>>;
    /// Runs one cell with a wall-clock `timeout`.
    fn execute(&mut self, code: &str, timeout: Duration, execution_count: u64) -> CellOutcome;
    /// The namespace's names with type, short repr and size.
    fn list_variables(&mut self) -> Result<Vec<VariableInfo>, CallError>;
    /// Empties the namespace as a fresh interpreter has it (modules stay loaded).
    fn reset_namespace(&mut self) -> Result<(), CallError>;
    /// The task's package layer changed: its new `.pth` files run and the import caches are
    /// dropped; which of `modules` are imported.
    fn layer_changed(&mut self, modules: &[String]) -> Result<Vec<String>, CallError>;
    /// Writes checkpoint `name` now, with every name.
    fn checkpoint(&mut self, name: &str) -> Result<CheckpointSummary, CheckpointError>;
    /// Replaces the namespace with checkpoint `name`'s (`fresh`: nothing ran yet).
    fn restore(&mut self, name: &str, fresh: bool) -> Result<RestoreReport, CheckpointError>;
    /// Writes the pending automatic checkpoint now, if one is.
    fn write_pending_checkpoint(&mut self);
    /// The session ends: exit handlers, finalizers, flushes.
    fn finish(&mut self);
}

/// A build of the executor against one CPython version.
#[derive(Debug, Clone, Copy)]
pub struct PythonBuild {
    /// The interpreter it was built against.
    pub python: &'static str,
    /// Its `major.minor.micro`.
    pub python_version: &'static str,
    /// Starts Python on the calling thread (which must run every later call).
    pub start: fn(&ExecutorConfig) -> Result<Box<dyn PythonExecutor>, ExecutorError>,
    /// Sends the executor's tracing events and panic messages to `diagnostics` (a library
    /// has its own copy of `tracing` and of the panic hook, which the kernel's set-up does
    /// not reach). Called by the kernel before [`PythonBuild::start`].
    pub logging: fn(File),
    /// The `flowrepl-worker` process: runs until the kernel closes the channel.
    pub run_worker: fn(WorkerArgs) -> ExitCode,
}
