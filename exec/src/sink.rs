//! Streaming a cell's output while it runs (worker mode).
//!
//! In-process, the executor reads a cell's output once, after the cell. A worker instead
//! hands output to an [`OutputSink`] (the pipe to the kernel) in chunks of at most
//! [`MAX_CHUNK_BYTES`]: the monitor thread pumps what the cell has written so far on every
//! tick, and the executor sends the rest when the cell ends. Nobody holds more than one chunk;
//! sent pages of the capture file are released.
//!
//! Only the part of the output that is kept whatever comes next is streamed early: the first
//! `max / 2` bytes. Past that, the output limit may drop a middle part whose end is not known
//! until the cell ends, so the rest (the marker and the last `max / 4` bytes) is sent then,
//! exactly as [`crate::capture::Stream::collect`] would have returned it.

use crate::capture::{drop_marker, kept_ranges, pread_into, punch_hole};
use flowrepl_protocol::frame::{OutputStream, MAX_CHUNK_BYTES};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a worker's output goes. Called from the executing thread and the monitor thread,
/// never at the same time for one cell (the [`Streamer`]'s lock orders them).
pub trait OutputSink: Send + Sync {
    /// Output of the running cell, in order per stream.
    fn chunk(&self, stream: OutputStream, bytes: &[u8]);
    /// Sends what [`OutputSink::chunk`] buffered.
    fn flush(&self);
    /// An event of the running cell: sent at once, with the output buffered before it.
    fn event(&self, event: &flowrepl_protocol::CellEvent);
    /// The running cell changed the task's context (the whole new context): sent at once.
    fn context(&self, json: &str);
}

use flowrepl_os::PAGE;
const STREAMS: [OutputStream; 2] = [OutputStream::Stdout, OutputStream::Stderr];

#[derive(Debug)]
struct State {
    /// A cell is streaming.
    active: bool,
    /// Per stream: where the cell's output starts, how far it was sent, how far released.
    start: [u64; 2],
    sent: [u64; 2],
    punched: [u64; 2],
    /// Last byte sent per stream (to end output with a newline before a traceback).
    last: [Option<u8>; 2],
    scratch: Vec<u8>,
}

/// What [`Streamer::finish`] did for one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finished {
    /// Bytes dropped by the output limit.
    pub dropped: u64,
}

/// Streams the capture files of one executor into a sink.
pub struct Streamer {
    sink: Arc<dyn OutputSink>,
    fds: [Arc<OwnedFd>; 2],
    max: u64,
    /// The kernel holds the capture files and reads each cell's output from them itself
    /// after its Done frame: nothing is streamed, and a cell's bytes are released only when
    /// the next cell begins (the kernel has read them by then).
    direct: bool,
    state: Mutex<State>,
}

impl std::fmt::Debug for Streamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamer").field("max", &self.max).finish()
    }
}

impl Streamer {
    /// A streamer over the stdout and stderr capture files.
    pub fn new(
        sink: Arc<dyn OutputSink>,
        fds: [Arc<OwnedFd>; 2],
        max: u64,
        direct: bool,
    ) -> Streamer {
        Streamer {
            sink,
            fds,
            max,
            direct,
            state: Mutex::new(State {
                active: false,
                start: [0; 2],
                sent: [0; 2],
                punched: [0; 2],
                last: [None; 2],
                scratch: vec![0; MAX_CHUNK_BYTES],
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        flowrepl_os::lock(&self.state)
    }

    /// A cell starts; its output begins at `starts` (the capture cursors).
    pub fn begin(&self, starts: [u64; 2]) {
        let mut st = self.lock();
        st.active = true;
        st.start = starts;
        st.sent = starts;
        st.last = [None; 2];
        for (i, s) in starts.into_iter().enumerate() {
            let to = s / PAGE * PAGE;
            if self.direct && to > st.punched[i] {
                // The kernel read the earlier cells' output before it sent this cell.
                let _ = punch_hole(self.fds[i].as_fd(), st.punched[i], to);
            }
            st.punched[i] = st.punched[i].max(to);
        }
    }

    /// Whether the kernel reads the output itself (nothing is streamed).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Monitor tick: sends the kept head of what the running cell wrote so far.
    pub fn pump(&self) {
        if self.direct {
            return;
        }
        let mut st = self.lock();
        if !st.active {
            return;
        }
        let mut any = false;
        for i in 0..2 {
            let Ok(size) = crate::capture::file_size(self.fds[i].as_fd()) else {
                continue;
            };
            let head_end = st.start[i] + self.max / 2;
            let to = size.min(head_end);
            any |= self.send_range(&mut st, i, to);
        }
        if any {
            self.sink.flush();
        }
    }

    /// The cell ended and stream sizes are final: sends the rest (head, marker, tail).
    /// The caller flushes after adding its own frames.
    pub fn finish(&self, sizes: [u64; 2]) -> [Finished; 2] {
        let mut st = self.lock();
        let mut out = [Finished::default(); 2];
        for i in 0..2 {
            let (start, size) = (st.start[i], sizes[i]);
            if size.saturating_sub(start) > self.max {
                let (head_end, tail_start) = kept_ranges(start, size, self.max);
                if self.direct {
                    out[i].dropped = tail_start - head_end;
                    continue;
                }
                self.send_range(&mut st, i, head_end);
                let dropped = tail_start - head_end;
                self.send_bytes(&mut st, i, drop_marker(dropped, self.max).as_bytes());
                st.sent[i] = tail_start;
                out[i].dropped = dropped;
            }
            if !self.direct {
                self.send_range(&mut st, i, size);
            }
        }
        st.active = false;
        out
    }

    /// Sends text that is not in the capture files (the traceback), after a newline if the
    /// stream's output did not end with one.
    pub fn send_text(&self, stream: OutputStream, text: &str) {
        if self.direct {
            // The kernel appends it from the Done report.
            return;
        }
        let i = stream as usize - 1;
        let mut st = self.lock();
        if st.last[i].is_some_and(|b| b != b'\n') {
            self.send_bytes(&mut st, i, b"\n");
        }
        self.send_bytes(&mut st, i, text.as_bytes());
    }

    /// Sends `[sent, to)` of stream `i` from its capture file; releases what was sent.
    fn send_range(&self, st: &mut State, i: usize, to: u64) -> bool {
        let fd = self.fds[i].as_fd();
        let mut any = false;
        while st.sent[i] < to {
            let want = ((to - st.sent[i]) as usize).min(MAX_CHUNK_BYTES);
            let n = match pread_into(fd, &mut st.scratch[..want], st.sent[i]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            self.sink.chunk(STREAMS[i], &st.scratch[..n]);
            st.last[i] = Some(st.scratch[n - 1]);
            st.sent[i] += n as u64;
            any = true;
        }
        let release_to = st.sent[i] / PAGE * PAGE;
        if release_to > st.punched[i] && punch_hole(fd, st.punched[i], release_to).is_ok() {
            st.punched[i] = release_to;
        }
        any
    }

    fn send_bytes(&self, st: &mut State, i: usize, bytes: &[u8]) {
        for chunk in bytes.chunks(MAX_CHUNK_BYTES) {
            self.sink.chunk(STREAMS[i], chunk);
        }
        if let Some(&b) = bytes.last() {
            st.last[i] = Some(b);
        }
    }
}
