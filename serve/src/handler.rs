//! The MCP server `serve` is: the kernels' tools, each with optional `task` and `plan`
//! arguments that pick the kernel, plus `list_kernels` and `stop_kernel`.

use super::child::{Child, Relay, TaskKey};
use super::pool::{KernelInfo, Pool, PoolError};
use flowrepl_mcp::approval::Asking;
use flowrepl_mcp::tasks::{self, CellTasks};
use flowrepl_mcp::tools::structured;
use flowrepl_mcp::{render, schema};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    GetTaskParams, GetTaskResult, InitializeResult, JsonObject, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, Tool, ToolAnnotations, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::sync::Arc;

/// The tools that are `serve`'s own (the others go to a kernel).
const LIST_KERNELS: &str = "list_kernels";
/// See [`LIST_KERNELS`].
const STOP_KERNEL: &str = "stop_kernel";

/// The names of the server's tools, sorted: the kernels' and its own.
pub fn tool_names() -> Vec<String> {
    let mut names = flowrepl_mcp::tools::tool_names();
    names.extend([LIST_KERNELS.to_owned(), STOP_KERNEL.to_owned()]);
    names.sort();
    names
}

/// `list_kernels`' structured result.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct KernelList {
    /// One per task with a kernel.
    pub kernels: Vec<KernelInfo>,
    /// `--max-kernels`.
    pub max_kernels: u32,
}

/// `stop_kernel`'s structured result.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct Stopped {
    /// The plan id.
    pub plan: String,
    /// The task id.
    pub task: String,
    /// Whether a kernel was running.
    pub stopped: bool,
    /// What happened (the checkpoint taken first).
    pub message: String,
}

/// A file tool's work on a task's workspace.
type FileOp =
    dyn FnOnce(&flowrepl_files::Workspace, &flowrepl_mcp::files::TaskRef) -> CallToolResult + Send;

/// The server (cloned per connection by rmcp; everything is shared).
#[derive(Clone)]
pub struct Serve {
    pool: Arc<Pool>,
    files: super::files::Files,
    tools: Arc<Vec<Tool>>,
    defaults: Arc<TaskKey>,
    instructions: Arc<str>,
    /// Cells that became MCP tasks (clients with the tasks extension).
    tasks: CellTasks,
}

impl Serve {
    /// A server over `pool`; `kernel_tools` are the kernels' own tools, `defaults` the task
    /// of calls that name none.
    pub fn new(files: super::files::Files, kernel_tools: Vec<Tool>, defaults: TaskKey) -> Serve {
        let pool = Arc::clone(&files.pool);
        let sandboxed = pool.sandboxed();
        let mut tools: Vec<Tool> = kernel_tools.into_iter().map(with_task_args).collect();
        tools.push(
            Tool::new_with_raw(
                LIST_KERNELS,
                Some("List this server's kernels, one per task: state (busy, idle, exited), mode, process id, memory, cells run, seconds idle. Kernels stopped when idle are not listed; their next call starts them again from their checkpoint.".into()),
                Arc::new(empty_object()),
            )
            .with_raw_output_schema(schema::shallow::<KernelList>())
            .with_annotations(ToolAnnotations::new().read_only(true).open_world(false)),
        );
        tools.push(
            Tool::new_with_raw(
                STOP_KERNEL,
                Some("Checkpoint a task's kernel and stop it (its running cell, if any, is interrupted). The task's next call starts it again from the checkpoint, with restored: true. If the checkpoint fails, the kernel is kept (stopped: false, and the message says why).".into()),
                Arc::new(task_args(empty_object())),
            )
            .with_raw_output_schema(schema::shallow::<Stopped>())
            .with_annotations(ToolAnnotations::new().destructive(false).idempotent(true).open_world(false)),
        );
        let instructions = format!(
            "Persistent Python sessions (flowrepl), one per task: every tool takes an optional `task` (and `plan`) naming the session (default task {task:?} of plan {plan:?}). Variables and imports persist between calls on the same task; different tasks are isolated{sb}. Each task has its own log, checkpoints and workspace. A kernel idle for a while is checkpointed and stopped; the task's next call resumes it (restored: true in that result). list_kernels shows them, stop_kernel stops one.",
            task = defaults.task,
            plan = defaults.plan,
            sb = if sandboxed { ", each in its own sandbox (no network; files written only in the task's workspace and /tmp)" } else { "" },
        );
        Serve {
            pool,
            files,
            tools: Arc::new(tools),
            defaults: Arc::new(defaults),
            instructions: instructions.into(),
            tasks: CellTasks::default(),
        }
    }

