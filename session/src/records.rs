//! Writing task-log records on a thread of their own.
//!
//! A cell's record holds its whole stdout; writing a 1 MB record costs about 0.7 ms of
//! `write(2)` (ext4, page cache) plus its JSON escaping, and more when the journal or
//! writeback get in the way. Requests often arrive back to back, so a large record written on
//! the request thread — even after the reply — delays the next cell. Such a result, once its
//! reply is sent, is *moved* (not copied) to the writer thread, which serializes and appends
//! it while the next cell runs. A small record (the usual case) costs ~2 µs and is written
//! inline right after the reply: waking another thread would cost more than that. Records
//! keep their order: while anything is queued, small records are queued too.
//!
//! Guarantees:
//! - `status` and `shutdown`/EOF wait for the queue to drain ([`RecordWriter::flush`]), so
//!   after any `status` reply every earlier record is in the file.
//! - An unusable log location is found before the reply (the writer reports it, and
//!   [`RecordWriter::check`] retries the open on the request thread), so the cell's own
//!   result carries the warning. A write that fails later (disk full) is reported on stderr
//!   at once and in the next result.

use crate::config::Identity;
use flowrepl_os::chain;
use flowrepl_protocol::{ExecuteParams, ExecuteResult};
use flowrepl_task_logger::{
    ContextRecord, EventRecord, ExecutionRecord, LogError, RecordHead, SessionRecord, TaskHead,
    TaskLog, RECORD_TYPE_CONTEXT, RECORD_TYPE_EVENT, RECORD_TYPE_EXECUTION,
};
use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

struct Job {
    params: ExecuteParams,
    result: ExecuteResult,
    /// The task's context after each change the cell made.
    contexts: Vec<String>,
}

#[derive(Default)]
struct State {
    queued: u64,
    done: u64,
    written: u64,
    /// The last open failed; cleared by a successful open.
    broken: Option<String>,
    /// Failures of records whose reply already went out.
    deferred: Vec<String>,
    /// Threads waiting on `drained`: nobody usually is, and a wake-up is a syscall.
    waiters: usize,
}

struct Shared {
    state: Mutex<State>,
    drained: Condvar,
    /// Used by the writer thread, and inline by the request thread while the queue is empty.
    log: Mutex<TaskLog>,
    identity: Identity,
    /// `--no-log`: nothing is written.
    disabled: bool,
}

/// Records with more text than this go to the writer thread.
const INLINE_MAX_BYTES: usize = 64 << 10;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The record writer thread and its queue.
pub struct RecordWriter {
    tx: Option<mpsc::Sender<Box<Job>>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    probe: TaskLog,
}

impl RecordWriter {
    /// Starts the writer for `path` (`None`: `--no-log`, nothing is ever written). Opens
    /// the log at once so that an unusable location is reported at start (on stderr) and in
    /// the first result.
    pub fn start(path: Option<PathBuf>, identity: Identity) -> std::io::Result<RecordWriter> {
        let disabled = path.is_none();
        let path = path.unwrap_or_default();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            drained: Condvar::new(),
            log: Mutex::new(TaskLog::new(path.clone())),
            identity,
            disabled,
        });
        let mut probe = TaskLog::new(path.clone());
        if disabled {
            tracing::info!("--no-log: no task log is written");
        } else if let Err(e) = probe.open() {
            let msg = chain(&e);
            tracing::warn!(error = %msg, "task log unavailable; cells will run and logging will be retried");
            shared.lock().broken = Some(msg);
        }
        let (tx, rx) = mpsc::channel::<Box<Job>>();
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("flowrepl-records".into())
            .spawn(move || {
                for job in rx {
                    write_one(&s, &job);
                    // `job` (and its megabytes of output) is freed here, off the request thread.
                }
            })?;
        Ok(RecordWriter {
            tx: Some(tx),
            thread: Some(thread),
            shared,
            probe,
        })
    }

    /// Before a reply: moves warnings about earlier records into `warnings`, and says whether
    /// this cell's record can be written (if not, adds a warning saying so).
    pub fn check(&mut self, warnings: &mut Vec<String>) -> bool {
        if self.shared.disabled {
            return false;
        }
        let mut st = self.shared.lock();
        warnings.append(&mut st.deferred);
        if st.broken.is_none() {
            return true;
        }
        // Retry here, so that a cause fixed since the last record counts for this cell.
        drop(st);
        let reopened = self.probe.open();
        let mut st = self.shared.lock();
        match reopened {
            Ok(()) => {
                st.broken = None;
                true
            }
            Err(e) => {
                let msg = chain(&e);
                tracing::warn!(error = %msg, "task log record not written");
                warnings.push(format!(
                    "task log: {msg}; this cell's record is not written"
                ));
                st.broken = Some(msg);
                false
            }
        }
    }

    /// Writes or queues the record of a cell whose reply has been sent.
    pub fn submit(&mut self, params: ExecuteParams, result: ExecuteResult, contexts: Vec<String>) {
        let size = params.code.len() + result.stdout.len() + result.stderr.len();
        {
            let mut st = self.shared.lock();
            st.queued += 1;
            if size <= INLINE_MAX_BYTES && st.done + 1 == st.queued {
                // Nothing in flight: write it here, in order.
                drop(st);
                write_one(
                    &self.shared,
                    &Job {
                        params,
                        result,
                        contexts,
                    },
                );
                return;
            }
        }
        let sent = match &self.tx {
            Some(tx) => tx
                .send(Box::new(Job {
                    params,
                    result,
                    contexts,
                }))
                .is_ok(),
            None => false,
        };
        if !sent {
            // The writer thread is gone (it panicked): count the record as lost.
            let mut st = self.shared.lock();
            st.done += 1;
            st.deferred
                .push("task log: the record writer stopped; records are not written".into());
        }
    }

    /// Waits until every queued record has been handled.
    pub fn flush(&self) {
        self.flusher().flush();
    }

    /// A handle that waits for pending records from another thread.
    pub fn flusher(&self) -> Flusher {
        Flusher(Arc::clone(&self.shared))
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.shared.lock().written
    }
}

