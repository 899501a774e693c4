//! Waiting for a cell: progress notifications, cancellation, `running: true` (the cell
//! parked for `wait_cell`), approvals through `inputRequests`, and cells that became MCP
//! tasks.

use super::results::{error_text, internal};
use super::KernelServer;
use crate::approval::Asking;
use crate::parked::{Take, Waiting};
use crate::render::{self, RunningCell};
use crate::tasks;
use crate::{Shared, Ticket};
use flowrepl_exec::tail::OutputTail;
use flowrepl_session::session::{not_stopped, unstoppable_for};
use rmcp::model::{
    CallToolResponse, InputRequiredResult, ProgressNotificationParam, ProgressToken,
    RequestMetaObject,
};
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture};
use rmcp::{ErrorData, Peer, RoleServer};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often a running cell reports progress when the call asked for it.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How often a queued call looks whether the cell ahead of it ignores SIGINT.
pub(super) const STUCK_CHECK: Duration = Duration::from_millis(250);

/// What a cell still running shows: its state and the end of its output so far.
pub(super) fn running_cell(
    shared: &Shared,
    id: u64,
    started: Instant,
    ticket: &Ticket,
) -> RunningCell {
    let queued = ticket.is_queued();
    let tail = if queued {
        None
    } else {
        shared.control.output_tail(shared.max_chars / 2)
    };
    let tail = tail.unwrap_or_default();
    let [stdout, stderr] = tail.recent;
    RunningCell {
        running: true,
        cell: id,
        elapsed_s: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        queued,
        stdout,
        stderr,
        stdout_bytes: tail.bytes[0],
        stderr_bytes: tail.bytes[1],
    }
}

/// How a call that waits for a cell ends when its client cancels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnCancel {
    /// `execute_code`: the cell is interrupted (dropped if still queued).
    Interrupt,
    /// `wait_cell`: only the waiting stops.
    StopWaiting,
}

/// How a call follows its cell.
pub(super) struct Follow {
    /// Answer `running: true` after this long.
    pub(super) wait: Duration,
    /// Send progress notifications to this token.
    pub(super) token: Option<ProgressToken>,
    pub(super) on_cancel: OnCancel,
    /// The client can answer approvals through `inputRequests` (2026-07-28).
    pub(super) asks: bool,
}

impl KernelServer {
    /// Whether this call's client answers approvals through `inputRequests` (a 2026-07-28
    /// client that declared elicitation in the request's `_meta`); said to the inbox.
    pub(super) fn answers_approvals(
        &self,
        peer: &Peer<RoleServer>,
        meta: &RequestMetaObject,
    ) -> bool {
        let asking = Asking::of(meta, peer);
        self.shared.inbox.asking.set(asking);
        asking == Asking::InAnswers
    }

    /// Takes parked cell `id` for a call to follow.
    pub(super) fn take_parked(&self, id: u64) -> Result<Waiting, ErrorData> {
        match self.shared.parked().take(id) {
            Take::Got(w) => Ok(w),
            Take::Busy => Err(ErrorData::invalid_params(
                format!("another call is already waiting for cell {id}"),
                None,
            )),
            Take::Unknown => Err(ErrorData::invalid_params(
                format!("no cell {id} to wait for: ids come from a running: true result, and a result is given once"),
                None,
            )),
        }
    }

