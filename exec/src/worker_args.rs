//! The worker's command line: what the kernel passes, and its defaults.

use crate::setup::{CheckpointConfig, ImageLimits, SessionSetup};
use flowrepl_protocol::sandbox::{SandboxPolicy, SandboxReport};
use flowrepl_protocol::CheckpointPolicy;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use flowrepl_protocol::limits::{
    DEFAULT_CHECKPOINT_MAX_MB, DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_OUTPUT_BYTES,
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
    /// The Python library of its version (`libflowrepl_pylib.so`); without it, the executor
    /// linked into this binary (`static-python`).
    #[arg(long, value_name = "PATH")]
    pub python_lib: Option<PathBuf>,
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
    /// Fd 5 holds the task's context to start from (`flow.context`, JSON), read and closed
    /// at start ([`WorkerArgs::take_context`]): not on the command line, where Linux bounds
    /// each string to 128 KiB (a bigger context stopped every worker of its task from
    /// starting).
    #[arg(long)]
    pub context_fd: bool,
    /// Fds 3 and 4 are the capture files for stdout and stderr (memfds the kernel keeps, so
    /// that it can read what this worker had not sent when it dies).
    #[arg(long)]
    pub capture_fds: bool,
    /// The task's checkpoint folder; without it, no checkpoints.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// When the automatic checkpoint is written: on-success, manual, off.
    #[arg(long, default_value = "on-success")]
    pub checkpoints: CheckpointPolicy,
    /// Names whose pickle is larger are not checkpointed, in MB.
    #[arg(long, default_value_t = DEFAULT_CHECKPOINT_MAX_MB)]
    pub checkpoint_max_mb: u64,
    /// Refuse every restore (the checkpoints were written by a sandboxed session, and this
    /// worker is not sandboxed).
    #[arg(long)]
    pub untrusted_checkpoints: bool,
    /// Restore this checkpoint before reporting ready.
    #[arg(long, value_name = "NAME")]
    pub restore: Option<String>,
    /// Confine the worker before Python starts ([`SandboxPolicy`] as JSON).
    #[arg(long, value_name = "JSON", value_parser = parse_sandbox)]
    pub sandbox: Option<SandboxPolicy>,
    /// What the sandbox enforced (set by the worker's `main` after applying it, for the
    /// Ready frame; not a flag).
    #[arg(skip)]
    pub sandboxed: Option<SandboxReport>,
    /// The worker's pid as the kernel knows it, when the sandbox's PID namespace gives the
    /// Python process another (set by the worker's `main`; not a flag).
    #[arg(skip)]
    pub pid: Option<u32>,
}

