//! Small OS and sync helpers shared by the kernel and the worker, on `nix` where it has the
//! call: signal masks, `poll`, the page size, poison-tolerant locks, error chains;
//! [`logging`], diagnostics to the original stderr; and [`beneath`], files beneath a folder a
//! cell can write, opened so that nothing planted there leads outside.

pub mod beneath;
pub mod logging;
pub mod process;
pub mod tree;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The page size assumed for punching holes in capture files and `clear_refs` arithmetic
/// (every Linux target this runs on uses 4 KiB pages).
pub const PAGE: u64 = 4096;

/// Locks `m`, going on with the data if another thread panicked while holding it: every
/// state guarded this way stays consistent between statements.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn sigint() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set
}

/// Blocks SIGINT on the calling thread (and the threads it starts afterwards), so that a
/// process-directed SIGINT is delivered to the thread that runs cells.
pub fn block_sigint() {
    // Cannot fail with a valid set and `how`.
    let _ = sigint().thread_block();
}

/// Unblocks SIGINT on the calling thread.
pub fn unblock_sigint() {
    let _ = sigint().thread_unblock();
}

/// The signals whose inherited state the kernel and the worker undo at start: the ones they
/// are stopped or interrupted with.
const RELIED_ON: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Undoes what a parent may have left on these signals: an ignored disposition (a
/// background job of a non-interactive shell, `nohup`, some supervisors start children with
/// SIGINT ignored, and an ignored signal stays ignored across `exec`; CPython then installs
/// no `KeyboardInterrupt` handler) or a blocked mask. Call it first thing in `main`, before
/// any thread starts: each of these gets its default action and is unblocked on the calling
/// thread, so that cells' child processes see what a shell would give them too.
pub fn reset_inherited_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    let mut set = SigSet::empty();
    for sig in RELIED_ON {
        // SAFETY: installs no handler (the default action); no handler of ours exists yet
        // (an exec keeps only ignored and default dispositions, so this changes only an
        // inherited SIG_IGN).
        let _ = unsafe { sigaction(sig, &default) };
        set.add(sig);
    }
    let _ = set.thread_unblock();
}

/// Waits up to `wait` for `fd` to be readable, at EOF or in error. `EINTR` counts as not
/// ready (the caller loops).
pub fn poll_readable(fd: RawFd, wait: Duration) -> std::io::Result<bool> {
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    poll(
        fd,
        timeout,
        PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR,
    )
}

/// How long a thread that waits for a hop between flowrepl's own threads and processes (the
/// worker's Done, the worker's next frame, MCP's job and reply) keeps polling before it
/// sleeps: `FLOWREPL_SPIN_US` (default 100 µs; 0: never).
///
/// On these VMs a sleeping thread costs 30–40 µs to wake when its vCPU has gone idle; one that
/// is still polling when the bytes arrive costs nothing. The poll yields the CPU between
/// looks, so a thread that has work to do on the same CPU runs first. Whether the read of
/// the JSON-RPC client's next request polls is measured per client
/// (`jsonrpc/src/spin.rs`).
pub fn spin_before_block() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("FLOWREPL_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(100)
            .min(10_000);
        Duration::from_micros(us)
    })
}

/// After this many polls in a row at a [`Spin`] site found nothing, it stops polling...
pub const SPIN_MISSES_BEFORE_PAUSE: u32 = 8;
/// ... except once every this many waits, to notice when polling pays again.
pub const SPIN_PROBE_EVERY: u32 = 32;

/// One place where a thread polls before it sleeps (see [`spin_before_block`]), which polls
/// only while polling pays there: after [`SPIN_MISSES_BEFORE_PAUSE`] polls in a row that
/// found nothing (the other side is slow: a client thinking, or a machine with more runnable
/// threads than CPUs, where polling only takes the CPU from the thread it waits for), it
/// sleeps at once, polling again once every [`SPIN_PROBE_EVERY`] waits and for good after
/// one poll that found something. The figures (50 clients on 10 kernels, one client) are in
/// docs/design.md, "Polling that does not pay stops".
#[derive(Debug, Default)]
pub struct Spin {
    misses: std::sync::atomic::AtomicU32,
    waits: std::sync::atomic::AtomicU32,
}

