//! The kernel's approval broker: requests from cells (`flow.request_approval`) go to the
//! front's [`Asker`], answers come back through [`Approvals::answer`].
//!
//! - **Requests** arrive from the engine: in-process straight from the executor (the broker
//!   is its [`Approver`]), in worker mode as ApprovalRequest frames, which the worker engine
//!   [`Approvals::open`]s with a delivery that writes the ApprovalAnswer frame.
//! - **Askers** belong to the fronts: the JSON-RPC front writes an `approval_requested`
//!   notification; the MCP front sends `elicitation/create`. Without an asker (drop-in mode,
//!   an MCP client without elicitation) the request is answered
//!   [`ApprovalOutcome::Unavailable`] at once.
//! - **Answers** come from any thread: the JSON-RPC `approve` method (the watcher answers it
//!   while the cell runs), the MCP elicitation result, or [`Approvals::cancel_all`] when the
//!   client goes away. The first answer wins; later ones are not accepted.
//!
//! A request is pending from [`Approvals::open`] until it is answered or the cell stops
//! waiting ([`Approvals::close`]: timed out or interrupted), which also withdraws the
//! question from the asker.

use flowrepl_exec::setup::Approver;
use flowrepl_os::lock;
use flowrepl_protocol::{ApprovalAnswer, ApprovalOutcome, ApprovalRequest};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Asks a person on behalf of the front.
pub trait Asker: Send + Sync {
    /// Shows `request`; the answer is handed to [`Approvals::answer`] later. `Err(reason)`:
    /// nobody can be asked this way.
    fn ask(&self, request: &ApprovalRequest, approvals: &Arc<Approvals>) -> Result<(), String>;
    /// The cell no longer waits for `approval_id`: stop asking, if the channel can.
    fn withdraw(&self, _approval_id: &str) {}
}

/// Hands an answer to the waiting cell.
pub type Deliver = Box<dyn FnOnce(ApprovalAnswer) + Send>;

/// The pending requests of the session and the way to ask.
#[derive(Default)]
pub struct Approvals {
    asker: Mutex<Option<Arc<dyn Asker>>>,
    /// Pending requests: how to deliver the answer, and the question (for progress reports).
    pending: Mutex<HashMap<String, (Deliver, String)>>,
    /// In-process: answers delivered and not yet taken by the waiting cell.
    answered: Mutex<HashMap<String, ApprovalAnswer>>,
    arrived: Condvar,
    /// Why nobody can be asked, when no asker is set.
    no_asker: Mutex<Option<String>>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("pending", &lock(&self.pending).len())
            .finish()
    }
}

impl Approvals {
    /// A broker without an asker yet.
    pub fn new() -> Arc<Approvals> {
        Arc::new(Approvals::default())
    }

    /// From now on requests are shown through `asker`.
    pub fn set_asker(&self, asker: Arc<dyn Asker>) {
        *lock(&self.asker) = Some(asker);
    }

    /// From now on nobody can be asked, for this reason (answered `Unavailable`).
    pub fn set_unavailable(&self, reason: impl Into<String>) {
        *lock(&self.asker) = None;
        *lock(&self.no_asker) = Some(reason.into());
    }

    /// A cell asks: `deliver` gets the answer (at once when nobody can be asked).
    pub fn open(self: &Arc<Self>, request: &ApprovalRequest, deliver: Deliver) {
        let id = request.approval_id.clone();
        lock(&self.pending).insert(id.clone(), (deliver, request.message.clone()));
        let asker = lock(&self.asker).clone();
        let refused =
            match asker {
                Some(a) => a.ask(request, self).err(),
                None => Some(lock(&self.no_asker).clone().unwrap_or_else(|| {
                    "this kernel has no channel to a person for approvals".into()
                })),
            };
        if let Some(reason) = refused {
            tracing::info!(approval_id = %id, %reason, "approval requested; nobody can be asked");
            self.answer(ApprovalAnswer::without_person(
                &id,
                ApprovalOutcome::Unavailable,
                reason,
            ));
        } else {
            tracing::info!(approval_id = %id, "approval requested");
        }
    }

    /// Answers a pending request; false if it is not (or no longer) pending.
    pub fn answer(&self, answer: ApprovalAnswer) -> bool {
        let deliver = lock(&self.pending).remove(&answer.approval_id);
        match deliver {
            Some((d, _)) => {
                tracing::info!(approval_id = %answer.approval_id, outcome = answer.outcome.as_str(), "approval answered");
                d(answer);
                true
            }
            None => false,
        }
    }

