//! One task's kernel: a `flowrepl mcp` child process, spoken to in MCP on its stdio.
//!
//! The child is the same kernel a task backend would start for the task (its `FLOW_*`
//! variables, its log, checkpoints and context, `--resume`), so each tool, its result shape,
//! `read_output`, progress and approvals are implemented once, in [`flowrepl_mcp`]; this
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

//!
//! # Layout
//! - here: the child's start, state and stop;
//! - `call`: a client's tool call relayed, with its progress, cancellation and approvals;
//! - `messages`: the wire to the child: sending requests, and the reader that routes what
//!   the child sends (responses, progress, elicitation) and passes its stderr on.

mod call;
mod messages;

pub use call::Relay;
use messages::{pass_on_stderr, read_loop};

use flowrepl_mcp::approval::LatestAsking;
use flowrepl_mcp::lines::BoundedLines;
use flowrepl_mcp::tools;
use flowrepl_os::lock;
use flowrepl_os::process::{Group, Supervision, Supervisor};
use rmcp::model::{CallToolResult, ElicitRequestParams, ProgressToken};
use rmcp::{Peer, RoleServer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// How long a child has to answer `initialize` (its Python starts first, and a live holder
/// of its task hands it over), besides the time it may wait for its task's lease
/// ([`Spawn::lease_wait`], or the lease the task's holder wrote in the store when that is
/// longer); `FLOWREPL_KERNEL_START_S` sets it.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The variable that sets how long a child has to answer `initialize` (whole seconds, at
/// least 1; default 60).
pub const START_TIMEOUT_VARIABLE: &str = "FLOWREPL_KERNEL_START_S";

fn start_timeout() -> Duration {
    std::env::var(START_TIMEOUT_VARIABLE)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s >= 1)
        .map_or(START_TIMEOUT, Duration::from_secs)
}

/// With `--store`: how long the task's holder, if it died, keeps the task from a taker, as
/// its head in the store says (`lease_ms`); zero when there is no head or it cannot be read
/// (the kernel's own start then says why).
async fn holder_lapse(url: &str, key: &TaskKey) -> Duration {
    let Ok(store) = flowrepl_store::Store::open(url) else {
        return Duration::ZERO;
    };
    let keys = flowrepl_store::head::TaskKeys::new(&key.plan, &key.task);
    let head = store.key(&keys.head());
    match tokio::time::timeout(Duration::from_secs(10), store.get(&head)).await {
        Ok(Ok(Some((bytes, _)))) => serde_json::from_slice::<flowrepl_store::head::Head>(&bytes)
            .map_or(Duration::ZERO, |h| {
                if h.released {
                    Duration::ZERO
                } else {
                    flowrepl_store::lease::lapse_of(&h)
                }
            }),
        _ => Duration::ZERO,
    }
}

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
    /// With `--store`: how long a kernel may wait for its task's lease at start (a holder that
    /// died holds it this long): its `--lease-s`.
    pub lease_wait: Duration,
    /// This server's id in the store's leases (`FLOWREPL_STORE_HOLDER` of its kernels).
    pub holder: String,
    /// `--store`: the store's URL (a start's budget follows the lease its task's holder wrote
    /// there).
    pub store: Option<String>,
    /// `--task-net DIR`: each task's own network rules.
    pub task_net: Option<std::path::PathBuf>,
}

impl Spawn {
    /// The arguments of the task's kernel: the server's, with the task's own `--sandbox-net`
    /// when `--task-net` has a file for it (`<DIR>/<safe plan>/<safe task>.net`).
    pub fn args_of(&self, key: &TaskKey) -> Result<Vec<std::ffi::OsString>, ChildError> {
        let Some(dir) = &self.task_net else {
            return Ok(self.args.clone());
        };
        let file = dir
            .join(flowrepl_task_logger::path::safe_component(&key.plan))
            .join(format!(
                "{}.net",
                flowrepl_task_logger::path::safe_component(&key.task)
            ));
        if !file.exists() {
            return Ok(self.args.clone());
        }
        let rules = flowrepl_egress::Rules::parse(&format!("@{}", file.display()))
            .map_err(|e| ChildError::TaskNet(e.to_string()))?;
        let net = if rules.is_empty() {
            "--sandbox-net=none".to_string()
        } else {
            format!("--sandbox-net=allow:@{}", file.display())
        };
        let mut args: Vec<std::ffi::OsString> = self
            .args
            .iter()
            .filter(|a| !a.to_string_lossy().starts_with("--sandbox-net"))
            .cloned()
            .collect();
        args.push(net.into());
        Ok(args)
    }

