//! One task's kernel: a `flowrepl mcp` child process, spoken to in MCP on its stdio.
//!
//! The child is the same kernel a task backend would start for the task (its `FLOW_*`
//! variables, its log, checkpoints and context, `--resume`), so each tool, its result shape,
//! `read_output`, progress and approvals are implemented once, in [`crate::mcp`]; this
//! module only relays. Requests get ids of this connection; the reader task routes
//! - responses to the call waiting for them;
//! - `notifications/progress` to the client whose call gave the progress token (each call's
//!   token is replaced by one of this connection, and mapped back);
//! - `elicitation/create` (a cell's `flow.request_approval`) to the client of the latest
//!   `execute_code` call, when it declared elicitation (else the cell's approval is
//!   cancelled), and its answer back;
//! - `ping` answered at once.
//!
//! The child ends when its stdin closes (its running cell is interrupted, every record is
//! written); [`Child::stop`] checkpoints it first.

use crate::lines::{BoundedLines, Line};
use crate::mcp::approval::{Asking, LatestAsking};
use crate::mcp::tools;
use flowrepl_os::lock;
use rmcp::model::{
    CallToolResponse, CallToolResult, ElicitRequestParams, InputRequests, InputRequiredResult,
    InputResponses, ProgressNotificationParam, ProgressToken, ResultType,
};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// How long a child has to answer `initialize` (its Python starts first).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The protocol version asked of the child.
const PROTOCOL_VERSION: &str = "2025-06-18";

/// A task: its plan and task ids (as given; paths use their safe forms).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TaskKey {
    /// The plan id.
    pub plan: String,
    /// The task id.
    pub task: String,
}

/// How to start a child.
#[derive(Debug, Clone)]
pub struct Spawn {
    /// `flowrepl`.
    pub exe: std::path::PathBuf,
    /// Flags for every child, before the task's own.
    pub args: Vec<std::ffi::OsString>,
    /// `<workspace-root>`; a task's workspace is `<root>/<safe plan>/<safe task>`.
    pub workspace_root: std::path::PathBuf,
    /// The workers' `--sandbox` level: `on`, `strict` or `off`.
    pub sandbox: &'static str,
    /// Each kernel's `--keep-output-mb`: its share of the server's.
    pub keep_output_mb: u64,
    /// The longest message a kernel may send (`FLOWREPL_MAX_REQUEST_BYTES`, as for the
    /// server's clients): a longer one is dropped and the call it answers gets an error.
    pub max_message_bytes: usize,
}

impl Spawn {
    /// Whether the kernels' workers are sandboxed.
    pub fn sandboxed(&self) -> bool {
        self.sandbox != "off"
    }

    /// `sandboxed` or `worker`: how the kernels run cells (always in a worker, which a
    /// sandbox implies).
    pub fn mode(&self) -> &'static str {
        if self.sandboxed() {
            "sandboxed"
        } else {
            "worker"
        }
    }
}

/// Why a child could not be started or spoken to.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The process did not start.
    #[error("cannot start the task's kernel: {0}")]
    Spawn(#[source] std::io::Error),
    /// Its workspace cannot be made.
    #[error("cannot make the task's workspace {path}: {source}")]
    Workspace {
        /// The folder.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It exited (or closed its stdout): when, and what it said last.
    #[error("the task's kernel exited{0}")]
    Exited(String),
    /// It did not answer `initialize` in time.
    #[error("the task's kernel did not start within {0:?}")]
    StartTimeout(Duration),
    /// It answered with a JSON-RPC error.
    #[error("{0}")]
    Rpc(String),
}

/// A progress token of a forwarded call, and whose it is.
struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
}

