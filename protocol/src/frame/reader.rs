//! Frames out of a byte stream (the kernel reading its worker's pipe, the worker the kernel's).

use super::{frame_len, FrameError, HEADER_BYTES, MAX_CHUNK_BYTES, MAX_FRAME_BYTES};
use bytes::BytesMut;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

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
