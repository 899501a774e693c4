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
//! | kind | direction | body |
//! | --- | --- | --- |
//! | `0x01` Execute | kernel → worker | `id: u64`, `timeout_ms: u64`, `execution_count: u64`, the cell's UTF-8 source |
//! | `0x02` Shutdown | kernel → worker | empty: exit after the current cell |
//! | `0x03` Variables | kernel → worker | `id: u64`: list the namespace (between cells) |
//! | `0x04` ApprovalAnswer | kernel → worker | JSON [`ApprovalAnswer`]: the answer to an ApprovalRequest, while its cell waits |
//! | `0x05` Checkpoint | kernel → worker | `id: u64`, the checkpoint's name (UTF-8): save every name now (between cells) |
//! | `0x06` Health | kernel → worker | `id: u64`: how is the automatic checkpoint doing (between cells; answered at once, even while it is being written) |
//! | `0x81` Ready | worker → kernel | JSON [`WorkerHello`]: sent once, when Python is up |
//! | `0x82` Output | worker → kernel | `id: u64`, `stream: u8` (1 stdout, 2 stderr), up to [`MAX_CHUNK_BYTES`] of output |
//! | `0x83` Done | worker → kernel | `id: u64`, JSON [`DoneReport`]: the cell's result without its output |
//! | `0x84` VariablesReply | worker → kernel | `id: u64`, JSON [`VariablesReport`] |
//! | `0x85` Event | worker → kernel | `id: u64`, JSON [`CellEvent`]: sent (and flushed) as the cell reports it |
//! | `0x86` Context | worker → kernel | `id: u64`, the task's whole new context (a JSON object), sent as the cell changes it |
//! | `0x87` ApprovalRequest | worker → kernel | `id: u64`, JSON [`ApprovalRequest`]: the cell waits for an ApprovalAnswer |
//! | `0x88` ApprovalEnded | worker → kernel | `id: u64`, the `approval_id` (UTF-8): the cell no longer waits (answered, timed out or interrupted) |
//! | `0x89` CheckpointReply | worker → kernel | `id: u64`, JSON [`CheckpointOutcome`] |
//! | `0x8a` HealthReply | worker → kernel | `id: u64`, JSON [`CheckpointHealth`](crate::CheckpointHealth) |
//!
//! Automatic checkpoints are not frames: the worker writes them itself between cells (see
//! `docs/snapshots.md`), and a worker started with `--restore` reports in its Ready frame what
//! it restored.
//!
//! A worker given the kernel's capture files (`--capture-fds`) sends no Output frames: its
//! Done says [`DoneReport::output_in_capture`] and the kernel reads the cell's output from the
//! files. Otherwise a cell's output arrives as Output frames while it runs (the worker reads
//! its capture files every monitor tick, 50 ms) and after it ends, in order; either way
//! exactly one Done frame with the same id ends the cell. Output chunks are raw bytes, cut
//! anywhere (even inside a UTF-8 sequence): the receiver decodes a stream's concatenated
//! chunks. While the cell waits for an
//! approval, the kernel writes the ApprovalAnswer frame to it mid-cell (the only frame it
//! sends while a cell runs); the time between ApprovalRequest and ApprovalEnded does not
//! count against the cell's timeout on either side. Interrupts are not frames:
//! the kernel sends SIGINT to the worker process, whose main thread (the only one that does
//! not block SIGINT) runs the cell.

use crate::approval::{ApprovalAnswer, ApprovalRequest};
use crate::execute::{CellEvent, CellReport, Image, VariableInfo};
use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

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

