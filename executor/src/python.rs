//! This build of the executor, as the kernel reaches it ([`flowrepl_exec::python`]).

use crate::executor::Executor;
use flowrepl_exec::monitor::Interrupter;
use flowrepl_exec::python::{PythonBuild, PythonExecutor};
use flowrepl_exec::setup::{
    CallError, CellOutcome, CheckpointError, ExecutorConfig, ExecutorError,
};
use flowrepl_protocol::{
    CheckpointHealth, CheckpointSummary, PythonInfo, RestoreReport, VariableInfo,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The executor built against [`BUILD_PYTHON`](crate::interpreter::BUILD_PYTHON).
pub static PYTHON: PythonBuild = PythonBuild {
    python: crate::interpreter::BUILD_PYTHON,
    python_version: crate::interpreter::BUILD_PYTHON_VERSION,
    start,
    logging: flowrepl_os::logging::init,
    run_worker: crate::worker::run,
};

fn start(config: &ExecutorConfig) -> Result<Box<dyn PythonExecutor>, ExecutorError> {
    Ok(Box::new(Executor::start(config)?))
}

impl PythonExecutor for Executor {
    fn info(&self) -> &PythonInfo {
        Executor::info(self)
    }

    fn interrupter(&self) -> Interrupter {
        Executor::interrupter(self)
    }

    fn checkpoint_health(&self) -> Option<Arc<Mutex<CheckpointHealth>>> {
        Executor::checkpoint_health(self)
    }

    fn execute(&mut self, code: &str, timeout: Duration, execution_count: u64) -> CellOutcome {
        Executor::execute(self, code, timeout, execution_count)
    }

    fn list_variables(&mut self) -> Result<Vec<VariableInfo>, CallError> {
        Executor::list_variables(self)
    }

    fn reset_namespace(&mut self) -> Result<(), CallError> {
        Executor::reset_namespace(self)
    }

    fn layer_changed(&mut self, modules: &[String]) -> Result<Vec<String>, CallError> {
        Executor::layer_changed(self, modules)
    }

    fn checkpoint(&mut self, name: &str) -> Result<CheckpointSummary, CheckpointError> {
        Executor::checkpoint(self, name)
    }

    fn restore(&mut self, name: &str, fresh: bool) -> Result<RestoreReport, CheckpointError> {
        Executor::restore(self, name, fresh)
    }

    fn write_pending_checkpoint(&mut self) {
        Executor::write_pending_checkpoint(self)
    }

    fn finish(&mut self) {
        Executor::finish(self)
    }
}
