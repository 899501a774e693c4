//! The worker process: spawning it, its guard, killing its process group, reaping.
//!
//! A worker is started directly from the `flowrepl-worker` executable (no shell), supervised
//! as every child of flowrepl is (`flowrepl_os::process`): its own process group (so that one
//! `kill(-pgid, SIGKILL)` also ends every process a cell started), SIGKILL when the kernel
//! dies, reaped with what it used; plus rlimits from the configuration, core dumps off. Its
//! stdin and stdout are the frame pipes; its stderr is the kernel's diagnostics stream.
//!
//! The death signal only reaches the worker itself. So that the processes a cell started die
//! too when the kernel is killed with SIGKILL, each worker gets a **guard**: a tiny forked
//! child of the kernel that joins the worker's process group, blocks every signal, and waits
//! for its own death signal (the kernel's death); then it kills the whole group, itself
//! included. On every normal path the kernel kills the group itself and reaps both.

use super::output::Capture;
use super::pipe::Pipe;
use super::SpawnConfig;
use flowrepl_os::process::{Group, Reaped, Supervision, Supervisor};
use flowrepl_protocol::frame::Frame;
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::Signal;
use nix::unistd::{getpid, Pid};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// A running worker.
#[derive(Debug)]
pub struct WorkerProcess {
    /// Its frame pipe.
    pub(super) pipe: Pipe,
    /// Its capture files (stdout, stderr).
    pub(super) capture: Capture,
    /// The worker itself: its group, its reaping.
    supervisor: Supervisor,
    guard: Option<libc::pid_t>,
    /// A sandboxed worker's private `/tmp`, removed with this value.
    _tmp: Option<super::sandbox::PrivateTmp>,
    /// A sandboxed worker's stderr, relayed to the diagnostics (`super::diagnostics`).
    relay: Option<super::diagnostics::Relay>,
    /// Its egress proxy (`--sandbox-net=allow:…`), stopped with it.
    _egress: Option<flowrepl_egress::Proxy>,
}

/// How a worker ended, with what it used (from `wait4`).
pub type Ended = Reaped;

/// Sets a resource limit, soft and hard.
fn set_limit(resource: Resource, value: u64) -> nix::Result<()> {
    setrlimit(resource, value, value)
}

/// Lowers a limit, soft and hard, to `value` (never above the hard limit it had).
fn lower_limit(resource: Resource, value: u64) -> nix::Result<()> {
    let (_, hard) = getrlimit(resource)?;
    setrlimit(resource, value.min(hard), value.min(hard))
}

