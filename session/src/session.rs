//! A session: the engine, the task log and the counters, and the one dispatcher both fronts
//! use ([`Session::dispatch`]): a call is answered through the front's [`Responder`], and a
//! cell's record is written after its reply.
//!
//! The `CellNotStopped` policy lives here too ([`unstoppable_for`], [`not_stopped`]): an
//! in-process cell that ignores SIGINT for the kill grace period cannot be stopped, so the
//! fronts answer for it instead of leaving their clients waiting.
//!
//! Size: the one dispatcher of every call, about 530 lines: splitting the call arms across
//! files would hide the one place each method is answered.

use crate::approvals::Approvals;
use crate::config::{Config, Identity};
use crate::engine::{Control, Engine, EngineError};
use crate::ledger::Ledger;
use crate::records::{Flusher, RecordWriter};
use chrono::{SecondsFormat, Utc};
use flowrepl_protocol::{
    ApproveReply, Call, CellReport, CheckpointPolicy, CheckpointSummary, CheckpointsReply,
    ErrorCode, ExecuteParams, ExecuteResult, Fault, Image, InterruptReply, Mode, RestartReply,
    RestoreReport, RpcError, ShutdownReply, StatusInfo, VariableInfo, VariablesReply,
};
use flowrepl_task_logger::{SessionLimits, SessionRecord, RECORD_TYPE_SESSION};
use serde::Serialize;
use std::borrow::Cow;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The answer to a call other than `execute_code`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// `status`.
    Status(Box<StatusInfo>),
    /// `interrupt`.
    Interrupt(InterruptReply),
    /// `restart`.
    Restart(RestartReply),
    /// `list_variables`.
    Variables(VariablesReply),
    /// `shutdown`.
    Shutdown(ShutdownReply),
    /// `approve`.
    Approve(ApproveReply),
    /// `checkpoint`.
    Checkpoint(CheckpointSummary),
    /// `restore`.
    Restore(RestoreReport),
    /// `checkpoints`.
    Checkpoints(CheckpointsReply),
    /// `upload_file`.
    Uploaded(flowrepl_protocol::files::FileInfo),
    /// `download_file`.
    Downloaded(flowrepl_protocol::files::Downloaded),
    /// `list_files`.
    Listing(flowrepl_protocol::files::Listing),
    /// `delete_file`.
    Deleted(flowrepl_protocol::files::Deleted),
    /// `install`.
    Installed(flowrepl_protocol::packages::InstallReply),
}

/// How a front answers the calls the dispatcher runs.
pub trait Responder {
    /// A cell (or an install) is about to run: calls the front answers at once may come.
    fn cell_starts(&mut self) {}
    /// The cell (or install) ended; true if the front already answered it ([`not_stopped`]).
    fn cell_ended(&mut self) -> bool {
        false
    }
    /// Answers a cell. The result is still the session's afterwards (its record is written
    /// from it), so the front may borrow it, or swap parts and put them back.
    fn executed(&mut self, result: &mut ExecuteResult, images: Vec<Image>) -> io::Result<()>;
    /// Answers any other call.
    fn answer(&mut self, answer: Answer) -> io::Result<()>;
    /// Answers a call that failed.
    fn failed(&mut self, error: RpcError) -> io::Result<()>;
}

/// With `--store-sync`: how long a cell's answer waits for its record to be in the store.
const SYNC_WITHIN: Duration = Duration::from_secs(30);

/// Calls that run a cell or change the task's state: with a store, only on a good lease.
fn needs_lease(call: &Call) -> bool {
    matches!(
        call,
        Call::Execute(..)
            | Call::Restart(_)
            | Call::Checkpoint(_)
            | Call::Restore(_)
            | Call::UploadFile(_)
            | Call::DeleteFile(_)
    )
}

/// Whether the front's loop goes on.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    /// Serve the next call.
    Continue,
    /// `shutdown` was answered.
    Shutdown,
}

