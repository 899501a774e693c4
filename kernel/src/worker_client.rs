//! Worker mode: running cells in a keep-alive `flowrepl-worker` and stopping them for sure.
//!
//! The request thread writes an Execute frame, then waits on the worker's pipe with `poll`,
//! collecting Output frames until the Done frame with the same id. While it waits, the
//! front's watcher answers `status` and `interrupt` ([`WorkerControl::interrupt`] sends
//! SIGINT to the worker, which its main thread turns into `KeyboardInterrupt`).
//!
//! # The stop ladder
//! 1. The worker's own monitor sends SIGINT when the cell's timeout passes (as in-process);
//!    an `interrupt` request sends SIGINT from here.
//! 2. If no Done frame has come [`SpawnConfig`]'s grace period (`FLOWREPL_KILL_GRACE_MS`)
//!    after the timeout or the interrupt, the worker's process group gets SIGKILL: code that
//!    ignores SIGINT, blocks in C, or sleeps with signals blocked is stopped, and the
//!    processes it started die too. The result says `stopped_by: "kill"` and `state_lost`.
//! 3. A fresh worker is started at once, in the background; the next cell waits for it.
//!
//! A worker that dies by itself (`os._exit`, a segfault, SIGKILL from outside, SIGXCPU) closes
//! its pipe, so the kernel sees it at once: the result is `WorkerDied` (or a limit's typed
//! error) with the exit code or signal, and the output received until then.

