//! The MCP tools, served by rmcp. Handlers run on the MCP thread's tokio runtime; anything
//! that touches Python is a [`Job`] for the kernel's main thread (see [`super`]), answered
//! through a oneshot channel. `interrupt` and `read_output` are answered here at once, even
//! while a cell runs.
//!
//! # Layout
//! - `args`: the tools' argument types (and `interrupt`'s result), parsed strictly.
//! - `results`: how answers become tool results.
//! - `follow`: waiting for a cell: progress, cancellation, `running: true`, MCP tasks.
//! - here: the server, its router (one handler per tool) and its MCP handler.

mod args;
mod follow;
mod results;

pub use args::{arguments, ExecuteArgs, InterruptArgs, InterruptOut, ReadOutputArgs, WaitCellArgs};
pub use follow::HEARTBEAT;
pub use results::{answer_result, error_text, structured};

use super::parked::Waiting;
use super::render::{self, McpExecuteResult, RunningCell};
use super::schema;
use super::store::{Page, ReadError};
use super::tasks;
use super::{Job, Shared, Ticket};
use args::{checkpoint_args, parse_args, wait_for};
use flowrepl_protocol::call::MAX_TIMEOUT_MS;
use flowrepl_protocol::files::{Deleted, FileInfo, ListParams, Listing, PathParams, UploadParams};
use flowrepl_protocol::packages::{InstallParams, InstallReply};
use flowrepl_protocol::{
    Call, CheckpointParams, CheckpointSummary, CheckpointsReply, ExecuteMethod, ExecuteParams,
    RestartParams, RestartReply, RestoreReport, VariablesReply,
};
use follow::{finish_cell, Follow, OnCancel};
use results::internal;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::schema_for_input;
use rmcp::handler::server::tool::{InputResponses, RequestState, ToolCallContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, GetTaskParams,
    GetTaskResult, InitializeResult, JsonObject, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    RequestMetaObject, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, Peer, RoleServer, ServerHandler};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The names of the tools that other code calls by name (`serve`): each is the `name` of its
/// `#[tool]` below (rmcp's macro takes only a literal; a test checks them against the router).
pub const EXECUTE_CODE: &str = "execute_code";
/// See [`EXECUTE_CODE`].
pub const WAIT_CELL: &str = "wait_cell";
/// See [`EXECUTE_CODE`].
pub const INTERRUPT: &str = "interrupt";
/// See [`EXECUTE_CODE`].
pub const CHECKPOINT: &str = "checkpoint";

/// The MCP server: a handle to the kernel's main thread.
#[derive(Clone)]
pub struct KernelServer {
    jobs: Sender<Job>,
    shared: Arc<Shared>,
    tool_router: ToolRouter<KernelServer>,
}

/// Polls `rx` without sleeping for up to [`flowrepl_os::spin_before_block`]
/// (yielding between looks); `None` if nothing came.
fn spin_for<T>(rx: &mut oneshot::Receiver<T>) -> Option<Result<T, ()>> {
    let mut got = None;
    static CELL_RESULT: flowrepl_os::Spin = flowrepl_os::Spin::new();
    CELL_RESULT.until(|| match rx.try_recv() {
        Ok(v) => got.replace(Ok(v)).is_none(),
        Err(oneshot::error::TryRecvError::Closed) => got.replace(Err(())).is_none(),
        Err(oneshot::error::TryRecvError::Empty) => false,
    });
    got
}

/// The server's tools as a server with these settings lists them (`flowrepl serve` lists
/// its kernels' tools so).
pub fn listed(max_chars: usize, default_timeout_ms: u64, wait: Duration) -> Vec<rmcp::model::Tool> {
    KernelServer::described(max_chars, default_timeout_ms, wait).list_all()
}

impl KernelServer {
    /// The router, its descriptions stating these settings rather than copies of defaults.
    fn described(
        max_chars: usize,
        default_timeout_ms: u64,
        wait: Duration,
    ) -> ToolRouter<KernelServer> {
        let mut tool_router = Self::tool_router();
        for route in tool_router.map.values_mut() {
            if let Some(d) = route.attr.description.take() {
                let d = d
                    .replace("{max_chars}", &max_chars.to_string())
                    .replace("{timeout_ms}", &default_timeout_ms.to_string())
                    .replace("{wait_s}", &wait.as_secs().to_string());
                route.attr.description = Some(d.into());
            }
        }
        tool_router
    }
}

