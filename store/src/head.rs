//! Where a task's objects are, and its head: the one object that says who holds the task and
//! which of its objects are its state.
//!
//! # Layout (format 1)
//! Under the store's prefix, per task, `tasks/<plan>/<task>/` (each id as
//! `flowrepl_task_logger::path::safe_component` makes it a file name):
//! - `head.json`: the [`Head`]. Only ever replaced by a swap against the version last read
//!   (S3 `If-Match`), so two holders can never both write it.
//! - `log/<epoch>-<seq>.jsonl`: the task log's segments, each a whole JSONL file (complete
//!   lines), numbered from 1 per epoch; the log is the segments the head counts, in order of
//!   [`Head::log`].
//! - `state/<epoch>-<seq>.json`: a [`crate::state::Manifest`]: every checkpoint's journal and
//!   which blob each of its segment files is, and the workspace's files.
//! - `blobs/<sha256>`: file contents by hash (checkpoint segments, workspace files), written
//!   once.
//!
//! Epochs and sequence numbers are written with ten digits, so names sort in order. Every
//! object but the head is written once under a name nobody else writes (its holder's epoch, or
//! its content's hash), and only the head makes it part of the task's state. Every batch of
//! writes starts with a swap of the head, so a holder whose lease was taken gets a refused
//! swap (412) before it writes anything, and stops:
//! - a log segment is counted in the head first, then written (a holder killed in between
//!   loses that segment; readers skip a counted segment that is missing);
//! - a state is fenced by a swap that renews the lease, then its blobs and manifest are
//!   written, then the head is swapped to name it, so the head never names a manifest that is
//!   not there.

use object_store::path::Path;
use serde::{Deserialize, Serialize};

/// The head's format.
pub const HEAD_FORMAT: u32 = 1;

/// Who holds (or last held) a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// This kernel run's id (its session id).
    pub id: String,
    /// The machine's host name.
    pub host: String,
    /// The kernel's process id there.
    pub pid: u32,
}

impl Holder {
    /// This process, as the kernel run `id`.
    pub fn me(id: &str) -> Holder {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        Holder {
            id: id.to_owned(),
            host,
            pid: std::process::id(),
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernel {} (pid {} on {})", self.id, self.pid, self.host)
    }
}

/// The log segments one holder wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRun {
    /// The holder's epoch.
    pub epoch: u64,
    /// Segments 1..=`segments` of that epoch are the log.
    pub segments: u64,
    /// Their bytes in all.
    pub bytes: u64,
}

/// A task's head object (`head.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// [`HEAD_FORMAT`].
    pub v: u32,
    /// The task's plan, as given.
    pub plan_id: String,
    /// The task, as given.
    pub task_id: String,
    /// Bumped by every holder that takes the task; its objects are written under it.
    pub epoch: u64,
    /// The holder of `epoch`.
    pub holder: Holder,
    /// When the holder last wrote the head (its own clock; informational: takers time a lease
    /// by their own clock, from when they first saw this version).
    pub renewed_at: String,
    /// How long the holder's lease lasts without a renewal, ms.
    pub lease_ms: u64,
    /// The holder let go (a clean stop): another may take the task at once.
    pub released: bool,
    /// The task log: each holder's segments, oldest first.
    pub log: Vec<LogRun>,
    /// The newest state manifest (`state/<epoch>-<seq>.json`), if any was written.
    pub state: Option<String>,
}

impl Head {
    /// The log's length in bytes, all runs.
    pub fn log_bytes(&self) -> u64 {
        self.log.iter().map(|r| r.bytes).sum()
    }

    /// This epoch's log run (made when missing).
    pub fn run_mut(&mut self) -> &mut LogRun {
        let epoch = self.epoch;
        if self.log.last().is_none_or(|r| r.epoch != epoch) {
            self.log.push(LogRun {
                epoch,
                segments: 0,
                bytes: 0,
            });
        }
        self.log.last_mut().expect("pushed above")
    }
}

/// The keys of one task's objects (relative to the store's prefix).
#[derive(Debug, Clone)]
pub struct TaskKeys {
    base: String,
}

/// Where every task's folder is: `tasks/<plan>/<task>/`.
pub const TASKS: &str = "tasks";

fn numbered(epoch: u64, seq: u64) -> String {
    format!("{epoch:010}-{seq:010}")
}

impl TaskKeys {
    /// The task `task_id` of plan `plan_id`.
    pub fn new(plan_id: &str, task_id: &str) -> TaskKeys {
        use flowrepl_task_logger::path::safe_component;
        TaskKeys::of_folder(&safe_component(plan_id), &safe_component(task_id))
    }

    /// The task whose folder is `tasks/<plan>/<task>` (names as the store lists them).
    pub fn of_folder(plan: &str, task: &str) -> TaskKeys {
        TaskKeys {
            base: format!("{TASKS}/{plan}/{task}"),
        }
    }

    /// `head.json`.
    pub fn head(&self) -> String {
        format!("{}/head.json", self.base)
    }

    /// Log segment `seq` of `epoch`.
    pub fn log_segment(&self, epoch: u64, seq: u64) -> String {
        format!("{}/log/{}.jsonl", self.base, numbered(epoch, seq))
    }

    /// State manifest `seq` of `epoch`.
    pub fn state(&self, epoch: u64, seq: u64) -> String {
        format!("{}/state/{}.json", self.base, numbered(epoch, seq))
    }

    /// The blob of content `sha256` (hex).
    pub fn blob(&self, sha256: &str) -> String {
        format!("{}/blobs/{sha256}", self.base)
    }

    /// Every key of the task starts with this.
    pub fn prefix(&self) -> Path {
        Path::from(self.base.as_str())
    }
}

/// Now, as heads write times: UTC, RFC 3339 with milliseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
