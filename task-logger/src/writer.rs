//! Appending records.
//!
//! Each record is serialized into a reused buffer and handed to the kernel in **one**
//! `write(2)` on a file opened with `O_APPEND`: Linux holds the inode lock for the whole
//! write, so records of concurrent kernels on one task file never interleave. The file is
//! created with mode 0600 (directories 0700) and opened once; after any failure the handle is
//! dropped and the next record reopens it, so logging resumes when the cause goes away.
//! Failures are returned to the caller, who reports them; they never panic or retry in a loop.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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

/// An append-only JSONL task log.
#[derive(Debug)]
pub struct TaskLog {
    path: PathBuf,
    file: Option<File>,
    buf: Vec<u8>,
}

impl TaskLog {
    /// A log appending to `path`. Nothing is opened until the first record, so creating a
    /// `TaskLog` never fails.
    pub fn new(path: PathBuf) -> Self {
        TaskLog {
            path,
            file: None,
            buf: Vec::with_capacity(4096),
        }
    }

    /// The file records go to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file now, to report an unusable location early. Later appends retry anyway.
    pub fn open(&mut self) -> Result<(), LogError> {
        if self.file.is_none() {
            self.file = Some(open_append(&self.path).map_err(|source| LogError::Open {
                path: self.path.clone(),
                source,
            })?);
        }
        Ok(())
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
        }
        // Do not keep a 50 MB buffer alive between records.
        if self.buf.capacity() > (1 << 20) {
            self.buf = Vec::with_capacity(4096);
        }
        result
    }

    fn write_line(&mut self) -> Result<(), LogError> {
        let Some(file) = self.file.as_mut() else {
            unreachable!("opened above")
        };
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

fn open_append(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
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