    /// Waits for cell `id` up to `follow.wait`: its result; or, still running, `running: true`
    /// (the cell parked for `wait_cell`); or, when the client can answer approvals through
    /// `inputRequests` and the cell waits for one, an `InputRequiredResult` (parked too).
    /// Meanwhile: progress notifications, cancellation, calls stuck behind a cell that
    /// ignores SIGINT.
    pub(super) async fn follow(
        &self,
        id: u64,
        mut waiting: Waiting,
        follow: Follow,
        peer: &Peer<RoleServer>,
        ct: &CancellationToken,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = Instant::now();
        let mut heartbeat = tokio::time::interval_at((started + HEARTBEAT).into(), HEARTBEAT);
        let mut stuck_check = tokio::time::interval(STUCK_CHECK);
        // One timer for the whole wait, not one per pass of the loop.
        let answer_by = tokio::time::sleep_until(tokio::time::Instant::from(started + follow.wait));
        tokio::pin!(answer_by);
        let mut inbox = self.shared.inbox.subscribe();
        let mut previous = OutputTail::default();
        let mut last_line: Option<String> = None;
        let mut cancelled = false;
        loop {
            if follow.asks && !cancelled {
                if let Some(requests) = self.shared.inbox.requests() {
                    self.shared.parked().park(id, waiting);
                    let state = format!("cell:{id}");
                    return Ok(InputRequiredResult::new(Some(requests), Some(state)).into());
                }
            }
            tokio::select! {
                r = &mut waiting.rx => {
                    self.shared.parked().collected(id);
                    return r.map(Into::into).map_err(|_| internal("the cell was dropped before it ran"));
                }
                _ = &mut answer_by, if !cancelled => {
                    let now = running_cell(&self.shared, id, waiting.started, &waiting.ticket);
                    self.shared.parked().park(id, waiting);
                    return Ok(render::running_result(now).into());
                }
                _ = inbox.changed(), if follow.asks => {}
                _ = ct.cancelled(), if !cancelled => {
                    if follow.on_cancel == OnCancel::StopWaiting {
                        self.shared.parked().park(id, waiting);
                        return Err(internal("cancelled: stopped waiting (the cell goes on)"));
                    }
                    cancelled = true;
                    tracing::info!("execute_code cancelled by the client: interrupting the cell");
                    crate::cancel(&self.shared, &waiting.ticket);
                }
                _ = stuck_check.tick(), if !cancelled && waiting.ticket.is_queued() => {
                    // In-process, a cell that ignores SIGINT cannot be stopped: do not leave
                    // the calls behind it waiting without a word (the JSON-RPC front's
                    // CellNotStopped). Worker mode kills such cells instead.
                    let grace = self.shared.kill_grace;
                    let stuck = unstoppable_for(&*self.shared.control, grace).is_some();
                    if stuck && waiting.ticket.withdraw() {
                        self.shared.parked().collected(id);
                        let report = not_stopped(self.shared.mode, grace, false);
                        let text = report.error.map(|e| e.traceback).unwrap_or_default();
                        return Ok(error_text(text.trim_end().to_owned()).into());
                    }
                }
                _ = heartbeat.tick(), if follow.token.is_some() && !cancelled => {
                    let elapsed = waiting.started.elapsed().as_secs_f64();
                    let mut message = if waiting.ticket.is_queued() {
                        format!("waiting {elapsed:.0} s for the previous call to finish")
                    } else if let Some(q) = self.shared.approvals.waiting_for() {
                        format!("running for {elapsed:.0} s, waiting for approval: {q}")
                    } else {
                        format!("running for {elapsed:.0} s")
                    };
                    if let Some(tail) = self.shared.control.output_tail(0) {
                        if let Some(l) = tail.latest_line(&previous) {
                            last_line = Some(l.to_owned());
                        }
                        previous = tail;
                    }
                    match &last_line {
                        Some(l) => { let _ = write!(message, "; last output: {l}"); }
                        None => message.push_str("; no output yet"),
                    }
                    let token = follow.token.clone().expect("checked");
                    notify_progress(peer, token, elapsed, message).await;
                }
            }
        }
    }
}

/// One progress notification: `elapsed` seconds (to a tenth) and `message`; a client that is
/// gone is not an error.
pub(super) async fn notify_progress(
    peer: &Peer<RoleServer>,
    token: ProgressToken,
    elapsed: f64,
    message: String,
) {
    let p = ProgressNotificationParam::new(token, (elapsed * 10.0).round() / 10.0)
        .with_message(message);
    if let Err(e) = peer.notify_progress(p).await {
        tracing::debug!(error = %e, "progress notification not sent");
    }
}

/// A task's operation on this kernel: wait for the parked cell `id`; a `tasks/cancel` stops it.
pub(super) fn finish_cell(shared: Arc<Shared>) -> impl FnOnce(u64, TaskContext) -> TaskFuture {
    move |id, ctx| {
        Box::pin(async move {
            let Take::Got(mut waiting) = shared.parked().take(id) else {
                return Err(TaskExit::Error(internal(format!("cell {id} is gone"))));
            };
            let mut status = tokio::time::interval(tasks::STATUS_EVERY);
            let mut inbox = shared.inbox.subscribe();
            let mut inputs = tasks::InputForwarder::default();
            let result = loop {
                let to = Arc::clone(&shared);
                inputs.forward(&ctx, shared.inbox.requests(), move |key, answer| {
                    to.inbox.deliver([(key, answer)].into(), &to.approvals);
                });
                tokio::select! {
                    _ = inbox.changed() => {}
                    r = &mut waiting.rx => break r.map_err(|_| TaskExit::Cancelled),
                    _ = ctx.cancelled() => {
                        tracing::info!(cell = id, "task cancelled: stopping its cell");
                        crate::cancel(&shared, &waiting.ticket);
                        let _ = (&mut waiting.rx).await;
                        break Err(TaskExit::Cancelled);
                    }
                    _ = status.tick() => {
                        let now = running_cell(&shared, id, waiting.started, &waiting.ticket);
                        ctx.set_status_message(render::running_text(&now, render::Next::Task));
                    }
                }
            };
            shared.parked().collected(id);
            result
        })
    }
}