/// Frame kinds.
pub mod kind {
    /// Kernel → worker: run a cell.
    pub const EXECUTE: u8 = 0x01;
    /// Kernel → worker: exit.
    pub const SHUTDOWN: u8 = 0x02;
    /// Kernel → worker: list the namespace.
    pub const VARIABLES: u8 = 0x03;
    /// Kernel → worker: the answer to an approval request.
    pub const APPROVAL_ANSWER: u8 = 0x04;
    /// Kernel → worker: write a checkpoint.
    pub const CHECKPOINT: u8 = 0x05;
    /// Kernel → worker: how is the automatic checkpoint doing.
    pub const HEALTH: u8 = 0x06;
    /// Worker → kernel: started.
    pub const READY: u8 = 0x81;
    /// Worker → kernel: output of the running cell.
    pub const OUTPUT: u8 = 0x82;
    /// Worker → kernel: the cell ended.
    pub const DONE: u8 = 0x83;
    /// Worker → kernel: the namespace listing.
    pub const VARIABLES_REPLY: u8 = 0x84;
    /// Worker → kernel: an event of the running cell.
    pub const EVENT: u8 = 0x85;
    /// Worker → kernel: the running cell changed the task's context.
    pub const CONTEXT: u8 = 0x86;
    /// Worker → kernel: the running cell asks for approval.
    pub const APPROVAL_REQUEST: u8 = 0x87;
    /// Worker → kernel: the running cell no longer waits for an approval.
    pub const APPROVAL_ENDED: u8 = 0x88;
    /// Worker → kernel: the checkpoint asked for was written (or not).
    pub const CHECKPOINT_REPLY: u8 = 0x89;
    /// Worker → kernel: how the automatic checkpoint is doing.
    pub const HEALTH_REPLY: u8 = 0x8a;
}

/// Which captured stream an Output frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// fd 1.
    Stdout = 1,
    /// fd 2.
    Stderr = 2,
}

/// Sent once by a worker when its interpreter is ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHello {
    /// The worker's process id.
    pub pid: u32,
    /// Its interpreter (fields at the top level).
    #[serde(flatten)]
    pub python: crate::PythonInfo,
    /// Where the first cell's stdout and stderr start in the capture files the kernel handed
    /// over (see [`DoneReport::capture_ends`]).
    #[serde(default)]
    pub capture_starts: [u64; 2],
    /// Started with `--restore`: what came back from the checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<crate::RestoreReport>,
    /// Started with `--restore`, and the checkpoint could not be restored at all: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_error: Option<String>,
}

/// The answer to a Checkpoint frame: the summary, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CheckpointOutcome {
    /// Written.
    #[serde(rename = "written")]
    Written(crate::CheckpointSummary),
    /// Not written: why.
    #[serde(rename = "failed")]
    Failed(String),
}

/// A cell's end as the worker reports it: everything but stdout and stderr, which came as
/// Output frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoneReport {
    /// What the cell did.
    pub report: CellReport,
    /// The worker's CPU time since it started, at the end of the cell (so that the kernel can
    /// tell what a cell that killed the worker used).
    pub cpu_total_ms: f64,
    /// Figures and rich values (only when the worker collects them: `--max-images` > 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
    /// Where the next cell's stdout and stderr start in the capture files: if the worker dies
    /// during that cell, the kernel reads what it had not yet received from there.
    #[serde(default)]
    pub capture_ends: [u64; 2],
    /// The worker sent none of the cell's output (nor the traceback): the kernel reads it from
    /// the capture files it handed over, up to `capture_ends`, and appends the traceback.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_in_capture: bool,
    /// How the automatic checkpoint is doing, when that changed since the worker last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::CheckpointHealth>,
}

/// The answer to a Variables frame.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VariablesReport {
    /// The namespace's names, sorted, without `__dunder__` names.
    #[serde(default)]
    pub variables: Vec<VariableInfo>,
    /// Why listing failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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

