//! Writing protocol lines to the private copy of the original stdout, one `write_all` each.

use flowrepl_protocol::jsonrpc::ErrorResponse;
use flowrepl_protocol::{ExecuteResult, Id, RpcError};
use serde::Serialize;
use std::fs::File;
use std::io::{self, Write};

/// Writes protocol lines to the private copy of the original stdout.
pub struct ReplyWriter {
    out: File,
    buf: Vec<u8>,
    /// Lines in ASCII only ([`flowrepl_protocol::json::to_ascii`]), for clients that decode
    /// each pipe read on its own; the escaped line is built here.
    ascii: Option<Vec<u8>>,
}

impl ReplyWriter {
    /// Writes to `out`; with `ascii`, every non-ASCII character as a `\u` escape.
    pub fn new(out: File, ascii: bool) -> Self {
        ReplyWriter {
            out,
            buf: Vec::with_capacity(4096),
            ascii: ascii.then(Vec::new),
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

    /// Writes a failed cell as a JSON-RPC error with the result as `data` (compatibility mode).
    pub fn send_execute_error(
        &mut self,
        id: &Id,
        message: &str,
        result: &ExecuteResult,
    ) -> io::Result<()> {
        self.buf.clear();
        flowrepl_protocol::json::write_execute_error(&mut self.buf, id, message, result);
        self.flush_buf()
    }

    /// Writes an error reply.
    pub fn error(&mut self, err: &RpcError) -> io::Result<()> {
        self.send(&ErrorResponse::new(err))
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        self.buf.push(b'\n');
        let line = match &mut self.ascii {
            Some(escaped) => {
                escaped.clear();
                if flowrepl_protocol::json::to_ascii(&self.buf, escaped) {
                    &escaped[..]
                } else {
                    &self.buf[..]
                }
            }
            None => &self.buf[..],
        };
        let r = self.out.write_all(line);
        if self.buf.capacity() > (8 << 20) {
            self.buf = Vec::with_capacity(4096);
        }
        if let Some(escaped) = &mut self.ascii {
            if escaped.capacity() > (8 << 20) {
                *escaped = Vec::new();
            }
        }
        r
    }
}