    /// The task's workspace: `<root>/<safe plan>/<safe task>`.
    pub fn workspace_of(&self, key: &TaskKey) -> std::path::PathBuf {
        self.workspace_root
            .join(flowrepl_task_logger::path::safe_component(&key.plan))
            .join(flowrepl_task_logger::path::safe_component(&key.task))
    }

    /// The task's workspace, made (mode 0700) if missing.
    pub fn make_workspace(&self, key: &TaskKey) -> std::io::Result<std::path::PathBuf> {
        let workspace = self.workspace_of(key);
        std::fs::create_dir_all(&workspace)?;
        std::fs::set_permissions(
            &workspace,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )?;
        Ok(workspace)
    }

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
    /// The task's own network rules (`--task-net`) do not parse.
    #[error("the task's network rules (--task-net): {0}")]
    TaskNet(String),
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
    /// The kernel process: its own group, SIGTERM if this server dies, reaped here.
    process: Mutex<Option<Supervisor>>,
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
impl Child {
    /// Starts the task's kernel and completes the MCP handshake.
    pub async fn start(key: TaskKey, spawn: &Spawn) -> Result<Arc<Child>, ChildError> {
        // A holder that died keeps the task for its own lease, which may be longer than this
        // server's: the start is allowed that long.
        let lapse = match &spawn.store {
            Some(url) => holder_lapse(url, &key).await,
            None => Duration::ZERO,
        };
        let workspace = spawn
            .make_workspace(&key)
            .map_err(|source| ChildError::Workspace {
                path: spawn.workspace_of(&key),
                source,
            })?;
        let mut cmd = std::process::Command::new(&spawn.exe);
        cmd.arg("mcp")
            .args(spawn.args_of(&key)?)
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
            .env(flowrepl_cli::env::STORE_HOLDER, &spawn.holder)
            // The server's token is not the cells' (without the sandbox they would see the
            // kernel's environment): it would let a cell call any task's kernel.
            .env_remove(super::auth::TOKEN_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A group of its own (a terminal's Ctrl-C reaches the server, which stops its kernels
        // in order), SIGTERM when this server dies, so that no kernel outlives it (SIGTERM:
        // the kernel writes every record first).
        Supervision {
            group: Group::Own,
            death_signal: nix::sys::signal::Signal::SIGTERM,
        }
        .apply(&mut cmd);
        let mut process = cmd.spawn().map_err(ChildError::Spawn)?;
        let pid = process.id();
        let pipes = (
            process
                .stdin
                .take()
                .map(tokio::process::ChildStdin::from_std),
            process
                .stdout
                .take()
                .map(tokio::process::ChildStdout::from_std),
            process
                .stderr
                .take()
                .map(tokio::process::ChildStderr::from_std),
        );
        let process = Supervisor::of(process);
        let (Some(Ok(stdin)), Some(Ok(stdout)), Some(Ok(stderr))) = pipes else {
            return Err(ChildError::Spawn(std::io::Error::other(
                "the kernel's pipes could not be registered with the runtime",
            )));
        };
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
        let within = start_timeout() + spawn.lease_wait.max(lapse);
        let initialized = tokio::time::timeout(within, child.request("initialize", init))
            .await
            .map_err(|_| ChildError::StartTimeout(within));
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
    /// Asks it to start no more cells ([`flowrepl_mcp::DRAIN`]): calls queued behind its
    /// running cell are answered "the server is shutting down" without running.
    pub async fn drain(&self) {
        let drain = json!({"jsonrpc": "2.0", "method": flowrepl_mcp::DRAIN});
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
            let stopped =
                tokio::task::spawn_blocking(move || p.stop(None, grace + Duration::from_secs(10)))
                    .await;
            if stopped.is_ok_and(|s| s.killed) {
                tracing::warn!(pid = self.pid, task = %self.key.task, "the kernel did not exit: killed");
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
            let _ = tokio::task::spawn_blocking(move || p.kill()).await;
        }
    }

    /// Reaps it if it has exited (a kernel that died by itself).
    pub fn reap(&self) {
        if let Some(p) = lock(&self.process).as_mut() {
            p.try_reap();
        }
    }
}
