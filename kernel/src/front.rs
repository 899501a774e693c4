//! The protocol front shared by the request thread and the busy-time watcher.
//!
//! While idle, the request thread (Python's main thread) reads requests itself and answers
//! them in order: no thread hop on the request path. While a cell runs it cannot read, so a
//! **watcher** thread takes over stdin: it answers `status` and `interrupt` at once (the only
//! requests answered out of order) and queues every other request, parsed, for the request
//! thread to answer in order after the cell.
//!
//! The two never read at the same time: the watcher reads only while `busy` is set and it
//! holds the reader lock, and it re-checks `busy` after taking the lock; the request thread
//! clears `busy` before taking the lock and looks at the queue first. The reader keeps
//! partial lines between the two ([`crate::line_reader`]).
//!
//! In-process, a cell that does not stop within the grace period after SIGINT (it ignores
//! SIGINT, or blocks in a C call that never checks for signals) cannot be killed without
//! killing the kernel. The watcher then answers its request itself with `CellNotStopped`,
//! so the client is not left hanging; the kernel keeps answering `status` (busy) and
//! `interrupt`, queues everything else, and logs the cell's real result if it ever ends.
//!
//! Like the monitor, the watcher is not woken per cell: it ticks every 50 ms and, after a
//! second without cells, sleeps until the request thread wakes it at the next cell.

use crate::line_reader::{Line, LineReader};
use crate::records::Flusher;
use crate::server::ReplyWriter;
use crate::session::CellControl;
use flowrepl_protocol::jsonrpc::Response;
use flowrepl_protocol::{
    Call, DebugInfo, ErrorCode, ExecError, ExecuteResult, ExecutionKind, Id, Request, RpcError,
    StatusInfo,
};
use serde::Serialize;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

const TICK: Duration = Duration::from_millis(50);
const IDLE_TICKS_BEFORE_DEEP_SLEEP: u32 = 20;

/// One unit of input, parsed and owned.
#[derive(Debug)]
pub enum Item {
    /// A request; `call` is the error to answer when it is malformed.
    Request {
        /// `None` for a notification.
        id: Option<Id>,
        /// What to do.
        call: Result<Call, RpcError>,
    },
    /// A line that is not a request at all (answered with `id: null`).
    Bad(RpcError),
    /// A blank line: ignored.
    Blank,
    /// End of input.
    Eof,
}

