//! The worker's life as [`State`] and its transitions: spawn (`Absent` → `Starting`), ready
//! (→ `Ready`), drop and stop (→ `Absent`), and noticing a death between cells.

use super::pipe::{Pipe, Wait};
use super::process::{Ended, WorkerProcess};
use super::{Worker, WorkerError, READY_TIMEOUT};
use crate::config::Limits;
use flowrepl_protocol::frame::{self, Frame, WorkerHello};
use flowrepl_protocol::AUTO_CHECKPOINT;
use std::io;
use std::time::Instant;

/// Where the worker is in its life.
#[derive(Debug)]
pub enum State {
    /// No worker (before the first start, after a death or kill).
    Absent,
    /// Spawned; its Ready frame has not come yet.
    Starting(WorkerProcess),
    /// Ready for cells.
    Ready {
        /// The process.
        proc: WorkerProcess,
        /// What it said when ready.
        hello: Box<WorkerHello>,
    },
}

impl State {
    pub(super) fn process(&self) -> Option<&WorkerProcess> {
        match self {
            State::Absent => None,
            State::Starting(p) | State::Ready { proc: p, .. } => Some(p),
        }
    }

    pub(super) fn process_mut(&mut self) -> Option<&mut WorkerProcess> {
        match self {
            State::Absent => None,
            State::Starting(p) | State::Ready { proc: p, .. } => Some(p),
        }
    }

    /// The current worker's frame pipe.
    pub(super) fn pipe(&mut self) -> Option<&mut Pipe> {
        self.process_mut().map(|p| &mut p.pipe)
    }
}

impl Worker {
    pub(super) fn limits(&self) -> Limits {
        self.spawn.limits
    }