/// What `status` says, shared with the threads that answer it while a cell runs.
#[derive(Debug)]
pub struct StatusBoard {
    template: StatusInfo,
    executions: AtomicU64,
    /// Cells that failed.
    failures: AtomicU64,
    /// For the session records: the limits, the front, when the kernel started.
    limits: SessionLimits,
    front: &'static str,
    started: Instant,
    /// The end record was written.
    ended: std::sync::atomic::AtomicBool,
    /// Whose records these are.
    identity: Identity,
    /// Cells whose record was queued (or skipped, when the log is unusable).
    settled: AtomicU64,
    control: Arc<dyn Control>,
    flusher: Flusher,
    /// `--store`: the task's uploader.
    store: Option<Arc<flowrepl_store::mirror::Mirror>>,
}

impl StatusBoard {
    /// The `status` answer; waits for pending log records first, so that every record of an
    /// earlier cell is in the file when it arrives.
    pub fn status(&self, busy: bool) -> StatusInfo {
        self.flusher.flush();
        let mut s = self.template.clone();
        s.execution_count = self.executions.load(Ordering::Relaxed);
        s.busy = busy;
        s.worker_pid = self.control.worker_pid();
        s.checkpoint = self.control.checkpoint_health();
        s.store = self.store.as_ref().map(|m| m.health().status());
        s
    }

    /// Why this kernel must stop: another kernel took its task in the store.
    pub fn fenced(&self) -> Option<String> {
        self.store.as_ref().and_then(|m| m.health().fenced())
    }

    /// With `--store`: the task's lease is good by this kernel's clock, or was renewed now
    /// (see `flowrepl_store::mirror::Mirror::ensure_lease`).
    pub fn ensure_lease(&self) -> Result<(), flowrepl_store::mirror::LeaseLost> {
        match &self.store {
            Some(m) => m.ensure_lease(),
            None => Ok(()),
        }
    }

    /// `execute_code` calls started so far (the session's one counter).
    pub fn executions(&self) -> u64 {
        self.executions.load(Ordering::Relaxed)
    }

    /// Waits until every cell started so far has had its record queued (or skipped), then
    /// until the queued records are written; gives up at `deadline`. True if all were.
    pub fn settle_until(&self, deadline: Instant) -> bool {
        while self.settled.load(Ordering::Acquire) < self.executions() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.flusher.flush_until(deadline)
    }

    /// Reaches the running cell.
    pub fn control(&self) -> &Arc<dyn Control> {
        &self.control
    }

    /// In-process or worker.
    pub fn status_mode(&self) -> Mode {
        self.template.mode
    }

    /// The session record of `event` (`start`, `end`), with the end's `reason` and counts.
    fn session_record(
        &self,
        event: &'static str,
        reason: Option<&'static str>,
    ) -> SessionRecord<'_> {
        let t = &self.template;
        let end = reason.is_some();
        SessionRecord {
            head: crate::records::task_head(&self.identity, RECORD_TYPE_SESSION),
            event: Cow::Borrowed(event),
            timestamp: Cow::Owned(Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)),
            kernel_version: Cow::Borrowed(&t.kernel_version),
            python_version: Cow::Borrowed(&t.python.python_version),
            python_executable: Cow::Borrowed(&t.python.python_executable),
            python_source: Cow::Borrowed(&t.python_source),
            mode: Cow::Borrowed(t.mode.as_str()),
            front: Cow::Borrowed(self.front),
            pid: t.pid,
            worker_pid: self.control.worker_pid(),
            limits: self.limits.clone(),
            reason: reason.map(Cow::Borrowed),
            cells: end.then(|| self.executions()),
            failures: end.then(|| self.failures.load(Ordering::Relaxed)),
            duration_ms: end.then(|| (self.started.elapsed().as_micros() as f64) / 1000.0),
            sandbox: t.sandbox.clone(),
        }
    }

    /// Writes the session's end record (once; later calls do nothing), after every pending
    /// record. `reason`: `eof`, `shutdown`, `signal`, `error`.
    pub fn end_session(&self, reason: &'static str) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        self.flusher
            .write_session(&self.session_record("end", Some(reason)));
        if let Some(store) = &self.store {
            // The end record too: a clean stop loses nothing that was answered.
            store.finish();
        }
    }
}

