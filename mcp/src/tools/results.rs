//! How the kernel's answers become tool results.

use flowrepl_protocol::VariableInfo;
use flowrepl_session::session::Answer;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::ErrorData;
use serde::Serialize;
use std::fmt::Write as _;

pub(super) fn internal(msg: impl Into<String>) -> ErrorData {
    ErrorData::internal_error(msg.into(), None)
}

/// A tool result: `text` for the model, `value` as its structured content.
pub fn structured<T: Serialize>(text: String, value: &T, is_error: bool) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = serde_json::to_value(value).ok();
    r.is_error = Some(is_error);
    r
}

/// A tool result with `isError` and one text block.
pub fn error_text(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// The tool result of a call other than `execute_code`.
pub fn answer_result(answer: Answer) -> CallToolResult {
    match answer {
        Answer::Restart(r) => structured(r.message.clone(), &r, false),
        Answer::Restore(r) => structured(flowrepl_session::engine::restored_message(&r), &r, false),
        Answer::Checkpoint(c) => {
            let mut text = format!(
                "checkpoint {:?} written after cell {}: {} names saved, {} bytes, {:.1} ms",
                c.checkpoint,
                c.execution_count,
                c.saved.len() + c.modules.len(),
                c.bytes,
                c.ms
            );
            for (name, why) in &c.unsaved {
                let _ = write!(text, "\nnot saved: {name}: {why}");
            }
            structured(text, &c, false)
        }
        Answer::Checkpoints(c) => {
            let mut text = String::new();
            for cp in &c.checkpoints {
                let _ = writeln!(
                    text,
                    "{}: after cell {}, {} names, {} bytes, {}",
                    cp.name,
                    cp.execution_count,
                    cp.names.len(),
                    cp.bytes,
                    cp.time
                );
            }
            if text.is_empty() {
                text = format!("no checkpoints yet (FLOWREPL_CHECKPOINTS={})", c.policy);
            }
            structured(text, &c, false)
        }
        Answer::Variables(v) => structured(variables_text(&v.variables), &v, false),
        Answer::Installed(r) => {
            let mut text = r.message.clone();
            if !r.output.trim().is_empty() {
                let _ = write!(text, "\n{}", r.output.trim_end());
            }
            structured(text, &r, false)
        }
        other => {
            let text = serde_json::to_string(&other).unwrap_or_default();
            structured(text, &other, false)
        }
    }
}

/// One line per variable: `name: type (module) len N shape (a, b) = repr`.
pub(super) fn variables_text(vars: &[VariableInfo]) -> String {
    if vars.is_empty() {
        return "(no variables)".into();
    }
    let mut t = String::new();
    for v in vars {
        let _ = write!(t, "{}: {}", v.name, v.kind);
        if let Some(m) = &v.module {
            let _ = write!(t, " ({m})");
        }
        if let Some(s) = &v.shape {
            let dims: Vec<String> = s.iter().map(u64::to_string).collect();
            let _ = write!(t, " shape ({})", dims.join(", "));
        } else if let Some(n) = v.len {
            let _ = write!(t, " len {n}");
        }
        let _ = writeln!(t, " = {}", v.repr);
    }
    t
}
