//! Approvals over MCP: a cell's `flow.request_approval` becomes an `elicitation/create`
//! request (form mode, MCP 2025-06-18) to the client, when the client declared the
//! elicitation capability.
//!
//! The form has one optional field, `comment`. The client's action decides: `accept` →
//! approved (`True`), `decline` → declined (`False`), `cancel` or an error → cancelled
//! (`flow.ApprovalCancelled`). When the cell stops waiting first (its `timeout_s`, an
//! interrupt, a cancelled call), the request is cancelled with `notifications/cancelled`.
//! Without the capability nothing is sent and the cell gets `None` at once.
//!
//! A 2026-07-28 client (no `initialize`) cannot be sent requests: its approvals go into the
//! [`Inbox`], and the call waiting for the cell (`execute_code`, `wait_cell`) answers with an
//! `InputRequiredResult` carrying them as `inputRequests` (SEP-2322, keyed by approval id)
//! and `requestState: "cell:<id>"`; the client asks the person and sends the same call again
//! with `inputResponses`, which answer the approvals, and the call goes on waiting for the
//! same cell (the code does not run twice). Whether such a client can answer is per request
//! (its `_meta` capabilities); the latest waiting call's say is the one used.

use flowrepl_os::lock;
use flowrepl_protocol::{ApprovalAnswer, ApprovalOutcome, ApprovalRequest};
use flowrepl_session::approvals::{Approvals, Asker};
use rmcp::model::{
    CancelledNotificationParam, ClientResult, ElicitRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationSchema, InputRequest, InputRequests, InputResponses,
    RequestMetaObject, ServerRequest,
};
use rmcp::service::PeerRequestOptions;
use rmcp::{Peer, RoleServer};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Approvals waiting to go to a 2026-07-28 client in an answer's `inputRequests`.
#[derive(Default)]
pub struct Inbox {
    waiting: Mutex<BTreeMap<String, ElicitRequestParams>>,
    /// Bumped when an approval comes in.
    changed: tokio::sync::watch::Sender<u64>,
    /// How the client of the latest call waiting for a cell can be asked.
    pub asking: LatestAsking,
}

impl Inbox {
    /// Notified when an approval comes in.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The approvals waiting, as `inputRequests` (none: `None`).
    pub fn requests(&self) -> Option<InputRequests> {
        input_requests(lock(&self.waiting).iter())
    }

    fn put(&self, approval_id: &str, params: ElicitRequestParams) {
        lock(&self.waiting).insert(approval_id.to_owned(), params);
        self.changed.send_modify(|n| *n += 1);
    }

    fn remove(&self, approval_id: &str) -> bool {
        lock(&self.waiting).remove(approval_id).is_some()
    }

    /// Answers the approvals `responses` name (each an `ElicitResult`); the others are
    /// ignored, as SEP-2322 asks.
    pub fn deliver(&self, responses: InputResponses, approvals: &Approvals) {
        for (id, value) in responses {
            if !self.remove(&id) {
                continue;
            }
            let reply = serde_json::from_value::<ElicitResult>(value)
                .map(ClientResult::ElicitResult)
                .map_err(|e| {
                    rmcp::ServiceError::McpError(rmcp::ErrorData::invalid_params(
                        format!("not an elicitation result: {e}"),
                        None,
                    ))
                });
            approvals.answer(answer_of(&id, reply));
        }
    }
}

/// The id in a `requestState` this server gave (`<prefix>:<id>`), else -32602.
pub fn state_id(state: &str, prefix: &str) -> Result<u64, rmcp::ErrorData> {
    state
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| {
            rmcp::ErrorData::invalid_params(
                format!("requestState {state:?} is not one this server gave"),
                None,
            )
        })
}

/// Elicitation requests by key as `inputRequests` (none: `None`).
pub fn input_requests<'a>(
    requests: impl Iterator<Item = (&'a String, &'a ElicitRequestParams)>,
) -> Option<InputRequests> {
    let requests: InputRequests = requests
        .map(|(key, params)| {
            let request = ElicitRequest::new(params.clone());
            (key.clone(), InputRequest::Elicitation(request))
        })
        .collect();
    (!requests.is_empty()).then_some(requests)
}

/// The MCP front's [`Asker`].
pub struct ElicitAsker {
    peer: Peer<RoleServer>,
    runtime: tokio::runtime::Handle,
    /// Requests in flight: the task awaiting each, and its request id once sent.
    asks: Arc<Mutex<HashMap<String, InFlight>>>,
    /// For a 2026-07-28 client.
    inbox: Arc<Inbox>,
}

struct InFlight {
    task: tokio::task::AbortHandle,
    request_id: Arc<Mutex<Option<rmcp::model::RequestId>>>,
}

impl ElicitAsker {
    /// Asks through `peer`, on the MCP thread's runtime (a 2026-07-28 client: through
    /// `inbox`).
    pub fn new(
        peer: Peer<RoleServer>,
        runtime: tokio::runtime::Handle,
        inbox: Arc<Inbox>,
    ) -> ElicitAsker {
        ElicitAsker {
            peer,
            runtime,
            asks: Arc::default(),
            inbox,
        }
    }

    /// Whether the client can be asked, else why not.
    fn askable(&self) -> Result<(), String> {
        if self
            .peer
            .supported_elicitation_modes()
            .contains(&rmcp::service::ElicitationMode::Form)
        {
            Ok(())
        } else {
            Err(NOT_DECLARED.into())
        }
    }
}

