//! SIGTERM and SIGHUP end the kernel without losing a record.
//!
//! Clients restart a kernel with SIGTERM (the original system's client does after its 300 s
//! reply timeout). By default that killed the process with records still queued for the
//! writer thread (a large one, and the small ones behind it). Now a handler only writes a
//! byte to a pipe (all it may do in a signal handler); a thread waiting on that pipe then
//! interrupts the running cell, waits until every started cell's record is written (at most
//! the kill grace period and a second), and ends the process by the same signal, with its
//! default action. In worker mode the worker dies with the kernel, as on any kernel death.
//!
//! A handler, not a blocked signal mask: a mask would be inherited by every process a cell
//! starts, so `Popen.terminate()` would stop working; handlers are reset by `exec`. A cell
//! that installs its own SIGTERM handler (in-process) replaces this one.

use crate::session::StatusBoard;
use nix::sys::signal::{raise, sigaction, signal, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::io::Read;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The write end of the wake-up pipe, for the handler.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// The signal that arrived.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // The interrupted code may be about to read errno: leave it as it was.
    let errno = nix::errno::Errno::last_raw();
    SIGNAL.store(sig, Ordering::SeqCst);
    let fd = WAKE.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; a one-byte buffer on the stack.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
    nix::errno::Errno::set_raw(errno);
}

/// Installs the handlers and starts the thread that acts on them.
pub fn install(board: Arc<StatusBoard>, grace: Duration) -> std::io::Result<()> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let mut read = std::fs::File::from(read);
    std::thread::Builder::new()
        .name("flowrepl-term".into())
        .spawn(move || {
            flowrepl_worker::sys::block_sigint();
            let mut byte = [0u8; 1];
            loop {
                match read.read(&mut byte) {
                    Ok(1) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // The write end is never closed: nothing else can happen.
                    _ => return,
                }
            }
            let sig = Signal::try_from(SIGNAL.load(Ordering::SeqCst)).unwrap_or(Signal::SIGTERM);
            tracing::info!(
                signal = sig.as_str(),
                "stopping: writing the records of every started cell first"
            );
            board.control().interrupt();
            if !board.settle_until(Instant::now() + grace + Duration::from_secs(1)) {
                tracing::warn!("not every record could be written before exiting");
            }
            board.end_session("signal");
            // SAFETY: restoring the default action; no handler of ours runs concurrently.
            unsafe {
                let _ = signal(sig, SigHandler::SigDfl);
            }
            let _ = raise(sig);
        })?;
    // The write end stays open for the life of the process.
    WAKE.store(write.into_raw_fd(), Ordering::SeqCst);
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to atomics and calls write(2).
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}
