//! The MCP Tasks extension (SEP-2663, `io.modelcontextprotocol/tasks`) for long cells, on
//! both MCP fronts (`flowrepl mcp` and `flowrepl serve`).
//!
//! A client that declares the extension gets a **task** where others get `running: true`:
//! when a cell is still running as its `execute_code` (or `wait_cell`) call answers (the
//! call's `wait_s`), the answer is a `CreateTaskResult`. The client polls `tasks/get` until
//! the task is `completed` with the cell's result (exactly what the call would have
//! returned), and `tasks/cancel` stops the cell (interrupted if it runs, dropped if it waits
//! its turn; the task ends `cancelled`). Short cells are answered at once as before: a task
//! costs the client a second round trip, so only cells that outlive `wait_s` become one.
//!
//! While the cell runs, the task's `statusMessage` says for how long and ends with the end
//! of its output so far (brought up to date every [`STATUS_EVERY`]).
//!
//! A cell of a task that asks for approval (a 2026-07-28 client that declared elicitation)
//! puts the task in `input_required` with the elicitation in `inputRequests` (keyed by
//! approval id); the client's `tasks/update` `inputResponses` answer it ([`InputForwarder`]).
//!
//! A task is kept [`TASK_TTL`] from its start: a cell still running then is reported
//! `failed` (it goes on, and its record still goes to the task log), and a finished task is
//! forgotten one more [`TASK_TTL`] after it ended.

use super::render;
use rmcp::model::{
    CallToolResponse, CallToolResult, CreateTaskResult, GetTaskResult, InputRequests,
    InputResponses,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskFuture, TaskManager, TaskOptions};
use rmcp::{ErrorData, RoleServer};
use std::collections::HashSet;
use std::time::Duration;

/// How long a task is kept from its start (and a finished one after it ended).
pub const TASK_TTL: Duration = Duration::from_secs(24 * 3600);
/// How often a running task's status message (the cell's output so far) is brought up to
/// date.
pub const STATUS_EVERY: Duration = Duration::from_secs(2);
/// How often a client should poll `tasks/get`.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Whether the request's client declared the tasks extension.
pub fn declared(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|caps| caps.supports_tasks())
}

/// One front's tasks (cheap to clone; clones share them).
#[derive(Clone, Default)]
pub struct CellTasks {
    manager: TaskManager,
}

impl CellTasks {
    /// If `result` says a cell is still running and the client declared tasks, a task that
    /// `finish` completes (given the cell id and the task's context); else `result`.
    pub fn or_task<F>(
        &self,
        context: &RequestContext<RoleServer>,
        result: CallToolResult,
        finish: F,
    ) -> CallToolResponse
    where
        F: FnOnce(u64, TaskContext) -> TaskFuture,
    {
        let Some(cell) = render::running_cell(&result) else {
            return result.into();
        };
        if !declared(context) {
            return result.into();
        }
        let options = TaskOptions::new()
            .with_ttl_ms(TASK_TTL.as_millis() as u64)
            .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64)
            .with_status_message(render::running_text(&cell, render::Next::Task));
        let id = cell.cell;
        let task = self.manager.spawn(options, |ctx| finish(id, ctx));
        tracing::info!(cell = id, task = %task.task_id, "a running cell became a task");
        CreateTaskResult::new(task).into()
    }

    /// `tasks/get`.
    pub fn get(&self, task_id: &str) -> Result<GetTaskResult, ErrorData> {
        self.manager.get_task(task_id).map(GetTaskResult::new)
    }

    /// `tasks/update`: answers to the task's `inputRequests` (others are ignored, as the
    /// extension says).
    pub fn update(&self, task_id: &str, responses: InputResponses) -> Result<(), ErrorData> {
        self.manager.update_task(task_id, responses)
    }

    /// `tasks/cancel`: the task's operation sees it and stops its cell.
    pub fn cancel(&self, task_id: &str) -> Result<(), ErrorData> {
        self.manager.cancel_task(task_id)
    }
}

/// Puts a task's cell's approvals in the task's `inputRequests` (each once) and passes the
/// client's answers on.
#[derive(Default)]
pub struct InputForwarder {
    forwarded: HashSet<String>,
}

impl InputForwarder {
    /// Forwards the `requests` not forwarded yet; `deliver(key, answer)` gets each answer.
    pub fn forward<D>(&mut self, ctx: &TaskContext, requests: Option<InputRequests>, deliver: D)
    where
        D: Fn(String, serde_json::Value) + Clone + Send + 'static,
    {
        for (key, request) in requests.unwrap_or_default() {
            if !self.forwarded.insert(key.clone()) {
                continue;
            }
            let (ctx, deliver) = (ctx.clone(), deliver.clone());
            tokio::spawn(async move {
                if let Ok(answer) = ctx.request_input(key.clone(), request).await {
                    deliver(key, answer);
                }
            });
        }
    }
}
