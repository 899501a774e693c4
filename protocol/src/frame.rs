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
//! | `0x01` Execute | kernel → worker | `id: u64`, `timeout_ms: u64`, the cell's UTF-8 source |
//! | `0x02` Shutdown | kernel → worker | empty: exit after the current cell |
//! | `0x03` Variables | kernel → worker | `id: u64`: list the namespace (between cells) |
//! | `0x81` Ready | worker → kernel | JSON [`WorkerHello`]: sent once, when Python is up |
//! | `0x82` Output | worker → kernel | `id: u64`, `stream: u8` (1 stdout, 2 stderr), up to [`MAX_CHUNK_BYTES`] of output |
//! | `0x83` Done | worker → kernel | `id: u64`, JSON [`DoneReport`]: the cell's result without its output |
//! | `0x84` VariablesReply | worker → kernel | `id: u64`, JSON [`VariablesReport`] |
//!
//! A cell's output arrives as Output frames while it runs (the worker reads its capture
//! files every monitor tick, 50 ms) and after it ends, in order, then exactly one Done frame
//! with the same id. Output chunks are raw bytes, cut anywhere (even inside a UTF-8
//! sequence): the receiver decodes a stream's concatenated chunks. Interrupts are not frames:
//! the kernel sends SIGINT to the worker process, whose main thread (the only one that does
//! not block SIGINT) runs the cell.

use crate::execute::{CellReport, Image, VariableInfo};
use serde::{Deserialize, Serialize};

/// Largest frame accepted, in bytes (`length` field): a cell's source can be as large as the
/// largest request line.
pub const MAX_FRAME_BYTES: u32 = 512 << 20;
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
    /// Worker → kernel: started.
    pub const READY: u8 = 0x81;
    /// Worker → kernel: output of the running cell.
    pub const OUTPUT: u8 = 0x82;
    /// Worker → kernel: the cell ended.
    pub const DONE: u8 = 0x83;
    /// Worker → kernel: the namespace listing.
    pub const VARIABLES_REPLY: u8 = 0x84;
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
    /// The namespace listing asked for by Variables `id`.
    VariablesReply {
        /// The request.
        id: u64,
        /// The listing.
        report: VariablesReport,
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
    code: &str,
) -> Result<(), FrameError> {
    begin(out, kind::EXECUTE, 16 + code.len())?;
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&timeout_ms.to_be_bytes());
    out.extend_from_slice(code.as_bytes());
    Ok(())
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
            let (timeout_ms, code) = split_u64(kind, rest)?;
            let code = std::str::from_utf8(code).map_err(|e| malformed(kind, e.to_string()))?;
            Ok(Frame::Execute {
                id,
                timeout_ms,
                code,
            })
        }
        kind::SHUTDOWN => Ok(Frame::Shutdown),
        kind::VARIABLES => {
            let (id, _) = split_u64(kind, body)?;
            Ok(Frame::Variables { id })
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

/// Splits frames off a byte stream that arrives in pieces (the kernel reads the worker's pipe
/// without blocking, between polls). Holds at most one frame plus one read.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
    start: usize,
}

impl FrameBuffer {
    /// An empty buffer.
    pub fn new() -> FrameBuffer {
        FrameBuffer {
            buf: Vec::with_capacity(MAX_CHUNK_BYTES * 2),
            start: 0,
        }
    }

    /// Room to read into: at least `min` bytes of spare capacity after what is buffered.
    /// Call [`FrameBuffer::filled`] with how many bytes were written into it.
    pub fn spare(&mut self, min: usize) -> &mut [std::mem::MaybeUninit<u8>] {
        if self.start > 0 && (self.start == self.buf.len() || self.start >= self.buf.len() / 2) {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(min);
        self.buf.spare_capacity_mut()
    }

    /// `n` bytes were written into [`FrameBuffer::spare`].
    ///
    /// # Safety
    /// The first `n` bytes of the spare capacity must have been initialised.
    pub unsafe fn filled(&mut self, n: usize) {
        // SAFETY: per this function's contract.
        unsafe { self.buf.set_len(self.buf.len() + n) };
    }

    /// The next complete frame's payload (`kind` + `body`), if one is buffered.
    pub fn next_payload(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let avail = &self.buf[self.start..];
        if avail.len() < HEADER_BYTES {
            return Ok(None);
        }
        let len = frame_len(avail[..HEADER_BYTES].try_into().expect("4 bytes"))?;
        if avail.len() < HEADER_BYTES + len {
            // Make room for the whole frame once, not read by read.
            self.buf.reserve(HEADER_BYTES + len - avail.len());
            return Ok(None);
        }
        let from = self.start + HEADER_BYTES;
        self.start = from + len;
        Ok(Some(&self.buf[from..from + len]))
    }

    /// Bytes buffered but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Drops everything (after the worker died).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.start = 0;
        if self.buf.capacity() > 8 * MAX_CHUNK_BYTES {
            self.buf = Vec::with_capacity(MAX_CHUNK_BYTES * 2);
        }
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
        }
    }

    #[test]
    fn round_trips() {
        let mut out = Vec::new();
        encode_execute(&mut out, 9, 1500, "print('é')").unwrap();
        assert_eq!(
            decode(payload(&out)).unwrap(),
            Frame::Execute {
                id: 9,
                timeout_ms: 1500,
                code: "print('é')"
            }
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

    #[test]
    fn buffer_splits_frames_arriving_byte_by_byte() {
        let mut stream = Vec::new();
        encode_output(&mut stream, 1, OutputStream::Stdout, &[b'a'; 1000]);
        encode_done(&mut stream, 1, &report()).unwrap();
        let mut fb = FrameBuffer::new();
        let mut got = Vec::new();
        for &b in &stream {
            let spare = fb.spare(1);
            spare[0].write(b);
            // SAFETY: one byte written above.
            unsafe { fb.filled(1) };
            while let Some(p) = fb.next_payload().unwrap() {
                got.push(match decode(p).unwrap() {
                    Frame::Output { bytes, .. } => bytes.len(),
                    Frame::Done { .. } => 0,
                    other => panic!("{other:?}"),
                });
            }
        }
        assert_eq!(got, [1000, 0]);
        assert_eq!(fb.pending(), 0);
    }
}
