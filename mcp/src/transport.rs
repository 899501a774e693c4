//! The MCP channel: the kernel's saved stdin and stdout (fds 0 and 1 themselves are the
//! cells' capture files, see [`flowrepl_exec::stdio`]) as tokio streams.
//!
//! When they are pipes, as MCP clients launch servers, they are reopened through
//! `/proc/self/fd` with `O_NONBLOCK` on new open file descriptions (so the flag stays ours,
//! not the parent's) and driven by tokio's reactor; otherwise (a file, a tty) through tokio's
//! blocking file adapter.
//!
//! [`LineTransport`] is the rmcp transport over them: one JSON-RPC message per line, lines up
//! to `FLOWREPL_MAX_REQUEST_BYTES` (rmcp's own stdio transport drops lines over 16 MiB without
//! a word, so a 50 MB cell never got an answer). A longer line is not stored: it is read to
//! its end and answered with error -32001 carrying its id when the id is within the line's
//! head ([`OversizedLine`]: the JSON-RPC front's reader keeps and answers such a line the
//! same way), and the server goes on. Memory stays bounded by the limit.

use crate::lines::{BoundedLines, Line};
use flowrepl_protocol::jsonrpc::{ErrorResponse, OversizedLine};
use flowrepl_protocol::RpcError;
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::io::{AsyncWrite, AsyncWriteExt};
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

/// The MCP server's transport: bounded NDJSON lines in, serialized messages out.
pub struct LineTransport<R, W> {
    /// The lines (a line being read is kept across cancelled `receive` calls: rmcp polls it
    /// inside `select!`).
    lines: BoundedLines<R>,
    write: Arc<tokio::sync::Mutex<W>>,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// Lines of at most `max` bytes (without the `\n`).
    pub fn new(read: R, write: W, max: usize) -> Self {
        LineTransport {
            lines: BoundedLines::new(read, max),
            write: Arc::new(tokio::sync::Mutex::new(write)),
        }
    }

    /// Writes a line in the background (in order with [`Transport::send`]'s, under the same
    /// lock), so that a cancelled `receive` never leaves half a reply.
    fn reply_raw(&self, mut bytes: Vec<u8>) {
        bytes.push(b'\n');
        let write = Arc::clone(&self.write);
        tokio::spawn(async move {
            let mut w = write.lock().await;
            if let Err(e) = async {
                w.write_all(&bytes).await?;
                w.flush().await
            }
            .await
            {
                tracing::warn!(error = %e, "writing an error reply failed");
            }
        });
    }

    /// Answers a line that was over the limit.
    fn too_large(&self, over: OversizedLine) {
        let err = over.error(self.lines.max());
        tracing::warn!(
            len = over.len,
            id = ?err.id,
            "MCP request line over the limit discarded"
        );
        let bytes = serde_json::to_vec(&ErrorResponse::new(&err)).expect("errors serialize");
        self.reply_raw(bytes);
    }

    /// Answers a line that is JSON but not a message rmcp knows (-32600, with its id).
    fn invalid(&self, line: &[u8], e: &serde_json::Error) {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            // Not JSON at all: no id to answer to; other MCP SDKs ignore such input too.
            tracing::debug!(error = %e, "unparsable MCP input ignored");
            return;
        };
        let Some(id) = v
            .get("id")
            .and_then(|i| serde_json::from_value(i.clone()).ok())
        else {
            tracing::debug!(error = %e, "malformed MCP notification ignored");
            return;
        };
        let err = RpcError::new(
            flowrepl_protocol::ErrorCode::InvalidRequest,
            format!("invalid request: {e}"),
        )
        .with_id(Some(id));
        let bytes = serde_json::to_vec(&ErrorResponse::new(&err)).expect("errors serialize");
        self.reply_raw(bytes);
    }
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = Arc::clone(&self.write);
        async move {
            let mut bytes = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            bytes.push(b'\n');
            let mut w = write.lock().await;
            w.write_all(&bytes).await?;
            w.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let line = match self.lines.next().await {
                Ok(Some(Line::Whole(line))) => line,
                Ok(Some(Line::Over(over))) => {
                    self.too_large(over);
                    continue;
                }
                Ok(None) => return None,
                Err(e) => {
                    tracing::error!(error = %e, "reading the MCP channel failed");
                    return None;
                }
            };
            let text = line.strip_suffix(b"\r").unwrap_or(&line);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed = serde_json::from_slice(text);
            match parsed {
                Ok(msg) => {
                    self.lines.recycle(line);
                    return Some(msg);
                }
                Err(e) => self.invalid(text, &e),
            }
            self.lines.recycle(line);
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.lock().await.shutdown().await
    }
}