impl WorkerProcess {
    /// Starts a worker and its guard. Does not wait for it to be ready.
    /// With `restore`, the worker restores that checkpoint before it reports ready.
    pub fn spawn(
        config: &SpawnConfig,
        diagnostics: &File,
        restore: Option<&str>,
    ) -> io::Result<WorkerProcess> {
        let mut cmd = Command::new(&config.exe);
        let (sandbox, tmp) = match &config.sandbox {
            Some(sb) => {
                let (policy, tmp) = super::sandbox::prepare(&mut cmd, sb, config)?;
                (Some(policy), Some(tmp))
            }
            None => (None, None),
        };
        cmd.args(
            flowrepl_exec::worker_args::WorkerArgs::new(
                config.python.clone(),
                config.python_lib.clone(),
                config.max_output_bytes,
                config.limits.cpu_seconds,
                config.images,
                config.setup.clone(),
                config.checkpoints.as_ref(),
                restore,
                true,
                sandbox,
            )
            .to_args(),
        );
        let capture = [
            memfd_create(c"flowrepl-worker-stdout", MFdFlags::MFD_CLOEXEC)?,
            memfd_create(c"flowrepl-worker-stderr", MFdFlags::MFD_CLOEXEC)?,
        ];
        let capture_raw = [capture[0].as_raw_fd(), capture[1].as_raw_fd()];
        // The task's context at fd 5 (`--context-fd`), not on the command line.
        let context = match &config.setup.flow.context {
            Some(text) => {
                let fd = memfd_create(c"flowrepl-worker-context", MFdFlags::MFD_CLOEXEC)?;
                let mut f = File::from(fd);
                io::Write::write_all(&mut f, text.as_bytes())?;
                io::Seek::rewind(&mut f)?;
                Some(f)
            }
            None => None,
        };
        // The egress proxy's channel: the worker hands its listening socket over the other
        // end, at fd 6 (`flowrepl_sandbox::proxy`).
        let egress = match (&config.egress, &config.sandbox) {
            (Some(e), Some(_)) => Some((std::os::unix::net::UnixStream::pair()?, e)),
            _ => None,
        };
        // What the worker finds at fds 3, 4, 5 and 6.
        let inherited = [
            (Some(capture_raw[0]), 3),
            (Some(capture_raw[1]), 4),
            (
                context.as_ref().map(|f| f.as_raw_fd()),
                flowrepl_exec::worker_args::CONTEXT_FD,
            ),
            (
                egress.as_ref().map(|((_, theirs), _)| theirs.as_raw_fd()),
                flowrepl_protocol::sandbox::PROXY_FD,
            ),
        ];
        // A sandboxed worker writes its diagnostics through a relay, never into the kernel's
        // own stream (a cell could truncate it, or write lines that read as the kernel's).
        let relay = match &config.sandbox {
            Some(_) => {
                let (relay, write, pid) =
                    super::diagnostics::Relay::start(diagnostics.try_clone()?)?;
                cmd.stderr(write);
                Some((relay, pid))
            }
            None => {
                cmd.stderr(diagnostics.try_clone()?);
                None
            }
        };
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        // A sandboxed worker gets a session of its own (no controlling terminal: a cell cannot
        // type into the user's; `flowrepl_sandbox::terminal`), which is also a process group
        // of its own; any other worker, a process group of its own in the kernel's session.
        let new_session = config
            .sandbox
            .as_ref()
            .is_some_and(|sb| flowrepl_sandbox::terminal::new_session(&sb.skip));
        let limits = config.limits;
        let kernel = getpid();
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // syscalls (fcntl, dup2, getrlimit/setrlimit) through thin wrappers that neither
        // allocate nor lock.
        unsafe {
            cmd.pre_exec(move || {
                // The capture files at fds 3 and 4, the context at fd 5 and the proxy's channel
                // at fd 6 (through high fds first, so that none overwrites another), without
                // close-on-exec.
                let high = inherited
                    .map(|(fd, _)| fd.map(|fd| libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100)));
                for (fd, (_, target)) in high.into_iter().zip(inherited) {
                    match fd {
                        None => {}
                        Some(fd) if fd >= 0 && libc::dup2(fd, target) >= 0 => {}
                        Some(_) => return Err(io::Error::last_os_error()),
                    }
                }
                let _ = set_limit(Resource::RLIMIT_CORE, 0);
                if let Some(mb) = limits.memory_mb {
                    set_limit(Resource::RLIMIT_AS, mb.saturating_mul(1 << 20))?;
                }
                if let Some(n) = limits.max_procs {
                    // Soft and hard: a cell could raise a soft limit back up to the hard one.
                    lower_limit(Resource::RLIMIT_NPROC, n)?;
                }
                Ok(())
            });
        }
        Supervision {
            group: if new_session {
                Group::Session
            } else {
                Group::Own
            },
            death_signal: Signal::SIGKILL,
        }
        .apply(&mut cmd);
        let mut child = cmd.spawn()?;
        drop(context);
        let egress = match egress {
            Some(((ours, theirs), config)) => {
                drop(theirs);
                Some(flowrepl_egress::Proxy::start(ours, config.clone())?)
            }
            None => None,
        };
        let pid = child.id() as libc::pid_t;
        let relay = relay.map(|(relay, shown)| {
            shown.set(pid);
            relay
        });
        let pipe = Pipe::new(
            File::from(std::os::fd::OwnedFd::from(
                child.stdin.take().expect("piped stdin"),
            )),
            File::from(std::os::fd::OwnedFd::from(
                child.stdout.take().expect("piped stdout"),
            )),
        );
        let supervisor = Supervisor::of(child);
        let guard = spawn_guard(pid, kernel.as_raw());
        Ok(WorkerProcess {
            pipe,
            capture: Capture::new(capture, config.max_output_bytes),
            supervisor,
            guard,
            _tmp: tmp,
            relay,
            _egress: egress,
        })
    }

    /// Whether `f` is forged (`Pipe::forged`: a cell wrote to the worker's frame pipe, with
    /// `output` bytes of the cell's output so far): then the worker is stopped (its group
    /// killed: the caller sees the pipe's end and starts a fresh worker, as after any worker
    /// fault) and the frame must not be used.
    pub(super) fn forged(&self, f: &Frame<'_>, output: usize) -> bool {
        let Some(why) = self.pipe.forged(f, output, self.capture.max_output()) else {
            return false;
        };
        tracing::error!(
            "the worker sent {why}: a cell wrote to its frame pipe; the worker is stopped"
        );
        self.kill_group();
        true
    }

    /// Its pid, also its process group id.
    pub fn pid(&self) -> libc::pid_t {
        self.supervisor.pid()
    }

    /// SIGKILL to the worker's whole process group (the worker, its guard, what cells
    /// started); nothing once it is reaped.
    pub fn kill_group(&self) {
        self.supervisor.signal_group(Signal::SIGKILL);
    }

    /// Kills the group if needed and reaps the worker and its guard. Idempotent: `None` once
    /// reaped.
    pub fn kill_and_reap(&mut self) -> Option<Ended> {
        if self.supervisor.is_reaped() && self.guard.is_none() {
            return None;
        }
        self.kill_group();
        Some(self.reap())
    }

    /// Waits for the worker (which must be dead or dying), then kills its group and reaps
    /// the guard.
    pub fn reap(&mut self) -> Ended {
        // The worker is gone; whatever its cells started goes with it (the supervisor kills
        // the group once it has reaped the leader).
        let ended = self.supervisor.reap();
        if let Some(relay) = &self.relay {
            // Its last lines (why it ended) before the kernel says anything of its end.
            relay.finish(std::time::Duration::from_millis(200));
        }
        if let Some(g) = self.guard.take() {
            // Our own child, killed above when it is in the group; a sandboxed worker's
            // session is not the kernel's, so its guard could not join the group.
            let _ = nix::sys::signal::kill(Pid::from_raw(g), Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(Pid::from_raw(g), None);
        }
        ended
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// Forks the guard of worker `pid` (see the module docs). Best effort: without it, only the
/// worker itself dies with the kernel.
fn spawn_guard(pid: libc::pid_t, kernel: libc::pid_t) -> Option<libc::pid_t> {
    // SAFETY: the child makes only async-signal-safe syscalls and ends with _exit or a
    // signal; it never returns into Rust code of this multi-threaded process.
    let g = unsafe { libc::fork() };
    if g < 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "cannot start the worker's guard");
        return None;
    }
    if g > 0 {
        return Some(g);
    }
    // SAFETY: child side, see above.
    unsafe {
        // Hold no descriptor of the kernel's: its pipes must reach EOF when their owners end.
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
            for fd in 0..4096 {
                libc::close(fd);
            }
        }
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        // Joins the worker's group where it can (the worker is in the kernel's session); a
        // worker in a session of its own (sandboxed) has a group no process outside that
        // session can join, and the kernel then kills the guard itself.
        if libc::setpgid(0, pid) != 0 && libc::kill(-pid, 0) != 0 {
            libc::_exit(0); // the worker is already gone
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1 as libc::c_ulong);
        if libc::getppid() == kernel {
            let mut wait: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut wait);
            libc::sigaddset(&mut wait, libc::SIGUSR1);
            while libc::sigwaitinfo(&wait, std::ptr::null_mut()) < 0 {}
        }
        libc::kill(-pid, libc::SIGKILL);
        libc::_exit(0)
    }
}