impl Spin {
    /// A site that polls until it learns that it should not.
    pub const fn new() -> Spin {
        Spin {
            misses: std::sync::atomic::AtomicU32::new(0),
            waits: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Whether this wait polls first.
    fn polls(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.misses.load(Relaxed) < SPIN_MISSES_BEFORE_PAUSE {
            return true;
        }
        self.waits.fetch_add(1, Relaxed) % SPIN_PROBE_EVERY == 0
    }

    fn found(&self, found: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if found {
            self.misses.store(0, Relaxed);
        } else {
            let _ = self
                .misses
                .fetch_update(Relaxed, Relaxed, |m| Some(m.saturating_add(1)));
        }
    }

    /// [`spin_until`], when this site polls at all.
    pub fn until(&self, ready: impl FnMut() -> bool) -> bool {
        if !self.polls() {
            return false;
        }
        let found = spin_until(ready);
        self.found(found);
        found
    }

    /// [`spin_until_readable`], when this site polls at all.
    pub fn until_readable(&self, fd: RawFd) -> bool {
        self.until(|| poll_readable(fd, Duration::ZERO).unwrap_or(true))
    }
}

/// Looks at `ready` again and again, yielding the CPU between looks, for up to
/// [`spin_before_block`]; true once it said yes. (Always: where polling may not pay, a
/// [`Spin`] site decides.)
pub fn spin_until(mut ready: impl FnMut() -> bool) -> bool {
    let spin = spin_before_block();
    let start = std::time::Instant::now();
    while start.elapsed() < spin {
        if ready() {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// Polls `fd` without sleeping for up to [`spin_before_block`]; true once it is readable.
pub fn spin_until_readable(fd: RawFd) -> bool {
    spin_until(|| poll_readable(fd, Duration::ZERO).unwrap_or(true))
}

/// Keeps blocks up to 32 MiB on the heap, and up to 64 MiB of free heap, instead of glibc's
/// defaults (a block over 128 KiB gets its own mapping, returned on `free`). A cell that
/// builds and prints a 1 MB string otherwise maps, faults in and unmaps 2 MB every time:
/// 0.5 ms of page faults per cell in a worker, which has no other large buffers to keep the
/// heap warm. Larger blocks still get their own mapping and go back to the system when freed.
pub fn tune_malloc() {
    // SAFETY: mallopt only sets allocator parameters (it is MT-safe; it takes the arena lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// Whether the other end of the pipe `fd` has closed (no wait).
pub fn poll_hangup(fd: RawFd) -> bool {
    poll(
        fd,
        PollTimeout::ZERO,
        PollFlags::POLLHUP | PollFlags::POLLERR,
    )
    .unwrap_or(false)
}

/// Whether the pipe `fd` has anything to read or its other end has closed (no wait).
pub fn poll_pending(fd: RawFd) -> bool {
    poll(
        fd,
        PollTimeout::ZERO,
        PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR,
    )
    .unwrap_or(false)
}

fn poll(fd: RawFd, timeout: PollTimeout, wanted: PollFlags) -> std::io::Result<bool> {
    // SAFETY: the caller owns `fd` for the duration of the call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match nix::poll::poll(&mut fds, timeout) {
        Ok(0) | Err(nix::Error::EINTR) => Ok(false),
        Ok(_) => Ok(fds[0].revents().is_some_and(|r| r.intersects(wanted))),
        Err(e) => Err(e.into()),
    }
}

/// An error and its sources, joined with `: ` (for one-line messages).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let c_text = c.to_string();
        // Some errors (object_store's, reqwest's) already say their causes in their message.
        if !s.contains(&c_text) {
            s.push_str(": ");
            s.push_str(&c_text);
        }
        cur = c.source();
    }
    s
}

/// Flushes every C stdio stream of the process (`fflush(NULL)`): what C code and extension
/// modules buffered reaches its descriptor.
pub fn flush_c_stdio() {
    // SAFETY: fflush(NULL) flushes every C stdio stream; no preconditions.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn poll_sees_data_and_hangup() {
        let (r, w) = std::io::pipe().unwrap();
        let fd = r.as_raw_fd();
        assert!(!poll_readable(fd, Duration::from_millis(1)).unwrap());
        assert!(!poll_hangup(fd));
        (&w).write_all(b"x").unwrap();
        assert!(poll_readable(fd, Duration::from_secs(5)).unwrap());
        drop(w);
        assert!(poll_hangup(fd));
    }

    #[test]
    fn chain_joins_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(chain(&e), "outer: inner");
    }
}
