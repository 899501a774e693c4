//! `egress` records: one per connection, allowed or refused, appended to the task log when
//! the connection ends.
//!
//! A cell can open connections as fast as the proxy accepts them; so that it cannot fill the
//! disk through the log, the records of connections refused before the proxy did anything
//! for them (no rule matched, a request that does not parse, too many open) are written
//! within a budget: [`BURST`] at once, refilled at [`PER_SECOND`]. Past it they are still
//! refused the same, only counted: the next record written says how many were not
//! (`unrecorded`), and when the proxy ends a last record (`via: "summary"`, not a
//! connection) gives the count not given yet. A connection a rule matched (the proxy
//! resolved its name, connected, forwarded) always has its own record, whatever the flood
//! before it: it is bounded by what the rules let through, and it is where data can leave.

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
    /// Bytes the cell sent past its plain HTTP request (one request per connection), read
    /// and not forwarded.
    pub bytes_dropped: u64,
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

    /// Appends the record of `c`, accepted at `accepted` and open for `duration`: always
    /// when a rule matched it (`c.rule`), else if the budget allows (else it is counted).
    pub fn write(&self, c: &Connection, accepted: chrono::DateTime<Utc>, duration: Duration) {
        if self.log.is_none() {
            return;
        }
        let unrecorded = {
            let mut b = self.budget.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * PER_SECOND).min(BURST);
            b.at = now;
            if b.tokens >= 1.0 {
                b.tokens -= 1.0;
            } else if c.rule.is_none() {
                b.unrecorded += 1;
                return;
            }
            std::mem::take(&mut b.unrecorded)
        };
        self.append(c, accepted, duration, unrecorded);
    }

    /// Writes, when the proxy ends, the count of connections not recorded yet: those past
    /// the budget since the last record, and `open`, those still open that will not be (cut
    /// and not finished within the proxy's drain). A record `via: "summary"`, only when there
    /// are some.
    pub fn finish(&self, open: u64) {
        if self.log.is_none() {
            return;
        }
        let unrecorded = {
            let mut b = self.budget.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut b.unrecorded) + open
        };
        if unrecorded == 0 {
            return;
        }
        let c = Connection {
            via: "summary",
            ..Connection::default()
        };
        self.append(&c, Utc::now(), Duration::ZERO, unrecorded);
    }

    fn append(
        &self,
        c: &Connection,
        accepted: chrono::DateTime<Utc>,
        duration: Duration,
        unrecorded: u64,
    ) {
        let Some(log) = &self.log else { return };
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
            bytes_dropped: c.bytes_dropped,
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
        let r = Recorder::new(who(), Some(path.clone()));
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
        let lines = read(&path);
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

    fn read(path: &std::path::Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn who() -> Who {
        Who {
            plan_id: "p".into(),
            task_id: "t".into(),
            task_name: None,
            session_id: "s".into(),
        }
    }

    /// Past the budget, a connection a rule matched still has its record (the control: the
    /// same connection without a rule is counted only); at the end the rest is counted in a
    /// summary, and everything adds up.
    #[test]
    fn a_connection_a_rule_matched_is_recorded_whatever_the_flood() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let r = Recorder::new(who(), Some(path.clone()));
        let refused = Connection {
            host: "other.com".into(),
            port: 80,
            via: "http",
            ..Connection::default()
        };
        let allowed = Connection {
            host: "example.com".into(),
            port: 80,
            via: "http",
            allowed: true,
            rule: Some("example.com".into()),
            ..Connection::default()
        };
        for _ in 0..1500 {
            r.write(&refused, Utc::now(), Duration::ZERO);
        }
        // The budget spent (whatever refilled while writing).
        let spend = || {
            let mut b = r.budget.lock().unwrap();
            b.tokens = 0.0;
            b.at = Instant::now();
        };
        // The control: past the budget, one more refusal is not written.
        let before = read(&path).len();
        spend();
        r.write(&refused, Utc::now(), Duration::ZERO);
        assert_eq!(read(&path).len(), before);
        spend();
        r.write(&allowed, Utc::now(), Duration::ZERO);
        assert_eq!(read(&path).len(), before + 1);
        for _ in 0..20 {
            r.write(&refused, Utc::now(), Duration::ZERO);
        }
        r.finish(3);
        let lines = read(&path);
        let summary = &lines[lines.len() - 1];
        assert_eq!(summary["via"], "summary");
        assert!(summary["unrecorded"].as_u64().unwrap() >= 3, "{summary}");
        let at = lines
            .iter()
            .position(|l| l["host"] == "example.com")
            .unwrap();
        assert!(at >= 1000, "{at}");
        assert!(lines[at]["unrecorded"].as_u64().unwrap() > 0);
        let connections = lines.iter().filter(|l| l["via"] != "summary").count() as u64;
        let counted: u64 = lines
            .iter()
            .map(|l| l["unrecorded"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(connections + counted, 1500 + 1 + 1 + 20 + 3);
        // Nothing left to count: no second summary.
        r.finish(0);
        assert_eq!(read(&path).len(), lines.len());
    }
}
