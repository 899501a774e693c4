//! `flowrepl mcp`: the same kernel as an MCP server on stdio (rmcp).
//!
//! `flowrepl serve` relays to such kernels and uses this crate's vocabulary for it: the tools
//! ([`tools`]: names, argument types, the listing), [`render`], [`approval`], [`tasks`],
//! [`lines`], [`server_info`] and [`DRAIN`].
//!
//! # Threads
//! - The **main thread** owns the [`Session`] (Python's main thread in-process, so signals
//!   and `KeyboardInterrupt` work as in the JSON-RPC front). It takes [`Job`]s one at a time:
//!   run a cell, restart, list variables. Cells therefore run in the order their calls
//!   arrived, one at a time.
//! - The **MCP thread** runs a single-threaded tokio runtime with rmcp's service: it parses
//!   requests, runs the [`tools`] handlers concurrently, sends progress notifications, and
//!   answers `interrupt` and `read_output` while a cell runs.
//!
//! A call's result is rendered on the main thread ([`render`]) right after the cell, sent to
//! its handler, and then the cell's record goes to the task log as in the JSON-RPC front.
//!
//! # Cancellation
//! `notifications/cancelled` for a queued call drops it before it runs; for the running call
//! it interrupts the cell through the same ladder as the `interrupt` tool (SIGINT, then in
//! worker mode SIGKILL after the grace period). The cell's record is still logged; rmcp
//! sends no response for a cancelled request.
//!
//! # End
//! When the client closes stdin, the running cell is interrupted at once (the worker-mode
//! ladder applies), queued calls are dropped, the running call's response is still sent if
//! the client reads it, pending records are written, and the kernel exits 0.

pub mod approval;
pub mod files;
pub mod lines;
pub mod parked;
pub mod render;
pub mod schema;
pub mod store;
pub mod tasks;
pub mod tools;
pub mod transport;

use flowrepl_protocol::sandbox::SandboxReport;
use flowrepl_protocol::{Call, ExecuteResult, Image, RpcError};
use flowrepl_session::config::Config;
use flowrepl_session::engine::Control;
use flowrepl_session::session::{Answer, Responder, Session};
use rmcp::model::CallToolResult;
use rmcp::ServiceExt;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use store::OutputStore;
use tokio::sync::oneshot;

/// What both MCP fronts say of themselves: tools and the tasks extension, flowrepl's name
/// and version, `title` and `instructions`.
pub fn server_info(title: &str, instructions: String) -> rmcp::model::InitializeResult {
    use rmcp::model::{Implementation, InitializeResult, ServerCapabilities};
    let capabilities = ServerCapabilities::builder()
        .enable_tools()
        .enable_resources()
        .enable_tasks()
        .build();
    InitializeResult::new(capabilities)
        .with_server_info(
            Implementation::new("flowrepl", env!("CARGO_PKG_VERSION")).with_title(title),
        )
        .with_instructions(instructions)
}

/// The notification (client to server, no params) that asks the kernel to start no more
/// cells: each `execute_code` not yet started, and every later one, is answered with
/// [`DRAINED`] and not run; the running cell goes on. `flowrepl serve` sends it to every
/// kernel when it is told to stop, so that only running cells get the kill grace.
pub const DRAIN: &str = "notifications/flowrepl/drain";

/// The answer (an `isError` tool result) to a cell refused after [`DRAIN`].
pub const DRAINED: &str = "not run: the server is shutting down";

/// Work for the main thread.
pub enum Job {
    /// Run a call and answer with its rendered tool result.
    Call {
        /// What to do.
        call: Call,
        /// `execute_code`: its place in the queue, shared with the handler for cancellation.
        ticket: Option<Arc<Ticket>>,
        /// Where the result goes.
        reply: oneshot::Sender<CallToolResult>,
    },
    /// The client went away.
    Stop,
}

const QUEUED: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const CANCELLED: u8 = 3;

/// An `execute_code` call's place in the queue.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    state: AtomicU8,
}

impl Ticket {
    fn new(id: u64) -> Ticket {
        Ticket {
            id,
            state: AtomicU8::new(QUEUED),
        }
    }

