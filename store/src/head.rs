//! Where a task's objects are, and its head: the one object that says who holds the task and
//! which of its objects are its state.
//!
//! # Layout (format 1)
//! Under the store's prefix, per task, `tasks/<plan>/<task>/` (each id as
//! `flowrepl_task_logger::path::safe_component` makes it a file name):
//! - `head.json`: the [`Head`]. Only ever replaced by a swap against the version last read
//!   (S3 `If-Match`), so two holders can never both write it.
//! - `log/<epoch>-<writer>-<seq>.jsonl`: the task log's segments, each a whole JSONL file
//!   (complete lines), numbered from 1 per epoch; the log is the segments the head counts, in
//!   order of [`Head::log`] ([`TaskKeys::segment`]). `<writer>` is the holder's own id
//!   ([`Holder::writer`]), so no other holder can ever write the same name, even with the same
//!   epoch (a deleted or hand-edited head). Runs of format 1 have no writer:
//!   `log/<epoch>-<seq>.jsonl`.
//! - `state/<epoch>-<writer>-<seq>.json`: a [`crate::state::Manifest`]: every checkpoint's
//!   journal and which blob each of its segment files is, and the workspace's files.
//! - `blobs/<sha256>`: file contents by hash (checkpoint segments, workspace files), written
//!   once.
//!
//! Epochs and sequence numbers are written with ten digits, so names sort in order. Every
//! object but the head is written once under a name nobody else writes (its holder's epoch and
//! writer id, or its content's hash): an object already there with other content is an error
//! ([`crate::StoreError::Clash`]), never taken as one's own earlier write. Only the head makes
//! an object part of the task's state. The epoch never wraps (a head at `u64::MAX` is refused),
//! and a task whose head is missing while objects of it are in the store starts at the epoch
//! after the newest of them, saying that the head was lost.
//!
//! A holder writes only while its lease is good by its own clock ([`crate::lease::Lease::good`]);
//! past it, it renews first (a swap, refused with 412 when another took the task). Within its
//! lease no other kernel can have taken the task, so a batch writes its objects first (the log
//! segment, the blobs, the manifest) and then swaps the head once to count and name them: the
//! head never names an object that is not there.
//!
//! # Format 2 (additions to format 1)
//! - [`LogRun::writer`]: the writer id in the run's segment names;
//! - [`Holder::session`]: the kernel run's id when [`Holder::id`] is a server's;
//! - [`Head::wanted`]: a handover request another kernel wrote ([`Wanted`]).
//!
//! A format-1 head is read (its runs' segments have the old names); a format-1 flowrepl
//! refuses a format-2 head (a newer flowrepl holds the store).

use object_store::path::Path;
use serde::{Deserialize, Serialize};

/// The head's format this flowrepl writes (it reads 1 and 2).
pub const HEAD_FORMAT: u32 = 2;

/// Who holds (or last held) a task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// This kernel run's id (its session id), or its server's (`serve`'s kernels hold their
    /// tasks as the server).
    pub id: String,
    /// The machine's host name.
    pub host: String,
    /// The kernel's process id there.
    pub pid: u32,
    /// The kernel run's own id (its session id) when `id` is not (format 2; empty in format 1).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session: String,
}

impl Holder {
    /// This process, as the kernel run `id`.
    pub fn me(id: &str) -> Holder {
        Holder::me_in(id, "")
    }

    /// This process, holding as `id` (its own session id, or its server's), its own session
    /// being `session`.
    pub fn me_in(id: &str, session: &str) -> Holder {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        Holder {
            id: id.to_owned(),
            host,
            pid: std::process::id(),
            session: if session == id {
                String::new()
            } else {
                session.to_owned()
            },
        }
    }

    /// The id in the names of the objects this holder writes: its session if it has one of
    /// its own, else its id, in a key-safe form (`[A-Za-z0-9_.-]`, at most 64 characters; others
    /// as `_`).
    pub fn writer(&self) -> String {
        let raw = if self.session.is_empty() {
            &self.id
        } else {
            &self.session
        };
        let safe: String = raw
            .chars()
            .take(64)
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if safe.is_empty() {
            "_".into()
        } else {
            safe
        }
    }
}

/// A handover request in the head: another kernel (or server) was asked for the task and
/// wants it. The holder sees it at its next renewal, lets its running cell finish, uploads
/// what is left and releases the task; the asker then takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wanted {
    /// Who asks.
    pub by: Holder,
    /// When it asked (its clock; informational).
    pub at: String,
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
    /// The writer id in their names ([`Holder::writer`]); absent in format 1 (names without
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

/// A task's head object (`head.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The newest state manifest (`state/<epoch>-<writer>-<seq>.json`), if any was written.
    pub state: Option<String>,
    /// A handover request (format 2): another kernel wants the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted: Option<Wanted>,
}

impl Head {
    /// The log's length in bytes, all runs.
    pub fn log_bytes(&self) -> u64 {
        self.log.iter().map(|r| r.bytes).sum()
    }

    /// This epoch's log run (made when missing, named with the holder's writer id).
    pub fn run_mut(&mut self) -> &mut LogRun {
        let epoch = self.epoch;
        let writer = self.holder.writer();
        if self
            .log
            .last()
            .is_none_or(|r| r.epoch != epoch || r.writer.as_deref() != Some(writer.as_str()))
        {
            self.log.push(LogRun {
                epoch,
                segments: 0,
                bytes: 0,
                writer: Some(writer),
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

    /// The task's folder names, `(plan, task)`, as the store lists them.
    pub fn folder(&self) -> (String, String) {
        let mut parts = self.base.splitn(3, '/').skip(1);
        let plan = parts.next().unwrap_or_default().to_owned();
        (plan, parts.next().unwrap_or_default().to_owned())
    }

    /// `head.json`.
    pub fn head(&self) -> String {
        format!("{}/head.json", self.base)
    }

    /// Log segment `seq` of a format-1 run of `epoch` (no writer id in the name); readers use
    /// [`TaskKeys::segment`], which names either.
    pub fn log_segment(&self, epoch: u64, seq: u64) -> String {
        format!("{}/log/{}.jsonl", self.base, numbered(epoch, seq))
    }

    /// Log segment `seq` of `run`: `log/<epoch>-<writer>-<seq>.jsonl`, or the format-1 name
    /// when the run has no writer.
    pub fn segment(&self, run: &LogRun, seq: u64) -> String {
        match &run.writer {
            Some(w) => format!("{}/log/{:010}-{w}-{seq:010}.jsonl", self.base, run.epoch),
            None => self.log_segment(run.epoch, seq),
        }
    }

    /// Where the log segments are: `log/`.
    pub fn log_folder(&self) -> String {
        format!("{}/log/", self.base)
    }

    /// Where the state manifests are: `state/`.
    pub fn state_folder(&self) -> String {
        format!("{}/state/", self.base)
    }

    /// State manifest `seq` of `epoch`, written by `writer`:
    /// `state/<epoch>-<writer>-<seq>.json`.
    pub fn state(&self, epoch: u64, writer: &str, seq: u64) -> String {
        format!("{}/state/{epoch:010}-{writer}-{seq:010}.json", self.base)
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

/// The epoch in the name of a log segment or state manifest (`<epoch>-...`), if it has one.
pub fn epoch_of_key(key: &str) -> Option<u64> {
    let name = key.rsplit('/').next()?;
    let digits = name.split(['-', '.']).next()?;
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Now, as heads write times: UTC, RFC 3339 with milliseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