/// One decoded frame, borrowing from the decoder's buffer.
#[derive(Debug, PartialEq)]
pub enum Frame<'a> {
    /// Run a cell.
    Execute {
        /// Matched by the Done frame.
        id: u64,
        /// The worker's own SIGINT deadline.
        timeout_ms: u64,
        /// The session's count for this cell (`flow.execution_count`).
        execution_count: u64,
        /// The cell's source.
        code: &'a str,
    },
    /// Exit.
    Shutdown,
    /// List the namespace.
    Variables {
        /// Matched by the reply.
        id: u64,
    },
    /// Say how the automatic checkpoint is doing.
    Health {
        /// Matched by the reply.
        id: u64,
    },
    /// The worker is ready.
    Ready(WorkerHello),
    /// Output of cell `id`.
    Output {
        /// The cell.
        id: u64,
        /// Which stream.
        stream: OutputStream,
        /// The bytes.
        bytes: &'a [u8],
    },
    /// Cell `id` ended.
    Done {
        /// The cell.
        id: u64,
        /// Its result.
        report: Box<DoneReport>,
    },
    /// An event cell `id` reported.
    Event {
        /// The cell.
        id: u64,
        /// The event.
        event: CellEvent,
    },
    /// Cell `id` changed the task's context to this JSON object.
    Context {
        /// The cell.
        id: u64,
        /// The whole new context.
        json: &'a str,
    },
    /// The answer to an approval request of the running cell.
    ApprovalAnswer(ApprovalAnswer),
    /// Cell `id` asks for approval and waits.
    ApprovalRequest {
        /// The cell.
        id: u64,
        /// The request.
        request: ApprovalRequest,
    },
    /// Cell `id` no longer waits for approval `approval_id`.
    ApprovalEnded {
        /// The cell.
        id: u64,
        /// The request.
        approval_id: &'a str,
    },
    /// Write a checkpoint now.
    Checkpoint {
        /// Matched by the reply.
        id: u64,
        /// Its name.
        name: &'a str,
    },
    /// What Checkpoint `id` did.
    CheckpointReply {
        /// The request.
        id: u64,
        /// The outcome.
        outcome: CheckpointOutcome,
    },
    /// The namespace listing asked for by Variables `id`.
    VariablesReply {
        /// The request.
        id: u64,
        /// The listing.
        report: VariablesReport,
    },
    /// The answer to Health `id`.
    HealthReply {
        /// The request.
        id: u64,
        /// The health (the default when checkpoints are off).
        health: crate::CheckpointHealth,
    },
}

fn begin(out: &mut Vec<u8>, kind: u8, body_len: usize) -> Result<(), FrameError> {
    let len = body_len as u64 + 1;
    if len > MAX_FRAME_BYTES as u64 {
        return Err(FrameError::TooLarge(len));
    }
    out.reserve(HEADER_BYTES + len as usize);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.push(kind);
    Ok(())
}

/// Appends an Execute frame.
pub fn encode_execute(
    out: &mut Vec<u8>,
    id: u64,
    timeout_ms: u64,
    execution_count: u64,
    code: &str,
) -> Result<(), FrameError> {
    begin(out, kind::EXECUTE, 24 + code.len())?;
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&timeout_ms.to_be_bytes());
    out.extend_from_slice(&execution_count.to_be_bytes());
    out.extend_from_slice(code.as_bytes());
    Ok(())
}

/// Appends a Context frame.
pub fn encode_context(out: &mut Vec<u8>, id: u64, json: &str) -> Result<(), FrameError> {
    begin(out, kind::CONTEXT, 8 + json.len())?;
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(json.as_bytes());
    Ok(())
}

/// Appends an Event frame.
pub fn encode_event(out: &mut Vec<u8>, id: u64, event: &CellEvent) -> Result<(), FrameError> {
    encode_json(out, kind::EVENT, Some(id), event)
}

/// Appends an ApprovalAnswer frame.
pub fn encode_approval_answer(
    out: &mut Vec<u8>,
    answer: &ApprovalAnswer,
) -> Result<(), FrameError> {
    encode_json(out, kind::APPROVAL_ANSWER, None, answer)
}

/// Appends an ApprovalRequest frame.
pub fn encode_approval_request(
    out: &mut Vec<u8>,
    id: u64,
    request: &ApprovalRequest,
) -> Result<(), FrameError> {
    encode_json(out, kind::APPROVAL_REQUEST, Some(id), request)
}

