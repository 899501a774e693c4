//! The JSON-RPC front: one request per line in, one reply per request out, in order
//! (except `status` and `interrupt` sent while a cell runs, answered at once by the watcher;
//! see [`front`]).
//!
//! The request thread is the one that owns the engine (Python's main thread in-process): read
//! a line, dispatch it ([`Session::dispatch`]), write the reply. No runtime and no thread hop
//! sits on the request path, which is what keeps a round trip close to a bare pipe ping-pong.

pub mod front;
pub mod line_reader;
pub mod spin;
pub mod writer;

use flowrepl_protocol::jsonrpc::Notification;
use flowrepl_protocol::{Call, ExecuteMethod, ExecuteResult, Id, Image, RpcError, READY_MARKER};
use flowrepl_session::session::{Answer, Flow, Responder, Session};
use front::{Front, Item};
use std::io;
use std::sync::Arc;
use std::thread::Thread;

/// How the loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown` was called.
    Shutdown,
    /// Stdin reached EOF.
    Eof,
}

/// Answers one request on the front.
struct Reply<'a> {
    front: &'a Front,
    watcher: &'a Thread,
    id: Option<Id>,
    /// A failing cell is a JSON-RPC error, as the original REPL answered `execute`.
    legacy_errors: bool,
}

impl Responder for Reply<'_> {
    fn cell_starts(&mut self) {
        self.front.begin_cell(self.watcher, self.id.as_ref());
    }

    fn cell_ended(&mut self) -> bool {
        self.front.end_cell()
    }

    fn executed(&mut self, result: &mut ExecuteResult, _images: Vec<Image>) -> io::Result<()> {
        let Some(id) = &self.id else { return Ok(()) };
        match &result.report.error {
            Some(e) if self.legacy_errors => {
                let message = if e.message.is_empty() {
                    &e.kind
                } else {
                    &e.message
                };
                self.front.writer().send_execute_error(id, message, result)
            }
            _ => self.front.writer().send_execute(id, result),
        }
    }

    fn answer(&mut self, answer: Answer) -> io::Result<()> {
        self.front.reply(self.id.as_ref(), &answer)
    }

    fn failed(&mut self, error: RpcError) -> io::Result<()> {
        match self.id.take() {
            Some(id) => self.front.writer().error(&error.with_id(Some(id))),
            None => Ok(()),
        }
    }
}

/// Serves requests until `shutdown` or EOF. For a `json_repl_client`, a failing cell called
/// as `execute` is answered with a JSON-RPC error (see `Config::json_repl_client`).
pub fn run(session: &mut Session, front: &Arc<Front>, json_repl_client: bool) -> io::Result<Ended> {
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
        let legacy_errors =
            json_repl_client && matches!(call, Ok(Call::Execute(_, ExecuteMethod::Execute)));
        let mut reply = Reply {
            front,
            watcher: watcher.thread(),
            id,
            legacy_errors,
        };
        let flow = match call {
            Ok(call) => session.dispatch(call, &mut reply)?,
            Err(e) => {
                reply.failed(e)?;
                Flow::Continue
            }
        };
        if flow == Flow::Shutdown {
            return Ok(Ended::Shutdown);
        }
    }
}