/// A running child.
pub struct Child {
    /// Its task.
    pub key: TaskKey,
    /// Its process id.
    pub pid: u32,
    /// Its workspace.
    pub workspace: std::path::PathBuf,
    /// When it started.
    pub started: Instant,
    /// `None` once closed (the child then ends).
    stdin: tokio::sync::Mutex<Option<tokio::process::ChildStdin>>,
    process: Mutex<Option<tokio::process::Child>>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Value>>>,
    progress: Mutex<HashMap<String, Progress>>,
    asker: Mutex<Option<Peer<RoleServer>>>,
    /// How the client of the latest `execute_code` can be asked for approvals.
    asking: LatestAsking,
    /// The kernel's elicitation requests waiting for such a client, by key (`e<request id>`),
    /// with where their answer goes.
    inbox: Mutex<std::collections::BTreeMap<String, (ElicitRequestParams, Answer)>>,
    /// Bumped when a request comes into `inbox`.
    inbox_changed: tokio::sync::watch::Sender<u64>,
    /// Calls answered with `inputRequests`, waiting for the client's next round.
    parked_calls: super::relay::ParkedCalls,
    next_id: AtomicU64,
    /// Calls in flight.
    in_flight: AtomicU32,
    /// `execute_code` calls answered.
    cells: AtomicU64,
    last_use: Mutex<Instant>,
    /// Set when its stdout ends (it exited or is exiting).
    ended: CancellationToken,
    stopping: AtomicBool,
    /// The last lines it wrote to stderr (passed on to the server's), for errors.
    last_words: Mutex<std::collections::VecDeque<String>>,
}

/// Lines of a kernel's stderr kept for its error messages.
const LAST_WORDS: usize = 8;

/// The longest line of a kernel's stderr passed on (a longer one is named, not shown).
const MAX_STDERR_LINE: usize = 64 << 10;

/// Where the answer to the kernel's elicitation request goes.
type Answer = oneshot::Sender<Result<Value, (i64, String)>>;

/// How a call is relayed.
#[derive(Debug, Default)]
pub struct Relay {
    /// How its client can be asked for approvals.
    pub asking: Asking,
    /// The call sent again: its `requestState` (see [`super::relay`]) and the client's
    /// `inputResponses`.
    pub resume: Option<(String, InputResponses)>,
}