/// Appends an ApprovalEnded frame.
pub fn encode_approval_ended(
    out: &mut Vec<u8>,
    id: u64,
    approval_id: &str,
) -> Result<(), FrameError> {
    begin(out, kind::APPROVAL_ENDED, 8 + approval_id.len())?;
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(approval_id.as_bytes());
    Ok(())
}

/// Appends a Checkpoint frame.
pub fn encode_checkpoint(out: &mut Vec<u8>, id: u64, name: &str) {
    begin(out, kind::CHECKPOINT, 8 + name.len()).expect("names are short");
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// Appends a CheckpointReply frame.
pub fn encode_checkpoint_reply(
    out: &mut Vec<u8>,
    id: u64,
    outcome: &CheckpointOutcome,
) -> Result<(), FrameError> {
    encode_json(out, kind::CHECKPOINT_REPLY, Some(id), outcome)
}

/// Appends a Shutdown frame.
pub fn encode_shutdown(out: &mut Vec<u8>) {
    begin(out, kind::SHUTDOWN, 0).expect("empty frame fits");
}

/// Appends a Variables frame.
pub fn encode_variables(out: &mut Vec<u8>, id: u64) {
    begin(out, kind::VARIABLES, 8).expect("small frame fits");
    out.extend_from_slice(&id.to_be_bytes());
}

/// Appends a Health frame.
pub fn encode_health(out: &mut Vec<u8>, id: u64) {
    begin(out, kind::HEALTH, 8).expect("small frame fits");
    out.extend_from_slice(&id.to_be_bytes());
}

/// Appends a HealthReply frame.
pub fn encode_health_reply(
    out: &mut Vec<u8>,
    id: u64,
    health: &crate::CheckpointHealth,
) -> Result<(), FrameError> {
    encode_json(out, kind::HEALTH_REPLY, Some(id), health)
}

/// Appends a VariablesReply frame. Fails (appending nothing) if it is over the frame limit.
pub fn encode_variables_reply(
    out: &mut Vec<u8>,
    id: u64,
    report: &VariablesReport,
) -> Result<(), FrameError> {
    encode_json(out, kind::VARIABLES_REPLY, Some(id), report)
}

/// Appends an Output frame; `bytes` must be at most [`MAX_CHUNK_BYTES`].
pub fn encode_output(out: &mut Vec<u8>, id: u64, stream: OutputStream, bytes: &[u8]) {
    debug_assert!(bytes.len() <= MAX_CHUNK_BYTES);
    begin(out, kind::OUTPUT, 9 + bytes.len()).expect("chunks are small");
    out.extend_from_slice(&id.to_be_bytes());
    out.push(stream as u8);
    out.extend_from_slice(bytes);
}

fn encode_json<T: Serialize>(
    out: &mut Vec<u8>,
    kind: u8,
    id: Option<u64>,
    value: &T,
) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    out.push(kind);
    if let Some(id) = id {
        out.extend_from_slice(&id.to_be_bytes());
    }
    serde_json::to_writer(&mut *out, value).expect("report types serialize");
    let len = (out.len() - start - HEADER_BYTES) as u64;
    if len > MAX_FRAME_BYTES as u64 {
        out.truncate(start);
        return Err(FrameError::TooLarge(len));
    }
    out[start..start + HEADER_BYTES].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// Appends a Ready frame.
pub fn encode_ready(out: &mut Vec<u8>, hello: &WorkerHello) {
    encode_json(out, kind::READY, None, hello).expect("a hello is small");
}

/// Appends a Done frame. Fails (appending nothing) if the report is over the frame limit.
pub fn encode_done(out: &mut Vec<u8>, id: u64, report: &DoneReport) -> Result<(), FrameError> {
    encode_json(out, kind::DONE, Some(id), report)
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

fn malformed(kind: u8, why: impl Into<String>) -> FrameError {
    FrameError::Malformed {
        kind,
        why: why.into(),
    }
}

fn split_u64(kind: u8, body: &[u8]) -> Result<(u64, &[u8]), FrameError> {
    if body.len() < 8 {
        return Err(malformed(kind, "body shorter than its id"));
    }
    let (id, rest) = body.split_at(8);
    Ok((u64::from_be_bytes(id.try_into().expect("8 bytes")), rest))
}

/// Decodes a frame's `kind` + `body` (everything after the length prefix).
pub fn decode(payload: &[u8]) -> Result<Frame<'_>, FrameError> {
    let (&kind, body) = payload.split_first().ok_or(FrameError::Empty)?;
    match kind {
        kind::EXECUTE => {
            let (id, rest) = split_u64(kind, body)?;
            let (timeout_ms, rest) = split_u64(kind, rest)?;
            let (execution_count, code) = split_u64(kind, rest)?;
            let code = std::str::from_utf8(code).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::Execute {
                id,
                timeout_ms,
                execution_count,
                code,
            })
        }
        kind::SHUTDOWN => Ok(Frame::Shutdown),
        kind::VARIABLES => {
            let (id, _) = split_u64(kind, body)?;
            Ok(Frame::Variables { id })
        }
        kind::HEALTH => {
            let (id, _) = split_u64(kind, body)?;
            Ok(Frame::Health { id })
        }
        kind::HEALTH_REPLY => {
            let (id, rest) = split_u64(kind, body)?;
            let health =
                serde_json::from_slice(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::HealthReply { id, health })
        }
        kind::CONTEXT => {
            let (id, rest) = split_u64(kind, body)?;
            let json = std::str::from_utf8(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::Context { id, json })
        }
        kind::EVENT => {
            let (id, rest) = split_u64(kind, body)?;
            let event = serde_json::from_slice(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::Event { id, event })
        }
        kind::APPROVAL_ANSWER => serde_json::from_slice(body)
            .map(Frame::ApprovalAnswer)
            .map_err(|e| malformed(kind, e.to_string())),
        kind::APPROVAL_REQUEST => {
            let (id, rest) = split_u64(kind, body)?;
            let request =
                serde_json::from_slice(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::ApprovalRequest { id, request })
        }
        kind::APPROVAL_ENDED => {
            let (id, rest) = split_u64(kind, body)?;
            let approval_id =
                std::str::from_utf8(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::ApprovalEnded { id, approval_id })
        }
        kind::CHECKPOINT => {
            let (id, rest) = split_u64(kind, body)?;
            let name = std::str::from_utf8(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::Checkpoint { id, name })
        }
        kind::CHECKPOINT_REPLY => {
            let (id, rest) = split_u64(kind, body)?;
            let outcome =
                serde_json::from_slice(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::CheckpointReply { id, outcome })
        }
        kind::VARIABLES_REPLY => {
            let (id, rest) = split_u64(kind, body)?;
            let report =
                serde_json::from_slice(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::VariablesReply { id, report })
        }
        kind::READY => serde_json::from_slice(body)
            .map(Frame::Ready)
            .map_err(|e| malformed(kind, e.to_string())),
        kind::OUTPUT => {
            let (id, rest) = split_u64(kind, body)?;
            let (&stream, bytes) = rest
                .split_first()
                .ok_or_else(|| malformed(kind, "no stream byte"))?;
            let stream = match stream {
                1 => OutputStream::Stdout,
                2 => OutputStream::Stderr,
                s => return Err(malformed(kind, format!("unknown stream {s}"))),
            };
            Ok(Frame::Output { id, stream, bytes })
        }
        kind::DONE => {
            let (id, rest) = split_u64(kind, body)?;
            let report =
                serde_json::from_slice(rest).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::Done {
                id,
                report: Box::new(report),
            })
        }
        other => Err(FrameError::UnknownKind(other)),
    }
}