impl Item {
    fn from_line(line: Line<'_>, max_request_bytes: usize) -> Item {
        match line {
            Line::Eof => Item::Eof,
            Line::TooLong { len } => {
                tracing::warn!(len, "request line over the limit discarded");
                Item::Bad(RpcError::new(
                    ErrorCode::RequestTooLarge,
                    format!(
                        "request too large: {len} bytes (limit {max_request_bytes}; see FLOWREPL_MAX_REQUEST_BYTES)"
                    ),
                ))
            }
            Line::Complete(l) if l.iter().all(u8::is_ascii_whitespace) => Item::Blank,
            Line::Complete(l) => match Request::parse(l) {
                Ok(req) => Item::Request {
                    call: Call::from_request(&req),
                    id: req.id,
                },
                Err(e) => {
                    tracing::debug!(error = %e, "bad request line");
                    Item::Bad(e)
                }
            },
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by the request thread and the watcher.
pub struct Front {
    reader: Mutex<LineReader<File>>,
    input_fd: RawFd,
    writer: Mutex<ReplyWriter>,
    queue: Mutex<VecDeque<Item>>,
    busy: AtomicBool,
    deep_sleep: AtomicBool,
    status: StatusInfo,
    started_cells: AtomicU64,
    control: CellControl,
    flusher: Flusher,
    max_request_bytes: usize,
    kill_grace: Duration,
    /// The running cell's request id, until it is answered.
    cell_id: Mutex<Option<Id>>,
    /// The running cell was answered with `CellNotStopped`.
    answered_early: AtomicBool,
}

impl Front {
    /// A front over the protocol's input and output.
    pub fn new(
        input: File,
        output: File,
        max_request_bytes: usize,
        status: StatusInfo,
        control: CellControl,
        flusher: Flusher,
        kill_grace: Duration,
    ) -> Front {
        Front {
            input_fd: input.as_raw_fd(),
            reader: Mutex::new(LineReader::new(input, max_request_bytes)),
            writer: Mutex::new(ReplyWriter::new(output)),
            queue: Mutex::new(VecDeque::new()),
            busy: AtomicBool::new(false),
            deep_sleep: AtomicBool::new(false),
            status,
            started_cells: AtomicU64::new(0),
            control,
            flusher,
            max_request_bytes,
            kill_grace,
            cell_id: Mutex::new(None),
            answered_early: AtomicBool::new(false),
        }
    }

    /// The reply writer (held briefly per reply).
    pub fn writer(&self) -> MutexGuard<'_, ReplyWriter> {
        lock(&self.writer)
    }

    /// The next item for the request thread: queued ones first, else read (blocking).
    pub fn next_item(&self) -> io::Result<Item> {
        if let Some(item) = lock(&self.queue).pop_front() {
            return Ok(item);
        }
        let mut reader = lock(&self.reader);
        // The watcher may have queued something while we waited for the reader.
        if let Some(item) = lock(&self.queue).pop_front() {
            return Ok(item);
        }
        let line = reader.next_line()?;
        Ok(Item::from_line(line, self.max_request_bytes))
    }

    /// A cell starts: the watcher takes over stdin.
    pub fn begin_cell(&self, watcher: &thread::Thread, id: Option<&Id>) {
        self.started_cells.fetch_add(1, Ordering::Relaxed);
        *lock(&self.cell_id) = id.cloned();
        self.busy.store(true, Ordering::SeqCst);
        if self.deep_sleep.load(Ordering::SeqCst) {
            watcher.unpark();
        }
    }

    /// The cell ended: stdin is the request thread's again. True if the watcher already
    /// answered it (`CellNotStopped`): then only its record remains to be written.
    pub fn end_cell(&self) -> bool {
        self.busy.store(false, Ordering::SeqCst);
        // Under the id lock, so the watcher cannot be half-way through its answer.
        let mut id = lock(&self.cell_id);
        *id = None;
        self.answered_early.swap(false, Ordering::SeqCst)
    }

    /// In-process: answers a cell that ignored SIGINT for the grace period.
    fn check_stuck(&self) {
        let Some(since) = self.control.sigint_since() else {
            return;
        };
        let waited = since.elapsed();
        if waited < self.kill_grace || self.answered_early.load(Ordering::SeqCst) {
            return;
        }
        let mut id = lock(&self.cell_id);
        if !self.busy.load(Ordering::SeqCst) {
            return;
        }
        self.answered_early.store(true, Ordering::SeqCst);
        let Some(id) = id.take() else { return };
        tracing::error!(
            waited_ms = waited.as_millis() as u64,
            "the cell does not respond to SIGINT; answering CellNotStopped"
        );
        let message = format!(
            "the cell did not stop within {} ms of SIGINT: it ignores SIGINT or is blocked in a call that never checks for signals. In-process mode cannot kill it without killing the kernel, so it may still be running: `status` says busy, other requests wait until it ends, and its real result goes to the task log. Run with USE_SUBPROCESS_WORKER=1 to make such cells killable.",
            self.kill_grace.as_millis()
        );
        let result = ExecuteResult {
            success: false,
            stdout: String::new(),
            stderr: format!("CellNotStopped: {message}\n"),
            result: None,
            error: Some(ExecError {
                kind: "CellNotStopped".into(),
                traceback: format!("CellNotStopped: {message}\n"),
                message,
            }),
            execution_count: self.started_cells.load(Ordering::Relaxed),
            elapsed_ms: 0.0,
            mode: self.status.mode,
            timed_out: false,
            interrupted: false,
            stopped_by: None,
            added_vars: Vec::new(),
            removed_vars: Vec::new(),
            added_imports: Vec::new(),
            variable_count: 0,
            timestamp: String::new(),
            warnings: Vec::new(),
            usage: Default::default(),
            state_lost: false,
            images: Vec::new(),
            debug_info: DebugInfo {
                execution: ExecutionKind::RuntimeError,
                execution_mode: self.status.mode,
                elapsed_ms: 0.0,
                phases_us: Default::default(),
            },
        };
        if let Err(e) = self.writer().send_execute(&id, &result) {
            tracing::warn!(error = %e, "writing CellNotStopped failed");
        }
    }

    /// The `status` answer; waits for pending log records first.
    pub fn status(&self) -> StatusInfo {
        self.flusher.flush();
        let mut s = self.status.clone();
        s.execution_count = self.started_cells.load(Ordering::Relaxed);
        s.busy = self.busy.load(Ordering::SeqCst);
        s.worker_pid = self.control.worker_pid();
        s
    }

    /// Answers `interrupt`: SIGINT to the running cell, if any.
    pub fn interrupt(&self) -> InterruptReply {
        let interrupted = self.control.interrupt();
        tracing::info!(interrupted, "interrupt requested");
        InterruptReply { interrupted }
    }

    /// Starts the watcher thread.
    pub fn spawn_watcher(self: &Arc<Self>) -> io::Result<thread::JoinHandle<()>> {
        let front = Arc::clone(self);
        thread::Builder::new()
            .name("flowrepl-watcher".into())
            .spawn(move || front.watch())
    }

    fn watch(&self) {
        flowrepl_worker::monitor::block_sigint();
        let mut idle_ticks = 0;
        let mut eof = false;
        loop {
            if !self.busy.load(Ordering::SeqCst) {
                if idle_ticks < IDLE_TICKS_BEFORE_DEEP_SLEEP {
                    idle_ticks += 1;
                    thread::park_timeout(TICK);
                } else {
                    self.deep_sleep.store(true, Ordering::SeqCst);
                    if !self.busy.load(Ordering::SeqCst) {
                        thread::park();
                    }
                    self.deep_sleep.store(false, Ordering::SeqCst);
                    idle_ticks = 0;
                }
                continue;
            }
            idle_ticks = 0;
            self.check_stuck();
            if eof {
                thread::park_timeout(TICK);
                continue;
            }
            // Requests already buffered (pipelined behind the running cell) come first.
            self.take_lines(false, &mut eof);
            if !eof && poll_readable(self.input_fd, TICK) {
                self.take_lines(true, &mut eof);
            }
        }
    }

    /// Under the reader lock and only while busy: handles the complete lines buffered, after
    /// one `read(2)` if `read` (the caller polled first, so it does not block).
    fn take_lines(&self, read: bool, eof: &mut bool) {
        let mut reader = lock(&self.reader);
        if !self.busy.load(Ordering::SeqCst) {
            return;
        }
        if read {
            if let Err(e) = reader.fill() {
                tracing::warn!(error = %e, "reading requests while busy failed");
                *eof = true;
                lock(&self.queue).push_back(Item::Eof);
                return;
            }
        }
        loop {
            let item = match reader.buffered_line() {
                Ok(Some(line)) => Item::from_line(line, self.max_request_bytes),
                Ok(None) => break,
                Err(_) => Item::Eof,
            };
            match item {
                Item::Request {
                    id,
                    call: Ok(Call::Status),
                } => {
                    let status = self.status();
                    self.reply_while_busy(id.as_ref(), &status);
                }
                Item::Request {
                    id,
                    call: Ok(Call::Interrupt),
                } => {
                    let r = self.interrupt();
                    self.reply_while_busy(id.as_ref(), &r);
                }
                Item::Eof => {
                    *eof = true;
                    lock(&self.queue).push_back(Item::Eof);
                    break;
                }
                Item::Blank => {}
                other => lock(&self.queue).push_back(other),
            }
        }
    }

    /// Answers a request; notifications (no id) get nothing.
    pub fn reply<T: Serialize>(&self, id: Option<&Id>, result: &T) -> io::Result<()> {
        match id {
            Some(id) => self.writer().send(&Response::new(id, result)),
            None => Ok(()),
        }
    }

    /// Answers from the watcher, which has nobody to hand a write error to.
    fn reply_while_busy<T: Serialize>(&self, id: Option<&Id>, result: &T) {
        if let Err(e) = self.reply(id, result) {
            tracing::warn!(error = %e, "writing a reply while busy failed");
        }
    }
}

/// The answer to `interrupt`.
#[derive(Debug, Serialize)]
pub struct InterruptReply {
    /// A running cell was sent SIGINT.
    pub interrupted: bool,
}

/// Waits up to `timeout` for `fd` to be readable (or at EOF).
fn poll_readable(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
    n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}
