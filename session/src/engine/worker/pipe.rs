//! Frames from the worker's pipe: waiting, reading, applying a cell's frames, and the
//! request/reply exchanges between cells.

use super::{Worker, WorkerError};
use crate::engine::EngineError;
use flowrepl_os::lock;
use flowrepl_protocol::frame::{self, DoneReport, Frame, FrameError, OutputStream};
use std::borrow::Cow;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
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

/// What reading the worker's pipe gave.
pub(super) enum Wait {
    Frames,
    Eof,
    Timeout,
}

impl Worker {
    /// The next frame the worker sent that is already buffered.
    pub(super) fn next_buffered(&mut self) -> Result<Option<bytes::BytesMut>, FrameError> {
        match self.state.process_mut() {
            Some(p) => p.from_worker.buffered(),
            None => Ok(None),
        }
    }

    /// Whether `f` cannot have come from the executor: a frame for a request not sent yet
    /// (its id is past the last one sent), or more output than the worker may send for a
    /// cell (`output` bytes so far). A cell can write to the worker's frame pipe; such a frame
    /// is forged, so the worker is stopped (its group killed: the caller then sees the pipe's
    /// end and starts a fresh worker, as after any worker fault) and the frame is not used.
    /// What a frame for the request in flight says is the cell's own business (a cell can
    /// print anything, and its code can change the executor in its worker), but it never
    /// answers another call, never crashes the kernel and never makes it allocate past the
    /// output limit.
    pub(super) fn forged(&mut self, f: &Frame<'_>, output: usize) -> bool {
        let why = match f {
            f if f.call_id().is_some_and(|id| id > self.next_id) => {
                format!(
                    "a {:#04x} frame for request {}, which was not sent (the last was {})",
                    f.kind(),
                    f.call_id().unwrap_or_default(),
                    self.next_id
                )
            }
            Frame::Output { bytes, .. }
                if (output + bytes.len()) as u64
                    > self.spawn.max_output_bytes.saturating_mul(2) =>
            {
                format!(
                    "Output frames past twice the output limit ({} bytes)",
                    self.spawn.max_output_bytes
                )
            }
            _ => return false,
        };
        tracing::error!(
            "the worker sent {why}: a cell wrote to its frame pipe; the worker is stopped"
        );
        if let Some(p) = self.state.process() {
            p.kill_group();
        }
        true
    }

    /// Waits up to `wait` for the worker's pipe, then reads what is there (one `read`).
    pub(super) fn read_frames(&mut self, wait: Duration) -> io::Result<Wait> {
        let Some(p) = self.state.process_mut() else {
            return Ok(Wait::Eof);
        };
        if !flowrepl_os::poll_readable(p.from_worker.get_ref().as_raw_fd(), wait)? {
            return Ok(Wait::Timeout);
        }
        Ok(self.fill_frames())
    }

    /// Reads what is on the worker's pipe (one `read`; it does not block).
    pub(super) fn fill_frames(&mut self) -> Wait {
        let Some(p) = self.state.process_mut() else {
            return Wait::Eof;
        };
        match p.from_worker.fill() {
            Ok(0) => Wait::Eof,
            Ok(_) => Wait::Frames,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Wait::Timeout,
            Err(_) => Wait::Eof,
        }
    }

    /// Applies the buffered frames to `c`; false if the worker broke the protocol.
    pub(super) fn take_frames(&mut self, c: &mut Collecting) -> bool {
        loop {
            let payload = match self.next_buffered() {
                Ok(Some(p)) => p,
                Ok(None) => return true,
                Err(e) => {
                    tracing::error!(error = %e, "bad frame from the worker");
                    return false;
                }
            };
            let frame = frame::decode(&payload);
            if let Ok(f) = &frame {
                if self.forged(f, c.stdout.len() + c.stderr.len()) {
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
                    let to_worker = self.state.process().map(|p| Arc::clone(&p.to_worker));
                    self.approvals.open(
                        &request,
                        Box::new(move |answer| {
                            let mut buf = Vec::new();
                            if let Err(e) = (Frame::ApprovalAnswer {
                                answer: Cow::Owned(answer),
                            })
                            .encode(&mut buf)
                            {
                                tracing::warn!(error = %e, "an approval answer too large for a frame was dropped");
                                return;
                            }
                            if let Some(w) = to_worker {
                                if let Err(e) = lock(&w).write_all(&buf) {
                                    tracing::warn!(error = %e, "the approval answer could not reach the worker");
                                }
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

    /// Sends a request frame (`encode` with a fresh id) between cells and waits up to
    /// `timeout` for the frame `pick` accepts; frames it does not are ignored. A worker that
    /// dies meanwhile is replaced (from the last checkpoint, if there is one).
    pub(super) fn ask<'r, T>(
        &mut self,
        request: impl FnOnce(u64) -> Frame<'r>,
        timeout: Duration,
        during: &'static str,
        mut pick: impl FnMut(Frame<'_>, u64) -> Option<T>,
    ) -> Result<T, EngineError> {
        if let Some(w) = self.check_idle_worker() {
            tracing::warn!("{w}");
        }
        self.ensure_ready()?;
        self.next_id += 1;
        let id = self.next_id;
        self.send_buf.clear();
        request(id)
            .encode(&mut self.send_buf)
            .map_err(|e| WorkerError::Io(io::Error::other(e)))?;
        let proc = self
            .state
            .process_mut()
            .expect("ensure_ready left a worker");
        lock(&proc.to_worker)
            .write_all(&self.send_buf)
            .map_err(WorkerError::Io)?;
        let until = Instant::now() + timeout;
        loop {
            while let Some(payload) = self
                .next_buffered()
                .map_err(io::Error::other)
                .map_err(WorkerError::Io)?
            {
                match frame::decode(&payload) {
                    Ok(f) if self.forged(&f, 0) => {
                        // Stopped: the loop below sees its end and starts a fresh worker.
                        continue;
                    }
                    Ok(f) => {
                        let shown = format!("{f:?}");
                        match pick(f, id) {
                            Some(v) => return Ok(v),
                            None => {
                                tracing::warn!(frame = %shown, "unexpected frame from the worker ignored")
                            }
                        }
                    }
                    Err(e) => return Err(WorkerError::Io(io::Error::other(e)).into()),
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EngineError::Timeout(timeout));
            }
            match self.read_frames(left).map_err(WorkerError::Io)? {
                Wait::Frames | Wait::Timeout => {}
                Wait::Eof => {
                    let ended = self.drop_worker();
                    let how = ended.map(|e| e.describe()).unwrap_or_default();
                    if let Err(e) = self.spawn_worker(self.after_death()) {
                        tracing::error!(error = %flowrepl_os::chain(&e), "a new worker could not be started");
                    }
                    return Err(EngineError::WorkerDied { how, during });
                }
            }
        }
    }
}