/// One kernel run.
pub struct Session {
    engine: Box<dyn Engine>,
    records: RecordWriter,
    board: Arc<StatusBoard>,
    default_timeout_ms: u64,
    kill_grace: Duration,
    /// Whether the record of the cell being answered can be written.
    record_this: bool,
    /// The task's context after each change the cell being answered made.
    contexts: Vec<String>,
    /// The cells' approval requests.
    approvals: Arc<Approvals>,
    /// The task's checkpoint folder, and `FLOWREPL_CHECKPOINTS`.
    checkpoint_root: std::path::PathBuf,
    checkpoint_policy: CheckpointPolicy,
    /// `--store-sync`: a cell is answered once its record is in the store.
    store_sync: bool,
    /// An automatic restore failed: said in the next cell's warnings.
    restore_failed: Option<String>,
    /// What each cell changed: what a restore from an older checkpoint cannot bring back.
    ledger: Ledger,
    /// The task log, and this session's id (a `--resume` reads earlier sessions' changes).
    log_file: std::path::PathBuf,
    session_id: String,
    /// The task's workspace for clients' files (or why it cannot be used).
    files: Result<Arc<flowrepl_files::Workspace>, String>,
    /// The largest file `download_file` answers on the JSON-RPC front: one message, as base64
    /// within the longest request line (`--max-request-bytes`).
    max_download_bytes: u64,
    /// The task's package installer.
    packages: crate::packages::Packages,
    /// Whose records the installs write, and whether they are written.
    identity: Identity,
    logging: bool,
}

/// The task's workspace for clients' files, recording into the task log (unless `--no-log`).
fn open_files(config: &Config) -> Result<Arc<flowrepl_files::Workspace>, String> {
    let id = &config.identity;
    let recorder = config.logging.then(|| {
        Arc::new(flowrepl_files::Recorder::new(
            config.log_file.clone(),
            &id.plan_id,
            &id.task_id,
            id.task_name.as_deref(),
            &id.session_id,
        ))
    });
    flowrepl_files::Workspace::open(
        &config.workspace,
        flowrepl_task_logger::path::log_dir_of(&config.log_file),
        config.file_limits,
        recorder,
        config
            .store
            .is_some()
            .then(|| flowrepl_task_logger::path::workspace_marker(&config.log_file)),
    )
    .map(Arc::new)
    .map_err(|e| format!("the task's workspace {}: {e}", config.workspace.display()))
}

/// A refused or failed file operation as a JSON-RPC error.
pub fn file_error(e: &flowrepl_files::FileError) -> RpcError {
    use flowrepl_files::Kind;
    let code = match e.kind() {
        Kind::BadRequest => ErrorCode::InvalidParams,
        Kind::Internal | Kind::Unsupported => ErrorCode::InternalError,
        _ => ErrorCode::FileRefused,
    };
    RpcError::new(code, e.to_string())
}