/// Takes fds 3 and 4 as the capture files (`--capture-fds`), close-on-exec from now on (the
/// cells' processes inherit fds 1 and 2 instead).
pub fn inherited_capture() -> io::Result<[Arc<std::os::fd::OwnedFd>; 2]> {
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

/// The descriptor `--context-fd` names.
pub const CONTEXT_FD: i32 = 5;

fn parse_sandbox(s: &str) -> Result<SandboxPolicy, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

fn parse_setup(s: &str) -> Result<SessionSetup, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

impl WorkerArgs {
    /// The command line for a worker of these settings (the inverse of [`WorkerArgs::images`]
    /// and [`WorkerArgs::checkpoint_config`]); `restore` needs `checkpoints`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        python: PathBuf,
        python_lib: Option<PathBuf>,
        max_output_bytes: u64,
        cpu_seconds: Option<u64>,
        images: Option<ImageLimits>,
        setup: SessionSetup,
        checkpoints: Option<&CheckpointConfig>,
        restore: Option<&str>,
        capture_fds: bool,
        sandbox: Option<SandboxPolicy>,
    ) -> WorkerArgs {
        let images = images.unwrap_or(ImageLimits {
            max_images: 0,
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        });
        WorkerArgs {
            python,
            python_lib,
            max_output_bytes,
            cpu_seconds,
            max_images: images.max_images,
            max_image_pixels: images.max_pixels,
            context_fd: setup.flow.context.is_some(),
            setup: (setup != SessionSetup::default()).then_some(setup),
            capture_fds,
            checkpoint_dir: checkpoints.map(|s| s.root.clone()),
            untrusted_checkpoints: checkpoints.is_some_and(|s| s.untrusted),
            checkpoints: checkpoints.map_or(CheckpointPolicy::Off, |s| s.policy),
            checkpoint_max_mb: checkpoints
                .map_or(DEFAULT_CHECKPOINT_MAX_MB, |s| (s.max_bytes >> 20).max(1)),
            restore: checkpoints.and(restore).map(str::to_owned),
            sandbox,
            sandboxed: None,
            pid: None,
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
            "--checkpoints".into(),
            self.checkpoints.as_str().into(),
            "--checkpoint-max-mb".into(),
            self.checkpoint_max_mb.to_string().into(),
        ];
        if let Some(lib) = &self.python_lib {
            a.extend(["--python-lib".into(), lib.clone().into()]);
        }
        if let Some(s) = self.cpu_seconds {
            a.extend(["--cpu-seconds".into(), s.to_string().into()]);
        }
        if let Some(setup) = &self.setup {
            // The context goes through fd 5 (`--context-fd`).
            let mut setup = setup.clone();
            setup.flow.context = None;
            let json = serde_json::to_string(&setup).expect("setup serializes");
            a.extend(["--setup".into(), json.into()]);
        }
        if self.context_fd {
            a.push("--context-fd".into());
        }
        if let Some(d) = &self.checkpoint_dir {
            a.extend(["--checkpoint-dir".into(), d.clone().into()]);
        }
        if self.untrusted_checkpoints {
            a.push("--untrusted-checkpoints".into());
        }
        if let Some(p) = &self.sandbox {
            let json = serde_json::to_string(p).expect("a policy serializes");
            a.extend(["--sandbox".into(), json.into()]);
        }
        if let Some(r) = &self.restore {
            a.extend(["--restore".into(), r.into()]);
        }
        if self.capture_fds {
            a.push("--capture-fds".into());
        }
        a
    }

    /// With `--context-fd`: reads the context from [`CONTEXT_FD`] (at most
    /// [`MAX_CONTEXT_BYTES`](flowrepl_protocol::limits::MAX_CONTEXT_BYTES)) into the setup and
    /// closes it. A context that cannot be read is left out (the session starts from `{}`),
    /// with the reason returned for the worker's diagnostics.
    pub fn take_context(&mut self) -> Result<(), String> {
        use std::os::fd::FromRawFd;
        if !std::mem::take(&mut self.context_fd) {
            return Ok(());
        }
        // SAFETY: the kernel's pre-exec code put the memfd at this fd for us, and nothing
        // else in this process owns it; it is closed when `file` drops.
        let file = unsafe { std::fs::File::from_raw_fd(CONTEXT_FD) };
        let limit = flowrepl_protocol::limits::MAX_CONTEXT_BYTES as u64;
        let text = flowrepl_task_logger::untrusted::read_bounded(
            file,
            limit,
            "the task's context".as_ref(),
        )
        .and_then(|b| {
            String::from_utf8(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        })
        .map_err(|e| format!("the task's context could not be read: {e}"))?;
        self.setup
            .get_or_insert_with(SessionSetup::default)
            .flow
            .context = Some(text);
        Ok(())
    }

    /// Checkpoints, when on.
    pub fn checkpoint_config(&self) -> Option<CheckpointConfig> {
        let root = self.checkpoint_dir.clone()?;
        (self.checkpoints != CheckpointPolicy::Off).then(|| CheckpointConfig {
            root,
            policy: self.checkpoints,
            max_bytes: self.checkpoint_max_mb.saturating_mul(1 << 20),
            untrusted: self.untrusted_checkpoints,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// What the kernel passes is what the worker parses, whatever is set.
    #[test]
    fn worker_args_round_trip() {
        let checkpoints = CheckpointConfig {
            root: "/tmp/t.checkpoints".into(),
            policy: CheckpointPolicy::EveryCell,
            max_bytes: 5 << 20,
            untrusted: true,
        };
        let full = WorkerArgs::new(
            "/usr/bin/python3".into(),
            Some("/opt/flowrepl/libflowrepl_pylib.so".into()),
            1234,
            Some(7),
            Some(ImageLimits {
                max_images: 3,
                max_pixels: 99_999,
            }),
            SessionSetup::default(),
            Some(&checkpoints),
            Some("auto"),
            true,
            Some(SandboxPolicy {
                strict: true,
                network: flowrepl_protocol::sandbox::Network::None,
                workspace: "/work/space".into(),
                writable: vec!["/tmp/t.checkpoints".into()],
                readable: vec!["/opt/python".into()],
                hidden: vec!["/work/space/.flowrepl/logs".into()],
                protected: vec!["/work/space/.venv".into()],
                tmp: "/tmp/private".into(),
                skip: vec!["seccomp".into()],
            }),
        );
        let bare = WorkerArgs::new(
            "/usr/bin/python3".into(),
            None,
            DEFAULT_MAX_OUTPUT_BYTES,
            None,
            None,
            SessionSetup::default(),
            None,
            Some("ignored without checkpoints"),
            false,
            None,
        );
        for args in [full, bare] {
            let mut argv = vec![std::ffi::OsString::from("flowrepl-worker")];
            argv.extend(args.to_args());
            assert_eq!(WorkerArgs::parse_from(argv), args);
        }
        // The defaults on both sides agree (a worker without a checkpoint folder has no
        // checkpoints, whatever its policy says).
        let mut bare = WorkerArgs::new(
            "/usr/bin/python3".into(),
            None,
            DEFAULT_MAX_OUTPUT_BYTES,
            None,
            None,
            SessionSetup::default(),
            None,
            None,
            false,
            None,
        );
        bare.checkpoints = CheckpointPolicy::OnSuccess;
        assert_eq!(
            WorkerArgs::parse_from(["flowrepl-worker", "--python", "/usr/bin/python3"]),
            bare
        );
    }
}