/// How the client of a call can be asked for approvals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Asking {
    /// Through elicitation requests (a handshake-era client; whether it declared the
    /// capability is in its `initialize`).
    #[default]
    Requests,
    /// In the call's answer, as `inputRequests` (a client of a revision without
    /// `initialize`, 2026-07-28 on, that declared elicitation in the request).
    InAnswers,
    /// Not at all (such a client that did not declare elicitation).
    Nobody,
}

impl Asking {
    /// How the client of a request with `meta`, from `peer`, can be asked.
    pub fn of(meta: &RequestMetaObject, peer: &Peer<RoleServer>) -> Asking {
        let version = meta
            .protocol_version()
            .or_else(|| peer.peer_info().map(|i| i.protocol_version.clone()));
        match version {
            // No `initialize` in the revision: no server-to-client requests either.
            Some(v) if !v.has_initialize() => {
                let declared = meta
                    .client_capabilities()
                    .is_some_and(|c| c.elicitation.is_some());
                if declared {
                    Asking::InAnswers
                } else {
                    Asking::Nobody
                }
            }
            _ => Asking::Requests,
        }
    }

    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> Asking {
        match code {
            1 => Asking::InAnswers,
            2 => Asking::Nobody,
            _ => Asking::Requests,
        }
    }
}

/// Why nobody can be asked, when the client did not declare elicitation.
pub const NOT_DECLARED: &str =
    "the MCP client did not declare the elicitation capability, so nobody can be asked";

/// The latest [`Asking`] said, shared between threads.
#[derive(Debug, Default)]
pub struct LatestAsking(std::sync::atomic::AtomicU8);

impl LatestAsking {
    /// Says how the client of the latest call can be asked.
    pub fn set(&self, asking: Asking) {
        self.0.store(asking.code(), Ordering::Release);
    }

    /// How the client of the latest call can be asked.
    pub fn get(&self) -> Asking {
        Asking::from_code(self.0.load(Ordering::Acquire))
    }
}

/// The text shown to the person: the message, then the data when there is any.
fn prompt(request: &ApprovalRequest) -> String {
    let data = request.data.get();
    if data == "{}" {
        request.message.clone()
    } else {
        format!("{}\n\n{data}", request.message)
    }
}

fn schema() -> ElicitationSchema {
    ElicitationSchema::builder()
        .optional_string_with("comment", |s| {
            s.title("Comment")
                .description("Optional: a note for the code that asked")
        })
        .description("Approve (accept) or decline the request")
        .build_unchecked()
}

/// The cell's answer from the client's reply.
fn answer_of(approval_id: &str, reply: Result<ClientResult, rmcp::ServiceError>) -> ApprovalAnswer {
    let cancelled =
        |why: String| ApprovalAnswer::without_person(approval_id, ApprovalOutcome::Cancelled, why);
    let r = match reply {
        Ok(ClientResult::ElicitResult(r)) => r,
        Ok(other) => return cancelled(format!("the client answered something else: {other:?}")),
        Err(e) => return cancelled(format!("the elicitation request failed: {e}")),
    };
    let comment = r
        .content
        .as_ref()
        .and_then(|c| c.get("comment"))
        .and_then(|c| c.as_str())
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    let outcome = match r.action {
        ElicitationAction::Accept => ApprovalOutcome::Approved,
        ElicitationAction::Decline => ApprovalOutcome::Declined,
        _ => return cancelled("the person dismissed the request".into()),
    };
    ApprovalAnswer {
        approval_id: approval_id.to_owned(),
        outcome,
        comment,
        reason: None,
    }
}

impl Asker for ElicitAsker {
    fn ask(&self, request: &ApprovalRequest, approvals: &Arc<Approvals>) -> Result<(), String> {
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: prompt(request),
            requested_schema: schema(),
        };
        match self.inbox.asking.get() {
            Asking::Requests => self.askable()?,
            Asking::Nobody => return Err(NOT_DECLARED.into()),
            Asking::InAnswers => {
                self.inbox.put(&request.approval_id, params);
                return Ok(());
            }
        }
        let id = request.approval_id.clone();
        let request_id = Arc::new(Mutex::new(None));
        let (peer, approvals, asks, sent) = (
            self.peer.clone(),
            Arc::clone(approvals),
            Arc::clone(&self.asks),
            Arc::clone(&request_id),
        );
        // Registered before the task can finish and remove it.
        let mut guard = lock(&self.asks);
        let task = self.runtime.spawn(async move {
            let reply = match peer
                .send_cancellable_request(
                    ServerRequest::ElicitRequest(ElicitRequest::new(params)),
                    PeerRequestOptions::no_options(),
                )
                .await
            {
                Ok(handle) => {
                    *lock(&sent) = Some(handle.id.clone());
                    handle.await_response().await
                }
                Err(e) => Err(e),
            };
            lock(&asks).remove(&id);
            approvals.answer(answer_of(&id, reply));
        });
        guard.insert(
            request.approval_id.clone(),
            InFlight {
                task: task.abort_handle(),
                request_id,
            },
        );
        Ok(())
    }

    fn withdraw(&self, approval_id: &str) {
        self.inbox.remove(approval_id);
        let Some(f) = lock(&self.asks).remove(approval_id) else {
            return;
        };
        f.task.abort();
        let Some(request_id) = lock(&f.request_id).take() else {
            return;
        };
        let peer = self.peer.clone();
        self.runtime.spawn(async move {
            let p = CancelledNotificationParam::new(
                Some(request_id),
                Some("the cell no longer waits for this approval".into()),
            );
            if let Err(e) = peer.notify_cancelled(p).await {
                tracing::debug!(error = %e, "cancelling an elicitation failed");
            }
        });
    }
}
