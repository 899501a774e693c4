//! The PID namespace: the sandbox sees and can signal only its own processes, and none of
//! them outlives the worker (not even one started in a new session).
//!
//! # Three processes
//! `unshare(CLONE_NEWPID)` puts the caller's next child in the new namespace, as its PID 1,
//! and leaves the caller outside. So:
//! - **the worker's own process** (the one the kernel started, signals and reaps) stays
//!   outside and becomes a **relay**: it forwards every signal it gets to the namespace's init
//!   and, when init ends, ends the same way the Python process did (the same exit code or the
//!   same signal), so the kernel sees what it would without the namespace;
//! - **init** (PID 1) mounts the namespace's own `/proc`, forwards what the relay sends to
//!   the Python process, reaps every orphan a cell leaves, and when the Python process ends,
//!   tells the relay its wait status and exits, which kills whatever else is in the
//!   namespace. Python is not init itself: the kernel drops signals to a namespace's init
//!   that it has no handler for (a cell's `os.kill(os.getpid(), SIGKILL)`, RLIMIT_CPU's
//!   SIGXCPU), and init must reap orphans;
//! - **the Python process** (PID 2) returns from [`enter`] and goes on with the sandbox's
//!   other layers and Python.
//!
//! Init holds no descriptor of the worker's but fd 2 (diagnostics); the relay also keeps fd 1
//! (the frame pipe to the kernel, never written), so that the kernel sees the pipe's end when
//! the relay has ended like the Python process, and then reaps that exit status rather than
//! killing a relay that is still passing it on. Their memory is
//! the worker's before Python starts, shared copy-on-write. The resource accounting the kernel
//! reads from `wait4` (CPU time, peak RSS) includes reaped descendants, so it is unchanged.

use flowrepl_os::process::Exit;
use flowrepl_protocol::sandbox::SandboxLayer;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, OwnedFd};

/// The PID namespace.
pub const LAYER: &str = "pid_namespace";

/// What [`enter`] gives the Python process.
pub struct Entered {
    /// The layer's report.
    pub report: SandboxLayer,
    /// The worker's pid as the kernel knows it (the Python process's own is 2 in the
    /// namespace).
    pub pid: u32,
}

/// Enters a PID namespace of its own when the mount namespace is in force (it needs one for
/// its own `/proc`). Returns only in the Python process; the relay and init never return.
pub fn enter(mount_ns: bool, skip: &dyn Fn(&str) -> bool) -> Entered {
    let pid = std::process::id();
    let report = crate::unless_skipped(LAYER, skip, || {
        if !mount_ns {
            return Err(
                "not entered: it needs the mount namespace (for a /proc of its own), which is not in force"
                    .into(),
            );
        }
        unshare(CloneFlags::CLONE_NEWPID)
            .map_err(|e| format!("the host refused unshare(CLONE_NEWPID): {e}"))?;
        split()
    });
    Entered { report, pid }
}

/// Forks init, which mounts `/proc` and forks the Python process; returns in the latter.
fn split() -> Result<String, String> {
    let (status_read, status_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("cannot make init's status pipe: {e}"))?;
    // SAFETY: this process is single-threaded (the user namespace could not have been entered
    // otherwise), so the child may run any code.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("cannot fork init: {e}"))? {
        nix::unistd::ForkResult::Parent { child } => {
            drop(status_write);
            relay(child, status_read)
        }
        nix::unistd::ForkResult::Child => {
            drop(status_read);
            // The relay ends only by a signal it cannot forward (SIGKILL): init goes with it.
            // (init's getppid() is 0, so the usual re-check is not possible; the kernel kills
            // the worker's whole process group, init included, in any case.)
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            let proc = mount(
                Some("proc"),
                "/proc",
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            );
            // SAFETY: as above, init is single-threaded.
            match unsafe { nix::unistd::fork() } {
                Ok(nix::unistd::ForkResult::Parent { child }) => init(child, status_write),
                Ok(nix::unistd::ForkResult::Child) => {
                    drop(status_write);
                    proc.map_err(|e| {
                        format!("entered, but the host refused a /proc of its own ({e}): the host's processes would stay listed")
                    })?;
                    Ok("PID 2 under an init of its own; /proc lists only the sandbox's processes; nothing started in it outlives the worker".into())
                }
                // Init cannot go on without the Python process: the relay reports it.
                Err(_) => std::process::exit(1),
            }
        }
    }
}

/// Closes every descriptor but fd 2 (diagnostics) and `keep`, and blocks every signal, so
/// that [`next_signal`] takes them in turn.
fn settle(keep: &[libc::c_int]) -> SigSet {
    let mut keep: Vec<u32> = keep.iter().chain(&[2]).map(|&fd| fd as u32).collect();
    keep.sort_unstable();
    let close = |from: u32, to: u32| {
        // SAFETY: closes this process's own descriptors (close_range: Linux 5.9; nix has no
        // wrapper for it).
        unsafe { libc::syscall(libc::SYS_close_range, from, to, 0u32) };
    };
    let mut from = 0;
    for fd in keep {
        if fd > from {
            close(from, fd - 1);
        }
        from = fd + 1;
    }
    close(from, u32::MAX);
    let all = SigSet::all();
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&all), None);
    all
}

/// The next signal (blocked, so it waits in the queue until taken here). A real-time signal,
/// which nothing sends a worker, is taken and dropped.
fn next_signal(set: &SigSet) -> Signal {
    loop {
        if let Ok(s) = set.wait() {
            return s;
        }
    }
}

/// Init: reaps every child, forwards signals to the Python process, and when that ends,
/// writes how it ended to the relay and exits (which ends the namespace).
fn init(python: Pid, to_relay: OwnedFd) -> ! {
    let set = settle(&[to_relay.as_raw_fd()]);
    loop {
        let sig = next_signal(&set);
        if sig != Signal::SIGCHLD {
            let _ = kill(python, sig);
            continue;
        }
        // Every child that ended (orphans too), without blocking.
        while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            if status == WaitStatus::StillAlive {
                break;
            }
            if status.pid() == Some(python) {
                if let Some(exit) = Exit::of_wait(status) {
                    let _ = nix::unistd::write(&to_relay, &exit.to_bytes());
                }
                // Ends init, and with it every process left in the namespace.
                std::process::exit(0);
            }
        }
    }
}

/// The relay: forwards every signal to init and, when init ends, ends as the Python process
/// did.
fn relay(init: Pid, from_init: OwnedFd) -> ! {
    // Fd 1, the frame pipe to the kernel, stays open here (never written): the kernel sees
    // its end only once this process has ended like the Python process, not before.
    let set = settle(&[1, from_init.as_raw_fd()]);
    loop {
        let sig = next_signal(&set);
        if sig != Signal::SIGCHLD {
            let _ = kill(init, sig);
            continue;
        }
        let status = match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => continue,
            Ok(status) => status,
        };
        // What init wrote before it exited; nothing if it was killed, and then the relay
        // ends as init did.
        let mut bytes = [0u8; 8];
        let said = match nix::unistd::read(&from_init, &mut bytes) {
            Ok(8) => Exit::from_bytes(bytes),
            _ => None,
        };
        said.or_else(|| Exit::of_wait(status))
            .unwrap_or(Exit::Code(1))
            .reproduce()
    }
}