/// The names of the server's tools, sorted (from the router itself).
pub fn tool_names() -> Vec<String> {
    let mut names: Vec<String> = KernelServer::tool_router()
        .list_all()
        .into_iter()
        .map(|t| t.name.into_owned())
        .collect();
    names.sort();
    names
}

#[tool_router]
impl KernelServer {
    /// A server sending its Python work to `jobs`.
    pub fn new(jobs: Sender<Job>, shared: Arc<Shared>) -> KernelServer {
        let tool_router = Self::described(shared.max_chars, shared.default_timeout_ms, shared.wait);
        KernelServer {
            jobs,
            shared,
            tool_router,
        }
    }

    /// Runs a file operation on the task's workspace, off this thread (file I/O blocks).
    async fn on_files(
        &self,
        op: impl FnOnce(&flowrepl_files::Workspace, &crate::files::TaskRef) -> CallToolResult
            + Send
            + 'static,
    ) -> Result<CallToolResult, ErrorData> {
        let ws = match &self.shared.files {
            Ok(ws) => Arc::clone(ws),
            Err(why) => return Ok(error_text(why.clone())),
        };
        let task = self.shared.task.clone();
        tokio::task::spawn_blocking(move || op(&ws, &task))
            .await
            .map_err(|_| internal("the file operation failed"))
    }

    /// A resource URI's task must be this kernel's.
    fn own_task(&self, task: &crate::files::TaskRef) -> Result<(), ErrorData> {
        if *task == self.shared.task {
            return Ok(());
        }
        Err(ErrorData::invalid_params(
            format!(
                "this kernel serves task {:?} of plan {:?}, not the URI's",
                self.shared.task.task, self.shared.task.plan
            ),
            None,
        ))
    }

    /// `resources/read` of a cell's whole output: a stream the budget cut (text), or a figure
    /// past the image limit (a PNG blob), while the kernel still holds it.
    fn read_output_resource(&self, uri: &str) -> Result<ReadResourceResult, ErrorData> {
        use rmcp::model::ResourceContents;
        let (task, cell, part) = crate::files::parse_output_uri(uri)?;
        self.own_task(&task)?;
        let store = self.shared.store();
        let held = |e: ReadError| {
            ErrorData::resource_not_found(format!("{e}. Task log: {}", self.shared.log_file), None)
        };
        let contents = match part.strip_prefix("figure-") {
            Some(n) => {
                let n = n
                    .parse()
                    .map_err(|_| ErrorData::invalid_params(format!("no part {part:?}"), None))?;
                ResourceContents::blob(store.figure(cell, n).map_err(held)?, uri)
                    .with_mime_type("image/png")
            }
            None => {
                let stream: super::store::StreamName = serde_json::from_value(
                    serde_json::Value::String(part.clone()),
                )
                .map_err(|_| ErrorData::invalid_params(format!("no part {part:?}"), None))?;
                ResourceContents::text(store.whole(cell, stream).map_err(held)?, uri)
            }
        };
        Ok(ReadResourceResult::new(vec![contents]))
    }

