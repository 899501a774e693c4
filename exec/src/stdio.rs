//! Keeping the protocol channel away from user code.
//!
//! At start the process moves its real stdin, stdout and stderr to private close-on-exec
//! descriptors (numbered from [`PRIVATE_FD_BASE`], out of the way of code that closes low fds),
//! points fd 0 at `/dev/null` (so `input()`, `sys.stdin.read()`, `os.read(0, …)` and child
//! processes see EOF at once and never eat protocol input), and points fds 1 and 2 at the
//! capture files ([`crate::capture`]). From then on nothing that writes to fd 1 — `print`,
//! C `printf`, a child process, a stray `println!` — can reach the protocol channel.

use nix::fcntl::{fcntl, FcntlArg};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, RawFd};

/// Private descriptors are duplicated at or above this number.
pub const PRIVATE_FD_BASE: RawFd = 64;

/// The process's original standard streams, private to the kernel.
#[derive(Debug)]
pub struct ProtocolStdio {
    /// Where requests arrive (the original fd 0).
    pub input: File,
    /// Where replies go (the original fd 1).
    pub output: File,
    /// Where diagnostics go (the original fd 2).
    pub diagnostics: File,
}

/// Duplicates `fd` to a private close-on-exec descriptor.
pub fn private_dup(fd: BorrowedFd<'_>) -> io::Result<File> {
    let new = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(PRIVATE_FD_BASE))?;
    // SAFETY: `new` is a fresh descriptor owned by nobody else.
    Ok(unsafe { File::from_raw_fd(new) })
}

/// Points standard descriptor `dst` (0, 1 or 2) at `src`, retried on EINTR.
pub fn dup2(src: BorrowedFd<'_>, dst: RawFd) -> io::Result<()> {
    loop {
        let r = match dst {
            0 => nix::unistd::dup2_stdin(src),
            1 => nix::unistd::dup2_stdout(src),
            2 => nix::unistd::dup2_stderr(src),
            other => panic!("dup2 onto fd {other}: only the standard descriptors are replaced"),
        };
        match r {
            Err(nix::Error::EINTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Largest pipe buffer we ask for (Linux's default `pipe-max-size` for unprivileged users).
const PIPE_BYTES: libc::c_int = 1 << 20;

/// If `fd` is a pipe, asks for a 1 MiB buffer instead of 64 KiB, so that a 1 MB reply (or
/// request) crosses in one write instead of sixteen writer/reader hand-offs. Best effort:
/// on anything but a pipe the calls fail harmlessly.
fn grow_pipe(fd: BorrowedFd<'_>) {
    if let Ok(size) = fcntl(fd, FcntlArg::F_GETPIPE_SZ) {
        if size > 0 && size < PIPE_BYTES {
            let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
        }
    }
}

/// Moves fds 0, 1, 2 to private descriptors and puts `/dev/null` on fd 0. Fds 1 and 2 keep
/// pointing at the originals until [`crate::capture::Capture::install`] replaces them.
pub fn take_protocol_stdio() -> io::Result<ProtocolStdio> {
    let input = private_dup(io::stdin().as_fd())?;
    let output = private_dup(io::stdout().as_fd())?;
    let diagnostics = private_dup(io::stderr().as_fd())?;
    let null = File::open("/dev/null")?;
    dup2(null.as_fd(), 0)?;
    for f in [&input, &output] {
        grow_pipe(f.as_fd());
    }
    Ok(ProtocolStdio {
        input,
        output,
        diagnostics,
    })
}
