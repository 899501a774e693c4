//! Worker mode: cells run in a keep-alive `flowrepl-worker` and are stopped for sure.
//!
//! The request thread writes an Execute frame, then waits on the worker's pipe with `poll`,
//! collecting Output frames until the Done frame with the same id. While it waits, other
//! threads reach the cell through [`WorkerControl`] (SIGINT to the worker, which its main
//! thread turns into `KeyboardInterrupt`). When SIGINT does not stop the cell, the
//! [`ladder`] kills the worker's process group, and a fresh worker is started at once, in
//! the background; the next cell waits for it.
//!
//! A worker that dies by itself (`os._exit`, a segfault, SIGKILL from outside, SIGXCPU) closes
//! its pipe, so the kernel sees it at once: the result is `WorkerDied` (or a limit's
//! [`Fault`]) with the exit code or signal, and the output received until then.
//!
//! # Lifecycle
//! [`State`]: `Absent` → `Starting` (spawned, no Ready frame yet) → `Ready` → (death, kill,
//! restart, finish) → `Absent`. Only `Ready` runs cells; a cell waits for `Starting` to
//! become `Ready`. At the end (and on `restart`) a `Ready` worker gets a Shutdown frame and
//! the kill grace period to run its cells' exit handlers before its group is killed.

pub mod ladder;
pub mod process;

use super::{CellRun, Control, Engine, EngineError};
use crate::approvals::Approvals;
use crate::config::Limits;
use crate::config::{Config, WorkerConfig};
use flowrepl_os::lock;
use flowrepl_protocol::frame::{
    self, CheckpointOutcome, DoneReport, Frame, FrameError, OutputStream, WorkerHello,
};
use flowrepl_protocol::{
    CellReport, CheckpointSummary, ExecutionKind, Fault, Mode, PythonInfo, ResourceUsage,
    RestartReply, RestoreReport, StoppedBy, VariableInfo, AUTO_CHECKPOINT,
};
use flowrepl_worker::capture::{append_traceback, decode_output};
use flowrepl_worker::tail::{last_line, TAIL_BYTES};
use flowrepl_worker::{CellOutcome, OutputTail};
use ladder::{KillReason, Ladder, Step};
use nix::sys::signal::Signal;
use process::{Ended, SpawnConfig, WorkerProcess};
use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a starting worker may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `list_variables` may take (it runs the reprs of the user's objects).
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `checkpoint` may take (pickling and writing every name).
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
struct ControlState {
    pid: Option<libc::pid_t>,
    running: bool,
    interrupted_at: Option<Instant>,
    /// The running cell's output so far, as far as Output frames brought it.
    tail: OutputTail,
    /// The current worker's capture files (copies of the kernel's handles), and where the
    /// running cell's output starts in them: the tail is read from there on demand.
    capture: Option<[std::os::fd::OwnedFd; 2]>,
    cell_starts: [u64; 2],
    /// How the automatic checkpoint is doing, as the worker last said (`None`: off).
    checkpoint: Option<flowrepl_protocol::CheckpointHealth>,
}

/// Shared with the fronts: the running worker's pid and the interrupt of the running cell.
#[derive(Debug, Default)]
pub struct WorkerControl {
    state: Mutex<ControlState>,
}

impl ControlState {
    /// SIGINT to the worker if a cell runs. The worker is our unreaped child while
    /// `running`: its pid cannot have been reused.
    fn signal_running(&self) -> bool {
        match self.pid.filter(|_| self.running) {
            Some(pid) => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGINT);
                true
            }
            None => false,
        }
    }
}

impl WorkerControl {
    fn lock(&self) -> MutexGuard<'_, ControlState> {
        lock(&self.state)
    }

    /// Sends SIGINT again to the running cell (the stop ladder's re-send), under the same
    /// lock as [`Control::interrupt`].
    fn signal_running(&self) {
        self.lock().signal_running();
    }
}

