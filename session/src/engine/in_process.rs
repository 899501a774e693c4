//! In-process engine: the executor embedded in the kernel, on Python's main thread.
//!
//! Fds 1 and 2 of the kernel are the cells' capture files; the protocol uses private copies
//! of the original stdio. A cell that ignores SIGINT cannot be stopped without stopping the
//! kernel: [`Control::unstoppable_since`] tells the fronts, which answer `CellNotStopped`.

use super::{CellRun, Control, Engine, EngineError};
use crate::approvals::{Approvals, InProcessApprover};
use crate::config::Config;
use flowrepl_exec::monitor::Interrupter;
use flowrepl_exec::python::PythonExecutor;
use flowrepl_exec::setup::ExecutorConfig;
use flowrepl_exec::tail::OutputTail;
use flowrepl_protocol::{
    CheckpointSummary, Mode, PythonInfo, RestartReply, RestoreReport, VariableInfo, AUTO_CHECKPOINT,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Embedded CPython.
pub struct InProcess {
    executor: Box<dyn PythonExecutor>,
    control: Arc<InProcessControl>,
    /// `--resume`: what came back, for the first cell.
    restored: Option<Result<RestoreReport, String>>,
}

impl InProcess {
    /// Starts Python on the calling thread, which must run every cell from then on; the
    /// executor's own diagnostics go to `diagnostics`.
    pub fn start(
        config: &Config,
        diagnostics: std::fs::File,
        approvals: Arc<Approvals>,
    ) -> Result<InProcess, super::StartError> {
        let python = super::python(&config.executor)?;
        (python.logging)(diagnostics);
        let executor = (python.start)(&ExecutorConfig {
            pid: std::process::id(),
            python: config.python.clone(),
            max_output_bytes: config.max_output_bytes,
            sink: None,
            images: config.image_limits(),
            setup: config.setup.clone(),
            approver: Some(Arc::new(InProcessApprover(approvals))),
            capture: None,
            checkpoints: config.checkpoints.clone(),
        })?;
        let control = Arc::new(InProcessControl(
            executor.interrupter(),
            executor.checkpoint_health(),
        ));
        let mut engine = InProcess {
            executor,
            control,
            restored: None,
        };
        if super::resumes(config) {
            engine.restored = Some(
                engine
                    .executor
                    .restore(AUTO_CHECKPOINT, true)
                    .map_err(|e| e.to_string()),
            );
        }
        Ok(engine)
    }
}

impl Engine for InProcess {
    fn mode(&self) -> Mode {
        Mode::InProcess
    }

    fn python(&self) -> PythonInfo {
        self.executor.info().clone()
    }

    fn control(&self) -> Arc<dyn Control> {
        self.control.clone()
    }

    fn run(&mut self, code: &str, timeout: Duration, execution_count: u64) -> CellRun {
        CellRun::ended(self.executor.execute(code, timeout, execution_count))
    }

    fn list_variables(&mut self) -> Result<Vec<VariableInfo>, EngineError> {
        Ok(self.executor.list_variables()?)
    }

    fn layer_changed(&mut self, modules: &[String]) -> Result<Vec<String>, EngineError> {
        Ok(self.executor.layer_changed(modules)?)
    }

    fn restart(&mut self, restore: bool) -> Result<RestartReply, EngineError> {
        // The session's last state is what `restore` gets.
        self.executor.write_pending_checkpoint();
        let mut reply = RestartReply {
            restarted: true,
            pid: std::process::id(),
            state_lost: true,
            message: "the namespace was cleared; modules already imported stay loaded in-process (use worker mode for a fresh interpreter)".into(),
            restored: None,
        };
        if restore {
            let r = self.executor.restore(AUTO_CHECKPOINT, false)?;
            reply.state_lost = !r.complete();
            reply.message = super::restored_message(&r);
            reply.restored = Some(r);
        } else {
            self.executor.reset_namespace()?;
        }
        Ok(reply)
    }

    fn checkpoint(&mut self, name: &str) -> Result<CheckpointSummary, EngineError> {
        Ok(self.executor.checkpoint(name)?)
    }

    fn restore(&mut self, name: &str) -> Result<RestoreReport, EngineError> {
        Ok(self.executor.restore(name, false)?)
    }

    fn take_restored(&mut self) -> Option<Result<RestoreReport, String>> {
        self.restored.take()
    }

    fn finish(&mut self) {
        self.executor.write_pending_checkpoint();
        self.executor.finish();
    }
}

/// The monitor's interrupter, and the checkpoint's health.
#[derive(Debug)]
struct InProcessControl(
    Interrupter,
    Option<Arc<std::sync::Mutex<flowrepl_protocol::CheckpointHealth>>>,
);

impl Control for InProcessControl {
    fn interrupt(&self) -> bool {
        self.0.interrupt()
    }

    fn unstoppable_since(&self) -> Option<Instant> {
        self.0.sigint_since()
    }

    fn output_tail(&self, recent: usize) -> Option<OutputTail> {
        self.0.output_tail(recent)
    }

    fn worker_pid(&self) -> Option<u32> {
        None
    }

    fn checkpoint_health(&self) -> Option<flowrepl_protocol::CheckpointHealth> {
        self.1.as_ref().map(|h| flowrepl_os::lock(h).clone())
    }
}
