//! The JSON-RPC front: one request per line in, one reply per request out, in order
//! (except `status` and `interrupt` sent while a cell runs, answered at once by the watcher;
//! see [`crate::front`]).
//!
//! The request thread is the one that owns the executor (Python's main thread): read a line,
//! run it, write the reply. No runtime and no thread hop sits on the request path, which is
//! what keeps a round trip close to a bare pipe ping-pong.

use crate::front::{Front, Item};
use crate::session::Session;
use flowrepl_protocol::jsonrpc::{ErrorResponse, Notification};
use flowrepl_protocol::{Call, ErrorCode, ExecuteResult, Id, RpcError, READY_MARKER};
use serde::Serialize;
use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;

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

    /// Writes an error reply.
    pub fn error(&mut self, err: &RpcError) -> io::Result<()> {
        self.send(&ErrorResponse::new(err))
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        self.buf.push(b'\n');
        let r = self.out.write_all(&self.buf);
        if self.buf.capacity() > (8 << 20) {
            self.buf = Vec::with_capacity(4096);
        }
        r
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

/// Serves requests until `shutdown` or EOF.
pub fn serve(session: &mut Session, front: &Arc<Front>) -> io::Result<Ended> {
    let watcher = front.spawn_watcher()?;
    let mut ready = front.status();
    ready.message = Some(READY_MARKER.to_owned());
    front.writer().send(&Notification {
        jsonrpc: "2.0",
        method: "ready",
        params: &ready,
    })?;
    loop {
        let (id, call) = match front.next_item()? {
            Item::Eof => return Ok(Ended::Eof),
            Item::Blank => continue,
            Item::Bad(e) => {
                front.writer().error(&e)?;
                continue;
            }
            Item::Request { id, call } => (id, call),
        };
        let call = match call {
            Ok(c) => c,
            Err(e) => {
                if id.is_some() {
                    front.writer().error(&e.with_id(id))?;
                }
                continue;
            }
        };
        match call {
            Call::Execute(params) => {
                front.begin_cell(watcher.thread(), id.as_ref());
                let mut result = session.execute(&params);
                let answered = front.end_cell();
                if answered {
                    result.warnings.push(
                        "the request was answered with CellNotStopped before the cell ended; this is the cell's real result".into(),
                    );
                } else if let Some(id) = &id {
                    front.writer().send_execute(id, &result)?;
                }
                session.record(params, result);
            }
            Call::Status => front.reply(id.as_ref(), &front.status())?,
            Call::Interrupt => front.reply(id.as_ref(), &front.interrupt())?,
            Call::Restart => match session.restart() {
                Ok(r) => {
                    tracing::info!(pid = r.pid, "restarted");
                    front.reply(id.as_ref(), &r)?
                }
                Err(e) => {
                    if let Some(id) = id {
                        let err =
                            RpcError::new(ErrorCode::InternalError, format!("restart failed: {e}"));
                        front.writer().error(&err.with_id(Some(id)))?;
                    }
                }
            },
            Call::ListVariables => match session.list_variables() {
                Ok(variables) => front.reply(
                    id.as_ref(),
                    &serde_json::json!({"count": variables.len(), "variables": variables}),
                )?,
                Err(e) => {
                    if let Some(id) = id {
                        let err = RpcError::new(
                            ErrorCode::InternalError,
                            format!("list_variables failed: {e}"),
                        );
                        front.writer().error(&err.with_id(Some(id)))?;
                    }
                }
            },
            Call::Shutdown => {
                front.reply(id.as_ref(), &serde_json::json!({"shutting_down": true}))?;
                return Ok(Ended::Shutdown);
            }
        }
    }
}