impl Control for WorkerControl {
    /// SIGINT to the worker if a cell runs. Sent under the lock that [`Worker`] holds to mark
    /// the cell ended, so it never reaches a later cell (the worker discards a SIGINT that
    /// arrives between cells).
    fn interrupt(&self) -> bool {
        let mut st = self.lock();
        if !st.signal_running() {
            return false;
        }
        st.interrupted_at.get_or_insert_with(Instant::now);
        true
    }

    fn unstoppable_since(&self) -> Option<Instant> {
        None
    }

    fn checkpoint_health(&self) -> Option<flowrepl_protocol::CheckpointHealth> {
        self.lock().checkpoint.clone()
    }

    fn output_tail(&self) -> Option<OutputTail> {
        use flowrepl_worker::capture::{file_size, pread_into};
        let st = self.lock();
        if !st.running {
            return None;
        }
        let mut tail = st.tail.clone();
        for (i, fd) in st.capture.iter().flatten().enumerate() {
            let fd = fd.as_fd();
            let (Ok(size), start) = (file_size(fd), st.cell_starts[i]) else {
                continue;
            };
            let written = size.saturating_sub(start);
            if written <= tail.bytes[i] {
                continue;
            }
            tail.bytes[i] = written;
            let from = size.saturating_sub(TAIL_BYTES as u64).max(start);
            let mut buf = vec![0; (size - from) as usize];
            if let Ok(n) = pread_into(fd, &mut buf, from) {
                tail.last_line[i] = last_line(&buf[..n]);
            }
        }
        Some(tail)
    }

    fn worker_pid(&self) -> Option<u32> {
        self.lock().pid.map(|p| p as u32)
    }
}

/// Why the worker could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The executable could not be started.
    #[error("cannot start {exe}")]
    Spawn {
        /// The executable.
        exe: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// It died or spoke nonsense before it was ready.
    #[error("the worker {0} before it was ready (see the kernel's stderr)")]
    DiedAtStart(String),
    /// It did not become ready in time.
    #[error("the worker was not ready after {0:?}")]
    NotReady(Duration),
    /// The pipe failed.
    #[error("worker pipe")]
    Io(#[from] io::Error),
}

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
    fn process(&self) -> Option<&WorkerProcess> {
        match self {
            State::Absent => None,
            State::Starting(p) | State::Ready { proc: p, .. } => Some(p),
        }
    }

    fn process_mut(&mut self) -> Option<&mut WorkerProcess> {
        match self {
            State::Absent => None,
            State::Starting(p) | State::Ready { proc: p, .. } => Some(p),
        }
    }
}

/// What reading the worker's pipe gave.
enum Wait {
    Frames,
    Eof,
    Timeout,
}

/// The kernel's side of worker mode.
pub struct Worker {
    spawn: SpawnConfig,
    diagnostics: File,
    grace: Duration,
    state: State,
    /// The interpreter of the last worker that was ready (kept while a new one starts).
    python: PythonInfo,
    control: Arc<WorkerControl>,
    next_id: u64,
    send_buf: Vec<u8>,
    last_cpu_total_ms: f64,
    /// Where the cells' approval requests go.
    approvals: Arc<Approvals>,
    /// Where the next cell's output starts in the current worker's capture files.
    capture_next: [u64; 2],
    /// The automatic checkpoint's journal, when checkpoints are on: a fresh worker after a
    /// death restores from it if it exists.
    auto_journal: Option<std::path::PathBuf>,
    /// What the last worker started with `--restore` restored (or why not), until reported.
    restored: Option<Result<RestoreReport, String>>,
}

/// What one cell's frames added up to.
struct Collecting {
    id: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    events: Vec<flowrepl_protocol::CellEvent>,
    contexts: Vec<String>,
    /// Approvals the cell waits for (its deadline is held meanwhile).
    waiting: Vec<String>,
    done: Option<Box<DoneReport>>,
}

