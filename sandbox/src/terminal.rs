//! The terminal: a sandboxed worker has no controlling terminal, so that a cell cannot push
//! input into the user's terminal (`ioctl(TIOCSTI)`, run by the user's shell once flowrepl
//! exits; CVE-2017-5226 for bubblewrap).
//!
//! The kernel starts a sandboxed worker in a session of its own (`setsid()` between fork and
//! exec, [`new_session`]); here the worker checks that `/dev/tty` names no terminal for it.
//! [`crate::syscalls`] also refuses the input-injecting ioctls (`TIOCSTI`, `TIOCLINUX`) on any
//! descriptor, whatever the host's `dev.tty.legacy_tiocsti`, so that a terminal reached
//! another way (an inherited descriptor) takes no input from a cell either.

use flowrepl_protocol::sandbox::SandboxLayer;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// The layer's name.
pub const LAYER: &str = "terminal";

/// Whether the kernel starts the worker in a session of its own: unless [`LAYER`] is
/// skipped (the tests show a cell typing into the terminal then).
pub fn new_session(skip: &[String]) -> bool {
    !skip.iter().any(|l| l == LAYER)
}

/// Checks that this process has no controlling terminal.
pub fn check(skip: &dyn Fn(&str) -> bool) -> SandboxLayer {
    crate::unless_skipped(LAYER, skip, || {
        match nix::fcntl::open(
            "/dev/tty",
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) {
            // ENXIO: "no controlling terminal"; no /dev/tty at all holds as well.
            Err(Errno::ENXIO) | Err(Errno::ENOENT) => Ok(
                "no controlling terminal (a session of its own): nothing reaches the user's terminal"
                    .into(),
            ),
            Err(e) => Err(format!("cannot tell whether it has a controlling terminal: /dev/tty: {e}")),
            Ok(_fd) => Err("the worker still has a controlling terminal (not started in a session of its own)".into()),
        }
    })
}