/// Reads frames from a byte stream: the kernel from the worker's pipe (one `read` after each
/// `poll`, [`FrameReader::fill`] + [`FrameReader::buffered`]), the worker from the kernel's
/// (blocking, [`FrameReader::read_frame`]).
///
/// The header is exactly the default of tokio-util's [`LengthDelimitedCodec`] (a 4-byte
/// big-endian length of what follows), so its decoder splits frames off a [`BytesMut`],
/// used synchronously: each frame comes out as its own `BytesMut` without a copy, and the
/// buffer is reserved for a whole large frame once its header is read. Holds at most one
/// frame plus one read.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    codec: LengthDelimitedCodec,
    /// The length of the frame being received, once its header was read (the codec then
    /// holds the header; `buf` holds the body so far).
    expect: Option<usize>,
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The stream failed.
    #[error("reading frames")]
    Io(#[from] std::io::Error),
    /// The stream does not carry valid frames.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The stream ended inside a frame.
    #[error("the stream ended inside a frame ({0} bytes of it were read)")]
    Truncated(usize),
}

impl<R: std::io::Read> FrameReader<R> {
    /// Frames from `inner`.
    pub fn new(inner: R) -> FrameReader<R> {
        FrameReader {
            inner,
            buf: BytesMut::with_capacity(MAX_CHUNK_BYTES * 2),
            codec: LengthDelimitedCodec::builder()
                .big_endian()
                .length_field_length(HEADER_BYTES)
                .max_frame_length(MAX_FRAME_BYTES as usize)
                .new_codec(),
            expect: None,
        }
    }