impl Worker {
    /// Starts a worker and waits until it is ready. Fds 1 and 2 of the kernel are pointed at
    /// `/dev/null` first: no Python runs here, and a stray write must not reach stdout.
    pub fn start(
        config: &Config,
        worker: &WorkerConfig,
        diagnostics: File,
        approvals: Arc<Approvals>,
    ) -> Result<Worker, super::StartError> {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map_err(super::StartError::Stdio)?;
        for fd in [1, 2] {
            flowrepl_worker::stdio::dup2(null.as_fd(), fd).map_err(super::StartError::Stdio)?;
        }
        let mut w = Worker {
            spawn: SpawnConfig {
                exe: worker.exe.clone(),
                python: config.python.clone(),
                max_output_bytes: config.max_output_bytes,
                limits: worker.limits,
                images: config.image_limits(),
                setup: config.setup.clone(),
                snapshots: config.snapshots.clone(),
            },
            diagnostics,
            grace: config.kill_grace,
            state: State::Absent,
            python: PythonInfo::default(),
            control: Arc::new(WorkerControl {
                state: Mutex::new(ControlState {
                    checkpoint: config
                        .snapshots
                        .as_ref()
                        .map(|_| flowrepl_protocol::CheckpointHealth::default()),
                    ..ControlState::default()
                }),
            }),
            next_id: 0,
            send_buf: Vec::with_capacity(4096),
            last_cpu_total_ms: 0.0,
            approvals,
            capture_next: [0; 2],
            auto_journal: super::auto_journal(config),
            restored: None,
        };
        w.spawn_worker(super::resumes(config).then_some(AUTO_CHECKPOINT))?;
        w.ensure_ready()?;
        Ok(w)
    }

    fn limits(&self) -> Limits {
        self.spawn.limits
    }