    /// The cell no longer waits for `approval_id`: drop it and withdraw the question.
    pub fn close(&self, approval_id: &str) {
        let was_pending = lock(&self.pending).remove(approval_id).is_some();
        lock(&self.answered).remove(approval_id);
        if was_pending {
            if let Some(a) = lock(&self.asker).clone() {
                a.withdraw(approval_id);
            }
        }
    }

    /// The question of a pending request, if a cell waits for one.
    pub fn waiting_for(&self) -> Option<String> {
        lock(&self.pending).values().next().map(|(_, m)| m.clone())
    }

    /// Cancels every pending request (the client went away, or the worker died).
    pub fn cancel_all(&self, reason: &str) {
        let ids: Vec<String> = lock(&self.pending).keys().cloned().collect();
        for id in ids {
            self.answer(ApprovalAnswer::without_person(
                &id,
                ApprovalOutcome::Cancelled,
                reason,
            ));
        }
    }
}

/// In-process: the executor's approver is the broker itself; answers wait in `answered`.
#[derive(Debug, Clone)]
pub struct InProcessApprover(pub Arc<Approvals>);

impl Approver for InProcessApprover {
    fn request(&self, request: &ApprovalRequest) {
        let me = Arc::clone(&self.0);
        self.0.open(
            request,
            Box::new(move |a: ApprovalAnswer| {
                lock(&me.answered).insert(a.approval_id.clone(), a);
                me.arrived.notify_all();
            }),
        );
    }

    fn wait(&self, approval_id: &str, wait: Duration) -> Option<ApprovalAnswer> {
        let answered = lock(&self.0.answered);
        let (mut answered, _) = self
            .0
            .arrived
            .wait_timeout_while(answered, wait, |a| !a.contains_key(approval_id))
            .unwrap_or_else(|p| p.into_inner());
        answered.remove(approval_id)
    }

    fn ended(&self, approval_id: &str) {
        self.0.close(approval_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowrepl_protocol::EventData;

    fn request(id: &str) -> ApprovalRequest {
        ApprovalRequest {
            approval_id: id.into(),
            message: "ok?".into(),
            data: EventData::from_json("{}".into()).unwrap(),
            timeout_s: None,
        }
    }

    struct Shown(Mutex<Vec<String>>);

    impl Asker for Shown {
        fn ask(&self, r: &ApprovalRequest, _: &Arc<Approvals>) -> Result<(), String> {
            lock(&self.0).push(r.approval_id.clone());
            Ok(())
        }
        fn withdraw(&self, id: &str) {
            lock(&self.0).push(format!("withdrawn {id}"));
        }
    }

    #[test]
    fn no_asker_answers_unavailable_at_once() {
        let a = InProcessApprover(Approvals::new());
        a.0.set_unavailable("drop-in mode");
        a.request(&request("1-1"));
        let got = a.wait("1-1", Duration::ZERO).unwrap();
        assert_eq!(got.outcome, ApprovalOutcome::Unavailable);
        assert_eq!(got.reason.as_deref(), Some("drop-in mode"));
    }

    #[test]
    fn first_answer_wins_and_close_withdraws() {
        let broker = Approvals::new();
        let a = InProcessApprover(Arc::clone(&broker));
        let shown = Arc::new(Shown(Mutex::new(Vec::new())));
        broker.set_asker(shown.clone());
        a.request(&request("1-1"));
        assert!(a.wait("1-1", Duration::from_millis(1)).is_none());
        let yes = flowrepl_protocol::ApproveParams {
            approval_id: "1-1".into(),
            approved: true,
            comment: None,
        };
        assert!(broker.answer(yes.clone().into_answer()));
        assert!(!broker.answer(yes.into_answer()), "answered twice");
        assert_eq!(
            a.wait("1-1", Duration::ZERO).unwrap().outcome,
            ApprovalOutcome::Approved
        );
        a.ended("1-1");
        a.request(&request("1-2"));
        a.ended("1-2");
        assert_eq!(
            *lock(&shown.0),
            vec!["1-1".to_owned(), "1-2".into(), "withdrawn 1-2".into()]
        );
        assert!(lock(&broker.pending).is_empty());
    }
}
