//! `flowrepl log show`: a task's cells in order, each with its events and context changes.

use super::table::{head, ms, paint, Colour};
use super::{
    each_record, one_task, print_json, say, short_id, task_file, LogCmdError, Read, Scope,
};
use flowrepl_task_logger::{ExecutionRecord, Record, SessionRecord};
use serde_json::{json, Value};
use std::path::Path;

/// Which cells `show` prints.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only failed cells.
    pub failed: bool,
    /// Only cells that started at or after this time.
    pub since: Option<String>,
    /// Only cells of sessions whose id starts with this.
    pub session: Option<String>,
}

impl Filter {
    fn keeps(&self, r: &ExecutionRecord<'_>) -> bool {
        (!self.failed || !r.success)
            && self.since.as_deref().is_none_or(|s| *r.timestamp >= *s)
            && self
                .session
                .as_deref()
                .is_none_or(|s| r.session_id.starts_with(s))
    }
}

/// A cell with what it reported.
#[derive(Debug)]
pub struct Cell {
    /// Its execution record.
    pub record: ExecutionRecord<'static>,
    /// Its context changes (each the whole new context).
    pub contexts: Vec<Value>,
}

/// What a task's log holds, in order.
#[derive(Debug, Default)]
pub struct TaskLog {
    /// Cells, in order.
    pub cells: Vec<Cell>,
    /// Session records, in order.
    pub sessions: Vec<SessionRecord<'static>>,
    /// Records read.
    pub records: usize,
}

impl TaskLog {
    /// Adds a record (events are already in their execution record; context records are
    /// attached to the cell that wrote them).
    pub fn add(&mut self, r: Record) {
        self.records += 1;
        match r {
            Record::Execution(e) => self.cells.push(Cell {
                record: *e,
                contexts: Vec::new(),
            }),
            Record::Context(c) => {
                let ctx = serde_json::from_str(c.context.get()).unwrap_or(Value::Null);
                if let Some(cell) = self.cells.iter_mut().rev().find(|x| {
                    x.record.session_id == c.head.task.session_id
                        && x.record.execution_count == c.head.execution_count
                }) {
                    cell.contexts.push(ctx);
                }
            }
            Record::Session(s) => self.sessions.push(*s),
            // Transfers of workspace files are not cells: `tail` shows them as they come.
            Record::Event(_) | Record::File(_) | Record::Install(_) | Record::Egress(_) => {}
        }
    }
}

/// Reads one task's log.
pub fn read_task(file: &Path) -> TaskLog {
    let mut log = TaskLog::default();
    each_record(file, |r| log.add(r));
    log
}

/// A cell as JSON (the `show` and `tail` document).
pub fn cell_json(c: &Cell) -> Value {
    let r = &c.record;
    json!({
        "session_id": r.session_id,
        "execution_count": r.execution_count,
        "timestamp": r.timestamp,
        "success": r.success,
        "elapsed_ms": r.elapsed_ms,
        "code": r.code,
        "error_type": r.error_type,
        "error_message": r.error_message,
        "result": r.result,
        "stdout_head": head(&r.stdout, 10, 1000),
        "stderr_head": head(&r.stderr, 10, 1000),
        "events": r.events,
        "context_changes": c.contexts,
    })
}

/// A session record as JSON.
pub fn session_json(s: &SessionRecord<'_>) -> Value {
    json!({
        "session_id": s.head.session_id,
        "event": s.event,
        "timestamp": s.timestamp,
        "python_version": s.python_version,
        "mode": s.mode,
        "front": s.front,
        "reason": s.reason,
        "cells": s.cells,
    })
}

/// A cell for people.
pub fn cell_text(c: &Cell) -> String {
    let r = &c.record;
    let status = if r.success {
        paint("ok", Colour::Green)
    } else {
        paint(r.error_type.as_deref().unwrap_or("failed"), Colour::Red)
    };
    let mut out = format!(
        "{} {status} {} {}\n",
        paint(&format!("[{}]", r.execution_count), Colour::Bold),
        ms(r.elapsed_ms),
        paint(
            &format!("{} session {}", r.timestamp, short_id(&r.session_id)),
            Colour::Dim
        ),
    );
    for line in r.code.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    let mut section = |label: &str, text: &str| {
        if text.is_empty() {
            return;
        }
        out.push_str(&format!("  {}:\n", paint(label, Colour::Dim)));
        for line in head(text, 5, 400).lines() {
            out.push_str("    ");
            out.push_str(line);
            out.push('\n');
        }
    };
    section("stdout", &r.stdout);
    if !r.success {
        if let Some(m) = &r.error_message {
            section(
                "error",
                &format!("{}: {m}", r.error_type.as_deref().unwrap_or("")),
            );
        }
    } else {
        section("stderr", &r.stderr);
    }
    if let Some(v) = &r.result {
        out.push_str(&format!(
            "  Out[{}]: {}\n",
            r.execution_count,
            head(v, 3, 300)
        ));
    }
    for e in r.events.iter() {
        let step = e
            .step
            .as_deref()
            .map(|s| format!(" in {s}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {} {}{step} {}\n",
            paint(&format!("event {}", e.seq), Colour::Dim),
            e.name,
            head(e.data.get(), 1, 200)
        ));
    }
    for ctx in &c.contexts {
        out.push_str(&format!(
            "  {} {}\n",
            paint("context", Colour::Dim),
            head(&ctx.to_string(), 1, 200)
        ));
    }
    out
}

/// A session boundary for people.
pub fn session_text(s: &SessionRecord<'_>) -> String {
    let what = match (&*s.event, &s.reason) {
        ("end", Some(reason)) => format!(
            "ended ({reason}) after {} cells",
            s.cells.unwrap_or_default()
        ),
        _ => format!(
            "started: Python {} ({}), {}, {}",
            s.python_version.split_whitespace().next().unwrap_or(""),
            s.python_source,
            s.mode,
            s.front
        ),
    };
    paint(
        &format!(
            "── session {} {what} at {}",
            short_id(&s.head.session_id),
            s.timestamp
        ),
        Colour::Dim,
    )
}

/// `show`.
pub fn run(log_dir: &Path, scope: &Scope, filter: &Filter) -> Result<Read, LogCmdError> {
    let (plan, task) = one_task(scope);
    let file = task_file(log_dir, &plan, &task)?;
    let log = read_task(&file);
    let cells: Vec<&Cell> = log
        .cells
        .iter()
        .filter(|c| filter.keeps(&c.record))
        .collect();
    if scope.json {
        print_json(&json!({
            "plan_id": plan,
            "task_id": task,
            "file": file,
            "cells": cells.iter().map(|c| cell_json(c)).collect::<Vec<_>>(),
            "sessions": log.sessions.iter().map(session_json).collect::<Vec<_>>(),
        }))?;
    } else {
        // Session boundaries in place, between the cells (by time).
        let mut sessions = log.sessions.iter().peekable();
        for c in &cells {
            while let Some(s) = sessions.next_if(|s| *s.timestamp <= *c.record.timestamp) {
                say(session_text(s))?;
            }
            say(cell_text(c))?;
        }
        if filter.since.is_none() && filter.session.is_none() && !filter.failed {
            for s in sessions {
                say(session_text(s))?;
            }
        }
        if cells.is_empty() {
            eprintln!(
                "flowrepl log: no cells{} in plan {plan:?} task {task:?}",
                if filter.failed || filter.since.is_some() || filter.session.is_some() {
                    " match"
                } else {
                    ""
                }
            );
        }
    }
    Ok(Read::from_count(log.records))
}