impl Session {
    /// A session around a started engine.
    pub fn new(
        engine: Box<dyn Engine>,
        config: &Config,
        approvals: Arc<Approvals>,
        store: Option<Arc<flowrepl_store::mirror::Mirror>>,
        packages: crate::packages::Packages,
    ) -> io::Result<Session> {
        let mode = engine.mode();
        let records = RecordWriter::start(
            config.logging.then(|| config.log_file.clone()),
            config.identity.clone(),
        )?;
        let Identity {
            plan_id,
            task_id,
            task_name,
            session_id,
        } = config.identity.clone();
        let board = Arc::new(StatusBoard {
            template: StatusInfo {
                message: None,
                kernel_version: env!("CARGO_PKG_VERSION").to_owned(),
                python: engine.python(),
                python_source: config.python_source.as_str().to_owned(),
                mode,
                pid: std::process::id(),
                worker_pid: None,
                execution_count: 0,
                busy: false,
                plan_id,
                task_id,
                task_name,
                session_id,
                log_file: config.log_file.display().to_string(),
                default_timeout_ms: config.default_timeout_ms,
                checkpoint: None,
                sandbox: engine.sandbox(),
                store: None,
            },
            executions: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            limits: config.session_limits(),
            front: config.front(),
            started: Instant::now(),
            ended: std::sync::atomic::AtomicBool::new(false),
            identity: config.identity.clone(),
            settled: AtomicU64::new(0),
            control: engine.control(),
            flusher: records.flusher(),
            store,
        });
        board
            .flusher
            .write_session(&board.session_record("start", None));
        Ok(Session {
            engine,
            records,
            board,
            default_timeout_ms: config.default_timeout_ms,
            kill_grace: config.kill_grace,
            record_this: false,
            contexts: Vec::new(),
            approvals,
            checkpoint_root: config.checkpoint_root.clone(),
            restore_failed: None,
            ledger: Ledger::new(&config.identity.session_id),
            log_file: config.log_file.clone(),
            session_id: config.identity.session_id.clone(),
            files: open_files(config),
            packages,
            identity: config.identity.clone(),
            logging: config.logging,
            max_download_bytes: (config.max_request_bytes as u64 / 4 * 3)
                .min(config.file_limits.max_file_bytes),
            store_sync: config.store.as_ref().is_some_and(|s| s.sync),
            checkpoint_policy: config
                .checkpoints
                .as_ref()
                .map_or(CheckpointPolicy::Off, |s| s.policy),
        })
    }

    /// What `status` says, for the threads that answer it while a cell runs.
    pub fn board(&self) -> Arc<StatusBoard> {
        Arc::clone(&self.board)
    }

    /// The task's workspace for clients' files, or why it cannot be used.
    pub fn files(&self) -> Result<Arc<flowrepl_files::Workspace>, String> {
        self.files.clone()
    }

    /// The last line of the running install's output (`None`: packages are off or unusable).
    pub fn install_progress(&self) -> Option<Arc<std::sync::Mutex<String>>> {
        match &self.packages {
            Some(Ok(i)) => Some(i.progress()),
            _ => None,
        }
    }

