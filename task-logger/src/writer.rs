//! Appending records.
//!
//! Each record is serialized into a reused buffer and handed to the kernel in **one**
//! `write(2)` on a file opened with `O_APPEND`: Linux holds the inode lock for the whole
//! write, so records of concurrent kernels on one task file never interleave. The file is
//! created with mode 0600 (directories 0700) and opened once; after any failure the handle is
//! dropped and the next record reopens it, so logging resumes when the cause goes away.
//!
//! A record cut short (the disk filled up mid-write) leaves a line without its newline, and
//! the file may be shared with other kernels of the task, so it is never truncated. Instead,
//! whenever the file was (re)opened or a write failed, the next record looks at the file's
//! last byte and starts with a newline of its own if that is not one: the torn line stays a
//! line of its own (readers name it), and no later record is glued onto it.
//!
//! A log file deleted while the kernel holds it open would swallow every later record
//! unseen: when an inotify watch says something happened to the file (see
//! `name_watch.rs`; without inotify, before every append) the append asks the file
//! (one `fstat`) whether it still has a name, and otherwise starts a new file at the same
//! path ([`TaskLog::take_restarted`] tells the caller). The watch's thread may notice a
//! deletion a little after it happened, so the records appended in the last
//! [`RECENT_WINDOW`] (up to [`RECENT_RECORDS`] of them, each under [`RECENT_MAX_BYTES`]) are
//! kept and written again into the new file: a record that went to the deleted file in that
//! moment is not lost, and one that did not fit is said.
//! Failures are returned to the caller, who reports them; they never panic or retry in a loop.

use std::collections::VecDeque;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::name_watch::NameWatch;