    /// The cell's id (`wait_cell`'s `cell`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Still waiting for an earlier call.
    pub fn is_queued(&self) -> bool {
        self.state.load(Ordering::Acquire) == QUEUED
    }

    fn advance(&self, from: u8, to: u8) -> bool {
        self.state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives up a queued call (it will not run); false if it already started.
    fn withdraw(&self) -> bool {
        self.advance(QUEUED, CANCELLED)
    }

    /// The main thread takes the call; false if it was withdrawn.
    fn start(&self) -> bool {
        self.advance(QUEUED, RUNNING)
    }

    /// The call's cell has ended.
    fn finish(&self) {
        self.state.store(DONE, Ordering::Release);
    }

    fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }
}

/// What the handlers share with the main thread.
pub struct Shared {
    /// Reaches the running cell.
    pub control: Arc<dyn Control>,
    /// Output cut from results, for `read_output`.
    store: Mutex<OutputStore>,
    /// The ticket of the cell running now.
    running: Mutex<Option<u64>>,
    next_ticket: AtomicU64,
    /// The output budget, in characters.
    pub max_chars: usize,
    /// Images put in a result (`--max-images`); those past it are kept and linked.
    pub max_images: usize,
    /// A cell's timeout when the call gives none.
    pub default_timeout_ms: u64,
    /// How long `execute_code` waits for its cell when the call gives no `wait_s`.
    pub wait: Duration,
    /// Cells still running after their call answered, for `wait_cell`.
    parked: Mutex<parked::Parked>,
    /// Cells that became MCP tasks (clients with the tasks extension).
    pub tasks: tasks::CellTasks,
    /// Approvals for a 2026-07-28 client, answered through `inputRequests`.
    pub inbox: Arc<approval::Inbox>,
    /// The task log, named in messages.
    pub log_file: String,
    /// The server's `instructions`.
    pub instructions: String,
    /// The client closed stdin: queued calls are dropped.
    closing: AtomicBool,
    /// [`DRAIN`] came: cells not yet started are refused, the running one goes on.
    draining: AtomicBool,
    /// After SIGINT, how long a cell has to stop (`FLOWREPL_KILL_GRACE_MS`).
    pub kill_grace: Duration,
    /// In-process or worker.
    pub mode: flowrepl_protocol::Mode,
    /// The cells' approval requests.
    pub approvals: Arc<flowrepl_session::approvals::Approvals>,
    /// Approvals are asked through the client (set at the first `execute_code`).
    asking: std::sync::Once,
    /// The task's workspace for clients' files (or why it cannot be used).
    pub files: Result<Arc<flowrepl_files::Workspace>, String>,
    /// The last line of the running install's output, for `install_packages`' progress.
    pub install_progress: Option<Arc<std::sync::Mutex<String>>>,
    /// The task, as resource URIs name it.
    pub task: files::TaskRef,
}

impl Shared {
    fn next_ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Approval requests go to this client (as elicitation requests when it can answer them).
    pub fn ask_through(&self, peer: &rmcp::Peer<rmcp::RoleServer>) {
        self.asking.call_once(|| {
            let asker = approval::ElicitAsker::new(
                peer.clone(),
                tokio::runtime::Handle::current(),
                Arc::clone(&self.inbox),
            );
            self.approvals.set_asker(Arc::new(asker));
        });
    }

