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
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::unix::pipe;
use tokio_util::either::Either;

/// The reading half, as opened.
pub type RawReader = Either<pipe::Receiver, tokio::fs::File>;
/// The reading half, telling [`AtEof`]'s callback when the client closes stdin.
pub type Reader = AtEof<RawReader>;
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

/// Wraps the protocol channel; `on_eof` runs once when stdin reaches its end (before rmcp
/// has drained its in-flight requests, which would wait for a running cell). Call inside a
/// tokio runtime with IO enabled.
pub fn open(input: File, output: File, on_eof: Box<dyn FnOnce() + Send>) -> (Reader, Writer) {
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
    (
        AtEof {
            inner: reader,
            on_eof: Some(on_eof),
        },
        writer,
    )
}

/// An `AsyncRead` that calls a function the first time its inner reader reports end of file.
pub struct AtEof<R> {
    inner: R,
    on_eof: Option<Box<dyn FnOnce() + Send>>,
}

impl<R: AsyncRead + Unpin> AsyncRead for AtEof<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            if buf.filled().len() == before && buf.remaining() > 0 {
                if let Some(f) = self.on_eof.take() {
                    f();
                }
            }
        }
        r
    }
}