    /// The checkpoint a fresh worker that replaces a dead one starts from, if there is one.
    pub(super) fn after_death(&self) -> Option<&'static str> {
        self.auto_journal
            .as_ref()
            .filter(|j| j.is_file())
            .map(|_| AUTO_CHECKPOINT)
    }

    /// `Absent` → `Starting`; with `restore`, the worker restores that checkpoint first.
    pub(super) fn spawn_worker(&mut self, restore: Option<&str>) -> Result<(), WorkerError> {
        let p =
            WorkerProcess::spawn(&self.spawn, &self.diagnostics, restore).map_err(|source| {
                WorkerError::Spawn {
                    exe: self.spawn.exe.display().to_string(),
                    source,
                }
            })?;
        tracing::info!(pid = p.pid(), "worker started");
        {
            let mut st = self.control.lock();
            st.pid = Some(p.pid());
            st.capture = match (
                p.capture.files[0].try_clone(),
                p.capture.files[1].try_clone(),
            ) {
                (Ok(o), Ok(e)) => Some([o, e]),
                _ => None,
            };
        }
        self.last_cpu_total_ms = 0.0;
        self.state = State::Starting(p);
        Ok(())
    }

    /// Starts a worker if there is none, and waits for its Ready frame (`Starting` →
    /// `Ready`).
    pub(super) fn ensure_ready(&mut self) -> Result<(), WorkerError> {
        if matches!(self.state, State::Absent) {
            self.spawn_worker(self.after_death())?;
        }
        if matches!(self.state, State::Ready { .. }) {
            return Ok(());
        }
        let until = Instant::now() + READY_TIMEOUT;
        loop {
            let buffered = self.state.pipe().map_or(Ok(None), Pipe::next_buffered);
            if let Some(payload) = buffered.map_err(io::Error::other)? {
                match frame::decode(&payload) {
                    Ok(Frame::Ready { hello }) => {
                        let mut hello = hello.into_owned();
                        tracing::debug!(pid = hello.pid, "worker ready");
                        let State::Starting(mut proc) =
                            std::mem::replace(&mut self.state, State::Absent)
                        else {
                            unreachable!("only a starting worker sends Ready");
                        };
                        proc.capture.next = proc.capture.real_ends(hello.capture_starts);
                        self.python = hello.python.clone();
                        if let Some(r) = hello.restored.take() {
                            self.restored = Some(Ok(r));
                        } else if let Some(e) = hello.restore_error.take() {
                            self.restored = Some(Err(e));
                        }
                        self.state = State::Ready {
                            proc,
                            hello: Box::new(hello),
                        };
                        return Ok(());
                    }
                    Ok(Frame::Context { json, .. }) => {
                        // Restoring gave the task the checkpoint's context (it had none).
                        self.spawn.setup.flow.context = Some(json.to_owned());
                    }
                    other => {
                        let why = format!("sent {other:?} instead of Ready");
                        self.drop_worker();
                        return Err(WorkerError::DiedAtStart(why));
                    }
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.drop_worker();
                return Err(WorkerError::NotReady(READY_TIMEOUT));
            }
            match self.state.pipe().map_or(Ok(Wait::Eof), |p| p.read(left))? {
                Wait::Frames | Wait::Timeout => {}
                Wait::Eof => {
                    let ended = self.drop_worker();
                    if ended.is_some_and(|e| {
                        e.exit.and_then(flowrepl_os::process::Exit::code)
                            == Some(i32::from(flowrepl_sandbox::REFUSED_EXIT))
                    }) {
                        return Err(WorkerError::SandboxRefused);
                    }
                    let how = ended.map(|e| e.describe()).unwrap_or_default();
                    return Err(WorkerError::DiedAtStart(how));
                }
            }
        }
    }

    /// Kills and reaps the current worker, if any (→ `Absent`).
    pub(super) fn drop_worker(&mut self) -> Option<Ended> {
        let state = std::mem::replace(&mut self.state, State::Absent);
        self.control.lock().pid = None;
        match state {
            State::Absent => None,
            State::Starting(mut p) | State::Ready { proc: mut p, .. } => p.kill_and_reap(),
        }
    }

    /// Ends a ready worker gracefully: a Shutdown frame, then up to the grace period for its
    /// exit handlers and flushes (its pipe closes when it exits), then SIGKILL to its group.
    pub(super) fn stop_worker(&mut self) {
        if let State::Ready { proc, .. } = &mut self.state {
            let pipe = &mut proc.pipe;
            if pipe.send_plain(&Frame::Shutdown {}).is_ok() {
                let until = Instant::now() + self.grace;
                loop {
                    let left = until.saturating_duration_since(Instant::now());
                    // Whatever it still sends (a late Done) is not wanted: read until EOF.
                    match pipe.read(left) {
                        Ok(Wait::Frames) => while let Ok(Some(_)) = pipe.next_buffered() {},
                        Ok(Wait::Timeout) if !left.is_zero() => {}
                        Ok(Wait::Eof) => break,
                        Ok(Wait::Timeout) | Err(_) => {
                            tracing::warn!(
                                grace_ms = self.grace.as_millis() as u64,
                                "the worker did not exit within the grace period after Shutdown; killing it"
                            );
                            break;
                        }
                    }
                }
            }
        }
        if let Some(ended) = self.drop_worker() {
            tracing::debug!(how = %ended.describe(), "worker ended");
        }
    }

    /// If the worker died while idle, notices it now (one `poll`), so that the cell runs on
    /// a fresh worker instead of failing. Returns a warning to attach to the cell.
    pub(super) fn check_idle_worker(&mut self) -> Option<String> {
        let p = self.state.process()?;
        let fd = p.pipe.fd();
        // The usual case, one poll: nothing came since the last request was answered.
        if p.pipe.is_empty() && !flowrepl_os::poll_pending(fd) {
            return None;
        }
        let forged = self.drain_between_requests();
        if !forged && !flowrepl_os::poll_hangup(fd) {
            return None;
        }
        let ended = self.drop_worker()?;
        let how = if forged {
            "sent frames for no request in flight (a cell wrote to its frame pipe) and was stopped"
                .to_owned()
        } else {
            ended.describe()
        };
        Some(format!(
            "the worker {how} while idle, after the previous cell; its state was lost and this cell ran on a fresh worker{}",
            if self.after_death().is_some() {
                " started from the last checkpoint (see `restored`)"
            } else {
                ""
            }
        ))
    }

    /// Between requests, reads what the worker sent unasked: late replies to requests that
    /// timed out are dropped; a frame for a request not sent yet (written by a cell, to
    /// answer a later call) or a frame that does not decode stops the worker (true). Only a
    /// ready worker (a starting one's Ready frame is still to come).
    fn drain_between_requests(&mut self) -> bool {
        if !matches!(self.state, State::Ready { .. }) {
            return false;
        }
        let Some(p) = self.state.process_mut() else {
            return false;
        };
        loop {
            let frame = match p.pipe.next_buffered() {
                Ok(Some(payload)) => frame::decode(&payload).map(|f| !p.forged(&f, 0)),
                Ok(None) => {
                    if !flowrepl_os::poll_readable(p.pipe.fd(), std::time::Duration::ZERO)
                        .unwrap_or(false)
                        || matches!(p.pipe.fill(), Wait::Eof)
                    {
                        return false;
                    }
                    continue;
                }
                Err(e) => Err(e),
            };
            match frame {
                Ok(true) => tracing::debug!("a late frame from the worker dropped"),
                Ok(false) => return true,
                Err(e) => {
                    tracing::error!(error = %e, "bad frame from the worker between requests; the worker is stopped");
                    return true;
                }
            }
        }
    }
}
