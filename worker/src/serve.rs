//! The `flowrepl-worker` process: the executor behind the frame protocol
//! ([`flowrepl_protocol::frame`]).
//!
//! The kernel starts it with a pipe on stdin (frames in) and a pipe on stdout (frames out);
//! both are moved to private descriptors at once, and fds 1 and 2 become the cells' capture
//! files, as in the kernel's in-process mode (the kernel made them and reads each cell's
//! output from them; a worker started without them streams Output frames instead). The loop:
//! read an Execute frame, run the cell on this (Python's main) thread, send a Done frame,
//! repeat; a pending checkpoint is written when idle, on a thread of its own. Shutdown or EOF
//! ends it, after the cells' exit handlers ran ([`Executor::finish`]).
//!
//! SIGINT is blocked on this thread except while a cell runs, so the kernel's interrupt
//! cannot land while a frame is being written; one that arrives between cells stays pending
//! and is discarded when the next cell starts.

use crate::approval::Approver;
use crate::checkpoint::SnapshotConfig;
use crate::executor::{CellOutcome, Executor, ExecutorConfig, ImageLimits, SessionSetup};
use crate::sink::OutputSink;
use crate::sys::lock;
use flowrepl_protocol::frame::{
    self, CheckpointOutcome, DoneReport, Frame, FrameReader, OutputStream, VariablesReport,
    WorkerHello,
};
use flowrepl_protocol::{ApprovalAnswer, ApprovalOutcome, ApprovalRequest, SnapshotPolicy};
use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Output frames are written once this much is buffered (one pipe's worth).
const FLUSH_AT: usize = 1 << 20;
/// A `repr` that does not fit in a frame is cut to this.
const MAX_RESULT_ON_OVERFLOW: usize = 1 << 20;

use flowrepl_protocol::limits::{
    DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_SNAPSHOT_MAX_MB,
};

/// Command line of `flowrepl-worker` (set by the kernel; not meant for people).
#[derive(Debug, Clone, PartialEq, Eq, clap::Parser)]
#[command(
    name = "flowrepl-worker",
    version,
    about = "The keep-alive subprocess of flowrepl's worker mode; started by `flowrepl --worker`, spoken to in frames on stdin/stdout."
)]
pub struct WorkerArgs {
    /// The interpreter or venv to emulate.
    #[arg(long, value_name = "PATH")]
    pub python: PathBuf,
    /// Output kept per stream and cell, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_OUTPUT_BYTES)]
    pub max_output_bytes: u64,
    /// CPU seconds per cell (RLIMIT_CPU, re-armed before each cell).
    #[arg(long)]
    pub cpu_seconds: Option<u64>,
    /// Figures collected as PNG images per cell (MCP mode); 0: off.
    #[arg(long, default_value_t = 0)]
    pub max_images: u32,
    /// Pixels per collected image.
    #[arg(long, default_value_t = DEFAULT_MAX_IMAGE_PIXELS)]
    pub max_image_pixels: u64,
    /// The session's setup ([`SessionSetup`] as JSON).
    #[arg(long, value_name = "JSON", value_parser = parse_setup)]
    pub setup: Option<SessionSetup>,
    /// Fds 3 and 4 are the capture files for stdout and stderr (memfds the kernel keeps, so
    /// that it can read what this worker had not sent when it dies).
    #[arg(long)]
    pub capture_fds: bool,
    /// The task's snapshot folder; without it, no checkpoints.
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// When the automatic checkpoint is written: on-success, manual, off.
    #[arg(long, default_value = "on-success")]
    pub snapshot: SnapshotPolicy,
    /// Names whose pickle is larger are not checkpointed, in MB.
    #[arg(long, default_value_t = DEFAULT_SNAPSHOT_MAX_MB)]
    pub snapshot_max_mb: u64,
    /// Restore this checkpoint before reporting ready.
    #[arg(long, value_name = "NAME")]
    pub restore: Option<String>,
}

/// Takes fds 3 and 4 as the capture files (`--capture-fds`), close-on-exec from now on (the
/// cells' processes inherit fds 1 and 2 instead).
fn inherited_capture() -> io::Result<[Arc<std::os::fd::OwnedFd>; 2]> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    use std::os::fd::{FromRawFd, OwnedFd};
    let take = |fd: i32| -> io::Result<Arc<OwnedFd>> {
        fcntl(
            // SAFETY: the kernel's pre-exec code put an open memfd at this fd for us, and
            // nothing else in this process owns it.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
            FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC),
        )?;
        // SAFETY: as above; from here on this OwnedFd is its only owner.
        Ok(Arc::new(unsafe { OwnedFd::from_raw_fd(fd) }))
    };
    Ok([take(3)?, take(4)?])
}