    /// The task `args` name (removing `task` and `plan` from them), else the one the request's
    /// path names (`bound`), else the defaults; naming another than the path's is -32602.
    fn task_of(
        &self,
        args: &mut JsonObject,
        bound: Option<&TaskKey>,
    ) -> Result<TaskKey, ErrorData> {
        let max = flowrepl_task_logger::path::MAX_ID_BYTES;
        let mut take = |k: &str| match args.remove(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() > max => Err(ErrorData::invalid_params(
                format!("{k} is {} bytes long; at most {max}", s.len()),
                None,
            )),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(other) => {
                // Never echoed whole: it could be anything up to the body limit.
                let shown: String = other.to_string().chars().take(40).collect();
                Err(ErrorData::invalid_params(
                    format!("{k} must be a non-empty string, not {shown}…"),
                    None,
                ))
            }
        };
        let task = take("task")?;
        let plan = take("plan")?;
        if let Some(bound) = bound {
            return super::route::check(bound, task.as_deref(), plan.as_deref());
        }
        Ok(TaskKey {
            plan: plan.unwrap_or_else(|| self.defaults.plan.clone()),
            task: task.unwrap_or_else(|| self.defaults.task.clone()),
        })
    }

    /// A file tool, served here (the task's kernel need not run; with `--store` a change
    /// starts it, which takes the task's lease).
    async fn file_tool(
        &self,
        name: &str,
        key: TaskKey,
        args: JsonObject,
    ) -> Result<CallToolResult, ErrorData> {
        use flowrepl_mcp::files as f;
        fn parse<T: serde::de::DeserializeOwned>(args: JsonObject) -> Result<T, ErrorData> {
            serde_json::from_value(Value::Object(args))
                .map_err(|e| ErrorData::invalid_params(format!("invalid arguments: {e}"), None))
        }
        let mut listed = None;
        let op: Box<FileOp> = match name {
            f::UPLOAD_FILE => {
                let a: flowrepl_protocol::files::UploadParams = parse(args)?;
                Box::new(move |ws, _| f::upload(ws, &a))
            }
            f::DOWNLOAD_FILE => {
                let a: flowrepl_protocol::files::PathParams = parse(args)?;
                let max = self.files.places.max_chars;
                Box::new(move |ws, t| f::download(ws, t, &a, max))
            }
            f::LIST_FILES => {
                let a: flowrepl_protocol::files::ListParams = parse(args)?;
                listed = Some(a.path.clone());
                Box::new(move |ws, _| f::list(ws, &a))
            }
            _ => {
                let a: flowrepl_protocol::files::PathParams = parse(args)?;
                Box::new(move |ws, _| f::delete(ws, &a))
            }
        };
        if matches!(name, f::UPLOAD_FILE | f::DELETE_FILE) {
            if let Err(why) = self.files.hold(&key).await {
                return Ok(CallToolResult::error(vec![ContentBlock::text(why)]));
            }
        }
        let places = Arc::clone(&self.files.places);
        let upload = name == f::UPLOAD_FILE;
        tokio::task::spawn_blocking(move || {
            let task = f::TaskRef {
                plan: key.plan.clone(),
                task: key.task.clone(),
            };
            match places.open(&key, upload) {
                Ok(ws) => op(&ws, &task),
                // A task with no workspace yet has no files (nothing is made for a look).
                Err(e @ flowrepl_files::FileError::NoTask { .. }) => match listed {
                    Some(path) => f::list_empty(path.as_deref(), &e),
                    None => f::refused(&e),
                },
                Err(e) => f::refused(&e),
            }
        })
        .await
        .map_err(|_| ErrorData::internal_error("the file operation failed", None))
    }

