//! One cell in the worker: sent, waited for under the stop ladder, its frames and output
//! gathered; a worker that died during it becomes the cell's [`Fault`].

use super::ladder::{KillReason, Ladder, Step};
use super::pipe::{Pipe, Wait};
use super::process::Ended;
use super::Worker;
use crate::engine::CellRun;
use flowrepl_exec::capture::{append_traceback, decode_output};
use flowrepl_exec::setup::CellOutcome;
use flowrepl_exec::tail::OutputTail;
use flowrepl_os::process::Exit;
use flowrepl_protocol::frame::{self, DoneReport, Frame, OutputStream};
use flowrepl_protocol::{CellReport, ExecutionKind, Fault, Mode, ResourceUsage, StoppedBy};
use nix::sys::signal::Signal;
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// What one cell's frames added up to.
pub(super) struct Collecting {
    pub(super) id: u64,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) events: Vec<flowrepl_protocol::CellEvent>,
    pub(super) contexts: Vec<String>,
    /// Approvals the cell waits for (its deadline is held meanwhile).
    pub(super) waiting: Vec<String>,
    pub(super) done: Option<Box<DoneReport>>,
}

impl Collecting {
    pub(super) fn new(id: u64) -> Collecting {
        Collecting {
            id,
            stdout: Vec::new(),
            stderr: Vec::new(),
            events: Vec::new(),
            contexts: Vec::new(),
            waiting: Vec::new(),
            done: None,
        }
    }
}

impl Worker {
    /// Runs one cell: a ready worker, the Execute frame, the frames until Done under the stop
    /// ladder, the output; a worker that died during it becomes the cell's [`Fault`].
    pub(super) fn run_cell(
        &mut self,
        code: &str,
        timeout: Duration,
        execution_count: u64,
    ) -> CellRun {
        let mut warnings = Vec::new();
        let state_lost = match self.ready_for_cell(&mut warnings) {
            Ok(lost) => lost,
            Err(run) => return *run,
        };
        let started = Instant::now();
        let mut ladder = Ladder::new(started, timeout, self.grace);
        let (id, sent) = self.send_cell(timeout, execution_count, code);
        let mut c = Collecting::new(id);
        self.wait_for_done(&mut c, &mut ladder, sent);
        let interrupted = self.cell_ended(&mut c);
        let elapsed = started.elapsed();
        let (stdout, stderr) = self.gather_output(&mut c, &mut warnings);
        let events = std::mem::take(&mut c.events);
        let contexts = std::mem::take(&mut c.contexts);
        let mut run = match c.done {
            Some(done) => {
                self.last_cpu_total_ms = done.cpu_total_ms;
                // The worker's word (a cell can forge it): every reader cuts it to the capture
                // files' real size (`read_output`, the output tail), so no fstat per cell here.
                if let Some(p) = self.state.process_mut() {
                    p.capture.next = done.capture_ends;
                }
                let mut run = self.finished_run(*done, stdout, stderr, interrupted);
                warnings.append(&mut run.outcome.report.warnings);
                run.outcome.report.warnings = warnings;
                run.state_lost = state_lost;
                run
            }
            None => self.died_run(&ladder, timeout, elapsed, stdout, stderr, warnings),
        };
        // What the cell reported is kept, even when its worker died.
        run.outcome.events = events;
        run.outcome.contexts = contexts;
        run
    }

    /// A worker ready for the next cell: one that died while idle is noticed and replaced
    /// (said in `warnings`; `Ok(true)`: state was lost), one that cannot start makes the
    /// cell's fault.
    fn ready_for_cell(&mut self, warnings: &mut Vec<String>) -> Result<bool, Box<CellRun>> {
        let mut state_lost = false;
        if let Some(w) = self.check_idle_worker() {
            warnings.push(w);
            state_lost = true;
        }
        let ready = self.ensure_ready();
        if state_lost {
            if let Some(Ok(r)) = &self.restored {
                // Only what the checkpoint could not bring back is lost.
                state_lost = !r.complete();
            }
        }
        match ready {
            Ok(()) => Ok(state_lost),
            Err(e) => Err(Box::new(fault_run(
                Fault::WorkerUnavailable,
                format!("the cell did not run: {}", flowrepl_os::chain(&e)),
                String::new(),
                String::new(),
                std::mem::take(warnings),
            ))),
        }
    }

