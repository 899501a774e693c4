//! SIGINTs that arrive between cells.

use pyo3::Python;

/// Runs Python's handlers for signals already delivered and drops the `KeyboardInterrupt`
/// they raise.
pub(super) fn clear_pending_signals(py: Python<'_>) {
    let _ = py.check_signals();
}

/// Lets a SIGINT still in flight be delivered (any syscall does: `getpid` is one, glibc does
/// not cache it), then clears it.
pub(super) fn absorb_pending_signals(py: Python<'_>) {
    nix::unistd::getpid();
    clear_pending_signals(py);
}
