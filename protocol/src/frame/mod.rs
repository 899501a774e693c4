//! The kernel ↔ worker pipe protocol (worker mode).
//!
//! The kernel talks to its `flowrepl-worker` over a dedicated pipe pair (the worker's original
//! stdin and stdout, moved to private descriptors at start; the worker's fds 1 and 2 are the
//! cells' capture files, never the channel). Each message is one **frame**:
//!
//! ```text
//! frame = length: u32 big-endian | kind: u8 | body
//! ```
//! `length` counts `kind` and `body` (so it is at least 1) and may not exceed
//! [`MAX_FRAME_BYTES`]; a larger length is a [`FrameError::TooLarge`] and the channel is
//! abandoned (the kernel kills the worker). Integers in bodies are big-endian.
//!
//! The kinds, their directions and their fields in wire order are one table, the
//! `frames!` invocation below: it makes the [`kind`] constants, [`KINDS`], [`Frame`] with
//! [`Frame::encode`], and [`decode`] (the fields' byte forms are in `codec.rs`: `u64`
//! big-endian, text and raw bytes and JSON running to the body's end). docs/protocol.md
//! shows the same table for people; a test keeps the two the same.
//!
//! Automatic checkpoints are not frames: the worker writes them itself between cells (see
//! `docs/checkpoints.md`), and a worker started with `--restore` reports in its Ready frame what
//! it restored.
//!
//! A worker given the kernel's capture files (`--capture-fds`) sends no Output frames: its
//! Done says [`DoneReport::output_in_capture`] and the kernel reads the cell's output from the
//! files. Otherwise a cell's output arrives as Output frames while it runs (the worker reads
//! its capture files every monitor tick, 50 ms) and after it ends, in order; either way
//! exactly one Done frame with the same id ends the cell. Output chunks are raw bytes, cut
//! anywhere (even inside a UTF-8 sequence): the receiver decodes a stream's concatenated
//! chunks. While the cell waits for an approval, the kernel writes the ApprovalAnswer frame to it mid-cell (the only frame it
//! sends while a cell runs); the time between ApprovalRequest and ApprovalEnded does not
//! count against the cell's timeout on either side. Interrupts are not frames:
//! the kernel sends SIGINT to the worker process, whose main thread (the only one that does
//! not block SIGINT) runs the cell.

mod bodies;
mod codec;
mod reader;

pub use bodies::{CheckpointOutcome, DoneReport, OutputStream, VariablesReport, WorkerHello};
pub use codec::Direction;
pub use reader::{FrameReader, ReadError};

use crate::approval::{ApprovalAnswer, ApprovalRequest};
use crate::execute::CellEvent;
use crate::CheckpointHealth;
use std::borrow::Cow;

/// Largest frame accepted, in bytes (`length` field): a cell's source can be as large as the
/// largest request line.
pub const MAX_FRAME_BYTES: u32 = 512 << 20;
/// Largest cell source an Execute frame carries (the frame limit less its kind, id and
/// timeout). Worker mode caps the request line limit at this, so every cell fits.
pub const MAX_CELL_BYTES: usize = MAX_FRAME_BYTES as usize - 25;
/// Largest output chunk the worker sends.
pub const MAX_CHUNK_BYTES: usize = 64 << 10;
/// Size of the length prefix.
pub const HEADER_BYTES: usize = 4;