fn parse_setup(s: &str) -> Result<SessionSetup, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

impl WorkerArgs {
    /// The command line for a worker of these settings (the inverse of [`WorkerArgs::images`]
    /// and [`WorkerArgs::snapshots`]); `restore` needs `snapshots`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        python: PathBuf,
        max_output_bytes: u64,
        cpu_seconds: Option<u64>,
        images: Option<ImageLimits>,
        setup: SessionSetup,
        snapshots: Option<&SnapshotConfig>,
        restore: Option<&str>,
        capture_fds: bool,
    ) -> WorkerArgs {
        let images = images.unwrap_or(ImageLimits {
            max_images: 0,
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        });
        WorkerArgs {
            python,
            max_output_bytes,
            cpu_seconds,
            max_images: images.max_images,
            max_image_pixels: images.max_pixels,
            setup: (setup != SessionSetup::default()).then_some(setup),
            capture_fds,
            snapshot_dir: snapshots.map(|s| s.root.clone()),
            snapshot: snapshots.map_or(SnapshotPolicy::Off, |s| s.policy),
            snapshot_max_mb: snapshots
                .map_or(DEFAULT_SNAPSHOT_MAX_MB, |s| (s.max_bytes >> 20).max(1)),
            restore: snapshots.and(restore).map(str::to_owned),
        }
    }

    /// These settings as the worker's arguments: the one place that spells its flags
    /// besides their definitions above (a test parses them back).
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = vec![
            "--python".into(),
            self.python.clone().into(),
            "--max-output-bytes".into(),
            self.max_output_bytes.to_string().into(),
            "--max-images".into(),
            self.max_images.to_string().into(),
            "--max-image-pixels".into(),
            self.max_image_pixels.to_string().into(),
            "--snapshot".into(),
            self.snapshot.as_str().into(),
            "--snapshot-max-mb".into(),
            self.snapshot_max_mb.to_string().into(),
        ];
        if let Some(s) = self.cpu_seconds {
            a.extend(["--cpu-seconds".into(), s.to_string().into()]);
        }
        if let Some(setup) = &self.setup {
            let json = serde_json::to_string(setup).expect("setup serializes");
            a.extend(["--setup".into(), json.into()]);
        }
        if let Some(d) = &self.snapshot_dir {
            a.extend(["--snapshot-dir".into(), d.clone().into()]);
        }
        if let Some(r) = &self.restore {
            a.extend(["--restore".into(), r.into()]);
        }
        if self.capture_fds {
            a.push("--capture-fds".into());
        }
        a
    }

    /// Checkpoints, when on.
    pub fn snapshots(&self) -> Option<SnapshotConfig> {
        let root = self.snapshot_dir.clone()?;
        (self.snapshot != SnapshotPolicy::Off).then(|| SnapshotConfig {
            root,
            policy: self.snapshot,
            max_bytes: self.snapshot_max_mb.saturating_mul(1 << 20),
        })
    }

    /// Figure collection, when on.
    pub fn images(&self) -> Option<ImageLimits> {
        (self.max_images > 0).then_some(ImageLimits {
            max_images: self.max_images,
            max_pixels: self.max_image_pixels,
        })
    }
}

/// The pipe to the kernel, shared by the executing thread and the monitor.
struct Channel {
    out: Mutex<(File, Vec<u8>)>,
    cell: AtomicU64,
}

impl Channel {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let mut g = crate::sys::lock(&self.out);
        let r = f(&mut g.1);
        if g.1.len() >= FLUSH_AT {
            write_or_exit(&mut g);
        }
        r
    }

    /// Encodes `frame` into the buffer (sent when full or at [`Channel::send`]).
    fn put(&self, frame: &Frame<'_>) -> Result<(), frame::FrameError> {
        self.with(|buf| frame.encode(buf))
    }

    fn send(&self) {
        let mut g = crate::sys::lock(&self.out);
        write_or_exit(&mut g);
    }
}

/// The kernel is gone (it would have killed us): nothing left to do.
fn write_or_exit(g: &mut (File, Vec<u8>)) {
    if g.1.is_empty() {
        return;
    }
    if let Err(e) = g.0.write_all(&g.1) {
        tracing::error!(error = %e, "the kernel's pipe is closed; exiting");
        // SAFETY: _exit ends the process at once, from any thread.
        unsafe { libc::_exit(0) };
    }
    g.1.clear();
    if g.1.capacity() > 4 * FLUSH_AT {
        g.1 = Vec::with_capacity(FLUSH_AT);
    }
}

