//! Child processes: what every child flowrepl starts does between `fork` and `exec`.

use nix::sys::signal::Signal;
use nix::unistd::{getppid, Pid};

/// Arms the parent-death signal of the calling process (a child between `fork` and `exec`,
/// in a `pre_exec` closure), then checks that `parent` is still its parent: a parent that
/// died before the signal was armed would never send it, and the child exits at once (0)
/// instead of living on as an orphan. Async-signal-safe (prctl, getppid, _exit).
pub fn die_with_parent(signal: Signal, parent: Pid) -> std::io::Result<()> {
    nix::sys::prctl::set_pdeathsig(signal)?;
    if getppid() != parent {
        // SAFETY: _exit is async-signal-safe and ends this (forked) process without running
        // the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    Ok(())
}