    /// Marks the cell running for [`WorkerControl`](super::WorkerControl) and writes its
    /// Execute frame: the cell's id, and false if the worker's pipe is gone.
    fn send_cell(&mut self, timeout: Duration, execution_count: u64, code: &str) -> (u64, bool) {
        let proc = self
            .state
            .process_mut()
            .expect("ensure_ready left a worker");
        {
            let mut st = self.control.lock();
            st.running = true;
            st.interrupted_at = None;
            st.tail = OutputTail::default();
            st.cell_starts = proc.capture.next;
        }
        // Worker mode caps request lines at frame::MAX_CELL_BYTES (config.rs): the frame fits.
        let (id, sent) = proc.pipe.send(|id| Frame::Execute {
            id,
            timeout_ms: timeout.as_millis() as u64,
            execution_count,
            code,
        });
        (id, sent.is_ok())
    }

    /// Reads the cell's frames until its Done frame or the worker's end, stepping the stop
    /// ladder (SIGINT again, then the kill) while it waits.
    fn wait_for_done(&mut self, c: &mut Collecting, ladder: &mut Ladder, mut alive: bool) {
        // A short cell answers within tens of µs: look before sleeping (and then read at
        // once, without polling again).
        let mut readable = alive
            && self.state.process().is_some_and(|p| {
                static WORKER_FRAME: flowrepl_os::Spin = flowrepl_os::Spin::new();
                WORKER_FRAME.until_readable(p.pipe.fd())
            });
        while alive && c.done.is_none() {
            let got = if std::mem::take(&mut readable) {
                Ok(self.state.pipe().map_or(Wait::Eof, Pipe::fill))
            } else {
                let interrupted_at = self.control.lock().interrupted_at;
                let wait = match ladder.step(Instant::now(), interrupted_at) {
                    Step::Wait(d) => d,
                    Step::Resend => {
                        self.control.signal_running();
                        continue;
                    }
                    Step::Kill(reason) => {
                        tracing::warn!(
                            ?reason,
                            grace_ms = self.grace.as_millis() as u64,
                            "cell did not stop after SIGINT; killing the worker's process group"
                        );
                        if let Some(p) = self.state.process() {
                            p.kill_group();
                        }
                        continue;
                    }
                };
                self.state.pipe().map_or(Ok(Wait::Eof), |p| p.read(wait))
            };
            match got {
                Ok(Wait::Frames) => {
                    alive = self.take_frames(c);
                    if c.done.is_none() {
                        self.control.publish_tail([&c.stdout, &c.stderr]);
                    }
                    ladder.hold(Instant::now(), !c.waiting.is_empty());
                }
                Ok(Wait::Timeout) => {}
                Ok(Wait::Eof) | Err(_) => alive = false,
            }
        }
    }

    /// Applies the buffered frames to `c`; false if the worker broke the protocol.
    fn take_frames(&mut self, c: &mut Collecting) -> bool {
        let Some(proc) = self.state.process_mut() else {
            return false;
        };
        loop {
            let payload = match proc.pipe.next_buffered() {
                Ok(Some(p)) => p,
                Ok(None) => return true,
                Err(e) => {
                    tracing::error!(error = %e, "bad frame from the worker");
                    return false;
                }
            };
            let frame = frame::decode(&payload);
            if let Ok(f) = &frame {
                if proc.forged(f, c.stdout.len() + c.stderr.len()) {
                    return false;
                }
            }
            match frame {
                Ok(Frame::Output { id, stream, bytes }) if id == c.id => match stream {
                    OutputStream::Stdout => c.stdout.extend_from_slice(bytes),
                    OutputStream::Stderr => c.stderr.extend_from_slice(bytes),
                },
                Ok(Frame::Event { id, event }) if id == c.id => c.events.push(event.into_owned()),
                Ok(Frame::Context { id, json }) if id == c.id => {
                    // A worker started later (after a crash or restart) starts from it.
                    self.spawn.setup.flow.context = Some(json.to_owned());
                    c.contexts.push(json.to_owned());
                }
                Ok(Frame::ApprovalRequest { id, request }) if id == c.id => {
                    c.waiting.push(request.approval_id.clone());
                    let to_worker = proc.pipe.writer();
                    self.approvals.open(
                        &request,
                        Box::new(move |answer| {
                            let answer = Frame::ApprovalAnswer {
                                answer: Cow::Owned(answer),
                            };
                            if let Err(e) = to_worker.send(&answer) {
                                tracing::warn!(error = %e, "the approval answer could not reach the worker");
                            }
                        }),
                    );
                }
                Ok(Frame::ApprovalEnded { id, approval_id }) if id == c.id => {
                    c.waiting.retain(|w| w != approval_id);
                    self.approvals.close(approval_id);
                }
                Ok(Frame::Done { id, report }) if id == c.id => {
                    c.done = Some(Box::new(report.into_owned()));
                    return true;
                }
                Ok(other) => tracing::warn!(?other, "unexpected frame from the worker ignored"),
                Err(e) => {
                    tracing::error!(error = %e, "bad frame from the worker");
                    return false;
                }
            }
        }
    }

