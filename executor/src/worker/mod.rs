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

mod channel;

use channel::{Channel, PipeApprover};
use flowrepl_exec::worker_args::{inherited_capture, WorkerArgs};

use crate::executor::Executor;
use flowrepl_exec::setup::{CellOutcome, ExecutorConfig};
use flowrepl_os::lock;
use flowrepl_protocol::frame::{
    self, CheckpointOutcome, DoneReport, Frame, FrameReader, VariablesReport, WorkerHello,
};
use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Output frames are written once this much is buffered (one pipe's worth).
const FLUSH_AT: usize = 1 << 20;
/// A `repr` that does not fit in a frame is cut to this.
const MAX_RESULT_ON_OVERFLOW: usize = 1 << 20;

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
    flowrepl_os::reset_inherited_signals();
    let stdio = match flowrepl_exec::stdio::take_protocol_stdio() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowrepl-worker: cannot set up stdio: {e}");
            return ExitCode::from(1);
        }
    };
    flowrepl_os::logging::init(stdio.diagnostics);
    // Before any thread starts, so that every thread we start inherits it.
    flowrepl_os::block_sigint();
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
    let pid = args.pid.unwrap_or_else(std::process::id);
    let config = ExecutorConfig {
        pid,
        capture,
        python: args.python.clone(),
        max_output_bytes: args.max_output_bytes,
        sink: Some(channel.clone()),
        images: args.images(),
        setup: args.setup.clone().unwrap_or_default(),
        approver: Some(approver),
        checkpoints: args.checkpoint_config(),
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
        pid,
        python: info,
        capture_starts: executor.capture_cursors(),
        restored,
        restore_error,
        sandbox: args.sandboxed.clone(),
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
                static NEXT_FRAME: flowrepl_os::Spin = flowrepl_os::Spin::new();
                NEXT_FRAME.until_readable(input.get_ref().as_raw_fd());
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
                flowrepl_os::unblock_sigint();
                let outcome =
                    executor.execute(code, Duration::from_millis(timeout_ms), execution_count);
                flowrepl_os::block_sigint();
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
            Frame::Packages { id, modules } => {
                let imported = executor.layer_changed(&modules).unwrap_or_else(|e| {
                    tracing::warn!(error = %e.0, "the package layer's change was not taken in");
                    Vec::new()
                });
                channel
                    .put(&Frame::PackagesReply {
                        id,
                        imported: Cow::Owned(imported),
                    })
                    .map_err(io::Error::other)?;
                channel.send();
            }
            Frame::Health { id } => {
                let health = executor
                    .checkpoint_health()
                    .map(|h| flowrepl_os::lock(&h).clone())
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
