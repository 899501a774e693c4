//! Reading request lines of any length without trusting them.
//!
//! Lines up to `max` bytes are returned whole (a 50 MB cell is fine). A longer line is read
//! to its end and discarded without being stored, and reported as [`Line::TooLong`], so the
//! next line is read normally. A final line without `\n` still counts.

use memchr::memchr;
use std::io::{self, BufRead, BufReader, Read};

/// Buffers larger than this are released after use.
const KEEP_CAPACITY: usize = 8 << 20;

/// One read.
#[derive(Debug, PartialEq)]
pub enum Line<'a> {
    /// A complete line, without its `\n`.
    Complete(&'a [u8]),
    /// A line longer than the limit; it was discarded.
    TooLong {
        /// Its length in bytes.
        len: u64,
    },
    /// End of input.
    Eof,
}

/// A bounded line reader.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
    max: usize,
}

impl<R: Read> LineReader<R> {
    /// Reads lines of at most `max` bytes from `inner`.
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner: BufReader::with_capacity(64 << 10, inner),
            line: Vec::new(),
            max,
        }
    }

    /// The next line.
    pub fn next_line(&mut self) -> io::Result<Line<'_>> {
        if self.line.capacity() > KEEP_CAPACITY {
            self.line = Vec::new();
        }
        self.line.clear();
        let mut len: u64 = 0;
        let mut too_long = false;
        loop {
            let available = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                return Ok(if too_long {
                    Line::TooLong { len }
                } else if len > 0 {
                    Line::Complete(&self.line)
                } else {
                    Line::Eof
                });
            }
            let (chunk, done) = match memchr(b'\n', available) {
                Some(i) => (&available[..i], true),
                None => (available, false),
            };
            len += chunk.len() as u64;
            if !too_long {
                if self.line.len() + chunk.len() > self.max {
                    too_long = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(chunk);
                }
            }
            let used = chunk.len() + usize::from(done);
            self.inner.consume(used);
            if done {
                return Ok(if too_long {
                    Line::TooLong { len }
                } else {
                    Line::Complete(&self.line)
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_bounds() {
        let input = b"a\n\nbbbbbbbbbbbb\nccc\nlast".to_vec();
        let mut r = LineReader::new(&input[..], 5);
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"a"));
        assert_eq!(r.next_line().unwrap(), Line::Complete(b""));
        assert_eq!(r.next_line().unwrap(), Line::TooLong { len: 12 });
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"ccc"));
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"last"));
        assert_eq!(r.next_line().unwrap(), Line::Eof);
    }

    #[test]
    fn long_lines_across_buffer_refills() {
        let mut input = vec![b'x'; 200_000];
        input.push(b'\n');
        input.extend_from_slice(b"ok\n");
        let mut r = LineReader::new(&input[..], 1 << 20);
        match r.next_line().unwrap() {
            Line::Complete(l) => assert_eq!(l.len(), 200_000),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"ok"));
        let mut r = LineReader::new(&input[..], 1000);
        assert_eq!(r.next_line().unwrap(), Line::TooLong { len: 200_000 });
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"ok"));
    }
}