    fn store(&self) -> MutexGuard<'_, OutputStore> {
        store::locked(&self.store)
    }

    fn parked(&self) -> MutexGuard<'_, parked::Parked> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn running(&self) -> MutexGuard<'_, Option<u64>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A cancelled call: drop it if it has not started, else interrupt its cell (retrying until
/// the cell has begun, so that a cancel that races the start is not lost; never reaching a
/// later cell, since the check and the signal happen under the lock that the main thread
/// takes to switch cells).
fn cancel(shared: &Arc<Shared>, ticket: &Arc<Ticket>) {
    if ticket.withdraw() {
        return;
    }
    let (shared, ticket) = (Arc::clone(shared), Arc::clone(ticket));
    tokio::spawn(async move {
        loop {
            {
                let running = shared.running();
                if ticket.is_done() {
                    return;
                }
                if *running == Some(ticket.id) && shared.control.interrupt() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

/// Serves MCP on `input`/`output` until the client closes stdin.
pub fn run(
    session: &mut Session,
    config: &Config,
    input: File,
    output: File,
) -> std::io::Result<()> {
    let mcp = config
        .mcp
        .clone()
        .unwrap_or_else(|| unreachable!("mcp mode"));
    let shared = Arc::new(Shared {
        control: Arc::clone(session.board().control()),
        store: Mutex::new(OutputStore::new((mcp.keep_output_mb as usize) << 20)),
        running: Mutex::new(None),
        next_ticket: AtomicU64::new(0),
        max_chars: mcp.max_chars as usize,
        max_images: mcp.max_images as usize,
        default_timeout_ms: config.default_timeout_ms,
        wait: Duration::from_secs(mcp.wait_s),
        parked: Mutex::new(parked::Parked::default()),
        tasks: tasks::CellTasks::default(),
        inbox: Arc::default(),
        log_file: config.log_file.display().to_string(),
        instructions: instructions(config, session.board().status(false).sandbox.as_ref()),
        closing: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        kill_grace: config.kill_grace,
        mode: session.mode(),
        approvals: Arc::clone(session.approvals()),
        asking: std::sync::Once::new(),
        files: session.files(),
        install_progress: session.install_progress(),
        task: files::TaskRef {
            plan: config.identity.plan_id.clone(),
            task: config.identity.task_id.clone(),
        },
    });
    let (jobs, queue) = std::sync::mpsc::channel();
    let server = tools::KernelServer::new(jobs.clone(), Arc::clone(&shared));
    let shared_mcp = Arc::clone(&shared);
    let max_request_bytes = config.max_request_bytes;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("flowrepl-mcp".into())
        .spawn(move || {
            // Process-directed SIGINT belongs to the cell's thread.
            flowrepl_os::block_sigint();
            let at_eof = Arc::clone(&shared_mcp);
            let on_eof = Box::new(move || {
                tracing::info!("stdin closed: stopping the running cell");
                at_eof.closing.store(true, Ordering::Release);
                at_eof
                    .approvals
                    .cancel_all("the client closed stdin: nobody can answer");
                at_eof.control.interrupt();
            });
            runtime.block_on(async move {
                let (reader, writer) = transport::open(input, output, on_eof);
                let channel = transport::LineTransport::new(reader, writer, max_request_bytes);
                match server.serve(channel).await {
                    Ok(running) => {
                        let reason = running.waiting().await;
                        tracing::info!(?reason, "MCP client went away");
                    }
                    Err(e) => tracing::error!(error = %e, "MCP initialization failed"),
                }
            });
            shared_mcp.closing.store(true, Ordering::Release);
            shared_mcp
                .approvals
                .cancel_all("the MCP client went away: nobody can answer");
            shared_mcp.control.interrupt();
            let _ = jobs.send(Job::Stop);
        })?;
    while let Some(job) = next_job(&queue) {
        let Job::Call {
            call,
            ticket,
            reply,
        } = job
        else {
            break;
        };
        if let Some(t) = &ticket {
            if shared.closing.load(Ordering::Acquire) || !t.start() {
                continue; // cancelled while queued, or the client is gone
            }
            if shared.draining.load(Ordering::Acquire) {
                t.finish();
                let _ = reply.send(tools::error_text(DRAINED.into()));
                continue;
            }
            *shared.running() = Some(t.id);
        }
        let mut to = McpReply {
            shared: &shared,
            ticket,
            reply: Some(reply),
        };
        if session.dispatch(call, &mut to)? == flowrepl_session::session::Flow::Shutdown {
            // The session must end (another kernel took its task in the store): its answer
            // is on its way to the client; give the writer a moment, then stop.
            std::thread::sleep(LAST_ANSWER_FLUSH);
            break;
        }
    }
    Ok(())
}

/// How long the MCP front waits for its last answer to be written when the session ends it.
const LAST_ANSWER_FLUSH: Duration = Duration::from_millis(200);

/// The next job: polled without sleeping for up to
/// [`flowrepl_os::spin_before_block`] (the next call usually comes within tens of µs),
/// then waited for. `None` when every sender is gone.
fn next_job(queue: &std::sync::mpsc::Receiver<Job>) -> Option<Job> {
    use std::sync::mpsc::TryRecvError;
    let mut got = None;
    static NEXT_JOB: flowrepl_os::Spin = flowrepl_os::Spin::new();
    NEXT_JOB.until(|| match queue.try_recv() {
        Ok(job) => got.replace(Some(job)).is_none(),
        Err(TryRecvError::Disconnected) => got.replace(None).is_none(),
        Err(TryRecvError::Empty) => false,
    });
    got.unwrap_or_else(|| queue.recv().ok())
}

/// Answers one tool call on the main thread.
struct McpReply<'a> {
    shared: &'a Shared,
    ticket: Option<Arc<Ticket>>,
    reply: Option<oneshot::Sender<CallToolResult>>,
}

impl McpReply<'_> {
    fn send(&mut self, result: CallToolResult) {
        if let Some(r) = self.reply.take() {
            let _ = r.send(result);
        }
    }
}

impl Responder for McpReply<'_> {
    fn cell_ended(&mut self) -> bool {
        // Under the lock a cancel takes to interrupt: it can no longer reach this cell.
        let mut running = self.shared.running();
        *running = None;
        if let Some(t) = &self.ticket {
            t.finish();
        }
        false
    }

    fn executed(&mut self, result: &mut ExecuteResult, images: Vec<Image>) -> std::io::Result<()> {
        let limits = render::Limits {
            max_chars: self.shared.max_chars,
            max_images: self.shared.max_images,
        };
        let r = render::execute_result(
            result,
            images,
            limits,
            &self.shared.store,
            &self.shared.task,
        );
        self.send(r);
        Ok(())
    }

    fn answer(&mut self, answer: Answer) -> std::io::Result<()> {
        let r = tools::answer_result(answer);
        self.send(r);
        Ok(())
    }

    fn failed(&mut self, error: RpcError) -> std::io::Result<()> {
        self.send(tools::error_text(error.message));
        Ok(())
    }
}

/// The `instructions` of the initialize result: what the session is, for the model (and,
/// sandboxed, what the sandbox enforces, as the worker reported it).
fn instructions(config: &Config, sandbox: Option<&SandboxReport>) -> String {
    let mcp = config.mcp.as_ref();
    let mut text = format!(
        "A persistent Python {mode} session (flowrepl). Code runs with execute_code; variables and imports persist between calls until restart_session. Output over {chars} characters per call is cut in the middle; read the rest with read_output, or whole with resources/read of its resource_link. Files move in and out of the working directory with upload_file, download_file, list_files and delete_file; install_packages installs packages (not pip in a cell). Default cell timeout: {timeout} ms. Figures: up to {images} matplotlib figures per cell are returned as PNG images. Every cell is logged to {log}.",
        mode = if config.worker.is_some() { "(worker subprocess)" } else { "(in-process)" },
        chars = mcp.map_or(0, |m| m.max_chars),
        timeout = config.default_timeout_ms,
        images = mcp.map_or(0, |m| m.max_images),
        log = config.log_file.display(),
    );
    if let Some(sb) = sandbox {
        let names = |enforced: bool| {
            sb.layers
                .iter()
                .filter(|l| l.enforced == enforced && (enforced || l.wanted))
                .map(|l| l.layer.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let workspace = config
            .worker
            .as_ref()
            .and_then(|w| w.sandbox.as_ref())
            .map(|s| s.workspace.display().to_string())
            .unwrap_or_default();
        let network = if sb.rules.is_empty() {
            sb.network.clone()
        } else {
            // The agent learns which hosts it may reach (the first ones of a long list).
            const SHOWN: usize = 20;
            let more = sb.rules.len().saturating_sub(SHOWN);
            format!(
                "only {}{} through the proxy in HTTP(S)_PROXY",
                sb.rules[..sb.rules.len().min(SHOWN)].join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )
        };
        text.push_str(&format!(
            " The code runs sandboxed ({level}; network: {network}): files may be written only in {workspace} (the working directory) and /tmp. Enforced: {on}.",
            level = sb.level,
            on = names(true),
        ));
        let off = names(false);
        if !off.is_empty() {
            text.push_str(&format!(" Not enforced on this host: {off}."));
        }
    }
    text
}
