//! The JSON-RPC front: one request per line in, one reply per request out, in order.
//!
//! Everything runs on the thread that owns the executor (Python's main thread): read a line,
//! run it, write the reply. No runtime and no thread hop sits on the request path, which is
//! what keeps a round trip close to a bare pipe ping-pong.

use crate::line_reader::{Line, LineReader};
use crate::session::Session;
use flowrepl_protocol::jsonrpc::{ErrorResponse, Notification, Response};
use flowrepl_protocol::{Call, ErrorCode, ExecuteResult, Id, Request, RpcError, READY_MARKER};
use serde::Serialize;
use std::fs::File;
use std::io::{self, Write};

/// Writes protocol lines to the private copy of the original stdout.
pub struct ReplyWriter {
    out: File,
    buf: Vec<u8>,
}

impl ReplyWriter {
    /// Writes to `out`.
    pub fn new(out: File) -> Self {
        ReplyWriter {
            out,
            buf: Vec::with_capacity(4096),
        }
    }

    /// Serializes `msg` and writes it with its `\n` in one `write_all`.
    pub fn send<T: Serialize>(&mut self, msg: &T) -> io::Result<()> {
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, msg).map_err(io::Error::other)?;
        self.flush_buf()
    }

    /// Writes an `execute_code` reply with the fast writer (stdout can be megabytes).
    pub fn send_execute(&mut self, id: &Id, result: &ExecuteResult) -> io::Result<()> {
        self.buf.clear();
        flowrepl_protocol::json::write_execute_response(&mut self.buf, id, result);
        self.flush_buf()
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        self.buf.push(b'\n');
        let r = self.out.write_all(&self.buf);
        if self.buf.capacity() > (8 << 20) {
            self.buf = Vec::with_capacity(4096);
        }
        r
    }

    fn error(&mut self, err: &RpcError) -> io::Result<()> {
        self.send(&ErrorResponse::new(err))
    }
}

/// How the loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown` was called.
    Shutdown,
    /// Stdin reached EOF.
    Eof,
}

/// Serves requests from `input` until `shutdown` or EOF.
pub fn serve(
    session: &mut Session,
    input: File,
    out: &mut ReplyWriter,
    max_request_bytes: usize,
) -> io::Result<Ended> {
    let mut ready = session.status();
    ready.message = Some(READY_MARKER.to_owned());
    out.send(&Notification {
        jsonrpc: "2.0",
        method: "ready",
        params: &ready,
    })?;
    let mut reader = LineReader::new(input, max_request_bytes);
    loop {
        let line = match reader.next_line()? {
            Line::Eof => return Ok(Ended::Eof),
            Line::TooLong { len } => {
                tracing::warn!(len, "request line over the limit discarded");
                out.error(&RpcError::new(
                    ErrorCode::RequestTooLarge,
                    format!("request too large: {len} bytes (limit {max_request_bytes}; see FLOWREPL_MAX_REQUEST_BYTES)"),
                ))?;
                continue;
            }
            Line::Complete(l) => l,
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let req = match Request::parse(line) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "bad request line");
                out.error(&e)?;
                continue;
            }
        };
        let call = match Call::from_request(&req) {
            Ok(c) => c,
            Err(e) => {
                if req.id.is_some() {
                    out.error(&e.with_id(req.id))?;
                }
                continue;
            }
        };
        let id = req.id;
        match call {
            Call::Execute(params) => {
                let result = session.execute(&params);
                if let Some(id) = &id {
                    out.send_execute(id, &result)?;
                }
                session.record(params, result);
            }
            Call::Status => reply(out, id.as_ref(), &session.status())?,
            Call::Shutdown => {
                reply(
                    out,
                    id.as_ref(),
                    &serde_json::json!({"shutting_down": true}),
                )?;
                return Ok(Ended::Shutdown);
            }
        }
    }
}

/// Answers a request; notifications (no id) get nothing.
fn reply<T: Serialize>(out: &mut ReplyWriter, id: Option<&Id>, result: &T) -> io::Result<()> {
    match id {
        Some(id) => out.send(&Response::new(id, result)),
        None => Ok(()),
    }
}
