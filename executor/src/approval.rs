//! `flow.request_approval`: the cell asks a person and waits for the answer.
//!
//! The executor does the waiting, the same way in both modes: it reports an `approval` event,
//! hands the request to an [`Approver`] (in-process: the kernel's broker; worker mode: an
//! ApprovalRequest frame to the kernel), holds the cell's deadline, and polls for the answer
//! every [`POLL`] with the GIL released, checking for signals in between, so that `interrupt`
//! (and the MCP cancellation that sends it) ends the wait with `KeyboardInterrupt`. Then it
//! tells the approver that it no longer waits, reports a second `approval` event with the
//! outcome, and the cell goes on.
//!
//! Only the cell's own thread may ask (a thread started by the cell gets `RuntimeError`):
//! in worker mode the answer is read from the kernel's pipe, which that thread alone reads
//! while a cell runs.

use crate::events::Emitter;
use flowrepl_exec::monitor::CellClock;
use flowrepl_exec::setup::Approver;
use flowrepl_protocol::{ApprovalRequest, EventData};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// How often a waiting cell looks for its answer and for signals.
pub const POLL: Duration = Duration::from_millis(50);

/// What `flow.request_approval` needs.
pub struct Approvals {
    approver: Option<Arc<dyn Approver>>,
    emitter: Arc<Emitter>,
    clock: CellClock,
    cell_thread: ThreadId,
    next: AtomicU64,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("channel", &self.approver.is_some())
            .finish()
    }
}

/// The `approval` event reported when the wait ends.
#[derive(Serialize)]
struct Ended<'a> {
    approval_id: &'a str,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    comment: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    waited_ms: f64,
}

/// The `approval` event reported when the cell asks.
#[derive(Serialize)]
struct Requested<'a> {
    approval_id: &'a str,
    status: &'static str,
    message: &'a str,
    data: &'a EventData,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_s: Option<f64>,
}

impl Approvals {
    /// Approvals of cells run on the calling thread; without an approver nobody can be asked
    /// and every request returns `None`.
    pub fn new(
        approver: Option<Arc<dyn Approver>>,
        emitter: Arc<Emitter>,
        clock: CellClock,
    ) -> Approvals {
        Approvals {
            approver,
            emitter,
            clock,
            cell_thread: std::thread::current().id(),
            next: AtomicU64::new(0),
        }
    }

    /// Asks and waits. Returns the outcome's name (`approved`, `declined`, `cancelled`,
    /// `unavailable`, or `timed_out`) and the comment or the reason; `KeyboardInterrupt` if the cell was
    /// interrupted while it waited. `data` is a JSON object's text.
    pub fn ask(
        &self,
        py: Python<'_>,
        message: String,
        data: String,
        timeout_s: Option<f64>,
        step: Option<String>,
    ) -> PyResult<(&'static str, Option<String>)> {
        if std::thread::current().id() != self.cell_thread {
            return Err(PyRuntimeError::new_err(
                "flow.request_approval can only be called from the cell's own thread, not from a thread it started",
            ));
        }
        let count = self.emitter.execution_count();
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let approval_id = format!("{count}-{n}");
        let data = EventData::from_json(data)
            .map_err(|e| PyRuntimeError::new_err(format!("approval data: {e}")))?;
        let request = ApprovalRequest {
            approval_id,
            message,
            data,
            timeout_s,
        };
        self.report(
            &Requested {
                approval_id: &request.approval_id,
                status: "requested",
                message: &request.message,
                data: &request.data,
                timeout_s,
            },
            step.clone(),
        )?;
        let id = request.approval_id.as_str();
        let started = Instant::now();
        let Some(approver) = self.approver.as_ref().filter(|_| self.emitter.in_cell()) else {
            let why = "no one can be asked: this kernel has no channel for approvals";
            self.finish(id, "unavailable", None, Some(why), started, step)?;
            return Ok(("unavailable", Some(why.to_owned())));
        };
        let limit = timeout_s.map(Duration::from_secs_f64);
        let held = self.clock.hold();
        approver.request(&request);
        let answer = loop {
            let left = limit.map(|l| l.saturating_sub(started.elapsed()));
            if left.is_some_and(|l| l.is_zero()) {
                break None;
            }
            let wait = left.map_or(POLL, |l| l.min(POLL));
            if let Some(a) = py.detach(|| approver.wait(id, wait)) {
                break Some(a);
            }
            if let Err(e) = py.check_signals() {
                approver.ended(id);
                drop(held);
                self.finish(id, "interrupted", None, None, started, step)?;
                return Err(e);
            }
        };
        approver.ended(id);
        drop(held);
        let (status, comment, reason) = match &answer {
            None => (
                "timed_out",
                None,
                Some(format!("no answer within {} s", timeout_s.unwrap_or(0.0))),
            ),
            Some(a) => (a.outcome.as_str(), a.comment.clone(), a.reason.clone()),
        };
        self.finish(
            id,
            status,
            comment.as_deref(),
            reason.as_deref(),
            started,
            step,
        )?;
        Ok(match answer {
            None => ("timed_out", reason),
            Some(a) => (a.outcome.as_str(), comment.or(reason)),
        })
    }

    fn finish(
        &self,
        approval_id: &str,
        status: &str,
        comment: Option<&str>,
        reason: Option<&str>,
        started: Instant,
        step: Option<String>,
    ) -> PyResult<()> {
        let waited_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1000.0;
        self.report(
            &Ended {
                approval_id,
                status,
                comment,
                reason,
                waited_ms,
            },
            step,
        )
    }

    fn report(&self, data: &impl Serialize, step: Option<String>) -> PyResult<()> {
        let json = serde_json::to_string(data).expect("approval events serialize");
        self.emitter
            .emit("approval".into(), json, step)
            .map_err(PyRuntimeError::new_err)
    }
}
