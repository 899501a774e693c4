//! The protocol front shared by the request thread and the busy-time watcher.
//!
//! While idle, the request thread (Python's main thread) reads requests itself and answers
//! them in order: no thread hop on the request path. While a cell runs it cannot read, so a
//! **watcher** thread takes over stdin: it answers `status`, `interrupt` and `approve` at once
//! (the only requests answered out of order) and queues every other request, parsed, for the
//! request thread to answer in order after the cell.
//!
//! A cell's `flow.request_approval` reaches the client as an `approval_requested`
//! notification ([`NotifyAsker`]); the client answers with `approve`. When stdin closes, every
//! pending approval is cancelled.
//!
//! The two never read at the same time: the watcher reads only while `busy` is set and it
//! holds the reader lock, and it re-checks `busy` after taking the lock; the request thread
//! clears `busy` before taking the lock and looks at the queue first. The reader keeps
//! partial lines between the two ([`super::line_reader`]).
//!
//! In-process, a cell that does not stop within the grace period after SIGINT (it ignores
//! SIGINT, or blocks in a C call that never checks for signals) cannot be killed without
//! killing the kernel. The watcher then answers its request itself with `CellNotStopped`,
//! so the client is not left hanging; the kernel keeps answering `status` (busy) and
//! `interrupt`, queues everything else, and logs the cell's real result if it ever ends.
//!
//! Like the monitor, the watcher is not woken per cell: it ticks every 50 ms and, after a
//! second without cells, sleeps until the request thread wakes it at the next cell.

