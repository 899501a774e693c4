//! SIGINTs that arrive between cells.

use pyo3::ffi;

/// Runs Python's handlers for signals already delivered and drops the `KeyboardInterrupt`
/// they raise. Needs the GIL.
pub(super) fn clear_pending_signals() {
    // SAFETY: the callers hold the GIL.
    unsafe {
        if ffi::PyErr_CheckSignals() != 0 {
            ffi::PyErr_Clear();
        }
    }
}

/// Lets a SIGINT still in flight be delivered (any syscall does), then clears it.
pub(super) fn absorb_pending_signals() {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::syscall(libc::SYS_getpid) };
    clear_pending_signals();
}
