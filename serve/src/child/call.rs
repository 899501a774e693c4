//! A client's tool call relayed to the child: its progress token mapped, its cancellation
//! passed on, and the approvals the cell asks meanwhile given to the client (as
//! elicitation requests, or in the call's answer for a 2026-07-28 client).

use super::{Child, Progress};
use flowrepl_mcp::approval::Asking;
use flowrepl_mcp::tools;
use flowrepl_os::lock;
use rmcp::model::{
    CallToolResponse, CallToolResult, InputRequests, InputRequiredResult, InputResponses,
    ProgressToken, ResultType,
};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// How a call is relayed.
#[derive(Debug, Default)]
pub struct Relay {
    /// How its client can be asked for approvals.
    pub asking: Asking,
    /// The call sent again: its `requestState` (see [`crate::relay`]) and the client's
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
        flowrepl_mcp::approval::input_requests(inbox.iter().map(|(key, (params, _))| (key, params)))
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
}
