//! The MCP channel: the kernel's saved stdin and stdout (fds 0 and 1 themselves are the
//! cells' capture files, see [`flowrepl_worker::stdio`]) as tokio streams.
//!
//! When they are pipes, as MCP clients launch servers, they are reopened through
//! `/proc/self/fd` with `O_NONBLOCK` on new open file descriptions (so the flag stays ours,
//! not the parent's) and driven by tokio's reactor; otherwise (a file, a tty) through tokio's
//! blocking file adapter.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use tokio::net::unix::pipe;
use tokio_util::either::Either;

/// The reading half.
pub type Reader = Either<pipe::Receiver, tokio::fs::File>;
/// The writing half.
pub type Writer = Either<pipe::Sender, tokio::fs::File>;

fn reopen_fifo(file: &File, write: bool) -> Option<OwnedFd> {
    let is_fifo = file.metadata().is_ok_and(|m| m.file_type().is_fifo());
    if !is_fifo {
        return None;
    }
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
        .map(OwnedFd::from)
}

/// Wraps the protocol channel. Call inside a tokio runtime with IO enabled.
pub fn open(input: File, output: File) -> (Reader, Writer) {
    let reader =
        match reopen_fifo(&input, false).and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok()) {
            Some(r) => Either::Left(r),
            None => Either::Right(tokio::fs::File::from_std(input)),
        };
    let writer =
        match reopen_fifo(&output, true).and_then(|fd| pipe::Sender::from_owned_fd(fd).ok()) {
            Some(w) => Either::Left(w),
            None => Either::Right(tokio::fs::File::from_std(output)),
        };
    (reader, writer)
}