impl OutputSink for Channel {
    fn chunk(&self, stream: OutputStream, bytes: &[u8]) {
        let id = self.cell.load(Ordering::Relaxed);
        let _ = self.put(&Frame::Output { id, stream, bytes });
    }

    fn flush(&self) {
        self.send();
    }

    fn event(&self, event: &flowrepl_protocol::CellEvent) {
        let id = self.cell.load(Ordering::Relaxed);
        let encoded = self.put(&Frame::Event {
            id,
            event: Cow::Borrowed(event),
        });
        if let Err(e) = encoded {
            tracing::warn!(error = %e, "an event too large for a frame was dropped");
        }
        self.send();
    }

    fn context(&self, json: &str) {
        let id = self.cell.load(Ordering::Relaxed);
        if let Err(e) = self.put(&Frame::Context { id, json }) {
            tracing::warn!(error = %e, "a context too large for a frame was not saved");
        }
        self.send();
    }
}

/// Worker mode's [`Approver`]: requests go to the kernel as frames; the answer is read from
/// the kernel's pipe by the waiting cell's thread (the thread that runs cells, which is not
/// reading frames while its cell runs).
struct PipeApprover {
    channel: Arc<Channel>,
    input: Arc<Mutex<FrameReader<File>>>,
    /// An answer decided here (the request could not be sent).
    local: Mutex<Option<ApprovalAnswer>>,
}

impl Approver for PipeApprover {
    fn request(&self, request: &ApprovalRequest) {
        let id = self.channel.cell.load(Ordering::Relaxed);
        if let Err(e) = self.channel.put(&Frame::ApprovalRequest {
            id,
            request: Cow::Borrowed(request),
        }) {
            *lock(&self.local) = Some(ApprovalAnswer::without_person(
                &request.approval_id,
                ApprovalOutcome::Cancelled,
                format!("the request could not be sent: {e}"),
            ));
        }
        self.channel.send();
    }

    fn wait(&self, approval_id: &str, wait: Duration) -> Option<ApprovalAnswer> {
        if let Some(a) = lock(&self.local).take() {
            return Some(a);
        }
        let until = Instant::now() + wait;
        let mut input = lock(&self.input);
        let gone = |why: String| {
            Some(ApprovalAnswer::without_person(
                approval_id,
                ApprovalOutcome::Cancelled,
                why,
            ))
        };
        loop {
            match input.buffered() {
                Ok(Some(payload)) => match frame::decode(&payload) {
                    Ok(Frame::ApprovalAnswer { answer }) if answer.approval_id == approval_id => {
                        return Some(answer.into_owned())
                    }
                    Ok(Frame::ApprovalAnswer { answer }) => {
                        tracing::debug!(approval_id = %answer.approval_id, "a late approval answer was dropped");
                    }
                    Ok(other) => {
                        tracing::error!(
                            ?other,
                            "unexpected frame from the kernel while waiting for an approval"
                        );
                        return gone("the kernel broke the protocol".into());
                    }
                    Err(e) => return gone(format!("bad frame from the kernel: {e}")),
                },
                Ok(None) => {}
                Err(e) => return gone(format!("bad frame from the kernel: {e}")),
            }
            let left = until.saturating_duration_since(Instant::now());
            match crate::sys::poll_readable(input.get_ref().as_raw_fd(), left) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return None,
                Err(e) => return gone(format!("the kernel's pipe failed: {e}")),
            }
            match input.fill() {
                Ok(0) => return gone("the kernel closed the channel".into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return None,
                Err(e) => return gone(format!("the kernel's pipe failed: {e}")),
            }
        }
    }

    fn ended(&self, approval_id: &str) {
        let id = self.channel.cell.load(Ordering::Relaxed);
        let _ = self.channel.put(&Frame::ApprovalEnded { id, approval_id });
        self.channel.send();
    }
}

/// Re-arms RLIMIT_CPU so that this cell may use `seconds` more CPU seconds (the limit counts
/// the whole process life). Past it the kernel sends SIGXCPU, which ends the worker.
fn arm_cpu_limit(seconds: u64, used_ms: f64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((_, hard)) = getrlimit(Resource::RLIMIT_CPU) else {
        return;
    };
    let want = (used_ms / 1000.0).ceil() as u64 + seconds;
    let _ = setrlimit(Resource::RLIMIT_CPU, want.min(hard), hard);
}