    /// The cells' approval requests.
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.approvals
    }

    /// In-process or worker.
    pub fn mode(&self) -> Mode {
        self.board.status_mode()
    }

    /// After SIGINT, how long a cell has to stop.
    pub fn kill_grace(&self) -> Duration {
        self.kill_grace
    }

    /// Runs `call` and answers it through `to`; a cell's record is queued after its answer.
    /// Fails only when the front cannot answer.
    pub fn dispatch(&mut self, call: Call, to: &mut impl Responder) -> io::Result<Flow> {
        if let Some(why) = self.board.fenced() {
            // Nothing this kernel does would reach the store, and the task is another's now.
            to.failed(RpcError::new(
                ErrorCode::InternalError,
                format!("{why}; the call was not run"),
            ))?;
            return Ok(Flow::Shutdown);
        }
        let executes = matches!(call, Call::Execute(..));
        if let (true, Some(m)) = (executes, &self.board.store) {
            // Before the lease check: an idle holder must not park its lease under a cell.
            m.set_busy(true);
        }
        if needs_lease(&call) {
            // No cell runs, and no state changes, on a lease that is not good by this
            // kernel's clock: renewed first, or the call is refused and nothing runs.
            if let Err(lost) = self.board.ensure_lease() {
                if let (true, Some(m)) = (executes, &self.board.store) {
                    m.set_busy(false);
                }
                tracing::warn!("{}", lost.why);
                to.failed(RpcError::new(
                    ErrorCode::InternalError,
                    format!("{}; the call was not run", lost.why),
                ))?;
                return Ok(if lost.fenced {
                    Flow::Shutdown
                } else {
                    Flow::Continue
                });
            }
        }
        match call {
            Call::Execute(params, _) => {
                let store = self.board.store.clone();
                to.cell_starts();
                let (mut result, images) = self.execute(&params);
                // Before the answer: the cell ran on a lease that may have ended meanwhile
                // (this kernel paused, the store away). Its answer is not a success unless a
                // renewal still finds this kernel the holder.
                let lost = self.board.ensure_lease().err();
                let mut flow = Flow::Continue;
                let replied = if to.cell_ended() {
                    result.report.warnings.push(
                        "the request was answered with CellNotStopped before the cell ended; this is the cell's real result".into(),
                    );
                    Ok(())
                } else if let Some(lost) = lost {
                    let why = format!(
                        "{}; the cell ran here (execution_count {}) but this kernel may no longer hold its task: its effects and output are not in the task's store, only in this kernel's log",
                        lost.why, result.execution_count
                    );
                    tracing::warn!("{why}");
                    result.report.warnings.push(why.clone());
                    if lost.fenced {
                        flow = Flow::Shutdown;
                    }
                    to.failed(RpcError::new(ErrorCode::InternalError, why))
                } else if let (true, Some(m)) = (self.store_sync, &store) {
                    // --store-sync: the record in the store before the answer; with
                    // every-cell checkpoints, the cell's checkpoint too (written now, every
                    // name, rather than before the next cell).
                    let with_state = self.checkpoint_policy == CheckpointPolicy::EveryCell;
                    if with_state {
                        if let Err(e) = self
                            .engine
                            .checkpoint(flowrepl_protocol::checkpoint::AUTO_CHECKPOINT)
                        {
                            result.report.warnings.push(format!(
                                "--store-sync: the cell's checkpoint could not be written before its answer: {e}"
                            ));
                        }
                    }
                    self.record(params.clone(), result.clone());
                    self.board.flusher.flush();
                    let upto = std::fs::metadata(&self.log_file).map_or(0, |m| m.len());
                    match m.sync(upto, with_state, SYNC_WITHIN) {
                        Ok(()) => {
                            if let Some(m) = &store {
                                m.set_busy(false);
                            }
                            return to.executed(&mut result, images).map(|()| Flow::Continue);
                        }
                        Err(e) => {
                            let why = format!(
                                "the cell ran (execution_count {}, success: {}; its record is in this kernel's log) but its record could not be put in the store (--store-sync): {e}",
                                result.execution_count, result.success
                            );
                            tracing::warn!("{why}");
                            if let Some(m) = &store {
                                m.set_busy(false);
                            }
                            to.failed(RpcError::new(ErrorCode::InternalError, why))?;
                            return Ok(if self.board.fenced().is_some() {
                                Flow::Shutdown
                            } else {
                                Flow::Continue
                            });
                        }
                    }
                } else {
                    to.executed(&mut result, images)
                };
                if let Some(m) = &store {
                    m.set_busy(false);
                }
                // Logged even when the reply could not be written (the client went away).
                self.record(params, result);
                replied?;
                if flow == Flow::Shutdown {
                    return Ok(flow);
                }
            }
            Call::Status => {
                self.engine.refresh_checkpoint_health();
                to.answer(Answer::Status(Box::new(self.board.status(false))))?
            }
            Call::Interrupt => {
                // Calls are answered between cells here: there is nothing to interrupt.
                let interrupted = self.board.control.interrupt();
                to.answer(Answer::Interrupt(InterruptReply { interrupted }))?
            }
            Call::Restart(p) => match self.engine.restart(p.restore) {
                Ok(mut r) => {
                    match &mut r.restored {
                        Some(restored) => {
                            self.tell_the_whole_truth(restored);
                            r.state_lost = !restored.complete();
                            r.message = crate::engine::restored_message(restored);
                        }
                        // An emptied namespace: nothing before it can be restored.
                        None => self.ledger.forget(),
                    }
                    tracing::info!(pid = r.pid, restored = r.restored.is_some(), "restarted");
                    to.answer(Answer::Restart(r))?
                }
                Err(e) => to.failed(checkpoint_error("restart failed", &e))?,
            },
            Call::Checkpoint(p) => match self.engine.checkpoint(p.name()) {
                Ok(s) => to.answer(Answer::Checkpoint(s))?,
                Err(e) => to.failed(checkpoint_error("checkpoint failed", &e))?,
            },
            Call::Restore(p) => match self.engine.restore(p.name()) {
                Ok(mut r) => {
                    self.tell_the_whole_truth(&mut r);
                    tracing::info!(checkpoint = %r.checkpoint, restored = r.restored_vars.len(), lost = r.lost_vars.len(), "restored");
                    to.answer(Answer::Restore(r))?
                }
                Err(e) => to.failed(checkpoint_error("restore failed", &e))?,
            },
            Call::Checkpoints => match self.list_checkpoints() {
                Ok(checkpoints) => to.answer(Answer::Checkpoints(CheckpointsReply {
                    checkpoints,
                    directory: self.checkpoint_root.display().to_string(),
                    policy: self.checkpoint_policy.as_str().to_owned(),
                    health: self.board.control.checkpoint_health(),
                }))?,
                Err(e) => to.failed(RpcError::new(
                    ErrorCode::InternalError,
                    format!("checkpoints: {e}"),
                ))?,
            },
            Call::ListVariables => match self.list_variables() {
                Ok(v) => to.answer(Answer::Variables(VariablesReply::new(v)))?,
                Err(e) => to.failed(internal("list_variables failed", &e))?,
            },
            Call::Approve(params) => {
                // Between cells nobody waits: answered for the record, not accepted.
                let accepted = self.approvals.answer(params.into_answer());
                to.answer(Answer::Approve(ApproveReply { accepted }))?
            }
            Call::UploadFile(_)
            | Call::DownloadFile(_)
            | Call::ListFiles(_)
            | Call::DeleteFile(_) => match self.file_call(call) {
                Ok(answer) => to.answer(answer)?,
                Err(e) => to.failed(e)?,
            },
            Call::Install(p) => {
                // Answered in its turn, but like a cell it leaves the front answering
                // `status` (busy), `interrupt` and `approve` at once while it runs.
                to.cell_starts();
                let result = self.install(&p.packages);
                to.cell_ended();
                match result {
                    Ok(reply) => to.answer(Answer::Installed(reply))?,
                    Err(e) => to.failed(e)?,
                }
            }
            Call::Shutdown => {
                to.answer(Answer::Shutdown(ShutdownReply {
                    shutting_down: true,
                }))?;
                return Ok(Flow::Shutdown);
            }
        }
        Ok(Flow::Continue)
    }

    /// `install`: the packages into the task's layer, then the engine takes the layer in (its
    /// new `.pth` files, fresh import caches) and says which replaced modules are imported.
    fn install(
        &mut self,
        packages: &[String],
    ) -> Result<flowrepl_protocol::packages::InstallReply, RpcError> {
        let started = Instant::now();
        let installer = match &self.packages {
            None => {
                return Err(RpcError::new(
                    ErrorCode::PackagesRefused,
                    flowrepl_packages::InstallError::Off.to_string(),
                ))
            }
            Some(Err(why)) => return Err(RpcError::new(ErrorCode::InternalError, why.clone())),
            Some(Ok(i)) => i,
        };
        let result = installer.install(packages);
        let restart_needed = match &result {
            Ok(i) => self.engine.layer_changed(&i.modules).unwrap_or_else(|e| {
                tracing::warn!(error = %flowrepl_os::chain(&e), "the engine did not take the package layer in");
                Vec::new()
            }),
            Err(_) => Vec::new(),
        };
        if self.logging {
            installer.record(
                &self.log_file,
                crate::packages::who(&self.identity),
                flowrepl_packages::Trigger::Call,
                packages,
                &result,
                &restart_needed,
                started.elapsed(),
            );
        }
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok(i) => Ok(crate::packages::reply(
                installer,
                i,
                restart_needed,
                self.mode(),
                elapsed_ms,
            )),
            Err(e) => Err(RpcError::new(
                if e.is_refusal() {
                    ErrorCode::PackagesRefused
                } else {
                    ErrorCode::InternalError
                },
                e.to_string(),
            )),
        }
    }

    /// A file operation of the JSON-RPC front.
    fn file_call(&self, call: Call) -> Result<Answer, RpcError> {
        use flowrepl_files::Via;
        let files = self
            .files
            .as_ref()
            .map_err(|why| RpcError::new(ErrorCode::InternalError, why.clone()))?;
        let max = self.max_download_bytes;
        let answer = match call {
            Call::UploadFile(p) => files.upload_params(&p, Via::JsonRpc).map(Answer::Uploaded),
            Call::DownloadFile(p) => files
                .download_params(&p.path, max, Via::JsonRpc)
                .map(Answer::Downloaded),
            Call::ListFiles(p) => files.list(&p).map(Answer::Listing),
            Call::DeleteFile(p) => files.delete(&p.path, Via::JsonRpc).map(Answer::Deleted),
            _ => unreachable!("only file calls come here"),
        };
        answer.map_err(|e| file_error(&e))
    }

    /// Runs a cell and returns its result and images; hand the result to
    /// [`Session::record`] after replying. Never fails: errors of the cell are in the result,
    /// failures of the log in `warnings`.
    fn execute(&mut self, params: &ExecuteParams) -> (ExecuteResult, Vec<Image>) {
        let execution_count = self.board.executions.fetch_add(1, Ordering::Relaxed) + 1;
        let timestamp = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        let timeout = Duration::from_millis(params.timeout_ms.unwrap_or(self.default_timeout_ms));
        let started = Instant::now();
        let run = self.engine.run(&params.code, timeout, execution_count);
        if let Ok(files) = &self.files {
            // The cell may have written the workspace: the next upload's cap looks again.
            files.cell_ran();
        }
        let restored = match self.engine.take_restored() {
            Some(Ok(mut r)) => {
                self.tell_the_whole_truth(&mut r);
                Some(r)
            }
            Some(Err(e)) => {
                self.restore_failed = Some(e);
                None
            }
            None => None,
        };
        let elapsed_ms = (started.elapsed().as_micros() as f64) / 1000.0;
        let mut o = run.outcome;
        o.report.debug_info.elapsed_ms = elapsed_ms;
        self.contexts = std::mem::take(&mut o.contexts);
        let events = crate::events::assemble(o.events, &o.stdout, &mut o.report.warnings);
        let mut result = ExecuteResult {
            success: o.report.error.is_none(),
            stdout: o.stdout,
            stderr: o.stderr,
            images: o.images.iter().map(|i| i.info.clone()).collect(),
            report: o.report,
            execution_count,
            elapsed_ms,
            mode: self.mode(),
            stopped_by: run.stopped_by,
            timestamp,
            state_lost: run.state_lost,
            events,
            restored,
        };
        if let Some(r) = &result.restored {
            // The state is lost only as far as the checkpoint could not bring it back.
            result.state_lost |= !r.complete();
        }
        if let Some(e) = self.restore_failed.take() {
            result.report.warnings.push(format!(
                "the session was to start from the last checkpoint, but it could not be restored: {e}"
            ));
        }
        while let Some(w) = self
            .board
            .store
            .as_ref()
            .and_then(|m| m.health().take_warning())
        {
            result.report.warnings.push(w);
        }
        self.ledger.note(execution_count, &result.report);
        self.record_this = self.records.check(&mut result.report.warnings);
        if !result.success {
            self.board.failures.fetch_add(1, Ordering::Relaxed);
        }
        (result, o.images)
    }

    /// A restore the engine did (after a crash, `--resume`, `restart {restore}`): adds the
    /// names changed after the checkpoint to its `lost_vars`, from this session's diffs or,
    /// for a checkpoint of an earlier kernel, from the task log. The namespace is the
    /// checkpoint's from now on.
    fn tell_the_whole_truth(&mut self, r: &mut RestoreReport) {
        match r.checkpoint_session_id.as_deref() {
            Some(s) if s != self.session_id => {
                Ledger::amend_from_log(r, &self.log_file, &self.session_id)
            }
            _ => self.ledger.amend(r),
        }
        self.ledger.forget();
    }

    /// The task's checkpoints on disk, after asking the engine how the automatic one is doing.
    fn list_checkpoints(
        &mut self,
    ) -> Result<Vec<flowrepl_protocol::CheckpointInfo>, flowrepl_task_logger::checkpoint::FolderError>
    {
        self.engine.refresh_checkpoint_health();
        flowrepl_task_logger::checkpoint::list(&self.checkpoint_root)
    }

    /// `list_variables`: the namespace's names with type, short repr and size. Between cells.
    pub fn list_variables(&mut self) -> Result<Vec<VariableInfo>, EngineError> {
        self.engine.list_variables()
    }

    /// Queues the record of the cell just answered (see [`crate::records`]).
    fn record(&mut self, params: ExecuteParams, result: ExecuteResult) {
        let contexts = std::mem::take(&mut self.contexts);
        if std::mem::take(&mut self.record_this) {
            self.records.submit(params, result, contexts);
        }
        self.board.settled.fetch_add(1, Ordering::Release);
    }

    /// The session ends for `reason` (`eof`, `shutdown`, `error`): the cells' exit handlers
    /// run (see [`Engine::finish`]), then every pending record is written, then the session's
    /// end record. Returns how many records were written.
    pub fn finish(&mut self, reason: &'static str) -> u64 {
        self.engine.finish();
        self.records.flush();
        self.board.end_session(reason);
        self.records.written()
    }
}