/// Marks a call in flight for as long as it lives.
struct InFlight<'a>(&'a Child);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        *lock(&self.0.last_use) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Child {
    /// Starts the task's kernel and completes the MCP handshake.
    pub async fn start(key: TaskKey, spawn: &Spawn) -> Result<Arc<Child>, ChildError> {
        let workspace = spawn
            .workspace_root
            .join(flowrepl_task_logger::path::safe_component(&key.plan))
            .join(flowrepl_task_logger::path::safe_component(&key.task));
        std::fs::create_dir_all(&workspace)
            .and_then(|()| {
                std::fs::set_permissions(
                    &workspace,
                    std::os::unix::fs::PermissionsExt::from_mode(0o700),
                )
            })
            .map_err(|source| ChildError::Workspace {
                path: workspace.clone(),
                source,
            })?;
        let mut cmd = tokio::process::Command::new(&spawn.exe);
        cmd.arg("mcp")
            .args(&spawn.args)
            .arg("--resume")
            .arg(format!("--sandbox={}", spawn.sandbox))
            // Unsandboxed too, cells run in a worker: a crash, a limit or a kill takes the
            // worker, never the kernel that keeps the task's log.
            .arg("--worker")
            .arg("--workspace")
            .arg(&workspace)
            .arg(format!("--keep-output-mb={}", spawn.keep_output_mb))
            .env(flowrepl_task_logger::path::PLAN_ID_ENV, &key.plan)
            .env(flowrepl_task_logger::path::TASK_ID_ENV, &key.task)
            .env(flowrepl_task_logger::path::TASK_NAME_ENV, &key.task)
            // The server's token is not the cells' (without the sandbox they would see the
            // kernel's environment): it would let a cell call any task's kernel.
            .env_remove(super::auth::TOKEN_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; it arms SIGTERM for when this server dies, so
        // that no kernel outlives it (SIGTERM: the kernel writes every record first).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut process = cmd.spawn().map_err(ChildError::Spawn)?;
        let pid = process.id().unwrap_or(0);
        let stdin = process.stdin.take().expect("piped stdin");
        let stdout = process.stdout.take().expect("piped stdout");
        let stderr = process.stderr.take().expect("piped stderr");
        let child = Arc::new(Child {
            key,
            pid,
            workspace,
            started: Instant::now(),
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            process: Mutex::new(Some(process)),
            pending: Mutex::new(HashMap::new()),
            progress: Mutex::new(HashMap::new()),
            asker: Mutex::new(None),
            asking: LatestAsking::default(),
            inbox: Mutex::default(),
            inbox_changed: tokio::sync::watch::channel(0).0,
            parked_calls: Default::default(),
            next_id: AtomicU64::new(1),
            in_flight: AtomicU32::new(0),
            cells: AtomicU64::new(0),
            last_use: Mutex::new(Instant::now()),
            ended: CancellationToken::new(),
            stopping: AtomicBool::new(false),
            last_words: Mutex::new(std::collections::VecDeque::new()),
        });
        let diagnostics = tokio::spawn(pass_on_stderr(Arc::clone(&child), stderr));
        let lines = BoundedLines::new(stdout, spawn.max_message_bytes);
        tokio::spawn(read_loop(Arc::clone(&child), lines, diagnostics));
        let init = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "flowrepl-serve", "version": env!("CARGO_PKG_VERSION")},
        });
        let initialized = tokio::time::timeout(START_TIMEOUT, child.request("initialize", init))
            .await
            .map_err(|_| ChildError::StartTimeout(START_TIMEOUT));
        if let Ok(Err(e)) | Err(e) = initialized {
            child.kill().await;
            return Err(e);
        }
        child
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(child)
    }

    /// Whether it has ended (its stdout closed).
    pub fn ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Calls in flight.
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// When it last finished a call (or started).
    pub fn last_use(&self) -> Instant {
        *lock(&self.last_use)
    }

    /// Marks it used now.
    pub fn touch(&self) {
        *lock(&self.last_use) = Instant::now();
    }

    /// `execute_code` calls answered.
    pub fn cells(&self) -> u64 {
        self.cells.load(Ordering::Relaxed)
    }

    /// Calls tool `name` with `arguments`; progress goes to `peer` under `progress` (the
    /// client's token), a cancelled `ct` cancels the call in the child. `how.asks`: the
    /// client answers approvals in this call's answer (a 2026-07-28 client that declared
    /// elicitation): an approval the kernel asks meanwhile ends the call with an
    /// `InputRequiredResult`, and `how.resume` (the call sent again with `requestState` and
    /// `inputResponses`) answers it and goes on waiting for the same reply.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: serde_json::Map<String, Value>,
        progress: Option<ProgressToken>,
        peer: &Peer<RoleServer>,
        ct: &CancellationToken,
        how: Relay,
    ) -> Result<CallToolResponse, ErrorData> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let _in_flight = InFlight(self);
        if name == tools::EXECUTE_CODE {
            *lock(&self.asker) = Some(peer.clone());
            self.asking.set(how.asking);
        }
        let asks = how.asking == Asking::InAnswers;
        let mut inbox = self.inbox_changed.subscribe();
        let (id, mut rx, mapped, sent) = match how.resume {
            Some((state, responses)) => {
                let (call, rx) = self.parked_calls.take(&state, name)?;
                self.deliver(responses);
                (call, rx, None, Ok(()))
            }
            None => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let mut params = json!({"name": name, "arguments": arguments});
                let mapped = progress.map(|token| {
                    let ours = format!("p{id}");
                    lock(&self.progress).insert(
                        ours.clone(),
                        Progress {
                            peer: peer.clone(),
                            token,
                        },
                    );
                    params["_meta"] = json!({"progressToken": ours});
                    ours
                });
                let rx = self.register(id);
                let sent = self
                    .send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
                    .await;
                (id, rx, mapped, sent)
            }
        };
        // Err(Some(_)): the kernel is gone; Err(None): the client cancelled.
        let outcome = match sent {
            Err(e) => Err(Some(e)),
            Ok(()) => loop {
                if asks {
                    if let Some(requests) = self.inbox_requests() {
                        if let Some(ours) = &mapped {
                            lock(&self.progress).remove(ours);
                        }
                        let state = self.parked_calls.park(id, name, rx).map_err(|e| {
                            ErrorData::internal_error(format!("no random state: {e}"), None)
                        })?;
                        return Ok(InputRequiredResult::new(Some(requests), Some(state)).into());
                    }
                }
                tokio::select! {
                    r = &mut rx => break r.map_err(|_| Some(self.exited("during the call"))),
                    _ = inbox.changed(), if asks => {}
                    _ = ct.cancelled() => {
                        let _ = self
                            .send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                "params": {"requestId": id, "reason": "cancelled by the client"}}))
                            .await;
                        lock(&self.pending).remove(&id);
                        break Err(None);
                    }
                }
            },
        };
        if let Some(ours) = mapped {
            lock(&self.progress).remove(&ours);
        }
        let mut reply = match outcome {
            Ok(r) => r,
            // A result the model reads (isError), not a protocol error.
            Err(Some(gone)) => {
                return Ok(
                    CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
                        "{gone}; the task's next call starts it again from its last checkpoint"
                    ))])
                    .into(),
                )
            }
            Err(None) => return Err(ErrorData::internal_error("cancelled by the client", None)),
        };
        if let Some(e) = reply.get("error") {
            let code = e["code"].as_i64().unwrap_or(-32603) as i32;
            let message = e["message"].as_str().unwrap_or("error").to_owned();
            return Err(ErrorData::new(
                rmcp::model::ErrorCode(code),
                message,
                e.get("data").cloned(),
            ));
        }
        if name == tools::EXECUTE_CODE {
            self.cells.fetch_add(1, Ordering::Relaxed);
        }
        let mut result: CallToolResult =
            serde_json::from_value(reply["result"].take()).map_err(|e| {
                ErrorData::internal_error(
                    format!("the kernel's result is not a tool result: {e}"),
                    None,
                )
            })?;
        // The kernel speaks the handshake-era protocol to us, whose results carry no
        // `resultType`; 2026-07-28 clients require it.
        result.result_type.get_or_insert(ResultType::COMPLETE);
        Ok(result.into())
    }

    /// Notified when an approval for a 2026-07-28 client comes in.
    pub fn inbox_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inbox_changed.subscribe()
    }

    /// The approvals waiting for a 2026-07-28 client, as `inputRequests` (none: `None`).
    pub fn inbox_requests(&self) -> Option<InputRequests> {
        let inbox = lock(&self.inbox);
        crate::mcp::approval::input_requests(inbox.iter().map(|(key, (params, _))| (key, params)))
    }

    /// Answers the kernel's elicitation requests that `responses` name (others are ignored,
    /// as SEP-2322 asks).
    pub fn deliver(&self, responses: InputResponses) {
        for (key, value) in responses {
            if let Some((_, tx)) = lock(&self.inbox).remove(&key) {
                let _ = tx.send(Ok(value));
            }
        }
    }

    /// Sends a request and waits for its response message.
    async fn request(&self, method: &str, params: Value) -> Result<Value, ChildError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.register(id);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        let mut reply = rx.await.map_err(|_| self.exited("before it answered"))?;
        match reply.get("error") {
            Some(e) => Err(ChildError::Rpc(e.to_string())),
            None => Ok(reply["result"].take()),
        }
    }

    /// It exited `when`: with what it said last on stderr, when that names an error.
    fn exited(&self, when: &str) -> ChildError {
        let words = lock(&self.last_words);
        let why = words
            .iter()
            .rev()
            .find(|l| l.contains("ERROR") || l.starts_with("flowrepl"))
            .map(|l| format!(": {}", l.trim()))
            .unwrap_or_default();
        ChildError::Exited(format!(" {when}{why}"))
    }

    fn register(&self, id: u64) -> oneshot::Receiver<Value> {
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        rx
    }

    async fn send(&self, message: &Value) -> Result<(), ChildError> {
        let mut line = serde_json::to_vec(message).expect("a JSON value serializes");
        line.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        let Some(stdin) = stdin.as_mut() else {
            return Err(ChildError::Exited(" (it is stopping)".into()));
        };
        stdin
            .write_all(&line)
            .await
            .map_err(|e| ChildError::Exited(format!(" (its stdin: {e})")))
    }

    /// Asks it to start no more cells ([`crate::mcp::DRAIN`]): calls queued behind its
    /// running cell are answered "the server is shutting down" without running.
    pub async fn drain(&self) {
        let drain = json!({"jsonrpc": "2.0", "method": crate::mcp::DRAIN});
        if let Err(e) = self.send(&drain).await {
            tracing::debug!(task = %self.key.task, error = %e, "drain not sent");
        }
    }

    /// Checkpoints it when it is idle and `checkpoint` is asked, closes its stdin (the running
    /// cell, if any, is interrupted; every record is written) and waits up to `grace` plus
    /// 10 s for it to exit, then kills it. Returns the checkpoint's text, if one was taken.
    pub async fn stop(&self, checkpoint: bool, grace: Duration) -> Option<String> {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return None;
        }
        let mut said = None;
        if checkpoint && !self.ended() && !self.busy() {
            said = self.checkpoint(grace).await.ok();
        }
        // Dropping the pipe's end is what closes it.
        drop(self.stdin.lock().await.take());
        let process = lock(&self.process).take();
        if let Some(mut p) = process {
            match tokio::time::timeout(grace + Duration::from_secs(10), p.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(pid = self.pid, task = %self.key.task, "the kernel did not exit: killing it");
                    let _ = p.kill().await;
                }
            }
        }
        said
    }

    /// Asks the kernel for a checkpoint now (at most `grace` + 30 s): what it said, or why it
    /// failed (the kernel's error result, or no answer).
    pub async fn checkpoint(&self, grace: Duration) -> Result<String, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.register(id);
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tools::CHECKPOINT, "arguments": {}}});
        self.send(&call)
            .await
            .map_err(|e| format!("the kernel could not be asked: {e}"))?;
        let mut r = match tokio::time::timeout(grace + Duration::from_secs(30), rx).await {
            Ok(Ok(r)) => r,
            _ => return Err("the kernel did not answer".into()),
        };
        if let Some(e) = r.get("error") {
            return Err(e["message"].as_str().unwrap_or("an error").to_owned());
        }
        let result: CallToolResult = serde_json::from_value(r["result"].take())
            .map_err(|e| format!("the kernel's answer is not a tool result: {e}"))?;
        let text = result
            .content
            .iter()
            .find_map(|c| c.as_text().map(|t| t.text.clone()))
            .unwrap_or_default();
        if result.is_error == Some(true) {
            Err(text)
        } else {
            Ok(text)
        }
    }

    /// Kills it at once (it did not start).
    async fn kill(&self) {
        let process = lock(&self.process).take();
        if let Some(mut p) = process {
            let _ = p.kill().await;
        }
    }

    /// Reaps it if it has exited (a kernel that died by itself).
    pub fn reap(&self) {
        if let Some(p) = lock(&self.process).as_mut() {
            let _ = p.try_wait();
        }
    }
}