    /// The stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Whether nothing read is waiting to be decoded (a `read` is next).
    pub fn is_empty(&self) -> bool {
        self.expect.is_none() && self.buf.is_empty()
    }

    /// The next complete frame's payload (`kind` + `body`) already buffered; no I/O.
    pub fn buffered(&mut self) -> Result<Option<BytesMut>, FrameError> {
        if self.expect.is_none() && self.buf.len() >= HEADER_BYTES {
            // Checked here so that the error says which limit, not the codec's io::Error.
            let len = frame_len(self.buf[..HEADER_BYTES].try_into().expect("4 bytes"))?;
            self.expect = Some(len);
        }
        let frame = self
            .codec
            .decode(&mut self.buf)
            .expect("lengths are checked above");
        if frame.is_some() {
            self.expect = None;
        }
        if self.buf.is_empty() && self.buf.capacity() > 8 * MAX_CHUNK_BYTES {
            // After a large frame, do not keep its buffer for the whole session.
            self.buf = BytesMut::with_capacity(MAX_CHUNK_BYTES * 2);
        }
        Ok(frame)
    }

    /// One `read(2)` into the buffer; returns how many bytes came (0: end of stream).
    pub fn fill(&mut self) -> std::io::Result<usize> {
        // Read at most what the frame being received still needs (but at least a page and at
        // most a few chunks), so that the zeroing below stays proportional to what arrives.
        let missing = self
            .expect
            .map_or(0, |len| len.saturating_sub(self.buf.len()));
        let want = missing.clamp(1024, 8 << 20);
        let start = self.buf.len();
        self.buf.resize(start + want, 0);
        let r = loop {
            match self.inner.read(&mut self.buf[start..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        self.buf.truncate(start + *r.as_ref().unwrap_or(&0));
        r
    }

    /// Blocks until the next frame: `Ok(None)` at a clean end of stream, an error at an end
    /// inside a frame.
    pub fn read_frame(&mut self) -> Result<Option<BytesMut>, ReadError> {
        loop {
            if let Some(f) = self.buffered()? {
                return Ok(Some(f));
            }
            if self.fill()? == 0 {
                return match (self.expect, self.buf.len()) {
                    (None, 0) => Ok(None),
                    (None, n) => Err(ReadError::Truncated(n)),
                    (Some(_), n) => Err(ReadError::Truncated(HEADER_BYTES + n)),
                };
            }
        }
    }

    /// Bytes received but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.buf.len() + self.expect.map_or(0, |_| HEADER_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(frame: &[u8]) -> &[u8] {
        let len = frame_len(frame[..4].try_into().unwrap()).unwrap();
        assert_eq!(len, frame.len() - 4);
        &frame[4..]
    }

    fn report() -> DoneReport {
        let mut report = CellReport::new(crate::Mode::Worker);
        report.result = Some("2".into());
        report.added_vars = vec!["x".into()];
        report.variable_count = 1;
        report.usage = crate::ResourceUsage {
            pid: 7,
            cpu_ms: 0.5,
            peak_rss_kb: 1000,
        };
        DoneReport {
            report,
            cpu_total_ms: 12.0,
            images: vec![Image {
                info: crate::ImageInfo {
                    mime: "image/png".into(),
                    width: 2,
                    height: 1,
                    bytes: 3,
                    source: "result".into(),
                },
                data: "AAAA".into(),
            }],
            capture_ends: [10, 20],
            output_in_capture: true,
            checkpoint: Some(crate::CheckpointHealth {
                auto_execution_count: Some(3),
                last_error: None,
                failing: false,
            }),
        }
    }

    #[test]
    fn round_trips() {
        let mut out = Vec::new();
        encode_execute(&mut out, 9, 1500, 4, "print('é')").unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::Execute {
                id: 9,
                timeout_ms: 1500,
                execution_count: 4,
                code: "print('é')"
            }
        );
        out.clear();
        let event = CellEvent {
            name: "step_start".into(),
            data: crate::EventData::from_json(r#"{"n":1}"#.into()).unwrap(),
            timestamp: "2026-11-23T00:00:00.000Z".into(),
            step: Some("outer".into()),
            offset: 12,
        };
        encode_event(&mut out, 9, &event).unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::Event { id: 9, event }
        );
        out.clear();
        let request = ApprovalRequest {
            approval_id: "4-1".into(),
            message: "go?".into(),
            data: crate::EventData::from_json("{}".into()).unwrap(),
            timeout_s: Some(2.5),
        };
        encode_approval_request(&mut out, 9, &request).unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::ApprovalRequest { id: 9, request }
        );
        out.clear();
        encode_approval_ended(&mut out, 9, "4-1").unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::ApprovalEnded {
                id: 9,
                approval_id: "4-1"
            }
        );
        out.clear();
        let answer = ApprovalAnswer::without_person(
            "4-1",
            crate::ApprovalOutcome::Unavailable,
            "nobody to ask",
        );
        encode_approval_answer(&mut out, &answer).unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::ApprovalAnswer(answer)
        );
        out.clear();
        encode_output(&mut out, 3, OutputStream::Stderr, b"\xffab");
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::Output {
                id: 3,
                stream: OutputStream::Stderr,
                bytes: b"\xffab"
            }
        );
        out.clear();
        encode_done(&mut out, 4, &report()).unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::Done {
                id: 4,
                report: Box::new(report())
            }
        );
        out.clear();
        encode_variables(&mut out, 5);
        assert_eq!(decode(payload(&out)).unwrap(), Frame::Variables { id: 5 });
        out.clear();
        encode_health(&mut out, 8);
        assert_eq!(decode(payload(&out)).unwrap(), Frame::Health { id: 8 });
        out.clear();
        let health = crate::CheckpointHealth {
            auto_execution_count: Some(4),
            last_error: Some(crate::CheckpointFailure {
                execution_count: 5,
                error: "OSError: [Errno 28] No space left on device".into(),
                time: "t".into(),
            }),
            failing: true,
        };
        encode_health_reply(&mut out, 8, &health).unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::HealthReply { id: 8, health }
        );
        out.clear();
        let listing = VariablesReport {
            variables: vec![VariableInfo {
                name: "df".into(),
                kind: "DataFrame".into(),
                module: Some("pandas.core.frame".into()),
                repr: "   a\n0  1".into(),
                len: Some(1),
                shape: Some(vec![1, 1]),
            }],
            error: None,
        };
        encode_variables_reply(&mut out, 5, &listing).unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::VariablesReply {
                id: 5,
                report: listing
            }
        );
        out.clear();
        encode_checkpoint(&mut out, 6, "before-merge");
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::Checkpoint {
                id: 6,
                name: "before-merge"
            }
        );
        out.clear();
        for outcome in [
            CheckpointOutcome::Failed("disk full".into()),
            CheckpointOutcome::Written(crate::CheckpointSummary {
                checkpoint: "auto".into(),
                execution_count: 3,
                saved: vec!["a".into()],
                unsaved: [("g".to_owned(), "a generator".to_owned())].into(),
                ..Default::default()
            }),
        ] {
            encode_checkpoint_reply(&mut out, 6, &outcome).unwrap();
            assert_eq!(
                decode(payload(&out)).unwrap(),
                Frame::CheckpointReply { id: 6, outcome }
            );
            out.clear();
        }
        encode_shutdown(&mut out);
        assert_eq!(out, [0, 0, 0, 1, kind::SHUTDOWN]);
    }

    #[test]
    fn rejects_bad_frames() {
        assert_eq!(frame_len([0, 0, 0, 0]), Err(FrameError::Empty));
        assert_eq!(
            frame_len([0xff, 0xff, 0xff, 0xff]),
            Err(FrameError::TooLarge(u32::MAX as u64))
        );
        assert_eq!(decode(&[0x7f]), Err(FrameError::UnknownKind(0x7f)));
        assert!(matches!(
            decode(&[kind::OUTPUT, 0, 0]),
            Err(FrameError::Malformed { .. })
        ));
        assert!(matches!(
            decode(&[
                kind::EXECUTE,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                1,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                1,
                0xff
            ]),
            Err(FrameError::Malformed { .. })
        ));
    }

    /// Hands out its bytes one at a time.
    struct Trickle<'a>(&'a [u8]);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            match (self.0.split_first(), out.first_mut()) {
                (Some((b, rest)), Some(o)) => {
                    *o = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn reader_splits_frames_arriving_byte_by_byte() {
        let mut stream = Vec::new();
        encode_output(&mut stream, 1, OutputStream::Stdout, &[b'a'; 1000]);
        encode_done(&mut stream, 1, &report()).unwrap();
        encode_shutdown(&mut stream);
        let mut r = FrameReader::new(Trickle(&stream));
        let mut got = Vec::new();
        while let Some(p) = r.read_frame().unwrap() {
            got.push(match decode(&p).unwrap() {
                Frame::Output { bytes, .. } => bytes.len(),
                Frame::Done { report: d, .. } => {
                    assert_eq!(*d, report());
                    0
                }
                Frame::Shutdown => 1,
                other => panic!("{other:?}"),
            });
        }
        assert_eq!(got, [1000, 0, 1]);
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn reader_reports_truncation_and_oversized_frames() {
        let mut stream = Vec::new();
        encode_output(&mut stream, 1, OutputStream::Stdout, b"abc");
        stream.truncate(stream.len() - 1);
        let mut r = FrameReader::new(&stream[..]);
        assert!(matches!(r.read_frame(), Err(ReadError::Truncated(n)) if n == stream.len()));
        let big = (MAX_FRAME_BYTES + 1).to_be_bytes();
        let mut r = FrameReader::new(&big[..]);
        assert!(matches!(
            r.read_frame(),
            Err(ReadError::Frame(FrameError::TooLarge(n))) if n == MAX_FRAME_BYTES as u64 + 1
        ));
        let mut r = FrameReader::new(&[0u8, 0, 0, 0][..]);
        assert!(matches!(
            r.read_frame(),
            Err(ReadError::Frame(FrameError::Empty))
        ));
    }
}
