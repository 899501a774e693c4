//! The wire to the child: requests sent with ids of this connection, and the reader that
//! routes what the child sends (see the parent module) and passes its stderr on.

use super::{Child, ChildError, LAST_WORDS, MAX_STDERR_LINE};
use flowrepl_mcp::approval::Asking;
use flowrepl_mcp::lines::{BoundedLines, Line};
use flowrepl_os::lock;
use rmcp::model::{ElicitRequestParams, ProgressNotificationParam};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

impl Child {
    /// Sends a request and waits for its response message.
    pub(super) async fn request(&self, method: &str, params: Value) -> Result<Value, ChildError> {
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

    /// Relays `resources/read` of `uri` (a cell's output, which the kernel holds): its result,
    /// or its error as the kernel gave it.
    pub async fn read_resource(
        &self,
        uri: &str,
    ) -> Result<Result<rmcp::model::ReadResourceResult, rmcp::ErrorData>, ChildError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.register(id);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "resources/read", "params": {"uri": uri}}))
            .await?;
        let mut reply = rx.await.map_err(|_| self.exited("before it answered"))?;
        let bad = |e: serde_json::Error| {
            ChildError::Rpc(format!("the kernel's answer to resources/read: {e}"))
        };
        Ok(match reply.get_mut("error") {
            Some(e) => Err(serde_json::from_value(e.take()).map_err(bad)?),
            None => Ok(serde_json::from_value(reply["result"].take()).map_err(bad)?),
        })
    }

    /// It exited `when`: with what it said last on stderr, when that names an error.
    pub(super) fn exited(&self, when: &str) -> ChildError {
        let words = lock(&self.last_words);
        let why = words
            .iter()
            .rev()
            .find(|l| l.contains("ERROR") || l.starts_with("flowrepl"))
            .map(|l| format!(": {}", l.trim()))
            .unwrap_or_default();
        ChildError::Exited(format!(" {when}{why}"))
    }

    pub(super) fn register(&self, id: u64) -> oneshot::Receiver<Value> {
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        rx
    }

    pub(super) async fn send(&self, message: &Value) -> Result<(), ChildError> {
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
}

/// Passes the kernel's stderr on to the server's, each line after its task, keeping the last
/// ones for error messages.
pub(super) async fn pass_on_stderr(child: Arc<Child>, stderr: tokio::process::ChildStderr) {
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
pub(super) async fn read_loop(
    child: Arc<Child>,
    mut lines: BoundedLines<tokio::process::ChildStdout>,
    diagnostics: tokio::task::JoinHandle<()>,
) {
    while let Ok(Some(line)) = lines.next().await {
        let line = match line {
            Line::Whole(line) => line,
            Line::Over(over) => {
                tracing::warn!(task = %child.key.task, len = over.len, "the kernel sent a message over FLOWREPL_MAX_REQUEST_BYTES: dropped");
                // Our ids are numbers, and the kernel writes a reply's id before its result.
                let id = flowrepl_protocol::jsonrpc::id_in_prefix(&over.head)
                    .and_then(|id| serde_json::to_value(id).ok()?.as_u64());
                let waiting = id.and_then(|id| lock(&child.pending).remove(&id));
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