    /// The cell is over (ended or its worker gone): approvals it waited for are closed, and
    /// it is no longer running. Whether it was interrupted.
    fn cell_ended(&mut self, c: &mut Collecting) -> bool {
        for id in c.waiting.drain(..) {
            // The worker died (or broke the protocol) while the cell waited.
            self.approvals.close(&id);
        }
        let mut st = self.control.lock();
        st.running = false;
        st.interrupted_at.take().is_some()
    }

    /// The cell's stdout and stderr, decoded: what came as Output frames, and what is in the
    /// capture files the kernel holds (all of it when the worker sends none,
    /// `output_in_capture`, or the rest when it died before sending all); the traceback from
    /// the report when the worker did not send it.
    fn gather_output(
        &mut self,
        c: &mut Collecting,
        warnings: &mut Vec<String>,
    ) -> (String, String) {
        let read_here = match &c.done {
            Some(d) if d.output_in_capture => Some(Some(d.capture_ends)),
            Some(_) => None,
            None => Some(None),
        };
        if let Some(ends) = read_here {
            let read = self.state.process().map_or_else(Default::default, |p| {
                p.capture
                    .read_output([c.stdout.len(), c.stderr.len()], ends)
            });
            for (have, more) in [&mut c.stdout, &mut c.stderr].into_iter().zip(read) {
                if have.is_empty() {
                    *have = more;
                } else {
                    have.extend_from_slice(&more);
                }
            }
        }
        let stdout = decode_output(std::mem::take(&mut c.stdout), "stdout", warnings);
        let mut stderr = decode_output(std::mem::take(&mut c.stderr), "stderr", warnings);
        if let Some(e) = c
            .done
            .as_ref()
            .filter(|d| d.output_in_capture)
            .and_then(|d| d.report.error.as_ref())
        {
            append_traceback(&mut stderr, &e.traceback);
        }
        (stdout, stderr)
    }

    /// A cell whose worker ended before its Done frame: the fault, what it used, a fresh
    /// worker starting (from the last checkpoint when there is one).
    fn died_run(
        &mut self,
        ladder: &Ladder,
        timeout: Duration,
        elapsed: Duration,
        stdout: String,
        stderr: String,
        mut warnings: Vec<String>,
    ) -> CellRun {
        let dead_pid = self.state.process().map_or(0, |p| p.pid() as u32);
        let ended = self.drop_worker();
        let killed = ladder.killed();
        let (fault, message) = self.death(dead_pid, ended.as_ref(), killed, timeout, elapsed);
        let restore = self.after_death();
        warnings.push(match restore {
            Some(_) => format!(
                "{message}; the worker's state was lost; a fresh worker is starting from the last checkpoint for the next cell (see `restored` there)"
            ),
            None => format!(
                "{message}; every variable and import was lost; a fresh worker is starting for the next cell"
            ),
        });
        let usage = ended.map(|e| ResourceUsage {
            pid: dead_pid,
            cpu_ms: ((e.cpu_total_ms - self.last_cpu_total_ms).max(0.0) * 1000.0).round() / 1000.0,
            peak_rss_kb: e.peak_rss_kb,
        });
        if let Err(e) = self.spawn_worker(restore) {
            warnings.push(format!(
                "a new worker could not be started: {}",
                flowrepl_os::chain(&e)
            ));
        }
        let mut run = fault_run(fault, message, stdout, stderr, warnings);
        let report: &mut CellReport = &mut run.outcome.report;
        report.timed_out = killed == Some(KillReason::Timeout);
        report.interrupted = killed == Some(KillReason::Interrupt);
        report.usage = usage.unwrap_or_default();
        report.debug_info.execution = ExecutionKind::RuntimeError;
        run.stopped_by = killed.map(|_| StoppedBy::Kill);
        run.state_lost = true;
        run
    }

