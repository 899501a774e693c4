//! SIGTERM and SIGHUP end the kernel without losing a record.
//!
//! Clients restart a kernel with SIGTERM (the original system's client does after its 300 s
//! reply timeout). By default that killed the process with records still queued for the
//! writer thread (a large one, and the small ones behind it). Now signal-hook's handler only
//! wakes a thread (a byte on its self-pipe, all a signal handler may do); that thread then
//! interrupts the running cell, waits until every started cell's record is written (at most
//! the kill grace period and a second), and ends the process by the same signal, with its
//! default action. In worker mode the worker dies with the kernel, as on any kernel death.
//!
//! A handler, not a blocked signal mask: a mask would be inherited by every process a cell
//! starts, so `Popen.terminate()` would stop working; handlers are reset by `exec`. A cell
//! that installs its own SIGTERM handler (in-process) replaces this one.

use crate::session::StatusBoard;
use signal_hook::consts::{SIGHUP, SIGTERM};
use signal_hook::iterator::Signals;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Installs the handlers and starts the thread that acts on them.
pub fn install(board: Arc<StatusBoard>, grace: Duration) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("flowrepl-term".into())
        .spawn(move || {
            flowrepl_os::block_sigint();
            let Some(sig) = signals.forever().next() else {
                return;
            };
            let name = if sig == SIGHUP { "SIGHUP" } else { "SIGTERM" };
            tracing::info!(
                signal = name,
                "stopping: writing the records of every started cell first"
            );
            board.control().interrupt();
            if !board.settle_until(Instant::now() + grace + Duration::from_secs(1)) {
                tracing::warn!("not every record could be written before exiting");
            }
            board.end_session("signal");
            // The default action: the process ends by that signal.
            let _ = signal_hook::low_level::emulate_default_handler(sig);
        })?;
    Ok(())
}
