//! The pipe to the kernel: frames out (output, events, context, approvals) from the thread
//! that runs cells and from the monitor, and approval answers in.

use super::FLUSH_AT;
use flowrepl_exec::setup::Approver;
use flowrepl_exec::sink::OutputSink;
use flowrepl_os::lock;
use flowrepl_protocol::frame::{self, Frame, FrameReader, OutputStream};
use flowrepl_protocol::{ApprovalAnswer, ApprovalOutcome, ApprovalRequest};
use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The pipe to the kernel, shared by the executing thread and the monitor.
pub(super) struct Channel {
    pub(super) out: Mutex<(File, Vec<u8>)>,
    pub(super) cell: AtomicU64,
}

impl Channel {
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let mut g = flowrepl_os::lock(&self.out);
        let r = f(&mut g.1);
        if g.1.len() >= FLUSH_AT {
            write_or_exit(&mut g);
        }
        r
    }

    /// Encodes `frame` into the buffer (sent when full or at [`Channel::send`]).
    pub(super) fn put(&self, frame: &Frame<'_>) -> Result<(), frame::FrameError> {
        self.with(|buf| frame.encode(buf))
    }

    pub(super) fn send(&self) {
        let mut g = flowrepl_os::lock(&self.out);
        write_or_exit(&mut g);
    }
}

/// The kernel is gone (it would have killed us): nothing left to do.
pub(super) fn write_or_exit(g: &mut (File, Vec<u8>)) {
    if g.1.is_empty() {
        return;
    }
    if let Err(e) = g.0.write_all(&g.1) {
        tracing::error!(error = %e, "the kernel's pipe is closed; exiting");
        // SAFETY: _exit ends the process at once, from any thread.
        unsafe { libc::_exit(0) };
    }
    g.1.clear();
    if g.1.capacity() > 4 * FLUSH_AT {
        g.1 = Vec::with_capacity(FLUSH_AT);
    }
}

impl OutputSink for Channel {
    fn chunk(&self, stream: OutputStream, bytes: &[u8]) {
        let id = self.cell.load(Ordering::Relaxed);
        let _ = self.put(&Frame::Output { id, stream, bytes });
    }

    fn flush(&self) {
        self.send();
    }

    fn event(&self, event: &flowrepl_protocol::CellEvent) {
        let id = self.cell.load(Ordering::Relaxed);
        let encoded = self.put(&Frame::Event {
            id,
            event: Cow::Borrowed(event),
        });
        if let Err(e) = encoded {
            tracing::warn!(error = %e, "an event too large for a frame was dropped");
        }
        self.send();
    }

    fn context(&self, json: &str) {
        let id = self.cell.load(Ordering::Relaxed);
        if let Err(e) = self.put(&Frame::Context { id, json }) {
            tracing::warn!(error = %e, "a context too large for a frame was not saved");
        }
        self.send();
    }
}

/// Worker mode's [`Approver`]: requests go to the kernel as frames; the answer is read from
/// the kernel's pipe by the waiting cell's thread (the thread that runs cells, which is not
/// reading frames while its cell runs).
pub(super) struct PipeApprover {
    pub(super) channel: Arc<Channel>,
    pub(super) input: Arc<Mutex<FrameReader<File>>>,
    /// An answer decided here (the request could not be sent).
    pub(super) local: Mutex<Option<ApprovalAnswer>>,
}

impl Approver for PipeApprover {
    fn request(&self, request: &ApprovalRequest) {
        let id = self.channel.cell.load(Ordering::Relaxed);
        if let Err(e) = self.channel.put(&Frame::ApprovalRequest {
            id,
            request: Cow::Borrowed(request),
        }) {
            *lock(&self.local) = Some(ApprovalAnswer::without_person(
                &request.approval_id,
                ApprovalOutcome::Cancelled,
                format!("the request could not be sent: {e}"),
            ));
        }
        self.channel.send();
    }

    fn wait(&self, approval_id: &str, wait: Duration) -> Option<ApprovalAnswer> {
        if let Some(a) = lock(&self.local).take() {
            return Some(a);
        }
        let until = Instant::now() + wait;
        let mut input = lock(&self.input);
        let gone = |why: String| {
            Some(ApprovalAnswer::without_person(
                approval_id,
                ApprovalOutcome::Cancelled,
                why,
            ))
        };
        loop {
            match input.buffered() {
                Ok(Some(payload)) => match frame::decode(&payload) {
                    Ok(Frame::ApprovalAnswer { answer }) if answer.approval_id == approval_id => {
                        return Some(answer.into_owned())
                    }
                    Ok(Frame::ApprovalAnswer { answer }) => {
                        tracing::debug!(approval_id = %answer.approval_id, "a late approval answer was dropped");
                    }
                    Ok(other) => {
                        tracing::error!(
                            ?other,
                            "unexpected frame from the kernel while waiting for an approval"
                        );
                        return gone("the kernel broke the protocol".into());
                    }
                    Err(e) => return gone(format!("bad frame from the kernel: {e}")),
                },
                Ok(None) => {}
                Err(e) => return gone(format!("bad frame from the kernel: {e}")),
            }
            let left = until.saturating_duration_since(Instant::now());
            match flowrepl_os::poll_readable(input.get_ref().as_raw_fd(), left) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return None,
                Err(e) => return gone(format!("the kernel's pipe failed: {e}")),
            }
            match input.fill() {
                Ok(0) => return gone("the kernel closed the channel".into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return None,
                Err(e) => return gone(format!("the kernel's pipe failed: {e}")),
            }
        }
    }

    fn ended(&self, approval_id: &str) {
        let id = self.channel.cell.load(Ordering::Relaxed);
        let _ = self.channel.put(&Frame::ApprovalEnded { id, approval_id });
        self.channel.send();
    }
}
