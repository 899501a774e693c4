//! Child processes: how every child flowrepl starts is set up, stopped, reaped, and how it
//! ended. One rule for all of them (the kernel's worker, `serve`'s kernels, `flowrepl log
//! replay`'s kernel, the sandbox's init and relay):
//!
//! - **Started** ([`Supervision::apply`]) in a process group of its own (or a session of its
//!   own), so that one `killpg` also ends what it started and a terminal's Ctrl-C reaches only
//!   the parent, which decides; with a **parent-death signal**, armed between `fork` and
//!   `exec` and checked against the race where the parent died first ([`die_with_parent`]).
//! - **Stopped** by a ladder ([`Supervisor::stop`]): the caller's polite ask (closing the
//!   child's stdin, or a signal), up to a grace period to end by itself, then SIGKILL to its
//!   whole group, then reaped.
//! - **Reaped** by its [`Supervisor`] (with `wait4`, so what it used is known), never left a
//!   zombie: dropping the supervisor kills and reaps what is still running.
//! - **Ended** as a typed [`Exit`]: a code or a signal, said the same way everywhere.

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::{getppid, Pid};
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::{Duration, Instant};

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

/// Where a child's process group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// A group of its own in the parent's session (`setpgid(0, 0)`).
    Own,
    /// A session of its own, which is also a group of its own, with no controlling terminal
    /// (`setsid`).
    Session,
}

/// How a child is started: its group and the signal it gets when its parent dies.
#[derive(Debug, Clone, Copy)]
pub struct Supervision {
    /// Its process group.
    pub group: Group,
    /// What it gets when the parent dies: SIGKILL for a child with nothing to save, SIGTERM
    /// for one that writes its records first.
    pub death_signal: Signal,
}

impl Supervision {
    /// Sets `cmd` up so: the group, and the parent-death signal with its race check (as the
    /// last of `cmd`'s `pre_exec` steps so far, after any the caller added).
    pub fn apply(self, cmd: &mut std::process::Command) {
        let parent = nix::unistd::getpid();
        if self.group == Group::Own {
            cmd.process_group(0);
        }
        let Supervision {
            group,
            death_signal,
        } = self;
        // SAFETY: the closure runs between fork and exec and makes only async-signal-safe
        // calls (setsid, prctl, getppid, _exit), allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                if group == Group::Session {
                    nix::unistd::setsid()?;
                }
                die_with_parent(death_signal, parent)
            });
        }
    }
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(Signal),
}

impl Exit {
    /// From a wait status; `None` for one that is not an end (stopped, continued, still
    /// alive) or a signal this system does not name.
    pub fn of_wait(status: WaitStatus) -> Option<Exit> {
        match status {
            WaitStatus::Exited(_, code) => Some(Exit::Code(code)),
            WaitStatus::Signaled(_, sig, _) => Some(Exit::Signal(sig)),
            _ => None,
        }
    }

    /// From the standard library's status.
    pub fn of_status(status: std::process::ExitStatus) -> Option<Exit> {
        match (status.code(), status.signal()) {
            (Some(code), _) => Some(Exit::Code(code)),
            (None, Some(sig)) => Signal::try_from(sig).ok().map(Exit::Signal),
            (None, None) => None,
        }
    }

    /// Its exit code, if it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Code(c) => Some(c),
            Exit::Signal(_) => None,
        }
    }

    /// The signal that ended it, if one did.
    pub fn signal(self) -> Option<Signal> {
        match self {
            Exit::Signal(s) => Some(s),
            Exit::Code(_) => None,
        }
    }

    /// "exited with code 3" / "was killed by signal 11 (SIGSEGV)".
    pub fn describe(self) -> String {
        match self {
            Exit::Code(code) => format!("exited with code {code}"),
            Exit::Signal(sig) => format!("was killed by signal {} ({})", sig as i32, sig.as_str()),
        }
    }

    /// Eight bytes that [`Exit::from_bytes`] reads back (a kind and a value, native order),
    /// for a process that passes another's end on through a pipe.
    pub fn to_bytes(self) -> [u8; 8] {
        let (kind, value): (i32, i32) = match self {
            Exit::Code(code) => (0, code),
            Exit::Signal(sig) => (1, sig as i32),
        };
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&kind.to_ne_bytes());
        bytes[4..].copy_from_slice(&value.to_ne_bytes());
        bytes
    }

    /// The reverse of [`Exit::to_bytes`]; `None` for bytes it did not write.
    pub fn from_bytes(bytes: [u8; 8]) -> Option<Exit> {
        let kind = i32::from_ne_bytes(bytes[..4].try_into().ok()?);
        let value = i32::from_ne_bytes(bytes[4..].try_into().ok()?);
        match kind {
            0 => Some(Exit::Code(value)),
            1 => Signal::try_from(value).ok().map(Exit::Signal),
            _ => None,
        }
    }

    /// Ends the calling process the same way: the same exit code, or death by the same
    /// signal (its disposition reset to the default and unblocked first).
    pub fn reproduce(self) -> ! {
        if let Exit::Signal(sig) = self {
            use nix::sys::signal::{raise, signal, sigprocmask, SigHandler, SigSet, SigmaskHow};
            // SAFETY: resets this process's own disposition of `sig` to the default, with no
            // handler involved.
            let _ = unsafe { signal(sig, SigHandler::SigDfl) };
            let mut one = SigSet::empty();
            one.add(sig);
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&one), None);
            let _ = raise(sig);
            std::process::exit(128 + sig as i32)
        }
        std::process::exit(self.code().unwrap_or(1))
    }
}