/// Waits for pending records; usable from any thread.
#[derive(Clone)]
pub struct Flusher(Arc<Shared>);

impl std::fmt::Debug for Flusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Flusher")
    }
}

impl Flusher {
    /// Writes a session record after every record queued so far (they are small and rare:
    /// written on the calling thread). Failures are reported on stderr.
    pub fn write_session(&self, record: &SessionRecord<'_>) {
        if self.0.disabled {
            return;
        }
        self.flush();
        let mut log = self.0.log.lock().unwrap_or_else(|p| p.into_inner());
        match log.append(record) {
            Ok(()) => self.0.lock().written += 1,
            Err(e) => {
                tracing::warn!(error = %chain(&e), event = %record.event, "session record not written")
            }
        }
    }

    /// Waits until every record queued so far has been handled.
    pub fn flush(&self) {
        let mut st = self.0.lock();
        st.waiters += 1;
        while st.done < st.queued {
            st = self.0.drained.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.waiters -= 1;
    }

    /// [`Flusher::flush`], giving up at `deadline`; true if everything was handled.
    pub fn flush_until(&self, deadline: std::time::Instant) -> bool {
        let mut st = self.0.lock();
        st.waiters += 1;
        while st.done < st.queued {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .0
                .drained
                .wait_timeout(st, left)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
        st.waiters -= 1;
        st.done >= st.queued
    }
}

impl Drop for RecordWriter {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Appends one record and accounts for it.
fn write_one(shared: &Shared, job: &Job) {
    let (outcome, restarted) = {
        let mut log = shared.log.lock().unwrap_or_else(|p| p.into_inner());
        let id = &shared.identity;
        let outcome = log
            .append(&ExecutionRecord::of(
                task_head(id, RECORD_TYPE_EXECUTION),
                &job.params.code,
                &job.result,
            ))
            .and_then(|()| {
                // Then each event as a record of its own, so that a reader can follow a
                // plan's events without parsing cells.
                job.result.events.iter().try_for_each(|event| {
                    log.append(&EventRecord {
                        head: head(id, RECORD_TYPE_EVENT, job.result.execution_count),
                        event: Cow::Borrowed(event),
                    })
                })
            })
            .and_then(|()| {
                // Then the task's context after each change, whole.
                job.contexts.iter().try_for_each(|json| {
                    let context = flowrepl_protocol::EventData::from_json(json.clone())
                        .map_err(LogError::Serialize)?;
                    log.append(&ContextRecord {
                        head: head(id, RECORD_TYPE_CONTEXT, job.result.execution_count),
                        timestamp: Cow::Borrowed(&job.result.timestamp),
                        context,
                    })
                })
            })
            .and_then(|()| match job.contexts.last() {
                // The current context, for the next kernel of the task to start from at once.
                Some(json) => {
                    flowrepl_task_logger::save_context(log.path(), json).map_err(|source| {
                        LogError::Write {
                            path: log.path().to_path_buf(),
                            source,
                        }
                    })
                }
                None => Ok(()),
            });
        (outcome, log.take_restarted())
    };
    let mut st = shared.lock();
    if let Some(r) = restarted {
        tracing::warn!(
            rewritten = r.rewritten,
            gap = r.gap,
            "the task log was deleted during the session; a new one was started"
        );
        let gap = if r.gap {
            "; a record of the second before it was too large to keep and may be lost"
        } else {
            ""
        };
        st.deferred.push(format!(
            "task log: the file was deleted during the session; a new one was started at the record of execution {}, after the {} records of the second before it{gap}",
            job.result.execution_count, r.rewritten
        ));
    }
    match outcome {
        Ok(()) => st.written += 1,
        Err(e) => {
            let msg = chain(&e);
            tracing::warn!(error = %msg, execution_count = job.result.execution_count, "task log record not written");
            if matches!(e, LogError::Open { .. }) {
                st.broken = Some(msg.clone());
            }
            st.deferred.push(format!(
                "task log: the record of execution {} was not written: {msg}",
                job.result.execution_count
            ));
        }
    }
    st.done += 1;
    let waited_for = st.waiters > 0;
    drop(st);
    if waited_for {
        shared.drained.notify_all();
    }
}

/// The first fields of a record of type `kind` of this session.
pub fn task_head<'a>(id: &'a Identity, kind: &'static str) -> TaskHead<'a> {
    TaskHead::new(
        kind,
        &id.plan_id,
        &id.task_id,
        id.task_name.as_deref(),
        &id.session_id,
    )
}

/// The head of a small record of cell `execution_count`.
fn head<'a>(id: &'a Identity, kind: &'static str, execution_count: u64) -> RecordHead<'a> {
    RecordHead {
        task: task_head(id, kind),
        execution_count,
    }
}