fn done_report(o: CellOutcome) -> DoneReport {
    DoneReport {
        report: o.report,
        cpu_total_ms: o.cpu_total_ms,
        images: o.images,
        capture_ends: [0; 2],
        output_in_capture: false,
        checkpoint: o.checkpoint,
    }
}

/// Runs the worker until Shutdown or EOF. Exit codes: 0 at the end, 1 if Python cannot start
/// or the channel breaks, 2 for bad arguments.
pub fn run(args: WorkerArgs) -> ExitCode {
    crate::sys::reset_inherited_signals();
    let stdio = match crate::stdio::take_protocol_stdio() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowrepl-worker: cannot set up stdio: {e}");
            return ExitCode::from(1);
        }
    };
    crate::sys::logging::init(stdio.diagnostics);
    // Before any thread starts, so that every thread we start inherits it.
    crate::sys::block_sigint();
    let channel = Arc::new(Channel {
        out: Mutex::new((stdio.output, Vec::with_capacity(FLUSH_AT))),
        cell: AtomicU64::new(0),
    });
    let input = Arc::new(Mutex::new(FrameReader::new(stdio.input)));
    let approver = Arc::new(PipeApprover {
        channel: Arc::clone(&channel),
        input: Arc::clone(&input),
        local: Mutex::new(None),
    });
    let capture = if args.capture_fds {
        match inherited_capture() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "the capture files the kernel handed over are unusable");
                return ExitCode::from(1);
            }
        }
    } else {
        None
    };
    let config = ExecutorConfig {
        capture,
        python: args.python.clone(),
        max_output_bytes: args.max_output_bytes,
        sink: Some(channel.clone()),
        images: args.images(),
        setup: args.setup.clone().unwrap_or_default(),
        approver: Some(approver),
        snapshots: args.snapshots(),
    };
    let mut executor = match Executor::start(&config) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "worker cannot start Python");
            return ExitCode::from(1);
        }
    };
    let info = executor.info().clone();
    let (restored, restore_error) = match &args.restore {
        None => (None, None),
        Some(name) => match executor.restore(name, true) {
            Ok(r) => (Some(r), None),
            Err(e) => {
                tracing::warn!(error = %e, checkpoint = %name, "the checkpoint was not restored");
                (None, Some(e.to_string()))
            }
        },
    };
    let hello = WorkerHello {
        pid: std::process::id(),
        python: info,
        capture_starts: executor.capture_cursors(),
        restored,
        restore_error,
    };
    if let Err(e) = channel.put(&Frame::Ready {
        hello: Cow::Owned(hello),
    }) {
        tracing::error!(error = %e, "the Ready frame was not sent");
        return ExitCode::from(1);
    }
    channel.send();
    match serve(&mut executor, &channel, &input, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "worker channel failed");
            ExitCode::from(1)
        }
    }
}

/// Appends cell `id`'s Done frame.
fn done(buf: &mut Vec<u8>, id: u64, report: &DoneReport) -> Result<(), frame::FrameError> {
    Frame::Done {
        id,
        report: Cow::Borrowed(report),
    }
    .encode(buf)
}