/// Why a record was not (fully) written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The directory or file could not be created or opened.
    #[error("cannot open task log {path}")]
    Open {
        /// The log file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The write failed (disk full, I/O error, …); nothing of the record was written.
    #[error("cannot write to task log {path}")]
    Write {
        /// The log file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Only part of the record was written (the disk filled up mid-write); the torn line was
    /// terminated so the next record starts on a line of its own.
    #[error("task log {path}: record truncated after {written} of {len} bytes")]
    Truncated {
        /// The log file.
        path: PathBuf,
        /// Bytes written.
        written: usize,
        /// Bytes of the record.
        len: usize,
    },
    /// The record could not be serialized (should not happen).
    #[error("cannot serialize a task log record")]
    Serialize(#[source] serde_json::Error),
}

/// How long after its append a record is kept to be written again if the file turns out to
/// have been deleted (far longer than the watch's thread takes to notice).
pub const RECENT_WINDOW: Duration = Duration::from_secs(1);
/// How many recent records are kept for that.
pub const RECENT_RECORDS: usize = 16;
/// Records larger than this are not kept (their place is marked, so a loss is said).
pub const RECENT_MAX_BYTES: usize = 64 << 10;

/// What [`TaskLog::take_restarted`] reports: the file was found deleted and a new one
/// started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    /// Recent records written again into the new file (some may have been appended before
    /// the deletion: they were in the deleted file).
    pub rewritten: usize,
    /// A recent record could not be written again (too large to keep, or more records in
    /// the window than are kept): it may be in the deleted file only.
    pub gap: bool,
}

/// An append-only JSONL task log.
#[derive(Debug)]
pub struct TaskLog {
    path: PathBuf,
    file: Option<File>,
    buf: Vec<u8>,
    /// The file may end inside a line (just opened, or a write of ours failed): the next
    /// record checks its last byte first.
    check_tail: bool,
    /// The file was found deleted and a new one was started (until taken).
    restarted: Option<Restart>,
    /// The last records appended (when, and their line; empty: too large to keep).
    recent: VecDeque<(Instant, Vec<u8>)>,
    /// Says when the file may have lost its name; `None`: ask the file before every append.
    watch: Option<NameWatch>,
    /// inotify was refused once: do not try again.
    unwatched: bool,
}

impl TaskLog {
    /// A log appending to `path`. Nothing is opened until the first record, so creating a
    /// `TaskLog` never fails.
    pub fn new(path: PathBuf) -> Self {
        TaskLog {
            path,
            file: None,
            buf: Vec::with_capacity(4096),
            check_tail: true,
            restarted: None,
            recent: VecDeque::with_capacity(RECENT_RECORDS),
            watch: None,
            unwatched: false,
        }
    }

    /// The file records go to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file now, to report an unusable location early. Later appends retry anyway.
    pub fn open(&mut self) -> Result<(), LogError> {
        if self.file.is_none() {
            self.check_tail = true;
            self.file = Some(open_append(&self.path).map_err(|source| LogError::Open {
                path: self.path.clone(),
                source,
            })?);
            self.watch_file();
        }
        Ok(())
    }

    /// Watches the file just opened (see [`crate::name_watch`]); where inotify is refused,
    /// every append asks the file instead.
    fn watch_file(&mut self) {
        if self.unwatched {
            return;
        }
        let armed = match &self.watch {
            Some(w) => w.rearm(&self.path),
            None => NameWatch::new(&self.path).map(|w| self.watch = Some(w)),
        };
        if let Err(e) = armed {
            tracing::debug!(path = %self.path.display(), error = %e, "task log: no inotify watch; every append asks the file whether it was deleted");
            self.watch = None;
            self.unwatched = true;
        }
    }

    /// Appends one record as one line, with one `write(2)`.
    pub fn append<R: serde::Serialize>(&mut self, record: &R) -> Result<(), LogError> {
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, record).map_err(LogError::Serialize)?;
        self.buf.push(b'\n');
        self.open()?;
        let result = self.write_line();
        if result.is_err() {
            // Reopen next time: the file may have been fixed, replaced or freed up.
            self.file = None;
        } else {
            self.keep_recent();
        }
        // Do not keep a 50 MB buffer alive between records.
        if self.buf.capacity() > (1 << 20) {
            self.buf = Vec::with_capacity(4096);
        }
        result
    }

    /// Keeps the record just written among the recent ones, swapping buffers (no copy).
    fn keep_recent(&mut self) {
        let mut spare = if self.recent.len() == RECENT_RECORDS {
            self.recent.pop_front().map(|(_, b)| b).unwrap_or_default()
        } else {
            Vec::new()
        };
        spare.clear();
        let line = if self.buf.len() <= RECENT_MAX_BYTES {
            std::mem::replace(&mut self.buf, spare)
        } else {
            spare
        };
        self.recent.push_back((Instant::now(), line));
    }

    /// Writes the records of the last [`RECENT_WINDOW`] again (into a file just started).
    fn rewrite_recent(&mut self) -> Restart {
        let now = Instant::now();
        let Some(file) = self.file.as_mut() else {
            unreachable!("opened by the caller")
        };
        let mut restart = Restart {
            rewritten: 0,
            gap: false,
        };
        let within = |t: &Instant| now.duration_since(*t) <= RECENT_WINDOW;
        if self.recent.len() == RECENT_RECORDS
            && self.recent.front().is_some_and(|(t, _)| within(t))
        {
            restart.gap = true; // older records of the window were not kept
        }
        for (t, line) in &self.recent {
            if !within(t) {
                continue;
            }
            // A line kept with the newline that ended a torn one before it: not again.
            let line = line.strip_prefix(b"\n").unwrap_or(line);
            if line.is_empty() || file.write_all(line).is_err() {
                restart.gap = true;
            } else {
                restart.rewritten += 1;
            }
        }
        self.recent.clear();
        restart
    }

    /// Whether the file was found deleted since the last call (and a new one started), and
    /// what became of the records appended just before.
    pub fn take_restarted(&mut self) -> Option<Restart> {
        self.restarted.take()
    }

    fn write_line(&mut self) -> Result<(), LogError> {
        let Some(file) = self.file.as_ref() else {
            unreachable!("opened above")
        };
        let look = self.check_tail || self.watch.as_ref().is_none_or(NameWatch::take);
        let meta = if look { file.metadata().ok() } else { None };
        if meta.as_ref().is_some_and(|m| m.nlink() == 0) {
            // Deleted (with its folder, perhaps) while open: start a new file there.
            self.file = None;
            self.open()?;
            self.restarted = Some(self.rewrite_recent());
        }
        let Some(file) = self.file.as_mut() else {
            unreachable!("opened above")
        };
        let len = meta.map_or(0, |m| m.len());
        if self.check_tail && !ends_with_newline(file, len) {
            // Rare (after a torn write): the record moves by one byte.
            self.buf.insert(0, b'\n');
        }
        let len = self.buf.len();
        let written = loop {
            match file.write(&self.buf) {
                Ok(n) => break n,
                // Nothing was written; the whole line can go again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(LogError::Write {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        };
        if written == len {
            self.check_tail = false;
            return Ok(());
        }
        // A short write on a regular file means the disk filled up. Writing the rest would
        // let another appender's line land in the middle of ours; end the torn line instead.
        let _ = file.write(b"\n");
        Err(LogError::Truncated {
            path: self.path.clone(),
            written,
            len,
        })
    }
}

/// Whether `file`, `len` bytes long, is empty or its last byte is a newline (an unreadable
/// file counts as one: nothing better can be done about it).
fn ends_with_newline(file: &File, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut last = [b'\n'];
    len == 0 || file.read_at(&mut last, len - 1).is_err() || last[0] == b'\n'
}

fn open_append(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .read(true) // to look at the last byte
        .mode(0o600)
        .open(path) // std opens with O_CLOEXEC: cells' child processes never inherit the log.
}

#[cfg(test)]
pub(crate) mod tests_support {
    use crate::ExecutionRecord;
    use std::borrow::Cow;

    pub(crate) fn record(n: u64) -> ExecutionRecord<'static> {
        record_with(n, "")
    }

    pub(crate) fn record_with(n: u64, stdout: &str) -> ExecutionRecord<'_> {
        ExecutionRecord {
            kind: Cow::Borrowed(crate::RECORD_TYPE_EXECUTION),
            version: crate::FORMAT_VERSION,
            plan_id: "p".into(),
            task_id: "t".into(),
            task_name: None,
            session_id: "s".into(),
            execution_count: n,
            timestamp: "2026-01-01T00:00:00.000Z".into(),
            elapsed_ms: 1.5,
            code: "x = 1".into(),
            stdout: stdout.into(),
            stderr: "".into(),
            success: true,
            error_type: None,
            error_message: None,
            result: None,
            timed_out: false,
            interrupted: false,
            stopped_by: None,
            added_vars: Cow::Owned(vec!["x".into()]),
            removed_vars: Cow::Borrowed(&[]),
            rebound_vars: Cow::Borrowed(&[]),
            added_imports: Cow::Borrowed(&[]),
            mode: "in_process".into(),
            warnings: Cow::Borrowed(&[]),
            pid: Some(1),
            cpu_ms: Some(0.5),
            peak_rss_kb: Some(1024),
            state_lost: false,
            images: Cow::Borrowed(&[]),
            events: Cow::Borrowed(&[]),
            restored: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::record_with as record;
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_torn_last_line_stays_a_line_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task.jsonl");
        // Another kernel's record, cut off by a full disk.
        std::fs::write(
            &path,
            b"{\"type\":\"execution\",\"version\":1,\"plan_id\":\"p",
        )
        .unwrap();
        let mut log = TaskLog::new(path.clone());
        log.append(&record(1, "a")).unwrap();
        log.append(&record(2, "b")).unwrap();
        let text = std::fs::read(&path).unwrap();
        let out = crate::reader::parse_records(&text);
        assert_eq!(out.records.len(), 2, "{:?}", out.skipped);
        assert_eq!(out.skipped.len(), 1);
        assert_eq!(out.skipped[0].line, 1);
        assert!(out.skipped[0].reason.contains("torn"), "{:?}", out.skipped);
        // Only the first record after opening needed the newline.
        assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 3);
    }

    #[test]
    fn a_deleted_log_is_started_again_and_said() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan/task.jsonl");
        let mut log = TaskLog::new(path.clone());
        log.append(&record(1, "a")).unwrap();
        assert_eq!(log.take_restarted(), None);
        std::fs::remove_dir_all(dir.path().join("plan")).unwrap();
        // Appended at once: it may beat the watch to the deleted file...
        log.append(&record(2, "b")).unwrap();
        let early = log.take_restarted();
        std::thread::sleep(std::time::Duration::from_millis(100));
        log.append(&record(3, "c")).unwrap();
        let restart = early
            .or(log.take_restarted())
            .expect("the deletion is noticed");
        assert!(!restart.gap);
        // ... and is then written again: the new file ends with 2 and 3, whole (1 was in
        // the deleted file, and is written again as a record of the last second).
        let out = crate::reader::parse_records(&std::fs::read(&path).unwrap());
        assert!(out.skipped.is_empty());
        let counts: Vec<u64> = out.records.iter().map(|r| r.execution_count).collect();
        assert!(counts.ends_with(&[2, 3]), "{counts:?}");
        assert!(counts.len() <= 3, "{counts:?}");
    }

    #[test]
    fn appends_lines_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan/task.jsonl");
        let mut log = TaskLog::new(path.clone());
        log.append(&record(1, "a")).unwrap();
        log.append(&record(2, "b\nc")).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
    }

    #[test]
    fn failure_is_reported_and_logging_resumes() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the plan directory should be: every open fails with ENOTDIR.
        let blocker = dir.path().join("plan");
        std::fs::write(&blocker, b"").unwrap();
        let mut log = TaskLog::new(blocker.join("task.jsonl"));
        assert!(matches!(
            log.append(&record(1, "")),
            Err(LogError::Open { .. })
        ));
        std::fs::remove_file(&blocker).unwrap();
        log.append(&record(2, "")).unwrap();
        let text = std::fs::read_to_string(blocker.join("task.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn disk_full_is_a_write_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task.jsonl");
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let mut log = TaskLog::new(path);
        let err = log.append(&record(1, "x")).unwrap_err();
        assert!(matches!(err, LogError::Write { .. }), "{err:?}");
    }
}
