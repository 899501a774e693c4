//! A task's own URL: `/mcp/<plan>/<task>` serves the same tools as `/mcp`, bound to that task,
//! so that an HTTP load balancer can send each task to one server by its path (nginx
//! `hash $uri consistent`, Envoy's ring hash, a Kubernetes ingress) and move it when a server
//! dies; the task's state follows through the store (`--store`).
//!
//! The path's two segments (percent-decoded, each 1 to `MAX_ID_BYTES` bytes) become a
//! [`BoundTask`] in the request's extensions, which the handler reads from the HTTP request
//! rmcp hands it: a call there may leave out `task` and `plan`, or name the same ones; naming
//! another is -32602. The binding is the request's, not the MCP session's: a session opened on
//! one path and used on another is bound to the path of each request.

use super::child::TaskKey;
use axum::response::IntoResponse;
use rmcp::model::ErrorData;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

/// The route of a task's own URL.
pub const TASK_ROUTE: &str = "/mcp/{plan}/{task}";

/// A path's plan and task: each 1 to `MAX_ID_BYTES` bytes.
pub fn check_ids(plan: &str, task: &str) -> Result<(), String> {
    let max = flowrepl_task_logger::path::MAX_ID_BYTES;
    for (what, id) in [("plan", plan), ("task", task)] {
        if id.is_empty() || id.len() > max {
            return Err(format!(
                "the {what} in the path must be 1 to {max} bytes long"
            ));
        }
    }
    Ok(())
}

/// The task a request's path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundTask(pub TaskKey);

/// Puts the path's task into the request as a [`BoundTask`]; a bad id is 400.
pub async fn bind(
    axum::extract::Path((plan, task)): axum::extract::Path<(String, String)>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Err(why) = check_ids(&plan, &task) {
        return (axum::http::StatusCode::BAD_REQUEST, why).into_response();
    }
    request
        .extensions_mut()
        .insert(BoundTask(TaskKey { plan, task }));
    next.run(request).await
}

/// The task the request of `context` is bound to by its path, if any.
pub fn bound(context: &RequestContext<RoleServer>) -> Option<TaskKey> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<BoundTask>())
        .map(|b| b.0.clone())
}

/// The call's `task` and `plan` (given or not) checked against the bound task.
pub fn check(
    bound: &TaskKey,
    task: Option<&str>,
    plan: Option<&str>,
) -> Result<TaskKey, ErrorData> {
    for (what, given, mine) in [("task", task, &bound.task), ("plan", plan, &bound.plan)] {
        if let Some(given) = given {
            if given != mine {
                let shown: String = given.chars().take(80).collect();
                return Err(ErrorData::invalid_params(
                    format!(
                        "this URL serves task {:?} of plan {:?}; the call names {what} {shown:?}: call that task at its own URL, or at /mcp",
                        bound.task, bound.plan
                    ),
                    None,
                ));
            }
        }
    }
    Ok(bound.clone())
}