use crate::session::CellRun;
use crate::worker_proc::{Ended, SpawnConfig, WorkerProcess};
use flowrepl_protocol::frame::VariablesReport;
use flowrepl_protocol::frame::{self, CellReport, Frame, FrameBuffer, OutputStream, WorkerHello};
use flowrepl_protocol::VariableInfo;
use flowrepl_protocol::{ExecError, ExecutionKind, ResourceUsage, StoppedBy};
use flowrepl_worker::tail::{last_line, TAIL_BYTES};
use flowrepl_worker::{CellOutcome, OutputTail};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a starting worker may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `list_variables` may take (it runs the reprs of the user's objects).
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// While no interrupt is pending, the request thread looks for one this often.
const INTERRUPT_CHECK: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
struct ControlState {
    pid: libc::pid_t,
    running: bool,
    interrupted_at: Option<Instant>,
    /// The running cell's output so far (updated once per read of the pipe).
    tail: OutputTail,
}

/// Shared with the front: the running worker's pid and the interrupt of the running cell.
#[derive(Debug, Default)]
pub struct WorkerControl {
    state: Mutex<ControlState>,
}

impl WorkerControl {
    fn lock(&self) -> MutexGuard<'_, ControlState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// SIGINT to the worker if a cell runs; false otherwise. Sent under the lock that
    /// [`WorkerClient`] holds to mark the cell ended, so it never reaches a later cell
    /// (the worker discards a SIGINT that arrives between cells).
    pub fn interrupt(&self) -> bool {
        let mut st = self.lock();
        if !st.running || st.pid <= 0 {
            return false;
        }
        // SAFETY: plain syscall; the worker is our unreaped child while `running`.
        unsafe { libc::kill(st.pid, libc::SIGINT) };
        st.interrupted_at.get_or_insert_with(Instant::now);
        true
    }

    /// While a cell runs: what it has written so far (for progress reports).
    pub fn output_tail(&self) -> Option<OutputTail> {
        let st = self.lock();
        st.running.then(|| st.tail.clone())
    }

    /// The current worker's pid.
    pub fn worker_pid(&self) -> Option<u32> {
        let pid = self.lock().pid;
        (pid > 0).then_some(pid as u32)
    }
}

/// Why the worker could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The executable could not be started.
    #[error("cannot start {exe}: {source}")]
    Spawn {
        /// The executable.
        exe: String,
        /// Why.
        source: io::Error,
    },
    /// It died or spoke nonsense before it was ready.
    #[error("the worker {0} before it was ready (see the kernel's stderr)")]
    DiedAtStart(String),
    /// It did not become ready in time.
    #[error("the worker was not ready after {0:?}")]
    NotReady(Duration),
    /// The pipe failed.
    #[error("worker pipe: {0}")]
    Io(#[from] io::Error),
}

/// What reading the worker's pipe gave.
enum Wait {
    Frames,
    Eof,
    Timeout,
}

/// The kernel's side of worker mode.
pub struct WorkerClient {
    spawn: SpawnConfig,
    diagnostics: File,
    grace: Duration,
    proc: Option<WorkerProcess>,
    hello: Option<WorkerHello>,
    frames: FrameBuffer,
    control: Arc<WorkerControl>,
    next_id: u64,
    send_buf: Vec<u8>,
    last_cpu_total_ms: f64,
}

/// What one cell's frames added up to.
struct Collecting {
    id: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    report: Option<Box<CellReport>>,
}

impl WorkerClient {
    /// Starts a worker and waits until it is ready.
    pub fn start(
        spawn: SpawnConfig,
        diagnostics: File,
        grace: Duration,
    ) -> Result<WorkerClient, WorkerError> {
        let mut c = WorkerClient {
            spawn,
            diagnostics,
            grace,
            proc: None,
            hello: None,
            frames: FrameBuffer::new(),
            control: Arc::new(WorkerControl::default()),
            next_id: 0,
            send_buf: Vec::with_capacity(4096),
            last_cpu_total_ms: 0.0,
        };
        c.ensure_ready()?;
        Ok(c)
    }

    /// The handle the front uses for `interrupt` and `status`.
    pub fn control(&self) -> Arc<WorkerControl> {
        Arc::clone(&self.control)
    }

    /// What the worker said about its interpreter.
    pub fn hello(&self) -> Option<&WorkerHello> {
        self.hello.as_ref()
    }

    fn spawn_worker(&mut self) -> Result<(), WorkerError> {
        let p = WorkerProcess::spawn(&self.spawn, &self.diagnostics).map_err(|source| {
            WorkerError::Spawn {
                exe: self.spawn.exe.display().to_string(),
                source,
            }
        })?;
        tracing::info!(pid = p.pid, "worker started");
        self.control.lock().pid = p.pid;
        self.frames.clear();
        self.hello = None;
        self.last_cpu_total_ms = 0.0;
        self.proc = Some(p);
        Ok(())
    }

    /// Starts a worker if there is none, and waits for its Ready frame.
    fn ensure_ready(&mut self) -> Result<(), WorkerError> {
        if self.proc.is_none() {
            self.spawn_worker()?;
        }
        if self.hello.is_some() {
            return Ok(());
        }
        let until = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(payload) = self.frames.next_payload().map_err(io::Error::other)? {
                match frame::decode(payload) {
                    Ok(Frame::Ready(h)) => {
                        tracing::debug!(pid = h.pid, "worker ready");
                        self.hello = Some(h);
                        return Ok(());
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

    /// Kills and reaps the current worker, if any.
    fn drop_worker(&mut self) -> Option<Ended> {
        let mut p = self.proc.take()?;
        self.control.lock().pid = 0;
        self.hello = None;
        self.frames.clear();
        p.kill_and_reap()
    }

    /// Waits up to `wait` for the worker's pipe, then reads what is there.
    fn read_frames(&mut self, wait: Duration) -> io::Result<Wait> {
        let Some(p) = &mut self.proc else {
            return Ok(Wait::Eof);
        };
        let fd = p.from_worker.as_raw_fd();
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Wait::Timeout)
            } else {
                Err(e)
            };
        }
        if n == 0 {
            return Ok(Wait::Timeout);
        }
        let spare = self.frames.spare(frame::MAX_CHUNK_BYTES + 64);
        // SAFETY: reading into spare capacity; `filled` is told exactly what was written.
        let r = unsafe { libc::read(fd, spare.as_mut_ptr().cast(), spare.len()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Ok(Wait::Timeout),
                _ => Ok(Wait::Eof),
            };
        }
        if r == 0 {
            return Ok(Wait::Eof);
        }
        // SAFETY: `r` bytes were written by read(2).
        unsafe { self.frames.filled(r as usize) };
        Ok(Wait::Frames)
    }

    /// Applies the buffered frames to `c`; false if the worker broke the protocol.
    fn take_frames(&mut self, c: &mut Collecting) -> bool {
        loop {
            let payload = match self.frames.next_payload() {
                Ok(Some(p)) => p,
                Ok(None) => return true,
                Err(e) => {
                    tracing::error!(error = %e, "bad frame from the worker");
                    return false;
                }
            };
            match frame::decode(payload) {
                Ok(Frame::Output { id, stream, bytes }) if id == c.id => match stream {
                    OutputStream::Stdout => c.stdout.extend_from_slice(bytes),
                    OutputStream::Stderr => c.stderr.extend_from_slice(bytes),
                },
                Ok(Frame::Done { id, report }) if id == c.id => {
                    c.report = Some(report);
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

    /// `list_variables`: asks the worker between cells (starting one if needed).
    pub fn list_variables(&mut self) -> Result<Vec<VariableInfo>, String> {
        if let Some(w) = self.check_idle_worker() {
            tracing::warn!("{w}");
        }
        self.ensure_ready().map_err(|e| e.to_string())?;
        self.next_id += 1;
        let id = self.next_id;
        self.send_buf.clear();
        frame::encode_variables(&mut self.send_buf, id);
        let proc = self.proc.as_mut().expect("ensure_ready left a worker");
        proc.to_worker
            .write_all(&self.send_buf)
            .map_err(|e| format!("the worker's pipe failed: {e}"))?;
        let until = Instant::now() + LIST_TIMEOUT;
        loop {
            while let Some(payload) = self.frames.next_payload().map_err(|e| e.to_string())? {
                match frame::decode(payload) {
                    Ok(Frame::VariablesReply { id: got, report }) if got == id => {
                        let VariablesReport { variables, error } = report;
                        return match error {
                            None => Ok(variables),
                            Some(e) => Err(e),
                        };
                    }
                    Ok(other) => tracing::warn!(?other, "unexpected frame from the worker ignored"),
                    Err(e) => return Err(format!("bad frame from the worker: {e}")),
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the worker did not list its variables within {LIST_TIMEOUT:?} (a slow repr?)"
                ));
            }
            match self.read_frames(left).map_err(|e| e.to_string())? {
                Wait::Frames | Wait::Timeout => {}
                Wait::Eof => {
                    let ended = self.drop_worker();
                    let how = ended.map(|e| e.describe()).unwrap_or_default();
                    if let Err(e) = self.spawn_worker() {
                        tracing::error!(error = %e, "a new worker could not be started");
                    }
                    return Err(format!(
                        "the worker {how} while listing variables; its state was lost and a fresh worker is starting"
                    ));
                }
            }
        }
    }

    /// If the worker died while idle, notices it now (one `poll`), so that the cell runs on
    /// a fresh worker instead of failing. Returns a warning to attach to the cell.
    fn check_idle_worker(&mut self) -> Option<String> {
        let p = self.proc.as_ref()?;
        let mut pfd = libc::pollfd {
            fd: p.from_worker.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        if n <= 0 || pfd.revents & (libc::POLLHUP | libc::POLLERR) == 0 {
            return None;
        }
        let ended = self.drop_worker()?;
        Some(format!(
            "the worker {} while idle, after the previous cell; every variable and import was lost and this cell ran on a fresh worker",
            ended.describe()
        ))
    }

    /// Runs a cell in the worker. Never fails: a dead or unusable worker is the cell's error.
    pub fn execute(&mut self, code: &str, timeout: Duration) -> CellRun {
        let mut warnings = Vec::new();
        let mut state_lost = false;
        if let Some(w) = self.check_idle_worker() {
            warnings.push(w);
            state_lost = true;
        }
        if let Err(e) = self.ensure_ready() {
            let mut run = error_run(
                "WorkerUnavailable",
                format!("the cell did not run: {e}"),
                String::new(),
                String::new(),
                warnings,
            );
            run.state_lost = true;
            return run;
        }
        self.next_id += 1;
        let mut c = Collecting {
            id: self.next_id,
            stdout: Vec::new(),
            stderr: Vec::new(),
            report: None,
        };
        self.send_buf.clear();
        if let Err(e) =
            frame::encode_execute(&mut self.send_buf, c.id, timeout.as_millis() as u64, code)
        {
            return error_run(
                "CellTooLarge",
                e.to_string(),
                String::new(),
                String::new(),
                warnings,
            );
        }
        let started = Instant::now();
        {
            let mut st = self.control.lock();
            st.running = true;
            st.interrupted_at = None;
            st.tail = OutputTail::default();
        }
        let proc = self.proc.as_mut().expect("ensure_ready left a worker");
        let mut alive = proc.to_worker.write_all(&self.send_buf).is_ok();
        if self.send_buf.capacity() > (1 << 20) {
            self.send_buf = Vec::with_capacity(4096);
        }
        let kill_at = started + timeout + self.grace;
        let mut killed: Option<&'static str> = None;
        while alive && c.report.is_none() {
            let now = Instant::now();
            let interrupted_at = self.control.lock().interrupted_at;
            if killed.is_none() {
                let reason = if now >= kill_at {
                    Some("timeout")
                } else if interrupted_at.is_some_and(|t| now >= t + self.grace) {
                    Some("interrupt")
                } else {
                    None
                };
                if let Some(reason) = reason {
                    tracing::warn!(
                        reason,
                        grace_ms = self.grace.as_millis() as u64,
                        "cell did not stop after SIGINT; killing the worker's process group"
                    );
                    if let Some(p) = &self.proc {
                        p.kill_group();
                    }
                    killed = Some(reason);
                }
            }
            let mut wait = match interrupted_at {
                Some(t) => (t + self.grace).saturating_duration_since(now),
                None => INTERRUPT_CHECK,
            };
            wait = wait.min(kill_at.saturating_duration_since(now));
            if killed.is_some() {
                wait = Duration::from_secs(1);
            }
            match self.read_frames(wait.max(Duration::from_millis(1))) {
                Ok(Wait::Frames) => {
                    alive = self.take_frames(&mut c);
                    if c.report.is_none() {
                        self.update_tail(&c);
                    }
                }
                Ok(Wait::Timeout) => {}
                Ok(Wait::Eof) | Err(_) => alive = false,
            }
        }
        let interrupted = {
            let mut st = self.control.lock();
            st.running = false;
            st.interrupted_at.take().is_some()
        };
        let elapsed = started.elapsed();
        let stdout = decode_output(c.stdout, "stdout", &mut warnings);
        let stderr = decode_output(c.stderr, "stderr", &mut warnings);
        match c.report {
            Some(report) => {
                self.last_cpu_total_ms = report.cpu_total_ms;
                let mut run = self.finished_run(*report, stdout, stderr, interrupted);
                warnings.append(&mut run.outcome.warnings);
                run.outcome.warnings = warnings;
                run.state_lost = state_lost;
                run
            }
            None => {
                let dead_pid = self.proc.as_ref().map_or(0, |p| p.pid as u32);
                let ended = self.drop_worker();
                let (kind, message, timed_out, interrupted, stopped_by) =
                    self.describe_death(dead_pid, ended.as_ref(), killed, timeout, elapsed);
                warnings.push(format!(
                    "{message}; every variable and import was lost; a fresh worker is starting for the next cell"
                ));
                let usage = ended.map(|e| ResourceUsage {
                    pid: dead_pid,
                    cpu_ms: ((e.cpu_total_ms - self.last_cpu_total_ms).max(0.0) * 1000.0).round()
                        / 1000.0,
                    peak_rss_kb: e.peak_rss_kb,
                });
                if let Err(e) = self.spawn_worker() {
                    warnings.push(format!("a new worker could not be started: {e}"));
                }
                let mut run = error_run(kind, message, stdout, stderr, warnings);
                run.outcome.timed_out = timed_out;
                run.outcome.interrupted = interrupted;
                run.outcome.usage = usage.unwrap_or_default();
                run.stopped_by = stopped_by;
                run.state_lost = true;
                run
            }
        }
    }

    /// A cell that ended with a Done frame: its report, plus the kernel's knowledge of
    /// interrupts and limits.
    fn finished_run(
        &self,
        r: CellReport,
        stdout: String,
        stderr: String,
        interrupted: bool,
    ) -> CellRun {
        let mut error = r.error;
        let mut was_interrupted = false;
        if let Some(e) = &mut error {
            let limits = self.spawn.limits;
            if e.kind == "KeyboardInterrupt" && interrupted && !r.timed_out {
                was_interrupted = true;
                e.message = "cell interrupted on request (KeyboardInterrupt)".to_owned();
            } else if e.kind == "MemoryError" {
                if let Some(mb) = limits.memory_mb {
                    e.message = format!(
                        "the cell ran out of memory under the worker's limit of {mb} MB of address space (FLOWREPL_MEMORY_MB); peak RSS during the cell {:.1} MB; Python raised MemoryError{}; the session is intact",
                        r.usage.peak_rss_kb as f64 / 1024.0,
                        if e.message.is_empty() { String::new() } else { format!(": {}", e.message) }
                    );
                    e.kind = "MemoryLimitExceeded".to_owned();
                }
            } else if e.kind == "BlockingIOError"
                && e.message.contains("Resource temporarily unavailable")
            {
                if let Some(n) = limits.max_procs {
                    e.message = format!(
                        "the cell could not start a process: the worker's limit is {n} processes (FLOWREPL_MAX_PROCS); Python raised BlockingIOError: {}",
                        e.message
                    );
                    e.kind = "ProcessLimitExceeded".to_owned();
                }
            }
        }
        let stopped = r.timed_out || was_interrupted;
        CellRun {
            outcome: CellOutcome {
                stdout,
                stderr,
                result: r.result,
                error,
                kind: r.kind,
                timed_out: r.timed_out,
                interrupted: was_interrupted,
                added_vars: r.added_vars,
                removed_vars: r.removed_vars,
                added_imports: r.added_imports,
                variable_count: r.variable_count,
                phases: r.phases,
                warnings: r.warnings,
                usage: r.usage,
                images: r.images,
            },
            stopped_by: stopped.then_some(StoppedBy::Interrupt),
            state_lost: false,
        }
    }

    /// Error type and message of a cell whose worker ended before its Done frame.
    fn describe_death(
        &self,
        pid: u32,
        ended: Option<&Ended>,
        killed: Option<&'static str>,
        timeout: Duration,
        elapsed: Duration,
    ) -> (&'static str, String, bool, bool, Option<StoppedBy>) {
        let grace = self.grace.as_millis();
        let how = ended.map(Ended::describe).unwrap_or_else(|| "ended".into());
        match killed {
            Some("timeout") => (
                "WorkerKilled",
                format!(
                    "cell timed out after {} ms and did not stop within {grace} ms of SIGINT, so the worker's process group was killed (SIGKILL)",
                    timeout.as_millis()
                ),
                true,
                false,
                Some(StoppedBy::Kill),
            ),
            Some(_) => (
                "WorkerKilled",
                format!(
                    "cell was interrupted on request and did not stop within {grace} ms of SIGINT, so the worker's process group was killed (SIGKILL)"
                ),
                false,
                true,
                Some(StoppedBy::Kill),
            ),
            None => {
                if let (Some(e), Some(secs)) = (ended, self.spawn.limits.cpu_seconds) {
                    if e.signal == Some(libc::SIGXCPU) {
                        let used = (e.cpu_total_ms - self.last_cpu_total_ms).max(0.0) / 1000.0;
                        return (
                            "CpuLimitExceeded",
                            format!(
                                "the cell used {used:.1} s of CPU, over the worker's limit of {secs} s per cell (FLOWREPL_CPU_SECONDS), and the worker was ended by SIGXCPU"
                            ),
                            false,
                            false,
                            None,
                        );
                    }
                }
                let mut msg = format!(
                    "the worker process (pid {pid}) {how} during the cell (after {:.0} ms)",
                    elapsed.as_secs_f64() * 1000.0
                );
                if let (Some(mb), Some(e)) = (self.spawn.limits.memory_mb, ended) {
                    if matches!(e.signal, Some(libc::SIGKILL | libc::SIGSEGV | libc::SIGABRT | libc::SIGBUS)) {
                        msg.push_str(&format!(
                            " (a memory limit of {mb} MB was set: it may have run out of memory)"
                        ));
                    }
                }
                ("WorkerDied", msg, false, false, None)
            }
        }
    }

    /// `restart`: kills the worker's group, starts a fresh one and waits until it is ready.
    pub fn restart(&mut self) -> Result<u32, WorkerError> {
        self.drop_worker();
        self.ensure_ready()?;
        Ok(self.control.worker_pid().unwrap_or(0))
    }
}

impl Drop for WorkerClient {
    fn drop(&mut self) {
        self.drop_worker();
    }
}

/// Decodes a stream's bytes, replacing invalid UTF-8 (with a warning).
fn decode_output(bytes: Vec<u8>, label: &str, warnings: &mut Vec<String>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            warnings.push(format!(
                "{label} was not valid UTF-8; invalid bytes were replaced with U+FFFD"
            ));
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        }
    }
}

/// A cell that failed outside Python (it did not run, or its worker died): `kind: message`
/// is its error, also appended to `stderr` as its traceback.
fn error_run(
    kind: &str,
    message: String,
    stdout: String,
    mut stderr: String,
    warnings: Vec<String>,
) -> CellRun {
    let traceback = format!("{kind}: {message}\n");
    if !stderr.is_empty() && !stderr.ends_with('\n') {
        stderr.push('\n');
    }
    stderr.push_str(&traceback);
    CellRun {
        outcome: CellOutcome {
            stdout,
            stderr,
            error: Some(ExecError {
                kind: kind.to_owned(),
                message,
                traceback,
            }),
            kind: ExecutionKind::RuntimeError,
            warnings,
            ..CellOutcome::empty()
        },
        stopped_by: None,
        state_lost: false,
    }
}