/// A child as its supervisor reaped it: how it ended and what it used.
#[derive(Debug, Clone, Copy)]
pub struct Reaped {
    /// How it ended (`None`: it could not be waited for, e.g. already reaped elsewhere).
    pub exit: Option<Exit>,
    /// Its CPU time over its whole life (with its reaped descendants), in milliseconds.
    pub cpu_total_ms: f64,
    /// Its peak RSS in KiB.
    pub peak_rss_kb: u64,
}

impl Reaped {
    /// How it ended in words ("exited with code 3"), or "ended" when that is not known.
    pub fn describe(&self) -> String {
        self.exit.map_or_else(|| "ended".to_owned(), Exit::describe)
    }
}

/// One running child, the leader of a group of its own: signalled, stopped and reaped here
/// (see the module docs). Dropping it kills the group and reaps the child.
#[derive(Debug)]
pub struct Supervisor {
    pid: Pid,
    reaped: Option<Reaped>,
}

impl Supervisor {
    /// Takes over `child` (started with a [`Supervision`]): the standard library's handle is
    /// dropped without waiting, the child is reaped here. Take its pipes out first.
    pub fn of(child: std::process::Child) -> Supervisor {
        Supervisor {
            pid: Pid::from_raw(child.id() as i32),
            reaped: None,
        }
    }

    /// Its pid, also its group's id.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// It has been reaped (its id is no longer its).
    pub fn is_reaped(&self) -> bool {
        self.reaped.is_some()
    }

    /// Sends `signal` to its whole group (nothing once it is reaped: the id may be reused).
    pub fn signal_group(&self, signal: Signal) {
        if self.reaped.is_none() {
            let _ = killpg(self.pid, signal);
        }
    }

    /// Sends `signal` to the child alone (nothing once it is reaped).
    pub fn signal(&self, signal: Signal) {
        if self.reaped.is_none() {
            let _ = nix::sys::signal::kill(self.pid, signal);
        }
    }

    /// Reaps it if it has ended, without waiting.
    pub fn try_reap(&mut self) -> Option<Reaped> {
        if self.reaped.is_none() {
            self.wait(false);
        }
        self.reaped
    }

    /// Waits for it to end (it must be ended or ending), then kills what is left of its
    /// group. Idempotent: the first reaping's answer after that.
    pub fn reap(&mut self) -> Reaped {
        if self.reaped.is_none() {
            self.wait(true);
        }
        self.reaped.expect("reaped by a blocking wait")
    }