    /// A cell that ended with a Done frame: its report, plus the kernel's knowledge of
    /// interrupts and limits.
    pub(super) fn finished_run(
        &self,
        done: DoneReport,
        stdout: String,
        stderr: String,
        interrupted: bool,
    ) -> CellRun {
        let mut r = done.report;
        let limits = self.limits();
        if let Some(e) = &mut r.error {
            if e.kind == "KeyboardInterrupt" && interrupted && !r.timed_out {
                r.mark_interrupted();
            } else if e.kind == "MemoryError" {
                if let Some(mb) = limits.memory_mb {
                    e.message = format!(
                        "the cell ran out of memory under the worker's limit of {mb} MB of address space (FLOWREPL_MEMORY_MB); peak RSS during the cell {:.1} MB; Python raised MemoryError{}; the session is intact",
                        r.usage.peak_rss_kb as f64 / 1024.0,
                        if e.message.is_empty() { String::new() } else { format!(": {}", e.message) }
                    );
                    e.kind = Fault::MemoryLimitExceeded.as_str().to_owned();
                }
            } else if e.kind == "BlockingIOError"
                && e.message.contains("Resource temporarily unavailable")
            {
                if let Some(n) = limits.max_procs {
                    e.message = format!(
                        "the cell could not start a process: the worker's limit is {n} processes (FLOWREPL_MAX_PROCS); Python raised BlockingIOError: {}",
                        e.message
                    );
                    e.kind = Fault::ProcessLimitExceeded.as_str().to_owned();
                }
            }
        }
        if let Some(h) = done.checkpoint {
            self.control.lock().checkpoint = Some(h);
        }
        CellRun::ended(CellOutcome {
            stdout,
            stderr,
            images: done.images,
            report: r,
            events: Vec::new(),
            contexts: Vec::new(),
            cpu_total_ms: done.cpu_total_ms,
            checkpoint: None,
        })
    }

    /// The fault of a cell whose worker ended before its Done frame, and its message.
    pub(super) fn death(
        &self,
        pid: u32,
        ended: Option<&Ended>,
        killed: Option<KillReason>,
        timeout: Duration,
        elapsed: Duration,
    ) -> (Fault, String) {
        let grace = self.grace.as_millis();
        match killed {
            Some(KillReason::Timeout) => (
                Fault::WorkerKilled,
                format!(
                    "cell timed out after {} ms and did not stop within {grace} ms of SIGINT, so the worker's process group was killed (SIGKILL)",
                    timeout.as_millis()
                ),
            ),
            Some(KillReason::Interrupt) => (
                Fault::WorkerKilled,
                format!(
                    "cell was interrupted on request and did not stop within {grace} ms of SIGINT, so the worker's process group was killed (SIGKILL)"
                ),
            ),
            None => {
                let limits = self.limits();
                if let (Some(e), Some(secs)) = (ended, limits.cpu_seconds) {
                    if e.exit.and_then(Exit::signal) == Some(Signal::SIGXCPU) {
                        let used = (e.cpu_total_ms - self.last_cpu_total_ms).max(0.0) / 1000.0;
                        return (
                            Fault::CpuLimitExceeded,
                            format!(
                                "the cell used {used:.1} s of CPU, over the worker's limit of {secs} s per cell (FLOWREPL_CPU_SECONDS), and the worker was ended by SIGXCPU"
                            ),
                        );
                    }
                }
                let how = ended.map(Ended::describe).unwrap_or_else(|| "ended".into());
                let mut msg = format!(
                    "the worker process (pid {pid}) {how} during the cell (after {:.0} ms)",
                    elapsed.as_secs_f64() * 1000.0
                );
                if let (Some(mb), Some(e)) = (limits.memory_mb, ended) {
                    let signal = e.exit.and_then(Exit::signal);
                    if matches!(
                        signal,
                        Some(Signal::SIGKILL | Signal::SIGSEGV | Signal::SIGABRT | Signal::SIGBUS)
                    ) {
                        msg.push_str(&format!(
                            " (a memory limit of {mb} MB was set: it may have run out of memory)"
                        ));
                    }
                }
                (Fault::WorkerDied, msg)
            }
        }
    }
}

/// A cell that did not run or whose worker died: the fault as its error (also appended to
/// `stderr`), with the output received until then.
pub(super) fn fault_run(
    fault: Fault,
    message: String,
    stdout: String,
    mut stderr: String,
    warnings: Vec<String>,
) -> CellRun {
    let mut report = fault.report(Mode::Worker, message);
    report.warnings = warnings;
    if let Some(e) = &report.error {
        append_traceback(&mut stderr, &e.traceback);
    }
    CellRun {
        outcome: CellOutcome {
            stdout,
            stderr,
            images: Vec::new(),
            report,
            events: Vec::new(),
            contexts: Vec::new(),
            cpu_total_ms: 0.0,
            checkpoint: None,
        },
        stopped_by: None,
        state_lost: fault.loses_state(),
    }
}
