//! Approvals: a cell asks a person (`flow.request_approval`) and waits for the answer.
//!
//! The request travels from the executor to the kernel (in-process: a call; worker mode: an
//! ApprovalRequest frame), and from the kernel to whoever can answer: the JSON-RPC client (an
//! `approval_requested` notification, answered with the `approve` method) or the MCP client
//! (an `elicitation/create` request). The answer travels back the same way. Where nobody can
//! answer, the kernel answers [`ApprovalOutcome::Unavailable`] at once.
//!
//! | Python sees | outcome |
//! | --- | --- |
//! | `True` | [`ApprovalOutcome::Approved`] |
//! | `False` | [`ApprovalOutcome::Declined`] |
//! | `flow.ApprovalCancelled` | [`ApprovalOutcome::Cancelled`], or no answer within `timeout_s` |
//! | `None` | [`ApprovalOutcome::Unavailable`]: no channel to a person |

use crate::execute::EventData;
use serde::{Deserialize, Serialize};

/// A cell's request for approval; also the params of the `approval_requested` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// Names the request in the `approve` call that answers it (unique in the kernel's life:
    /// `"<execution_count>-<n>"`).
    pub approval_id: String,
    /// What the person is asked.
    pub message: String,
    /// The keyword data of the call (a JSON object), to show with the message.
    pub data: EventData,
    /// How long the cell waits for an answer, in seconds; `null`: until the cell is
    /// interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalOutcome {
    /// The person approved: `True`.
    Approved,
    /// The person declined: `False`.
    Declined,
    /// The person dismissed the question, or the channel failed: `flow.ApprovalCancelled`.
    Cancelled,
    /// Nobody can be asked (an MCP client without elicitation, drop-in mode): `None`.
    Unavailable,
}

impl ApprovalOutcome {
    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalOutcome::Approved => "approved",
            ApprovalOutcome::Declined => "declined",
            ApprovalOutcome::Cancelled => "cancelled",
            ApprovalOutcome::Unavailable => "unavailable",
        }
    }
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalAnswer {
    /// The request answered.
    pub approval_id: String,
    /// What became of it.
    pub outcome: ApprovalOutcome,
    /// The person's comment, if they left one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// Why it was cancelled or could not be asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ApprovalAnswer {
    /// An answer without a person: cancelled or unavailable, and why.
    pub fn without_person(
        approval_id: &str,
        outcome: ApprovalOutcome,
        reason: impl Into<String>,
    ) -> ApprovalAnswer {
        ApprovalAnswer {
            approval_id: approval_id.to_owned(),
            outcome,
            comment: None,
            reason: Some(reason.into()),
        }
    }
}

/// Params of the `approve` method.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproveParams {
    /// The `approval_id` of the `approval_requested` notification.
    pub approval_id: String,
    /// True approves (`True` in the cell), false declines (`False`).
    pub approved: bool,
    /// A comment for the cell (in the `approval` event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

impl ApproveParams {
    /// The answer these params give.
    pub fn into_answer(self) -> ApprovalAnswer {
        ApprovalAnswer {
            approval_id: self.approval_id,
            outcome: if self.approved {
                ApprovalOutcome::Approved
            } else {
                ApprovalOutcome::Declined
            },
            comment: self.comment,
            reason: None,
        }
    }
}

/// The answer to `approve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApproveReply {
    /// True if a cell was waiting for that approval and now has the answer; false if the id
    /// is unknown or no longer waited for (answered, timed out, interrupted).
    pub accepted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names_match_serde() {
        use ApprovalOutcome::*;
        for o in [Approved, Declined, Cancelled, Unavailable] {
            assert_eq!(serde_json::to_value(o).unwrap(), o.as_str());
        }
    }

    #[test]
    fn wire_names() {
        let a = ApproveParams {
            approval_id: "3-1".into(),
            approved: false,
            comment: Some("not now".into()),
        }
        .into_answer();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"approval_id":"3-1","outcome":"declined","comment":"not now"}"#
        );
        let r = ApprovalRequest {
            approval_id: "1-1".into(),
            message: "deploy?".into(),
            data: EventData::from_json(r#"{"env":"prod"}"#.into()).unwrap(),
            timeout_s: None,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"approval_id":"1-1","message":"deploy?","data":{"env":"prod"}}"#
        );
        assert_eq!(serde_json::from_str::<ApprovalRequest>(&text).unwrap(), r);
    }
}