    /// The ladder: `ask` (a signal to the child, or `None` when the caller has asked another
    /// way, e.g. by closing its stdin), up to `grace` for it to end by itself, then SIGKILL to
    /// its whole group; reaped. Whether it ended by itself is `Stopped::killed`.
    pub fn stop(&mut self, ask: Option<Signal>, grace: Duration) -> Stopped {
        if let Some(sig) = ask {
            self.signal(sig);
        }
        let deadline = Instant::now() + grace;
        let mut pause = Duration::from_millis(1);
        while self.try_reap().is_none() {
            let now = Instant::now();
            if now >= deadline {
                self.signal_group(Signal::SIGKILL);
                return Stopped {
                    reaped: self.reap(),
                    killed: true,
                };
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        Stopped {
            reaped: self.reap(),
            killed: false,
        }
    }

    /// Kills its whole group and reaps it (the end of the ladder at once). Idempotent.
    pub fn kill(&mut self) -> Reaped {
        self.signal_group(Signal::SIGKILL);
        self.reap()
    }

    fn wait(&mut self, block: bool) {
        let mut status = 0;
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        let flags = if block { 0 } else { libc::WNOHANG };
        let r = loop {
            // SAFETY: wait4 on our own child; fills `status` and `ru`.
            let r = unsafe { libc::wait4(self.pid.as_raw(), &mut status, flags, ru.as_mut_ptr()) };
            if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break r;
        };
        if r == 0 {
            return; // still running (WNOHANG)
        }
        // The leader is gone (or cannot be waited for): whatever it started goes with it.
        // Its id cannot have been reused before this, as it was our unreaped child.
        let _ = killpg(self.pid, Signal::SIGKILL);
        if r != self.pid.as_raw() {
            self.reaped = Some(Reaped {
                exit: None,
                cpu_total_ms: 0.0,
                peak_rss_kb: 0,
            });
            return;
        }
        // SAFETY: initialised by the successful wait4.
        let ru = unsafe { ru.assume_init() };
        let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
        self.reaped = Some(Reaped {
            exit: Exit::of_status(std::process::ExitStatus::from_raw(status)),
            cpu_total_ms: tv(ru.ru_utime) + tv(ru.ru_stime),
            peak_rss_kb: ru.ru_maxrss.max(0) as u64,
        });
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            self.kill();
        }
    }
}

/// What [`Supervisor::stop`] came to.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    /// How it ended.
    pub reaped: Reaped,
    /// It did not end within the grace and was killed.
    pub killed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(script).stdin(Stdio::null());
        c
    }

    fn started(script: &str, group: Group) -> Supervisor {
        let mut c = sh(script);
        Supervision {
            group,
            death_signal: Signal::SIGKILL,
        }
        .apply(&mut c);
        Supervisor::of(c.spawn().unwrap())
    }

    #[test]
    fn exits_are_typed_and_said_one_way() {
        let mut s = started("exit 3", Group::Own);
        let r = s.reap();
        assert_eq!(r.exit, Some(Exit::Code(3)));
        assert_eq!(r.exit.unwrap().describe(), "exited with code 3");
        let mut s = started("kill -SEGV $$", Group::Own);
        let r = s.reap();
        assert_eq!(r.exit, Some(Exit::Signal(Signal::SIGSEGV)));
        assert_eq!(
            r.exit.unwrap().describe(),
            "was killed by signal 11 (SIGSEGV)"
        );
        for e in [Exit::Code(0), Exit::Code(-1), Exit::Signal(Signal::SIGXCPU)] {
            assert_eq!(Exit::from_bytes(e.to_bytes()), Some(e));
        }
        assert_eq!(Exit::from_bytes([9; 8]), None);
    }

    #[test]
    fn the_ladder_asks_then_kills_the_whole_group() {
        // Ignores the ask; a grandchild in its group would outlive a kill of the pid alone.
        let mut s = started("trap '' TERM; sleep 30 & echo $! >&2; wait", Group::Own);
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let stopped = s.stop(Some(Signal::SIGTERM), Duration::from_millis(300));
        assert!(stopped.killed);
        assert_eq!(stopped.reaped.exit, Some(Exit::Signal(Signal::SIGKILL)));
        assert!(t.elapsed() < Duration::from_secs(5));
        // Nothing is left in its group (the grandchild, killed, is reaped by whoever
        // inherited it: a moment later).
        let gone = Instant::now() + Duration::from_secs(5);
        while killpg(Pid::from_raw(s.pid()), None).is_ok() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            killpg(Pid::from_raw(s.pid()), None),
            Err(nix::errno::Errno::ESRCH)
        );
        // One that heeds the ask is not killed.
        let mut s = started(
            "trap 'exit 7' TERM; while :; do sleep 0.05; done",
            Group::Own,
        );
        std::thread::sleep(Duration::from_millis(200));
        let stopped = s.stop(Some(Signal::SIGTERM), Duration::from_secs(10));
        assert!(!stopped.killed);
        assert_eq!(stopped.reaped.exit, Some(Exit::Code(7)));
    }

    /// The same child and grandchild, stopped the way a supervisor that signals only its
    /// child's pid would: the grandchild lives on (what the group kill above prevents).
    #[test]
    fn without_the_group_kill_the_grandchild_outlives_its_parent() {
        let mut c = sh("trap '' TERM; sleep 30 & echo $! >&2; wait");
        c.process_group(0);
        let mut child = c.spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        std::thread::sleep(Duration::from_millis(200));
        child.kill().unwrap(); // SIGKILL to the pid alone
        child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let left = killpg(pid, None);
        let _ = killpg(pid, Signal::SIGKILL);
        assert_eq!(left, Ok(()), "the grandchild should still be in the group");
    }

    #[test]
    fn its_own_group_or_session() {
        let s = started("sleep 30", Group::Own);
        let pgid = nix::unistd::getpgid(Some(Pid::from_raw(s.pid()))).unwrap();
        assert_eq!(pgid.as_raw(), s.pid());
        let sid = nix::unistd::getsid(Some(Pid::from_raw(s.pid()))).unwrap();
        assert_eq!(sid, nix::unistd::getsid(None).unwrap());
        drop(s);
        let s = started("sleep 30", Group::Session);
        let sid = nix::unistd::getsid(Some(Pid::from_raw(s.pid()))).unwrap();
        assert_eq!(sid.as_raw(), s.pid());
    }
}
