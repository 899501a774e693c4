//! How a frame's fields become bytes and back: one [`Part`] per field type, and the macro
//! that turns the table in `mod.rs` into the kind constants, [`Frame`](super::Frame),
//! [`Frame::encode`](super::Frame::encode) and [`decode`](super::decode).

use super::{FrameError, OutputStream, HEADER_BYTES, MAX_FRAME_BYTES};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::borrow::Cow;

/// One field of a frame body, in the order the table lists them. Fixed-size parts (`u64`, the
/// stream byte) come first; a part that runs to the end of the body (text, bytes, JSON) is the
/// last.
pub trait Part<'a>: Sized {
    /// Appends the field.
    fn put(&self, out: &mut Vec<u8>);
    /// Takes the field off the front of `body`.
    fn take(body: &mut &'a [u8]) -> Result<Self, String>;
}

impl<'a> Part<'a> for u64 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }

    fn take(body: &mut &'a [u8]) -> Result<u64, String> {
        let Some((head, rest)) = body.split_first_chunk::<8>() else {
            return Err(format!("{} bytes where a u64 was expected", body.len()));
        };
        *body = rest;
        Ok(u64::from_be_bytes(*head))
    }
}

impl<'a> Part<'a> for OutputStream {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }

    fn take(body: &mut &'a [u8]) -> Result<OutputStream, String> {
        let Some((&b, rest)) = body.split_first() else {
            return Err("no stream byte".into());
        };
        *body = rest;
        match b {
            1 => Ok(OutputStream::Stdout),
            2 => Ok(OutputStream::Stderr),
            s => Err(format!("unknown stream {s}")),
        }
    }
}

/// The rest of the body, raw.
impl<'a> Part<'a> for &'a [u8] {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }

    fn take(body: &mut &'a [u8]) -> Result<&'a [u8], String> {
        Ok(std::mem::take(body))
    }
}

/// The rest of the body, UTF-8.
impl<'a> Part<'a> for &'a str {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn take(body: &mut &'a [u8]) -> Result<&'a str, String> {
        std::str::from_utf8(std::mem::take(body)).map_err(|e| e.to_string())
    }
}

/// The rest of the body, JSON: borrowed to encode, owned when decoded.
impl<'a, T: Serialize + DeserializeOwned + Clone> Part<'a> for Cow<'a, T> {
    fn put(&self, out: &mut Vec<u8>) {
        serde_json::to_writer(&mut *out, self.as_ref()).expect("frame bodies serialize");
    }

    fn take(body: &mut &'a [u8]) -> Result<Cow<'a, T>, String> {
        serde_json::from_slice(std::mem::take(body))
            .map(Cow::Owned)
            .map_err(|e| e.to_string())
    }
}

/// Appends one frame whose body `put` writes: the length is filled in after, and a frame over
/// [`MAX_FRAME_BYTES`] is taken back out (nothing appended) and refused.
pub(super) fn encode_with(
    out: &mut Vec<u8>,
    kind: u8,
    put: impl FnOnce(&mut Vec<u8>),
) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    out.push(kind);
    put(out);
    let len = (out.len() - start - HEADER_BYTES) as u64;
    if len > MAX_FRAME_BYTES as u64 {
        out.truncate(start);
        return Err(FrameError::TooLarge(len));
    }
    out[start..start + HEADER_BYTES].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// Takes field after field of a kind's body; every byte must be used.
pub(super) struct Fields<'a> {
    pub kind: u8,
    pub body: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn next<P: Part<'a>>(&mut self) -> Result<P, FrameError> {
        P::take(&mut self.body).map_err(|why| malformed(self.kind, why))
    }

    pub fn end(&self) -> Result<(), FrameError> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(malformed(
                self.kind,
                format!("{} bytes after the last field", self.body.len()),
            ))
        }
    }
}

pub(super) fn malformed(kind: u8, why: impl Into<String>) -> FrameError {
    FrameError::Malformed {
        kind,
        why: why.into(),
    }
}

/// Which way a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Kernel → worker.
    ToWorker,
    /// Worker → kernel.
    ToKernel,
}

/// The table: each row is one frame kind, written once. A row is its doc, the kind byte, the
/// constant's name in [`kind`](super::kind), the direction, and the variant of
/// [`Frame`](super::Frame) with its fields in wire order (each field's type is a [`Part`]).
macro_rules! frames {
    ($(
        $(#[doc = $doc:literal])*
        $code:literal $KIND:ident $dir:ident $Variant:ident {
            $( $(#[doc = $fdoc:literal])* $field:ident : $ty:ty ),* $(,)?
        }
    )*) => {
        /// Frame kinds (the `kind` byte).
        pub mod kind {
            $(
                $(#[doc = $doc])*
                pub const $KIND: u8 = $code;
            )*
        }

        /// Every kind: its byte, its name, which way it goes (for docs and checks).
        pub const KINDS: &[(u8, &str, Direction)] = &[
            $( ($code, stringify!($Variant), Direction::$dir), )*
        ];

        /// One frame. Decoded, it borrows text and bytes from the reader's buffer and owns
        /// its JSON parts; to encode, build one from references (`Cow::Borrowed`).
        // A frame lives from its decode to its match (or its encode): its size is no cost.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, PartialEq)]
        pub enum Frame<'a> {
            $(
                $(#[doc = $doc])*
                $Variant {
                    $( $(#[doc = $fdoc])* $field: $ty, )*
                },
            )*
        }

        impl Frame<'_> {
            /// Its kind byte.
            pub fn kind(&self) -> u8 {
                match self {
                    $( Frame::$Variant { .. } => $code, )*
                }
            }

            /// Appends it, length prefix first. Fails (appending nothing) when it is over
            /// [`MAX_FRAME_BYTES`].
            pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
                match self {
                    $(
                        Frame::$Variant { $( $field, )* } => {
                            codec::encode_with(out, $code, |_out| {
                                $( codec::Part::put($field, _out); )*
                            })
                        }
                    )*
                }
            }
        }

        /// Decodes a frame's `kind` + `body` (everything after the length prefix).
        pub fn decode(payload: &[u8]) -> Result<Frame<'_>, FrameError> {
            let (&kind, body) = payload.split_first().ok_or(FrameError::Empty)?;
            #[allow(unused_mut)]
            let mut _fields = codec::Fields { kind, body };
            let frame = match kind {
                $(
                    $code => Frame::$Variant {
                        $( $field: _fields.next()?, )*
                    },
                )*
                other => return Err(FrameError::UnknownKind(other)),
            };
            _fields.end()?;
            Ok(frame)
        }
    };
}

pub(super) use frames;