    /// The checkpoint a fresh worker that replaces a dead one starts from, if there is one.
    fn after_death(&self) -> Option<&'static str> {
        self.auto_journal
            .as_ref()
            .filter(|j| j.is_file())
            .map(|_| AUTO_CHECKPOINT)
    }

    /// `Absent` → `Starting`; with `restore`, the worker restores that checkpoint first.
    fn spawn_worker(&mut self, restore: Option<&str>) -> Result<(), WorkerError> {
        let p =
            WorkerProcess::spawn(&self.spawn, &self.diagnostics, restore).map_err(|source| {
                WorkerError::Spawn {
                    exe: self.spawn.exe.display().to_string(),
                    source,
                }
            })?;
        tracing::info!(pid = p.pid, "worker started");
        {
            let mut st = self.control.lock();
            st.pid = Some(p.pid);
            st.capture = match (p.capture[0].try_clone(), p.capture[1].try_clone()) {
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
    fn ensure_ready(&mut self) -> Result<(), WorkerError> {
        if matches!(self.state, State::Absent) {
            self.spawn_worker(self.after_death())?;
        }
        if matches!(self.state, State::Ready { .. }) {
            return Ok(());
        }
        let until = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(payload) = self.next_buffered().map_err(io::Error::other)? {
                match frame::decode(&payload) {
                    Ok(Frame::Ready { hello }) => {
                        let mut hello = hello.into_owned();
                        tracing::debug!(pid = hello.pid, "worker ready");
                        let State::Starting(proc) =
                            std::mem::replace(&mut self.state, State::Absent)
                        else {
                            unreachable!("only a starting worker sends Ready");
                        };
                        self.python = hello.python.clone();
                        self.capture_next = hello.capture_starts;
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
            match self.read_frames(left)? {
                Wait::Frames | Wait::Timeout => {}
                Wait::Eof => {
                    let ended = self.drop_worker();
                    let how = ended.map(|e| e.describe()).unwrap_or_default();
                    return Err(WorkerError::DiedAtStart(how));
                }
            }
        }
    }

    /// Kills and reaps the current worker, if any (→ `Absent`).
    fn drop_worker(&mut self) -> Option<Ended> {
        let state = std::mem::replace(&mut self.state, State::Absent);
        self.control.lock().pid = None;
        match state {
            State::Absent => None,
            State::Starting(mut p) | State::Ready { proc: mut p, .. } => p.kill_and_reap(),
        }
    }

    /// Ends a ready worker gracefully: a Shutdown frame, then up to the grace period for its
    /// exit handlers and flushes (its pipe closes when it exits), then SIGKILL to its group.
    fn stop_worker(&mut self) {
        if let State::Ready { proc, .. } = &mut self.state {
            self.send_buf.clear();
            Frame::Shutdown {}
                .encode(&mut self.send_buf)
                .expect("an empty frame fits");
            if lock(&proc.to_worker).write_all(&self.send_buf).is_ok() {
                let until = Instant::now() + self.grace;
                loop {
                    let left = until.saturating_duration_since(Instant::now());
                    // Whatever it still sends (a late Done) is not wanted: read until EOF.
                    match self.read_frames(left) {
                        Ok(Wait::Frames) => while let Ok(Some(_)) = self.next_buffered() {},
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

    /// The next frame the worker sent that is already buffered.
    fn next_buffered(&mut self) -> Result<Option<bytes::BytesMut>, FrameError> {
        match self.state.process_mut() {
            Some(p) => p.from_worker.buffered(),
            None => Ok(None),
        }
    }

    /// Waits up to `wait` for the worker's pipe, then reads what is there (one `read`).
    fn read_frames(&mut self, wait: Duration) -> io::Result<Wait> {
        let Some(p) = self.state.process_mut() else {
            return Ok(Wait::Eof);
        };
        if !flowrepl_os::poll_readable(p.from_worker.get_ref().as_raw_fd(), wait)? {
            return Ok(Wait::Timeout);
        }
        Ok(self.fill_frames())
    }

    /// Reads what is on the worker's pipe (one `read`; it does not block).
    fn fill_frames(&mut self) -> Wait {
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
    fn take_frames(&mut self, c: &mut Collecting) -> bool {
        loop {
            let payload = match self.next_buffered() {
                Ok(Some(p)) => p,
                Ok(None) => return true,
                Err(e) => {
                    tracing::error!(error = %e, "bad frame from the worker");
                    return false;
                }
            };
            match frame::decode(&payload) {
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

    /// What the cell wrote that did not arrive as Output frames (`received` bytes per stream
    /// did), read from the kernel's handle on the capture files up to `ends` (a worker's
    /// Done) or to their current size (a worker that died), with the output limit applied as
    /// the worker applies it: the kept head, the marker, the last quarter. One `pread` per
    /// range, straight into the buffer the reply is made from.
    fn read_output(&self, received: [usize; 2], ends: Option<[u64; 2]>) -> [Vec<u8>; 2] {
        use flowrepl_worker::capture::{drop_marker, file_size, kept_ranges, pread_into};
        let Some(p) = self.state.process() else {
            return Default::default();
        };
        let max = self.spawn.max_output_bytes;
        let mut out: [Vec<u8>; 2] = Default::default();
        for i in 0..2 {
            let fd = p.capture[i].as_fd();
            let size = match ends {
                Some(e) => e[i],
                None => match file_size(fd) {
                    Ok(s) => s,
                    Err(_) => continue,
                },
            };
            let start = self.capture_next[i];
            let from = start + received[i] as u64;
            let read = |buf: &mut Vec<u8>, a: u64, b: u64| {
                if b <= a {
                    return;
                }
                let at = buf.len();
                buf.resize(at + (b - a) as usize, 0);
                let mut n = 0;
                while at + n < buf.len() {
                    match pread_into(fd, &mut buf[at + n..], a + n as u64) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                }
                buf.truncate(at + n);
            };
            if size.saturating_sub(start) <= max {
                read(&mut out[i], from, size);
            } else {
                let (head_end, tail_start) = kept_ranges(start, size, max);
                read(&mut out[i], from, head_end);
                out[i].extend_from_slice(drop_marker(tail_start - head_end, max).as_bytes());
                read(&mut out[i], tail_start.max(from), size);
            }
        }
        out
    }

    /// Publishes the running cell's output so far to [`WorkerControl::output_tail`].
    fn update_tail(&self, c: &Collecting) {
        let mut st = self.control.lock();
        for (i, bytes) in [&c.stdout, &c.stderr].into_iter().enumerate() {
            if st.tail.bytes[i] != bytes.len() as u64 {
                st.tail.bytes[i] = bytes.len() as u64;
                st.tail.last_line[i] = last_line(&bytes[bytes.len().saturating_sub(TAIL_BYTES)..]);
            }
        }
    }

    /// If the worker died while idle, notices it now (one `poll`), so that the cell runs on
    /// a fresh worker instead of failing. Returns a warning to attach to the cell.
    fn check_idle_worker(&mut self) -> Option<String> {
        let p = self.state.process()?;
        if !flowrepl_os::poll_hangup(p.from_worker.get_ref().as_raw_fd()) {
            return None;
        }
        let ended = self.drop_worker()?;
        Some(format!(
            "the worker {} while idle, after the previous cell; its state was lost and this cell ran on a fresh worker{}",
            ended.describe(),
            if self.after_death().is_some() {
                " started from the last checkpoint (see `restored`)"
            } else {
                ""
            }
        ))
    }

    /// Sends a request frame (`encode` with a fresh id) between cells and waits up to
    /// `timeout` for the frame `pick` accepts; frames it does not are ignored. A worker that
    /// dies meanwhile is replaced (from the last checkpoint, if there is one).
    fn ask<'r, T>(
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

    /// A cell that ended with a Done frame: its report, plus the kernel's knowledge of
    /// interrupts and limits.
    fn finished_run(
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
    fn death(
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
                    if e.signal == Some(Signal::SIGXCPU as i32) {
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
                    let signal = e.signal.and_then(|s| Signal::try_from(s).ok());
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
fn fault_run(
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

impl Engine for Worker {
    fn mode(&self) -> Mode {
        Mode::Worker
    }

    fn python(&self) -> PythonInfo {
        self.python.clone()
    }

    fn control(&self) -> Arc<dyn Control> {
        self.control.clone()
    }

    fn run(&mut self, code: &str, timeout: Duration, execution_count: u64) -> CellRun {
        let mut warnings = Vec::new();
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
        if let Err(e) = ready {
            let message = format!("the cell did not run: {}", flowrepl_os::chain(&e));
            return fault_run(
                Fault::WorkerUnavailable,
                message,
                String::new(),
                String::new(),
                warnings,
            );
        }
        self.next_id += 1;
        let mut c = Collecting {
            id: self.next_id,
            stdout: Vec::new(),
            stderr: Vec::new(),
            events: Vec::new(),
            contexts: Vec::new(),
            waiting: Vec::new(),
            done: None,
        };
        self.send_buf.clear();
        let timeout_ms = timeout.as_millis() as u64;
        Frame::Execute {
            id: c.id,
            timeout_ms,
            execution_count,
            code,
        }
        .encode(&mut self.send_buf)
        .expect("worker mode caps request lines at frame::MAX_CELL_BYTES (config.rs)");
        let started = Instant::now();
        {
            let mut st = self.control.lock();
            st.running = true;
            st.interrupted_at = None;
            st.tail = OutputTail::default();
            st.cell_starts = self.capture_next;
        }
        let proc = self
            .state
            .process_mut()
            .expect("ensure_ready left a worker");
        let mut alive = lock(&proc.to_worker).write_all(&self.send_buf).is_ok();
        if self.send_buf.capacity() > (1 << 20) {
            self.send_buf = Vec::with_capacity(4096);
        }
        let mut ladder = Ladder::new(started, timeout, self.grace);
        // A short cell answers within tens of µs: look before sleeping (and then read at
        // once, without polling again).
        let mut readable = alive
            && self.state.process().is_some_and(|p| {
                flowrepl_os::spin_until_readable(p.from_worker.get_ref().as_raw_fd())
            });
        while alive && c.done.is_none() {
            let got = if std::mem::take(&mut readable) {
                Ok(self.fill_frames())
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
                self.read_frames(wait)
            };
            match got {
                Ok(Wait::Frames) => {
                    alive = self.take_frames(&mut c);
                    if c.done.is_none() {
                        self.update_tail(&c);
                    }
                    ladder.hold(Instant::now(), !c.waiting.is_empty());
                }
                Ok(Wait::Timeout) => {}
                Ok(Wait::Eof) | Err(_) => alive = false,
            }
        }
        for id in c.waiting.drain(..) {
            // The worker died (or broke the protocol) while the cell waited.
            self.approvals.close(&id);
        }
        let interrupted = {
            let mut st = self.control.lock();
            st.running = false;
            st.interrupted_at.take().is_some()
        };
        let elapsed = started.elapsed();
        // The cell's output is in the capture files the kernel holds: the worker sends none
        // of it (`output_in_capture`), or died before it sent all.
        let read_here = match &c.done {
            Some(d) if d.output_in_capture => Some(Some(d.capture_ends)),
            Some(_) => None,
            None => Some(None),
        };
        if let Some(ends) = read_here {
            let read = self.read_output([c.stdout.len(), c.stderr.len()], ends);
            for (have, more) in [&mut c.stdout, &mut c.stderr].into_iter().zip(read) {
                if have.is_empty() {
                    *have = more;
                } else {
                    have.extend_from_slice(&more);
                }
            }
        }
        let stdout = decode_output(c.stdout, "stdout", &mut warnings);
        let mut stderr = decode_output(c.stderr, "stderr", &mut warnings);
        // Nor did it send the traceback: it is in the report.
        if let Some(e) = c
            .done
            .as_ref()
            .filter(|d| d.output_in_capture)
            .and_then(|d| d.report.error.as_ref())
        {
            append_traceback(&mut stderr, &e.traceback);
        }
        if let Some(done) = c.done {
            self.last_cpu_total_ms = done.cpu_total_ms;
            self.capture_next = done.capture_ends;
            let mut run = self.finished_run(*done, stdout, stderr, interrupted);
            warnings.append(&mut run.outcome.report.warnings);
            run.outcome.report.warnings = warnings;
            run.outcome.events = c.events;
            run.outcome.contexts = c.contexts;
            run.state_lost = state_lost;
            return run;
        }
        let dead_pid = self.state.process().map_or(0, |p| p.pid as u32);
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
        // What the cell reported before the worker died is kept.
        run.outcome.events = c.events;
        run.outcome.contexts = c.contexts;
        let report: &mut CellReport = &mut run.outcome.report;
        report.timed_out = killed == Some(KillReason::Timeout);
        report.interrupted = killed == Some(KillReason::Interrupt);
        report.usage = usage.unwrap_or_default();
        report.debug_info.execution = ExecutionKind::RuntimeError;
        run.stopped_by = killed.map(|_| StoppedBy::Kill);
        run.state_lost = true;
        run
    }

    fn list_variables(&mut self) -> Result<Vec<VariableInfo>, EngineError> {
        let report = self.ask(
            |id| Frame::Variables { id },
            LIST_TIMEOUT,
            "while listing variables",
            |frame, id| match frame {
                Frame::VariablesReply { id: got, report } if got == id => Some(report.into_owned()),
                _ => None,
            },
        )?;
        match report.error {
            None => Ok(report.variables),
            Some(e) => Err(flowrepl_worker::CallError(e).into()),
        }
    }

    fn refresh_checkpoint_health(&mut self) {
        if self.control.lock().checkpoint.is_none() {
            return; // checkpoints are off
        }
        let asked = self.ask(
            |id| Frame::Health { id },
            LIST_TIMEOUT,
            "while saying how the checkpoint is doing",
            |frame, id| match frame {
                Frame::HealthReply { id: got, health } if got == id => Some(health.into_owned()),
                _ => None,
            },
        );
        match asked {
            Ok(h) => self.control.lock().checkpoint = Some(h),
            // What the last Done said stands.
            Err(e) => {
                tracing::debug!(error = %e, "the worker did not say how the checkpoint is doing")
            }
        }
    }

    fn restart(&mut self, restore: bool) -> Result<RestartReply, EngineError> {
        self.stop_worker();
        self.restored = None;
        let from = if restore {
            if self.auto_journal.is_none() {
                return Err(flowrepl_worker::CheckpointError::Off.into());
            }
            Some(self.after_death().ok_or_else(|| {
                EngineError::NotRestored(
                    "the task has no automatic checkpoint yet; a fresh worker was not started"
                        .into(),
                )
            })?)
        } else {
            None
        };
        self.spawn_worker(from)?;
        self.ensure_ready()?;
        let mut reply = RestartReply {
            restarted: true,
            pid: self.control.worker_pid().unwrap_or(0),
            state_lost: true,
            message: "a fresh worker process was started; every variable and import was dropped"
                .into(),
            restored: None,
        };
        match self.restored.take() {
            Some(Ok(r)) => {
                reply.state_lost = !r.complete();
                reply.message = format!(
                    "a fresh worker process was started; {}",
                    super::restored_message(&r)
                );
                reply.restored = Some(r);
            }
            Some(Err(e)) => return Err(EngineError::NotRestored(e)),
            None => {}
        }
        Ok(reply)
    }

    fn checkpoint(&mut self, name: &str) -> Result<CheckpointSummary, EngineError> {
        if self.auto_journal.is_none() {
            return Err(flowrepl_worker::CheckpointError::Off.into());
        }
        let outcome = self.ask(
            |id| Frame::Checkpoint { id, name },
            CHECKPOINT_TIMEOUT,
            "while writing a checkpoint",
            |frame, id| match frame {
                Frame::CheckpointReply { id: got, outcome } if got == id => {
                    Some(outcome.into_owned())
                }
                _ => None,
            },
        )?;
        match outcome {
            CheckpointOutcome::Written(s) => Ok(s),
            CheckpointOutcome::Failed(e) => Err(EngineError::Worker(WorkerError::Io(
                io::Error::other(format!("the checkpoint was not written: {e}")),
            ))),
        }
    }

    fn restore(&mut self, name: &str) -> Result<RestoreReport, EngineError> {
        let Some(snapshots) = &self.spawn.snapshots else {
            return Err(flowrepl_worker::CheckpointError::Off.into());
        };
        // Read before the worker is replaced: a bad name, a missing checkpoint or a folder
        // that is not private keeps it.
        flowrepl_task_logger::snapshot::load(&snapshots.root, name)
            .map_err(flowrepl_worker::CheckpointError::from)?;
        self.stop_worker();
        self.restored = None;
        self.spawn_worker(Some(name))?;
        self.ensure_ready()?;
        match self.restored.take() {
            Some(Ok(r)) => Ok(r),
            Some(Err(e)) => Err(EngineError::NotRestored(format!(
                "{e}; the fresh worker starts empty"
            ))),
            None => Err(EngineError::NotRestored(
                "the worker did not report a restore; it starts empty".into(),
            )),
        }
    }

    fn take_restored(&mut self) -> Option<Result<RestoreReport, String>> {
        self.restored.take()
    }

    fn finish(&mut self) {
        self.stop_worker();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.drop_worker();
    }
}