codec::frames! {
    /// Run a cell.
    0x01 EXECUTE ToWorker Execute {
        /// Matched by the Done frame.
        id: u64,
        /// The worker's own SIGINT deadline.
        timeout_ms: u64,
        /// The session's count for this cell (`flow.execution_count`).
        execution_count: u64,
        /// The cell's source.
        code: &'a str,
    }
    /// Exit after the current cell.
    0x02 SHUTDOWN ToWorker Shutdown {}
    /// List the namespace (between cells).
    0x03 VARIABLES ToWorker Variables {
        /// Matched by the reply.
        id: u64,
    }
    /// The answer to an approval request of the running cell (written mid-cell, while it
    /// waits).
    0x04 APPROVAL_ANSWER ToWorker ApprovalAnswer {
        /// The answer.
        answer: Cow<'a, ApprovalAnswer>,
    }
    /// Write a checkpoint now, with every name (between cells).
    0x05 CHECKPOINT ToWorker Checkpoint {
        /// Matched by the reply.
        id: u64,
        /// Its name.
        name: &'a str,
    }
    /// Say how the automatic checkpoint is doing (between cells; answered at once, even while
    /// it is being written).
    0x06 HEALTH ToWorker Health {
        /// Matched by the reply.
        id: u64,
    }
    /// The task's package layer changed (between cells): run its new `.pth` files, drop the
    /// import caches, and say which of `modules` are imported.
    0x07 PACKAGES ToWorker Packages {
        /// Matched by the reply.
        id: u64,
        /// Top-level module names the install added or changed.
        modules: Cow<'a, Vec<String>>,
    }
    /// The worker is ready: sent once, when Python is up.
    0x81 READY ToKernel Ready {
        /// Who it is and what it restored.
        hello: Cow<'a, WorkerHello>,
    }
    /// Output of the running cell: up to `MAX_CHUNK_BYTES` raw bytes, cut anywhere.
    0x82 OUTPUT ToKernel Output {
        /// The cell.
        id: u64,
        /// Which stream.
        stream: OutputStream,
        /// The bytes.
        bytes: &'a [u8],
    }
    /// The cell ended: its result without its output.
    0x83 DONE ToKernel Done {
        /// The cell.
        id: u64,
        /// Its result.
        report: Cow<'a, DoneReport>,
    }
    /// The namespace listing.
    0x84 VARIABLES_REPLY ToKernel VariablesReply {
        /// The request.
        id: u64,
        /// The listing.
        report: Cow<'a, VariablesReport>,
    }
    /// An event of the running cell, sent (and flushed) as the cell reports it.
    0x85 EVENT ToKernel Event {
        /// The cell.
        id: u64,
        /// The event.
        event: Cow<'a, CellEvent>,
    }
    /// The running cell changed the task's context: the whole new context.
    0x86 CONTEXT ToKernel Context {
        /// The cell.
        id: u64,
        /// A JSON object.
        json: &'a str,
    }
    /// The running cell asks for approval and waits for an ApprovalAnswer.
    0x87 APPROVAL_REQUEST ToKernel ApprovalRequest {
        /// The cell.
        id: u64,
        /// The request.
        request: Cow<'a, ApprovalRequest>,
    }
    /// The running cell no longer waits for an approval (answered, timed out or interrupted).
    0x88 APPROVAL_ENDED ToKernel ApprovalEnded {
        /// The cell.
        id: u64,
        /// The request.
        approval_id: &'a str,
    }
    /// What a Checkpoint frame did.
    0x89 CHECKPOINT_REPLY ToKernel CheckpointReply {
        /// The request.
        id: u64,
        /// The outcome.
        outcome: Cow<'a, CheckpointOutcome>,
    }
    /// How the automatic checkpoint is doing (the default when checkpoints are off).
    0x8a HEALTH_REPLY ToKernel HealthReply {
        /// The request.
        id: u64,
        /// The health.
        health: Cow<'a, CheckpointHealth>,
    }
    /// What a Packages frame found: the modules of its list that are imported.
    0x8b PACKAGES_REPLY ToKernel PackagesReply {
        /// The request.
        id: u64,
        /// Imported modules the layer replaced (they need a restart).
        imported: Cow<'a, Vec<String>>,
    }
}

impl Frame<'_> {
    /// The request a frame belongs to (an Execute's, Variables', Checkpoint's, Health's or Packages'
    /// id); `None` for Ready, Shutdown and ApprovalAnswer. The kernel checks it on every
    /// frame from the worker: a cell can write to the worker's frame pipe, and a frame for a
    /// request not sent yet is forged.
    pub fn call_id(&self) -> Option<u64> {
        match self {
            Frame::Execute { id, .. }
            | Frame::Variables { id }
            | Frame::Checkpoint { id, .. }
            | Frame::Health { id }
            | Frame::Packages { id, .. }
            | Frame::PackagesReply { id, .. }
            | Frame::Output { id, .. }
            | Frame::Done { id, .. }
            | Frame::VariablesReply { id, .. }
            | Frame::Event { id, .. }
            | Frame::Context { id, .. }
            | Frame::ApprovalRequest { id, .. }
            | Frame::ApprovalEnded { id, .. }
            | Frame::CheckpointReply { id, .. }
            | Frame::HealthReply { id, .. } => Some(*id),
            Frame::Ready { .. } | Frame::Shutdown {} | Frame::ApprovalAnswer { .. } => None,
        }
    }
}

/// What is wrong with a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix is over [`MAX_FRAME_BYTES`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge(u64),
    /// A zero length (no kind byte).
    #[error("empty frame")]
    Empty,
    /// The body does not fit its kind.
    #[error("malformed frame of kind {kind:#04x}: {why}")]
    Malformed {
        /// The kind byte.
        kind: u8,
        /// What is wrong.
        why: String,
    },
    /// An unknown kind byte.
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
}

/// Reads a frame's length prefix.
pub fn frame_len(header: [u8; HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header);
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len as u64));
    }
    Ok(len as usize)
}

#[cfg(test)]
mod tests;