/// Passes the kernel's stderr on to the server's, each line after its task, keeping the last
/// ones for error messages.
async fn pass_on_stderr(child: Arc<Child>, stderr: tokio::process::ChildStderr) {
    let mut lines = BoundedLines::new(stderr, MAX_STDERR_LINE);
    while let Ok(Some(line)) = lines.next().await {
        let line = match line {
            Line::Whole(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Line::Over(over) => format!("(a line of {} bytes, not shown)", over.len),
        };
        eprintln!("[{}/{}] {line}", child.key.plan, child.key.task);
        let mut words = lock(&child.last_words);
        if words.len() == LAST_WORDS {
            words.pop_front();
        }
        words.push_back(line);
    }
}

/// Reads the child's messages and routes them (see the module docs). At their end, waits
/// (briefly) for its stderr to end too, so that what it said last is there for the errors.
async fn read_loop(
    child: Arc<Child>,
    mut lines: BoundedLines<tokio::process::ChildStdout>,
    diagnostics: tokio::task::JoinHandle<()>,
) {
    while let Ok(Some(line)) = lines.next().await {
        let line = match line {
            Line::Whole(line) => line,
            Line::Over(over) => {
                let err = over.error(lines.max());
                tracing::warn!(task = %child.key.task, len = over.len, "the kernel sent a message over FLOWREPL_MAX_REQUEST_BYTES: dropped");
                let id = err.id.as_ref().and_then(|id| serde_json::to_value(id).ok());
                let waiting = id
                    .and_then(|id| id.as_u64())
                    .and_then(|id| lock(&child.pending).remove(&id));
                if let Some(tx) = waiting {
                    let message = format!(
                        "the kernel's reply was {} bytes, over FLOWREPL_MAX_REQUEST_BYTES ({})",
                        over.len,
                        lines.max()
                    );
                    let _ = tx.send(
                        json!({"jsonrpc": "2.0", "error": {"code": -32603, "message": message}}),
                    );
                }
                continue;
            }
        };
        let Ok(msg) = serde_json::from_slice::<Value>(&line) else {
            tracing::warn!(task = %child.key.task, "the kernel sent a line that is not JSON");
            continue;
        };
        let method = msg.get("method").and_then(Value::as_str);
        match (method, msg.get("id")) {
            (None, Some(id)) => {
                let waiting = id.as_u64().and_then(|id| lock(&child.pending).remove(&id));
                if let Some(tx) = waiting {
                    let _ = tx.send(msg);
                }
            }
            (Some("notifications/progress"), None) => forward_progress(&child, &msg["params"]),
            (Some("notifications/cancelled"), None) => {
                // The cell stopped waiting for an approval: withdraw it.
                let key = elicitation_key(&msg["params"]["requestId"]);
                lock(&child.inbox).remove(&key);
            }
            (Some(_), None) | (None, None) => {}
            (Some(method), Some(id)) => {
                let child = Arc::clone(&child);
                let (method, id) = (method.to_owned(), id.clone());
                tokio::spawn(async move { answer(&child, &method, id, msg).await });
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), diagnostics).await;
    child.ended.cancel();
    // Whoever waits gets "exited".
    lock(&child.pending).clear();
    child.reap();
}

fn forward_progress(child: &Child, params: &Value) {
    let Some(ours) = params["progressToken"].as_str() else {
        return;
    };
    let target = lock(&child.progress)
        .get(ours)
        .map(|p| (p.peer.clone(), p.token.clone()));
    let Some((peer, token)) = target else {
        return;
    };
    let mut param =
        ProgressNotificationParam::new(token, params["progress"].as_f64().unwrap_or(0.0));
    if let Some(total) = params["total"].as_f64() {
        param = param.with_total(total);
    }
    if let Some(message) = params["message"].as_str() {
        param = param.with_message(message);
    }
    tokio::spawn(async move {
        let _ = peer.notify_progress(param).await;
    });
}

/// The key of the kernel's elicitation request `id` in `inputRequests`.
fn elicitation_key(id: &Value) -> String {
    format!("e{id}")
}

/// Answers a request from the child.
async fn answer(child: &Child, method: &str, id: Value, msg: Value) {
    let result: Result<Value, (i64, String)> = match method {
        "ping" => Ok(json!({})),
        "elicitation/create" => elicit(child, &elicitation_key(&id), &msg["params"]).await,
        other => Err((-32601, format!("method not found: {other}"))),
    };
    let reply = match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    let _ = child.send(&reply).await;
}

/// A cell's approval, asked of the client of the latest `execute_code` call.
/// `key` names the request in a 2026-07-28 client's `inputRequests`.
async fn elicit(child: &Child, key: &str, params: &Value) -> Result<Value, (i64, String)> {
    let Some(peer) = lock(&child.asker).clone() else {
        return Err((
            -32600,
            "no client has called execute_code: nobody can answer".into(),
        ));
    };
    let params: ElicitRequestParams =
        serde_json::from_value(params.clone()).map_err(|e| (-32602, e.to_string()))?;
    let declared = peer
        .peer_info()
        .is_some_and(|i| i.capabilities.elicitation.is_some());
    match child.asking.get() {
        Asking::Requests if declared => match peer.create_elicitation(params).await {
            Ok(r) => serde_json::to_value(r).map_err(|e| (-32603, e.to_string())),
            Err(e) => Err((-32603, e.to_string())),
        },
        Asking::InAnswers => {
            // A client of a revision without server-to-client requests: it gets the request
            // in the answer of the call waiting for the cell (`inputRequests`).
            let (tx, rx) = oneshot::channel();
            lock(&child.inbox).insert(key.to_owned(), (params, tx));
            child.inbox_changed.send_modify(|n| *n += 1);
            rx.await.unwrap_or_else(|_| {
                Err((
                    -32603,
                    "the request was withdrawn before the client answered".into(),
                ))
            })
        }
        Asking::Requests | Asking::Nobody => Err((
            -32600,
            "the client of this call declared no elicitation: nobody can answer".into(),
        )),
    }
}