    /// Runs `call` on the main thread (after the cells queued before it).
    async fn ask(&self, call: Call) -> Result<CallToolResult, ErrorData> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Job::Call {
                call,
                ticket: None,
                reply: tx,
            })
            .map_err(|_| internal("the kernel is shutting down"))?;
        rx.await
            .map_err(|_| internal("the kernel is shutting down"))
    }

    #[tool(
        name = "execute_code",
        description = "Run Python code in a persistent CPython session, like a notebook cell. Variables, functions and imports persist across calls until restart_session. Returns what the code printed (stdout; stderr under [stderr], with the traceback if it raised) and, if the code ends with an expression, its value as Out[n]. A cell that raises is a result with isError true; the session stays usable. Matplotlib figures left open are returned as PNG images and closed (no plt.show() needed). Output over {max_chars} characters keeps its head and tail with a marker between them; page through the cut part with read_output using the offset the marker gives, or read it whole with resources/read of the resource_link the result carries. timeout_ms (default {timeout_ms}) stops a long cell with KeyboardInterrupt; variables survive. There is no stdin (input() gets EOF). A cell still running after wait_s seconds (default {wait_s}) is answered with running: true, its cell id and the output so far; it goes on, and wait_cell collects its result. Long cells send progress notifications if the call has a progress token; cancelling the call interrupts the cell. In cells, `flow.event(name, **data)` and `with flow.step(name):` report progress (listed after the output), `flow.context` keeps task state across sessions, and `flow.request_approval(message)` asks the user (an elicitation request) and returns True or False.",
        input_schema = schema_for_input::<Parameters<ExecuteArgs>>().expect("an object schema"),
        output_schema = schema::either::<McpExecuteResult, RunningCell>(),
        annotations(title = "Run Python", destructive_hint = true, open_world_hint = true)
    )]
    async fn execute_code(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
        state: RequestState,
        responses: InputResponses,
    ) -> Result<CallToolResponse, ErrorData> {
        let args: ExecuteArgs = parse_args(args)?;
        let wait = wait_for(args.wait_s, self.shared.wait)?;
        self.shared.ask_through(&peer);
        let follow = Follow {
            wait,
            token: meta.get_progress_token(),
            on_cancel: OnCancel::Interrupt,
            asks: self.answers_approvals(&peer, &meta),
        };
        if let Some(state) = state.0 {
            // The same call again with the person's answers: follow the same cell.
            let id = super::approval::state_id(&state, "cell")?;
            self.shared
                .inbox
                .deliver(responses.0.unwrap_or_default(), &self.shared.approvals);
            let waiting = self.take_parked(id)?;
            return self.follow(id, waiting, follow, &peer, &ct).await;
        }
        if let Some(t) = args.timeout_ms {
            if t == 0 || t > MAX_TIMEOUT_MS {
                return Err(ErrorData::invalid_params(
                    format!("timeout_ms must be between 1 and {MAX_TIMEOUT_MS}"),
                    None,
                ));
            }
        }
        let ticket = Arc::new(Ticket::new(self.shared.next_ticket()));
        let (tx, mut rx) = oneshot::channel();
        self.jobs
            .send(Job::Call {
                call: Call::Execute(
                    ExecuteParams {
                        code: args.code,
                        timeout_ms: args.timeout_ms,
                    },
                    ExecuteMethod::ExecuteCode,
                ),
                ticket: Some(Arc::clone(&ticket)),
                reply: tx,
            })
            .map_err(|_| internal("the kernel is shutting down"))?;
        // A short cell answers within tens of µs: look before this thread sleeps.
        if let Some(r) = spin_for(&mut rx) {
            return r
                .map(Into::into)
                .map_err(|_| internal("the cell was dropped before it ran"));
        }
        let waiting = Waiting {
            rx,
            started: Instant::now(),
            ticket,
        };
        self.follow(waiting.ticket.id(), waiting, follow, &peer, &ct)
            .await
    }

    #[tool(
        name = "wait_cell",
        description = "Wait for a cell that execute_code answered with running: true (its cell id), up to wait_s seconds (default {wait_s}): its result, exactly as execute_code would have returned it, or running: true again with the output so far. A result is given once. Cancelling this call only stops waiting; interrupt stops the cell.",
        input_schema = schema_for_input::<Parameters<WaitCellArgs>>().expect("an object schema"),
        output_schema = schema::either::<McpExecuteResult, RunningCell>(),
        annotations(title = "Wait for a running cell", read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_cell(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
        responses: InputResponses,
    ) -> Result<CallToolResponse, ErrorData> {
        let args: WaitCellArgs = parse_args(args)?;
        let wait = wait_for(args.wait_s, self.shared.wait)?;
        if let Some(responses) = responses.0 {
            self.shared.inbox.deliver(responses, &self.shared.approvals);
        }
        let follow = Follow {
            wait,
            token: meta.get_progress_token(),
            on_cancel: OnCancel::StopWaiting,
            asks: self.answers_approvals(&peer, &meta),
        };
        let waiting = self.take_parked(args.cell)?;
        self.follow(args.cell, waiting, follow, &peer, &ct).await
    }

    #[tool(
        name = "read_output",
        description = "Read output that execute_code cut to fit its budget: characters [offset, offset+length) of a cell's stdout, stderr or result. The cut marker in the execute_code result gives the execution_count, stream and offset to use. Pages are at most the output budget long; the reply ends with where the next page starts.",
        input_schema = schema_for_input::<Parameters<ReadOutputArgs>>().expect("an object schema"),
        output_schema = schema::shallow::<Page>(),
        annotations(title = "Read cut output", read_only_hint = true, open_world_hint = false)
    )]
    async fn read_output(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        let args: ReadOutputArgs = parse_args(args)?;
        let max = self.shared.max_chars;
        let length = args.length.unwrap_or(max).min(max);
        if length == 0 {
            return Err(ErrorData::invalid_params("length must be at least 1", None));
        }
        let page = self
            .shared
            .store()
            .read(args.execution_count, args.stream, args.offset, length);
        Ok(match page {
            Ok(p) => structured(render::page_text(&p), &p, false),
            Err(e @ ReadError::NotHeld { .. }) => {
                error_text(format!("{e}. Task log: {}", self.shared.log_file))
            }
            Err(e) => error_text(e.to_string()),
        })
    }

    #[tool(
        name = "upload_file",
        description = "Write a file into the task's workspace (the session's working directory, where cells read and write files): path relative to it (folders are made), content as text or as base64 for binary files. A file there is replaced whole. Limits: the server's --max-file-bytes per file and --max-workspace-mb for the workspace; paths outside the workspace, through links, or into flowrepl's own folder are refused.",
        input_schema = schema_for_input::<Parameters<UploadParams>>().expect("an object schema"),
        output_schema = schema::shallow::<FileInfo>(),
        annotations(title = "Upload a file", destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn upload_file(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        let args: UploadParams = parse_args(args)?;
        self.on_files(move |ws, _| crate::files::upload(ws, &args))
            .await
    }

    #[tool(
        name = "download_file",
        description = "Read a file of the task's workspace (path relative to it), e.g. one a cell wrote: text up to {max_chars} characters comes as text, images as an image, other files up to 1 MiB as an embedded blob resource with their MIME type; larger files as a resource_link to read with resources/read. The result gives size, MIME type and sha256.",
        input_schema = schema_for_input::<Parameters<PathParams>>().expect("an object schema"),
        output_schema = schema::shallow::<crate::files::DownloadOut>(),
        annotations(title = "Download a file", read_only_hint = true, open_world_hint = false)
    )]
    async fn download_file(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        let args: PathParams = parse_args(args)?;
        let max = self.shared.max_chars;
        self.on_files(move |ws, task| crate::files::download(ws, task, &args, max))
            .await
    }

    #[tool(
        name = "list_files",
        description = "List a folder of the task's workspace (path relative to it; default the workspace itself): name, path, kind (file, dir, symlink, other), size and modification time, sorted by name, up to limit entries (default 200); pass next_cursor as cursor for the next page.",
        input_schema = schema_for_input::<Parameters<ListParams>>().expect("an object schema"),
        output_schema = schema::shallow::<Listing>(),
        annotations(title = "List files", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        let args: ListParams = parse_args(args)?;
        self.on_files(move |ws, _| crate::files::list(ws, &args))
            .await
    }

    #[tool(
        name = "delete_file",
        description = "Remove a file of the task's workspace (path relative to it; folders are not removed).",
        input_schema = schema_for_input::<Parameters<PathParams>>().expect("an object schema"),
        output_schema = schema::shallow::<Deleted>(),
        annotations(title = "Delete a file", destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn delete_file(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        let args: PathParams = parse_args(args)?;
        self.on_files(move |ws, _| crate::files::delete(ws, &args))
            .await
    }

    #[tool(
        name = "install_packages",
        description = "Install Python packages into this task's package layer, e.g. [\"pandas>=2\", \"polars==1.15\"] (names with version specifiers, as pip takes them; no URLs or options): the next cell imports them, no restart needed. Use this instead of pip in a cell (cells have no network and a read-only environment when sandboxed). Resolved from the shared cache first, from the operator's index otherwise, wheels only unless the operator allows builds; the layer keeps every package the task installed and comes back when the task resumes. Modules already imported stay as loaded until a restart; the result lists them in restart_needed. A failed resolution is an error with the installer's message, and the layer is unchanged.",
        input_schema = schema_for_input::<Parameters<InstallParams>>().expect("an object schema"),
        output_schema = schema::shallow::<InstallReply>(),
        annotations(title = "Install packages", destructive_hint = false, idempotent_hint = true, open_world_hint = true)
    )]
    async fn install_packages(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let ask = self.ask(Call::Install(parse_args(args)?));
        let (Some(token), Some(last)) = (
            meta.get_progress_token(),
            self.shared.install_progress.clone(),
        ) else {
            return ask.await;
        };
        // A heartbeat while it installs: the time so far and the installer's last line.
        tokio::pin!(ask);
        let started = Instant::now();
        let mut beat = tokio::time::interval_at(
            tokio::time::Instant::now() + follow::HEARTBEAT,
            follow::HEARTBEAT,
        );
        loop {
            tokio::select! {
                answer = &mut ask => return answer,
                _ = beat.tick() => {
                    let elapsed = started.elapsed().as_secs_f64();
                    let mut message = format!("installing for {elapsed:.0} s");
                    let line = flowrepl_os::lock(&last).clone();
                    if !line.is_empty() {
                        message.push_str(&format!("; last output: {line}"));
                    }
                    follow::notify_progress(&peer, token.clone(), elapsed, message).await;
                }
            }
        }
    }

    #[tool(
        name = "interrupt",
        description = "Stop the cell that is running now (another execute_code call still waiting for it) with KeyboardInterrupt; its variables are kept. With cell (an id from a running: true result), stop that cell only: interrupted if it runs, dropped if it still waits its turn, nothing if it has ended. If the cell does not stop within the grace period (2 s by default), worker mode kills the worker and its processes (all variables are lost) and the session continues in a fresh one. Does nothing when no cell runs.",
        input_schema = schema_for_input::<Parameters<InterruptArgs>>().expect("an object schema"),
        output_schema = schema::shallow::<InterruptOut>(),
        annotations(title = "Interrupt the running cell", destructive_hint = false, open_world_hint = false)
    )]
    async fn interrupt(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        let args: InterruptArgs = parse_args(args)?;
        let (interrupted, message) = match args.cell {
            None => {
                let interrupted = self.shared.control.interrupt();
                let message = if interrupted {
                    "KeyboardInterrupt was sent to the running cell; its execute_code call returns with the error"
                } else {
                    "no cell was running"
                };
                (interrupted, message.to_owned())
            }
            Some(id) => match self.shared.parked().ticket(id) {
                Some(ticket) if !ticket.is_done() => {
                    let message = if ticket.is_queued() {
                        format!("cell {id} was waiting its turn: it will not run")
                    } else {
                        format!("KeyboardInterrupt was sent to cell {id}; wait_cell (or its task) gives its result")
                    };
                    super::cancel(&self.shared, &ticket);
                    (true, message)
                }
                _ => (false, format!("cell {id} is not running")),
            },
        };
        let out = InterruptOut {
            interrupted,
            message: message.clone(),
        };
        Ok(structured(message, &out, false))
    }

    #[tool(
        name = "restart_session",
        description = "Start over: drop every variable (and, in worker mode, every import: a fresh Python process). With restore: true, the fresh session starts from the last automatic checkpoint instead (taken after each successful cell); the reply lists restored_vars and lost_vars. Waits for a running cell to finish first; use interrupt to stop it.",
        input_schema = schema_for_input::<Parameters<RestartParams>>().expect("an object schema"),
        output_schema = schema::shallow::<RestartReply>(),
        annotations(title = "Restart the Python session", destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn restart_session(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        self.ask(Call::Restart(parse_args(args)?)).await
    }

    #[tool(
        name = "checkpoint",
        description = "Save every variable of the session now, into the automatic checkpoint or, with name, a named one that later checkpoints do not overwrite. Functions, classes, data frames and arrays are saved; what cannot be (open files, generators, locks) is listed with the reason. A checkpoint is also taken automatically after each successful cell.",
        input_schema = schema_for_input::<Parameters<CheckpointParams>>().expect("an object schema"),
        output_schema = schema::shallow::<CheckpointSummary>(),
        annotations(title = "Checkpoint the session", destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn checkpoint(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        self.ask(Call::Checkpoint(checkpoint_args(args)?)).await
    }

    #[tool(
        name = "restore_checkpoint",
        description = "Replace the session's variables with a checkpoint's (the automatic one, or the one named): modules are imported again, and the reply lists restored_vars and lost_vars. Cells run after the checkpoint are not replayed.",
        input_schema = schema_for_input::<Parameters<CheckpointParams>>().expect("an object schema"),
        output_schema = schema::shallow::<RestoreReport>(),
        annotations(title = "Restore a checkpoint", destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn restore_checkpoint(&self, args: JsonObject) -> Result<CallToolResult, ErrorData> {
        self.ask(Call::Restore(checkpoint_args(args)?)).await
    }

    #[tool(
        name = "list_checkpoints",
        description = "List the task's checkpoints: name, the cell they were taken after, when, their size and the names they hold.",
        output_schema = schema::shallow::<CheckpointsReply>(),
        annotations(title = "List checkpoints", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_checkpoints(&self) -> Result<CallToolResult, ErrorData> {
        self.ask(Call::Checkpoints).await
    }

    #[tool(
        name = "list_variables",
        description = "List the variables of the session: name, type, a short repr, and the length or shape of sized values (lists, strings, arrays, data frames). Waits for a running cell to finish first.",
        output_schema = schema::shallow::<VariablesReply>(),
        annotations(title = "List session variables", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_variables(&self) -> Result<CallToolResult, ErrorData> {
        self.ask(Call::ListVariables).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for KernelServer {
    fn get_info(&self) -> InitializeResult {
        super::server_info("flowrepl Python kernel", self.shared.instructions.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let asked_for_tasks = tasks::declared(&context).then(|| context.clone());
        let response = self
            .tool_router
            .call(ToolCallContext::new(self, request, context))
            .await?;
        Ok(match (response, asked_for_tasks) {
            (CallToolResponse::Complete(result), Some(context)) => {
                let finish = finish_cell(Arc::clone(&self.shared));
                self.shared.tasks.or_task(&context, result, finish)
            }
            (response, _) => response,
        })
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let cursor = request.and_then(|r| r.cursor);
        let ws = match &self.shared.files {
            Ok(ws) => Arc::clone(ws),
            Err(why) => return Err(internal(why.clone())),
        };
        let task = self.shared.task.clone();
        let (resources, next) = tokio::task::spawn_blocking(move || {
            crate::files::resources(&ws, &task, cursor.as_deref())
        })
        .await
        .map_err(|_| internal("listing the workspace failed"))?;
        let mut r = ListResourcesResult::with_all_items(resources);
        r.next_cursor = next;
        Ok(r)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(crate::files::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri.starts_with(crate::files::OUTPUT_URI) {
            return self.read_output_resource(&request.uri).map(Into::into);
        }
        let (task, path) = crate::files::parse_uri(&request.uri)?;
        self.own_task(&task)?;
        let ws = match &self.shared.files {
            Ok(ws) => Arc::clone(ws),
            Err(why) => return Err(internal(why.clone())),
        };
        let uri = request.uri;
        tokio::task::spawn_blocking(move || crate::files::read(&ws, &uri, &path))
            .await
            .map_err(|_| internal("reading the file failed"))?
            .map(Into::into)
    }

    async fn on_custom_notification(
        &self,
        notification: rmcp::model::CustomNotification,
        _context: rmcp::service::NotificationContext<RoleServer>,
    ) {
        if notification.method == super::DRAIN {
            tracing::info!("drain: no more cells start; the running one goes on");
            self.shared
                .draining
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.shared.tasks.get(&request.task_id)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared
            .tasks
            .update(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared.tasks.cancel(&request.task_id)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tool_name_constants_are_the_routers() {
        let names = super::tool_names();
        for name in [
            super::EXECUTE_CODE,
            super::WAIT_CELL,
            super::INTERRUPT,
            super::CHECKPOINT,
        ]
        .into_iter()
        .chain(crate::files::TOOLS)
        {
            assert!(names.iter().any(|n| n == name), "{name} is not a tool");
        }
    }
}