use super::line_reader::{Line, LineReader};
use super::writer::ReplyWriter;
use flowrepl_os::lock;
use flowrepl_protocol::jsonrpc::{Notification, Response};
use flowrepl_protocol::{
    ApprovalRequest, ApproveReply, Call, ExecuteResult, Id, InterruptReply, Request, RpcError,
    StatusInfo,
};
use flowrepl_session::approvals::{Approvals, Asker};
use flowrepl_session::session::{not_stopped, unstoppable_for, StatusBoard};
use serde::Serialize;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
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
            Line::TooLong(over) => {
                let err = over.error(max_request_bytes);
                tracing::warn!(len = over.len, id = ?err.id, "request line over the limit discarded");
                Item::Bad(err)
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

/// State shared by the request thread and the watcher.
pub struct Front {
    reader: Mutex<LineReader<File>>,
    input_fd: RawFd,
    writer: Mutex<ReplyWriter>,
    queue: Mutex<VecDeque<Item>>,
    busy: AtomicBool,
    deep_sleep: AtomicBool,
    board: Arc<StatusBoard>,
    max_request_bytes: usize,
    kill_grace: Duration,
    /// The running cell's request id, until it is answered.
    cell_id: Mutex<Option<Id>>,
    /// The running cell was answered with `CellNotStopped`.
    answered_early: AtomicBool,
    /// The cells' approval requests.
    approvals: Arc<Approvals>,
    /// Whether to poll for the next request before sleeping.
    spin: Mutex<super::spin::SpinChooser>,
}

/// Asks the JSON-RPC client: an `approval_requested` notification, answered with `approve`.
pub struct NotifyAsker(Weak<Front>);

impl Asker for NotifyAsker {
    fn ask(&self, request: &ApprovalRequest, _: &Arc<Approvals>) -> Result<(), String> {
        let front = self.0.upgrade().ok_or("the JSON-RPC front is gone")?;
        let sent = front.writer().send(&Notification {
            jsonrpc: "2.0",
            method: "approval_requested",
            params: request,
        });
        sent.map_err(|e| format!("the notification could not be written: {e}"))
    }
}

impl Front {
    /// A front over the protocol's input and output; with `ascii_replies`, every reply in
    /// ASCII ([`ReplyWriter::new`]).
    pub fn new(
        input: File,
        output: File,
        max_request_bytes: usize,
        board: Arc<StatusBoard>,
        kill_grace: Duration,
        approvals: Arc<Approvals>,
        ascii_replies: bool,
    ) -> Front {
        Front {
            input_fd: input.as_raw_fd(),
            reader: Mutex::new(LineReader::new(input, max_request_bytes)),
            writer: Mutex::new(ReplyWriter::new(output, ascii_replies)),
            queue: Mutex::new(VecDeque::new()),
            busy: AtomicBool::new(false),
            deep_sleep: AtomicBool::new(false),
            board,
            max_request_bytes,
            kill_grace,
            cell_id: Mutex::new(None),
            answered_early: AtomicBool::new(false),
            approvals,
            spin: Mutex::new(Default::default()),
        }
    }

    /// From now on the cells' approval requests are sent to this front's client.
    pub fn ask_client(self: &Arc<Self>) {
        self.approvals
            .set_asker(Arc::new(NotifyAsker(Arc::downgrade(self))));
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
        // Poll before sleeping, or not: whichever this client answers faster to (spin.rs).
        let started = std::time::Instant::now();
        let mut chooser = lock(&self.spin);
        if chooser.spin() && reader.is_empty() {
            flowrepl_os::spin_until_readable(self.input_fd);
        }
        let line = reader.next_line()?;
        chooser.record(started.elapsed());
        Ok(Item::from_line(line, self.max_request_bytes))
    }

    /// A cell starts: the watcher takes over stdin.
    pub fn begin_cell(&self, watcher: &thread::Thread, id: Option<&Id>) {
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
        if self.answered_early.load(Ordering::SeqCst) {
            return;
        }
        let Some(waited) = unstoppable_for(&**self.board.control(), self.kill_grace) else {
            return;
        };
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
        let status = &self.board;
        let report = not_stopped(self.mode(), self.kill_grace, true);
        let result = ExecuteResult {
            restored: None,
            success: false,
            stdout: String::new(),
            stderr: report
                .error
                .as_ref()
                .map(|e| e.traceback.clone())
                .unwrap_or_default(),
            report,
            execution_count: status.executions(),
            elapsed_ms: 0.0,
            mode: self.mode(),
            stopped_by: None,
            timestamp: String::new(),
            state_lost: false,
            images: Vec::new(),
            events: Vec::new(),
        };
        if let Err(e) = self.writer().send_execute(&id, &result) {
            tracing::warn!(error = %e, "writing CellNotStopped failed");
        }
    }

    fn mode(&self) -> flowrepl_protocol::Mode {
        self.board.status_mode()
    }

    /// The `status` answer while a cell may run; waits for pending log records first.
    pub fn status(&self) -> StatusInfo {
        self.board.status(self.busy.load(Ordering::SeqCst))
    }

    /// Answers `interrupt`: SIGINT to the running cell, if any.
    pub fn interrupt(&self) -> InterruptReply {
        let interrupted = self.board.control().interrupt();
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
        flowrepl_os::block_sigint();
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
            if !eof && readable(self.input_fd, TICK) {
                self.take_lines(true, &mut eof);
            }
        }
    }

    /// Under the reader lock and only while busy: handles the complete lines buffered, after
    /// one `read(2)` if `read` and stdin is still readable. (The caller polled without the
    /// lock; meanwhile the request thread may have ended the cell, read that very line and
    /// started the next cell: a read then would block with the lock held, and no `status` or
    /// `interrupt` would be answered until the cell ended. Under the lock only this thread
    /// reads, so a poll that does not wait is exact.)
    fn take_lines(&self, read: bool, eof: &mut bool) {
        let mut reader = lock(&self.reader);
        if !self.busy.load(Ordering::SeqCst) {
            return;
        }
        if read && readable(self.input_fd, Duration::ZERO) {
            if let Err(e) = reader.fill() {
                tracing::warn!(error = %e, "reading requests while busy failed");
                *eof = true;
                self.approvals
                    .cancel_all("the client's input failed: nobody can answer");
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
                    self.ack_before_cell(id.as_ref(), || self.interrupt());
                }
                Item::Request {
                    id,
                    call: Ok(Call::Approve(params)),
                } => {
                    self.ack_before_cell(id.as_ref(), || ApproveReply {
                        accepted: self.approvals.answer(params.into_answer()),
                    });
                }
                Item::Eof => {
                    *eof = true;
                    self.approvals
                        .cancel_all("the client closed stdin: nobody can answer");
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

    /// Does what a request asks to the running cell (interrupt it, answer its approval) and
    /// acknowledges it before the cell's own reply can go out: the writer is held from the
    /// act until the ack is written.
    fn ack_before_cell<T: Serialize>(&self, id: Option<&Id>, act: impl FnOnce() -> T) {
        let mut writer = self.writer();
        let r = act();
        if let Some(id) = id {
            if let Err(e) = writer.send(&Response::new(id, &r)) {
                tracing::warn!(error = %e, "writing a reply while busy failed");
            }
        }
    }

    /// Answers from the watcher, which has nobody to hand a write error to.
    fn reply_while_busy<T: Serialize>(&self, id: Option<&Id>, result: &T) {
        if let Err(e) = self.reply(id, result) {
            tracing::warn!(error = %e, "writing a reply while busy failed");
        }
    }
}

/// Whether `fd` has input (or is at EOF or in error) within `wait`. A failed poll counts as
/// readable, so that the read reports the error.
fn readable(fd: RawFd, wait: Duration) -> bool {
    flowrepl_os::poll_readable(fd, wait).unwrap_or(true)
}
