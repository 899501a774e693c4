//! `egress` records: one per connection, allowed or refused, appended to the task log when
//! the connection ends.
//!
//! A cell can open connections as fast as the proxy accepts them; so that it cannot fill the
//! disk through the log, records are written within a budget: [`BURST`] at once, refilled at
//! [`PER_SECOND`]. Past it, connections are still decided and served the same, only counted,
//! and the next record written says how many were not (`unrecorded`).

use chrono::{SecondsFormat, Utc};
use flowrepl_task_logger::{EgressRecord, TaskHead, TaskLog, RECORD_TYPE_EGRESS};
use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Records written at once before the budget applies.
pub const BURST: f64 = 1000.0;
/// Records per second after that.
pub const PER_SECOND: f64 = 100.0;
/// Characters of an `error` kept.
const MAX_ERROR: usize = 1000;

/// Whose records they are.
#[derive(Debug, Clone)]
pub struct Who {
    /// `FLOW_PLAN_ID`.
    pub plan_id: String,
    /// `FLOW_TASK_ID`.
    pub task_id: String,
    /// `FLOW_TASK_NAME`.
    pub task_name: Option<String>,
    /// The kernel's session.
    pub session_id: String,
}

/// One connection, as it ended.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// The name asked for (canonical), or empty.
    pub host: String,
    /// The port asked for, or 0.
    pub port: u16,
    /// `connect` or `http`.
    pub via: &'static str,
    /// Let through to the host.
    pub allowed: bool,
    /// The rule that allowed it.
    pub rule: Option<String>,
    /// The address connected to.
    pub address: Option<String>,
    /// Cell to host.
    pub bytes_up: u64,
    /// Host to cell.
    pub bytes_down: u64,
    /// Why refused, or how it failed.
    pub error: Option<String>,
}

struct Budget {
    tokens: f64,
    at: Instant,
    unrecorded: u64,
}

/// Writes the records of one proxy.
pub struct Recorder {
    who: Who,
    log: Option<Mutex<TaskLog>>,
    budget: Mutex<Budget>,
}

impl Recorder {
    /// Records into `log` (`None`: `--no-log`, nothing written).
    pub fn new(who: Who, log: Option<PathBuf>) -> Recorder {
        Recorder {
            who,
            log: log.map(|p| Mutex::new(TaskLog::new(p))),
            budget: Mutex::new(Budget {
                tokens: BURST,
                at: Instant::now(),
                unrecorded: 0,
            }),
        }
    }

    /// Appends the record of `c`, accepted at `accepted` and open for `duration`, if the
    /// budget allows.
    pub fn write(&self, c: &Connection, accepted: chrono::DateTime<Utc>, duration: Duration) {
        let Some(log) = &self.log else { return };
        let unrecorded = {
            let mut b = self.budget.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * PER_SECOND).min(BURST);
            b.at = now;
            if b.tokens < 1.0 {
                b.unrecorded += 1;
                return;
            }
            b.tokens -= 1.0;
            std::mem::take(&mut b.unrecorded)
        };
        let w = &self.who;
        let record = EgressRecord {
            head: TaskHead::new(
                RECORD_TYPE_EGRESS,
                &w.plan_id,
                &w.task_id,
                w.task_name.as_deref(),
                &w.session_id,
            ),
            timestamp: accepted.to_rfc3339_opts(SecondsFormat::Millis, true).into(),
            host: Cow::Borrowed(&c.host),
            port: c.port,
            via: Cow::Borrowed(c.via),
            allowed: c.allowed,
            rule: c.rule.as_deref().map(Cow::Borrowed),
            address: c.address.as_deref().map(Cow::Borrowed),
            bytes_up: c.bytes_up,
            bytes_down: c.bytes_down,
            duration_ms: duration.as_secs_f64() * 1e3,
            // A refusal may quote the cell's request: bounded.
            error: c
                .error
                .as_deref()
                .map(|e| match e.char_indices().nth(MAX_ERROR) {
                    Some((i, _)) => Cow::Owned(format!("{}...", &e[..i])),
                    None => Cow::Borrowed(e),
                }),
            unrecorded,
        };
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = log.append(&record) {
            tracing::warn!(error = %flowrepl_os::chain(&e), "an egress record was not written");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_connections_are_counted_in_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let who = Who {
            plan_id: "p".into(),
            task_id: "t".into(),
            task_name: None,
            session_id: "s".into(),
        };
        let r = Recorder::new(who, Some(path.clone()));
        let c = Connection {
            host: "example.com".into(),
            port: 443,
            via: "connect",
            ..Connection::default()
        };
        for _ in 0..1500 {
            r.write(&c, Utc::now(), Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        r.write(&c, Utc::now(), Duration::from_millis(1));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // The burst, what the refill allowed while writing, and one after the pause.
        assert!(lines.len() >= 1001 && lines.len() < 1400, "{}", lines.len());
        let counted: u64 = lines
            .iter()
            .map(|l| l["unrecorded"].as_u64().unwrap_or(0))
            .sum();
        assert!(counted > 0);
        assert_eq!(lines.len() as u64 + counted, 1501);
        assert_eq!(lines[0]["type"], "egress");
    }
}
