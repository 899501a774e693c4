//! The worker's frame pipe, the kernel's end: frames written to the worker (each request
//! with a fresh id), frames read from it, and what a frame that cannot have come from the
//! executor looks like.

use flowrepl_os::lock;
use flowrepl_protocol::frame::{Frame, FrameError, FrameReader};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What reading the worker's pipe gave.
pub(super) enum Wait {
    Frames,
    Eof,
    Timeout,
}

/// Encodes `frame` into `buf` and writes it whole to `to` (one `write_all` under the lock,
/// so frames from several threads never interleave).
fn write_frame(to: &Mutex<File>, frame: &Frame<'_>, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    frame.encode(buf).map_err(io::Error::other)?;
    lock(to).write_all(buf)
}

/// The pipe's writing end, shared with a thread that answers the worker later.
pub(super) struct FrameWriter(Arc<Mutex<File>>);

impl FrameWriter {
    /// Writes one frame (a frame too large to encode is an error and nothing is written).
    pub(super) fn send(&self, frame: &Frame<'_>) -> io::Result<()> {
        write_frame(&self.0, frame, &mut Vec::new())
    }
}

/// One worker's frame pipe.
#[derive(Debug)]
pub(super) struct Pipe {
    /// Frames to the worker (shared with the threads that deliver approval answers).
    to_worker: Arc<Mutex<File>>,
    /// Frames from the worker.
    from_worker: FrameReader<File>,
    /// The frame being written, kept between requests.
    send_buf: Vec<u8>,
    /// The id of the last request sent (ids start at 1 on each pipe).
    last_id: u64,
}

impl Pipe {
    /// The pipe over the worker's stdin and stdout.
    pub(super) fn new(to_worker: File, from_worker: File) -> Pipe {
        Pipe {
            to_worker: Arc::new(Mutex::new(to_worker)),
            from_worker: FrameReader::new(from_worker),
            send_buf: Vec::with_capacity(4096),
            last_id: 0,
        }
    }

    /// Writes the request `frame` makes of a fresh id: the id (taken even when the write
    /// fails: the request counts as sent), and whether the write went through. A frame too
    /// large to encode is an error and nothing is written.
    pub(super) fn send<'f>(
        &mut self,
        frame: impl FnOnce(u64) -> Frame<'f>,
    ) -> (u64, io::Result<()>) {
        self.last_id += 1;
        let sent = write_frame(&self.to_worker, &frame(self.last_id), &mut self.send_buf);
        if self.send_buf.capacity() > (1 << 20) {
            // A big cell's buffer is not kept for the small ones after it.
            self.send_buf = Vec::with_capacity(4096);
        }
        (self.last_id, sent)
    }

    /// Writes a frame that is no request (Shutdown).
    pub(super) fn send_plain(&mut self, frame: &Frame<'_>) -> io::Result<()> {
        write_frame(&self.to_worker, frame, &mut self.send_buf)
    }

    /// The writing end, for a thread that answers the worker later (an approval).
    pub(super) fn writer(&self) -> FrameWriter {
        FrameWriter(Arc::clone(&self.to_worker))
    }

    /// The reading end's descriptor, to wait on.
    pub(super) fn fd(&self) -> RawFd {
        self.from_worker.get_ref().as_raw_fd()
    }

    /// Nothing read and not yet taken.
    pub(super) fn is_empty(&self) -> bool {
        self.from_worker.is_empty()
    }

    /// The next frame the worker sent that is already buffered.
    pub(super) fn next_buffered(&mut self) -> Result<Option<bytes::BytesMut>, FrameError> {
        self.from_worker.buffered()
    }

    /// Waits up to `wait` for the pipe, then reads what is there (one `read`).
    pub(super) fn read(&mut self, wait: Duration) -> io::Result<Wait> {
        if !flowrepl_os::poll_readable(self.fd(), wait)? {
            return Ok(Wait::Timeout);
        }
        Ok(self.fill())
    }

    /// Reads what is on the pipe (one `read`; it does not block).
    pub(super) fn fill(&mut self) -> Wait {
        match self.from_worker.fill() {
            Ok(0) => Wait::Eof,
            Ok(_) => Wait::Frames,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Wait::Timeout,
            Err(_) => Wait::Eof,
        }
    }

    /// Why `f` cannot have come from the executor, if it cannot: a frame for a request not
    /// sent yet (its id is past the last one sent), or more output than the worker may send
    /// for a cell (`output` bytes so far, twice `max_output`). A cell can write to the
    /// worker's frame pipe: such a frame is forged (see `WorkerProcess::forged`). What a frame
    /// for the request in flight says is the cell's own business (a cell can print anything,
    /// and its code can change the executor in its worker), but it never answers another
    /// call, never crashes the kernel and never makes it allocate past the output limit.
    pub(super) fn forged(&self, f: &Frame<'_>, output: usize, max_output: u64) -> Option<String> {
        match f {
            f if f.call_id().is_some_and(|id| id > self.last_id) => Some(format!(
                "a {:#04x} frame for request {}, which was not sent (the last was {})",
                f.kind(),
                f.call_id().unwrap_or_default(),
                self.last_id
            )),
            Frame::Output { bytes, .. }
                if (output + bytes.len()) as u64 > max_output.saturating_mul(2) =>
            {
                Some(format!(
                    "Output frames past twice the output limit ({max_output} bytes)"
                ))
            }
            _ => None,
        }
    }
}