/// A failed `restart`, `checkpoint` or `restore`: a bad or unknown checkpoint name is the
/// caller's (-32602), anything else the kernel's (-32603).
fn checkpoint_error(what: &str, e: &EngineError) -> RpcError {
    use flowrepl_exec::setup::CheckpointError;
    use flowrepl_task_logger::checkpoint::FolderError;
    match e {
        EngineError::Checkpoint(CheckpointError::Folder(
            FolderError::BadName(_) | FolderError::Missing(_),
        )) => RpcError::new(ErrorCode::InvalidParams, format!("{what}: {e}")),
        _ => internal(what, e),
    }
}

fn internal(what: &str, e: &EngineError) -> RpcError {
    RpcError::new(
        ErrorCode::InternalError,
        format!("{what}: {}", flowrepl_os::chain(e)),
    )
}

/// How long the running cell has ignored SIGINT, once that is longer than `grace`: it cannot
/// be stopped (in-process; worker mode kills such cells and never reports one).
pub fn unstoppable_for(control: &dyn Control, grace: Duration) -> Option<Duration> {
    let waited = control.unstoppable_since()?.elapsed();
    (waited >= grace).then_some(waited)
}

/// The `CellNotStopped` answer: for the stuck cell's own call (`ran`), or for a call queued
/// behind it that will not run.
pub fn not_stopped(mode: Mode, grace: Duration, ran: bool) -> CellReport {
    let ms = grace.as_millis();
    let message = if ran {
        format!(
            "the cell did not stop within {ms} ms of SIGINT: it ignores SIGINT or is blocked in a call that never checks for signals. In-process mode cannot kill it without killing the kernel, so it may still be running: `status` says busy, other requests wait until it ends, and its real result goes to the task log. Run with USE_SUBPROCESS_WORKER=1 to make such cells killable."
        )
    } else {
        format!(
            "this code did not run. The previous cell was sent KeyboardInterrupt more than {ms} ms ago and is still running: it ignores SIGINT or is blocked in a call that never checks for signals. In-process mode cannot kill it; later calls wait until it ends (its result goes to the task log). Restart the server with worker mode (USE_SUBPROCESS_WORKER=1) to make such cells killable."
        )
    };
    Fault::CellNotStopped.report(mode, message)
}