fn serve(
    executor: &mut Executor,
    channel: &Channel,
    input: &Mutex<FrameReader<File>>,
    args: &WorkerArgs,
) -> io::Result<()> {
    loop {
        // Not held while the cell runs: a cell waiting for an approval reads its answer.
        let next = {
            let mut input = lock(input);
            if input.is_empty() {
                // The next frame usually comes within tens of µs: look before sleeping.
                crate::sys::spin_until_readable(input.get_ref().as_raw_fd());
            }
            input.read_frame()
        };
        let body = match next.map_err(io::Error::other)? {
            Some(body) => body,
            None => {
                // The kernel closed the channel without a Shutdown frame: exit all the same.
                executor.write_pending_checkpoint();
                executor.finish();
                return Ok(());
            }
        };
        match frame::decode(&body).map_err(io::Error::other)? {
            Frame::Execute {
                id,
                timeout_ms,
                execution_count,
                code,
            } => {
                channel.cell.store(id, Ordering::Relaxed);
                if let Some(s) = args.cpu_seconds {
                    arm_cpu_limit(s, executor.cpu_total_ms());
                }
                crate::sys::unblock_sigint();
                let outcome =
                    executor.execute(code, Duration::from_millis(timeout_ms), execution_count);
                crate::sys::block_sigint();
                let mut rep = done_report(outcome);
                rep.capture_ends = executor.capture_cursors();
                rep.output_in_capture = args.capture_fds;
                channel.with(|buf| {
                    if done(buf, id, &rep).is_err() {
                        if !rep.images.is_empty() {
                            rep.images.clear();
                            rep.report.warnings.push(
                                "the cell's images were left out: they did not fit in a frame"
                                    .into(),
                            );
                            if done(buf, id, &rep).is_ok() {
                                return Ok(());
                            }
                        }
                        if let Some(r) = &mut rep.report.result {
                            let mut cut = MAX_RESULT_ON_OVERFLOW;
                            while !r.is_char_boundary(cut) {
                                cut -= 1;
                            }
                            r.truncate(cut);
                            r.push('…');
                        }
                        rep.report.warnings.push(format!(
                            "the result's repr was cut to {MAX_RESULT_ON_OVERFLOW} bytes: it did not fit in a frame"
                        ));
                        done(buf, id, &rep).map_err(io::Error::other)
                    } else {
                        Ok(())
                    }
                })?;
                channel.send();
            }
            Frame::Variables { id } => {
                let listing = match executor.list_variables() {
                    Ok(variables) => VariablesReport {
                        variables,
                        error: None,
                    },
                    Err(e) => VariablesReport {
                        variables: Vec::new(),
                        error: Some(e.0),
                    },
                };
                channel
                    .with(|buf| {
                        Frame::VariablesReply {
                            id,
                            report: Cow::Borrowed(&listing),
                        }
                        .encode(buf)
                        .or_else(|e| {
                            let small = VariablesReport {
                                variables: Vec::new(),
                                error: Some(e.to_string()),
                            };
                            Frame::VariablesReply {
                                id,
                                report: Cow::Owned(small),
                            }
                            .encode(buf)
                        })
                    })
                    .map_err(io::Error::other)?;
                channel.send();
            }
            Frame::Health { id } => {
                let health = executor
                    .checkpoint_health()
                    .map(|h| crate::sys::lock(&h).clone())
                    .unwrap_or_default();
                channel
                    .put(&Frame::HealthReply {
                        id,
                        health: Cow::Owned(health),
                    })
                    .map_err(io::Error::other)?;
                channel.send();
            }
            Frame::Checkpoint { id, name } => {
                let outcome = match executor.checkpoint(name) {
                    Ok(summary) => CheckpointOutcome::Written(summary),
                    Err(e) => CheckpointOutcome::Failed(e.to_string()),
                };
                channel
                    .put(&Frame::CheckpointReply {
                        id,
                        outcome: Cow::Owned(outcome),
                    })
                    .map_err(io::Error::other)?;
                channel.send();
            }
            Frame::Shutdown {} => {
                // The session's last state is what `--resume` and `restart {restore}` get.
                executor.write_pending_checkpoint();
                executor.finish();
                return Ok(());
            }
            Frame::ApprovalAnswer { answer } => {
                // The cell stopped waiting (timed out, interrupted) before the answer came.
                tracing::debug!(approval_id = %answer.approval_id, "a late approval answer was dropped");
            }
            other => {
                return Err(io::Error::other(format!(
                    "unexpected frame from the kernel: {other:?}"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// What the kernel passes is what the worker parses, whatever is set.
    #[test]
    fn worker_args_round_trip() {
        let snapshots = SnapshotConfig {
            root: "/tmp/t.snapshot".into(),
            policy: SnapshotPolicy::EveryCell,
            max_bytes: 5 << 20,
        };
        let full = WorkerArgs::new(
            "/usr/bin/python3".into(),
            1234,
            Some(7),
            Some(ImageLimits {
                max_images: 3,
                max_pixels: 99_999,
            }),
            SessionSetup::default(),
            Some(&snapshots),
            Some("auto"),
            true,
        );
        let bare = WorkerArgs::new(
            "/usr/bin/python3".into(),
            DEFAULT_MAX_OUTPUT_BYTES,
            None,
            None,
            SessionSetup::default(),
            None,
            Some("ignored without snapshots"),
            false,
        );
        for args in [full, bare] {
            let mut argv = vec![std::ffi::OsString::from("flowrepl-worker")];
            argv.extend(args.to_args());
            assert_eq!(WorkerArgs::parse_from(argv), args);
        }
        // The defaults on both sides agree (a worker without a snapshot folder has no
        // checkpoints, whatever its policy says).
        let mut bare = WorkerArgs::new(
            "/usr/bin/python3".into(),
            DEFAULT_MAX_OUTPUT_BYTES,
            None,
            None,
            SessionSetup::default(),
            None,
            None,
            false,
        );
        bare.snapshot = SnapshotPolicy::OnSuccess;
        assert_eq!(
            WorkerArgs::parse_from(["flowrepl-worker", "--python", "/usr/bin/python3"]),
            bare
        );
    }
}