    /// `resources/read` of a cell's whole output: the task's kernel holds it, so the read is
    /// relayed to it while it runs (a stopped kernel took it along; the task log has it).
    async fn read_output(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResult, ErrorData> {
        let (task, _, _) = flowrepl_mcp::files::parse_output_uri(uri)?;
        let key = uri_task(context, task)?;
        let Some(kernel) = self.pool.running_kernel(&key) else {
            // A task that ran has a log (and a workspace); one that never did has neither.
            let log = flowrepl_task_logger::task_log_path(
                &self.files.places.log_dir,
                &key.plan,
                &key.task,
            );
            let ran = log.exists() || self.files.places.spawn.workspace_of(&key).is_dir();
            let why = if ran {
                format!(
                    "task {:?}'s kernel has stopped, and the output it held went with it; every cell's full output is in the task log",
                    key.task
                )
            } else {
                format!(
                    "task {:?} of plan {:?} does not exist here: no kernel ever ran it, so it has no output",
                    flowrepl_files::shown(&key.task),
                    flowrepl_files::shown(&key.plan)
                )
            };
            return Err(ErrorData::resource_not_found(why, None));
        };
        kernel
            .read_resource(uri)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
    }

    /// The task a resource request is about: the request's path's, else the defaults.
    fn resource_task(&self, context: &RequestContext<RoleServer>) -> TaskKey {
        super::route::bound(context).unwrap_or_else(|| (*self.defaults).clone())
    }

    fn list_kernels(&self) -> CallToolResult {
        let list = KernelList {
            kernels: self.pool.list(),
            max_kernels: self.pool.max_kernels(),
        };
        let mut text = format!(
            "{} kernel(s) (at most {}):",
            list.kernels.len(),
            list.max_kernels
        );
        for k in &list.kernels {
            let _ = write!(
                text,
                "\n{}/{}: {}, {}, pid {}, {} KiB, {} cells, idle {:.0} s",
                k.plan, k.task, k.state, k.mode, k.pid, k.memory_kb, k.cells, k.idle_s
            );
        }
        structured(text, &list, false)
    }
}

/// A task's operation through the relay: `wait_cell` on the kernel until the cell's result
/// comes, each running answer (every [`tasks::STATUS_EVERY`]) becoming the task's status
/// message; a `tasks/cancel` sends `interrupt {cell}` and the task ends cancelled once the
/// cell has stopped.
fn finish_relayed(
    kernel: Arc<Child>,
    peer: Peer<RoleServer>,
) -> impl FnOnce(u64, TaskContext) -> TaskFuture {
    move |cell, ctx| {
        Box::pin(async move {
            use flowrepl_mcp::tools::{
                arguments, InterruptArgs, WaitCellArgs, INTERRUPT, WAIT_CELL,
            };
            let never = tokio_util::sync::CancellationToken::new();
            let every = tasks::STATUS_EVERY.as_secs_f64();
            let mut cancelled = false;
            let mut inbox = kernel.inbox_changes();
            let mut inputs = tasks::InputForwarder::default();
            loop {
                let wait = relayed(kernel.call_tool(
                    WAIT_CELL,
                    arguments(&WaitCellArgs {
                        cell,
                        wait_s: Some(every),
                    }),
                    None,
                    &peer,
                    &never,
                    Relay::default(),
                ));
                tokio::pin!(wait);
                let result = loop {
                    let to = Arc::clone(&kernel);
                    inputs.forward(&ctx, kernel.inbox_requests(), move |key, answer| {
                        to.deliver([(key, answer)].into());
                    });
                    tokio::select! {
                        r = &mut wait => break r.map_err(TaskExit::Error)?,
                        _ = inbox.changed() => {}
                        _ = ctx.cancelled(), if !cancelled => {
                            cancelled = true;
                            tracing::info!(cell, "task cancelled: interrupting its cell");
                            let args = arguments(&InterruptArgs { cell: Some(cell) });
                            let stop = kernel.call_tool(INTERRUPT, args, None, &peer, &never, Relay::default());
                            if let Err(e) = stop.await {
                                tracing::warn!(cell, error = %e.message, "interrupting a task's cell failed");
                            }
                        }
                    }
                };
                match render::running_cell(&result) {
                    Some(now) => {
                        ctx.set_status_message(render::running_text(&now, render::Next::Task))
                    }
                    None if cancelled => return Err(TaskExit::Cancelled),
                    None => return Ok(result),
                }
            }
        })
    }
}

/// A relayed call's tool result (a task's relayed calls never ask for input).
/// A kernel's refusal of a call it did not run because another kernel took its task
/// (`--store`; the session's lease check, docs/store.md).
fn taken_over_not_run(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
        && r.content.iter().any(|c| {
            c.as_text().is_some_and(|t| {
                t.text.contains("taken over") && t.text.contains("the call was not run")
            })
        })
}

async fn relayed(
    call: impl std::future::Future<Output = Result<CallToolResponse, ErrorData>>,
) -> Result<CallToolResult, ErrorData> {
    match call.await? {
        CallToolResponse::Complete(r) => Ok(r),
        _ => Err(ErrorData::internal_error(
            "the kernel's answer to a task's call is not a tool result",
            None,
        )),
    }
}

/// A resource URI's task, checked against the task the request's path names (if any).
fn uri_task(
    context: &RequestContext<RoleServer>,
    task: flowrepl_mcp::files::TaskRef,
) -> Result<TaskKey, ErrorData> {
    let key = match super::route::bound(context) {
        Some(bound) => super::route::check(&bound, Some(&task.task), Some(&task.plan))?,
        None => TaskKey {
            plan: task.plan,
            task: task.task,
        },
    };
    super::route::check_ids(&key.plan, &key.task)
        .map_err(|why| ErrorData::invalid_params(why, None))?;
    Ok(key)
}

fn empty_object() -> JsonObject {
    serde_json::from_value(json!({"type": "object", "properties": {}})).expect("an object")
}

/// Adds the optional `task` and `plan` properties to a tool's input schema.
fn task_args(mut schema: JsonObject) -> JsonObject {
    let props = schema.entry("properties").or_insert_with(|| json!({}));
    if let Some(p) = props.as_object_mut() {
        p.insert(
            "task".into(),
            json!({"type": "string", "description": "The task whose session to use (default: the server's FLOW_TASK_ID, else `adhoc`). Each task has its own kernel, variables, log, checkpoints and workspace."}),
        );
        p.insert(
            "plan".into(),
            json!({"type": "string", "description": "The task's plan (default: the server's FLOW_PLAN_ID, else `local`)."}),
        );
    }
    schema
}

fn with_task_args(mut tool: Tool) -> Tool {
    tool.input_schema = Arc::new(task_args((*tool.input_schema).clone()));
    tool
}

impl ServerHandler for Serve {
    fn get_info(&self) -> InitializeResult {
        flowrepl_mcp::server_info("flowrepl Python kernels", self.instructions.to_string())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks.get(&request.task_id)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.update(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel(&request.task_id)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(flowrepl_mcp::files::templates())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let key = self.resource_task(&context);
        let cursor = request.and_then(|r| r.cursor);
        let places = Arc::clone(&self.files.places);
        let (resources, next) = tokio::task::spawn_blocking(move || {
            let task = flowrepl_mcp::files::TaskRef {
                plan: key.plan.clone(),
                task: key.task.clone(),
            };
            match places.open(&key, false) {
                Ok(ws) => Ok(flowrepl_mcp::files::resources(
                    &ws,
                    &task,
                    cursor.as_deref(),
                )),
                // No workspace yet: no files.
                Err(flowrepl_files::FileError::NoTask { .. }) => Ok((Vec::new(), None)),
                Err(e) => Err(flowrepl_mcp::files::resource_error(&e)),
            }
        })
        .await
        .map_err(|_| ErrorData::internal_error("listing the workspace failed", None))??;
        let mut r = ListResourcesResult::with_all_items(resources);
        r.next_cursor = next;
        Ok(r)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri.starts_with(flowrepl_mcp::files::OUTPUT_URI) {
            return self
                .read_output(&request.uri, &context)
                .await
                .map(Into::into);
        }
        let (task, path) = flowrepl_mcp::files::parse_uri(&request.uri)?;
        let key = uri_task(&context, task)?;
        let places = Arc::clone(&self.files.places);
        let uri = request.uri;
        tokio::task::spawn_blocking(move || {
            let ws = places
                .open(&key, false)
                .map_err(|e| flowrepl_mcp::files::resource_error(&e))?;
            flowrepl_mcp::files::read(&ws, &uri, &path)
        })
        .await
        .map_err(|_| ErrorData::internal_error("reading the file failed", None))?
        .map(Into::into)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items((*self.tools).clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.as_ref();
        if !self.tools.iter().any(|t| t.name == name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool: {name}"),
                None,
            ));
        }
        let mut args = request.arguments.unwrap_or_default();
        if name == LIST_KERNELS {
            return Ok(self.list_kernels().into());
        }
        let key = self.task_of(&mut args, super::route::bound(&context).as_ref())?;
        if flowrepl_mcp::files::TOOLS.contains(&name) {
            return Ok(self.file_tool(name, key, args).await?.into());
        }
        if name == STOP_KERNEL {
            let said = self.pool.stop_kept_unless_saved(&key).await;
            let stopped = Stopped {
                plan: key.plan.clone(),
                task: key.task.clone(),
                stopped: matches!(said, Some(Ok(_))),
                message: match said {
                    Some(Ok(text)) => text,
                    Some(Err(why)) => format!(
                        "not stopped: its checkpoint failed ({why}), and stopping it would lose its variables; it keeps running (fix the log folder and call stop_kernel again)"
                    ),
                    None => "no kernel was running for this task".into(),
                },
            };
            return Ok(structured(stopped.message.clone(), &stopped, false).into());
        }
        let kernel = match self.pool.kernel(&key).await {
            Ok(k) => k,
            Err(e @ (PoolError::Full(_) | PoolError::Closing)) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(e.to_string())]).into())
            }
            Err(PoolError::Child(e)) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "{}: {e}",
                    key.task
                ))])
                .into())
            }
        };
        let progress = context.meta.get_progress_token();
        let how = Relay {
            asking: Asking::of(&context.meta, &context.peer),
            resume: request
                .request_state
                .map(|state| (state, request.input_responses.unwrap_or_default())),
        };
        let again = args.clone();
        let mut response = kernel
            .call_tool(
                name,
                args,
                progress.clone(),
                &context.peer,
                &context.ct,
                how,
            )
            .await?;
        let mut kernel = kernel;
        if matches!(&response, CallToolResponse::Complete(r) if taken_over_not_run(r)) {
            // With --store: another server took the task while this kernel idled (a
            // balancer's move, a failback). The kernel ran nothing and stops; a new one asks
            // for the task through the store (its holder hands it over) and gets the call.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !kernel.ended() && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            if kernel.ended() {
                tracing::info!(task = %key.task, "the task was taken over while its kernel idled: starting a kernel that asks for it back");
                if let Ok(k) = self.pool.kernel(&key).await {
                    let how = Relay {
                        asking: Asking::of(&context.meta, &context.peer),
                        resume: None,
                    };
                    response = k
                        .call_tool(name, again, progress, &context.peer, &context.ct, how)
                        .await?;
                    kernel = k;
                }
            }
        }
        Ok(match response {
            CallToolResponse::Complete(result) => {
                let finish = finish_relayed(kernel, context.peer.clone());
                self.tasks.or_task(&context, result, finish)
            }
            other => other,
        })
    }
}
