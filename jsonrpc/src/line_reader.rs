//! Reading request lines of any length without trusting them.
//!
//! Lines up to `max` bytes are returned whole (a 50 MB cell is fine). A longer line is read
//! to its end and discarded but for its head, where a client writes the request's `id`
//! ([`OversizedLine`], which the MCP transport keeps and answers the same way), and reported
//! as [`Line::TooLong`], so the next line is read normally. A final line without `\n` still
//! counts.
//!
//! The reader is incremental: [`LineReader::buffered_line`] hands out a complete line from
//! what has already been read, without I/O, and [`LineReader::fill`] does one `read(2)`.
//! A partial line stays buffered across calls, so two threads can take turns (the request
//! thread blocks in [`LineReader::next_line`] while idle; the busy-time watcher takes lines
//! only after `poll(2)` said data is there).

use flowrepl_protocol::jsonrpc::OversizedLine;
#[cfg(test)]
use flowrepl_protocol::jsonrpc::ID_SEARCH_BYTES;
use memchr::memchr;
use std::io::{self, Read};

/// Buffers larger than this are released after use.
const KEEP_CAPACITY: usize = 8 << 20;
const READ_CHUNK: usize = 64 << 10;

/// One read.
#[derive(Debug, PartialEq)]
pub enum Line<'a> {
    /// A complete line, without its `\n`.
    Complete(&'a [u8]),
    /// A line longer than the limit: its length, and its head (the rest was discarded).
    TooLong(&'a OversizedLine),
    /// End of input.
    Eof,
}

/// A bounded, incremental line reader.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    /// Bytes read but not yet consumed: `buf[start..end]`. `buf` is zeroed once, when it
    /// grows, never per read.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The line being assembled across reads (only when it spans more than `buf`).
    line: Vec<u8>,
    /// Length of the current line so far (including discarded bytes).
    len: u64,
    too_long: bool,
    /// The line over the limit being read (while `too_long`).
    over: OversizedLine,
    eof: bool,
    /// The line last handed out lives in `line` (true) or at `buf[out..out_end]`.
    out: (usize, usize),
    out_in_line: bool,
    max: usize,
}

impl<R: Read> LineReader<R> {
    /// Whether nothing read is waiting to be handed out (a `read` is next).
    pub fn is_empty(&self) -> bool {
        self.start == self.end && self.line.is_empty() && !self.eof
    }

    /// Reads lines of at most `max` bytes from `inner`.
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            line: Vec::new(),
            len: 0,
            too_long: false,
            over: OversizedLine::default(),
            eof: false,
            out: (0, 0),
            out_in_line: false,
            max,
        }
    }

    /// The next line, reading (and blocking) as needed.
    pub fn next_line(&mut self) -> io::Result<Line<'_>> {
        loop {
            if self.take_buffered()? {
                return Ok(self.last());
            }
            if self.fill()? == 0 && self.eof {
                return Ok(self.finish_at_eof());
            }
        }
    }

    /// A complete line from what is already buffered, without I/O; `None` if there is none
    /// yet (and not at EOF).
    pub fn buffered_line(&mut self) -> io::Result<Option<Line<'_>>> {
        if self.take_buffered()? {
            return Ok(Some(self.last()));
        }
        if self.eof {
            return Ok(Some(self.finish_at_eof()));
        }
        Ok(None)
    }

    /// One `read(2)` into the buffer; returns the bytes read (0 at EOF).
    pub fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_CHUNK / 2 {
            self.buf.resize(self.buf.len() + READ_CHUNK, 0);
        }
        let n = loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        self.end += n;
        if n == 0 {
            self.eof = true;
        }
        Ok(n)
    }

    /// Moves buffered bytes into the current line; true when a line is complete.
    fn take_buffered(&mut self) -> io::Result<bool> {
        if self.out_in_line {
            // The previous line was handed out from `line`: start afresh.
            self.out_in_line = false;
            if self.line.capacity() > KEEP_CAPACITY {
                self.line = Vec::new();
            }
            self.line.clear();
        }
        let avail = &self.buf[self.start..self.end];
        if avail.is_empty() {
            return Ok(false);
        }
        let (chunk_len, done) = match memchr(b'\n', avail) {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        self.len += chunk_len as u64;
        let from = self.start;
        self.start += chunk_len + usize::from(done);
        let chunk = &self.buf[from..from + chunk_len];
        if self.too_long {
            self.over.push(chunk);
        } else {
            if self.line.len() + chunk_len > self.max {
                self.too_long = true;
                // Keep only the head, where the id is.
                self.over = OversizedLine::new(&self.line);
                self.over.push(chunk);
                self.line.clear();
            } else if done && self.line.is_empty() {
                // The whole line is in `buf`: hand it out from there, no copy.
                self.out = (from, from + chunk_len);
                self.out_in_line = false;
                return Ok(true);
            } else {
                self.line.extend_from_slice(chunk);
            }
        }
        if done {
            self.out_in_line = true;
        }
        Ok(done)
    }

    /// The line just completed.
    fn last(&mut self) -> Line<'_> {
        self.len = 0;
        if std::mem::take(&mut self.too_long) {
            self.out_in_line = true;
            return Line::TooLong(&self.over);
        }
        if self.out_in_line {
            Line::Complete(&self.line)
        } else {
            Line::Complete(&self.buf[self.out.0..self.out.1])
        }
    }

    fn finish_at_eof(&mut self) -> Line<'_> {
        if self.len > 0 || self.too_long || !self.line.is_empty() {
            self.out_in_line = true;
            return self.last();
        }
        Line::Eof
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
        assert_eq!(
            r.next_line().unwrap(),
            Line::TooLong(&OversizedLine {
                len: 12,
                head: b"bbbbbbbbbbbb".to_vec()
            })
        );
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"ccc"));
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"last"));
        assert_eq!(r.next_line().unwrap(), Line::Eof);
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
        match r.next_line().unwrap() {
            Line::TooLong(over) => {
                assert_eq!(over.len, 200_000);
                assert_eq!(over.head, &input[..ID_SEARCH_BYTES]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.next_line().unwrap(), Line::Complete(b"ok"));
        assert_eq!(r.next_line().unwrap(), Line::Eof);
    }

    /// A reader that returns its input in small pieces, like a pipe written slowly.
    struct Trickle<'a>(&'a [u8], usize);
    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(self.0.len()).min(out.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn partial_lines_survive_between_calls() {
        let input = b"{\"a\":1}\n{\"b\":2}\npartial-then-more\n";
        let mut r = LineReader::new(Trickle(input, 3), 100);
        let mut got = Vec::new();
        loop {
            match r.buffered_line().unwrap() {
                Some(Line::Complete(l)) => got.push(String::from_utf8(l.to_vec()).unwrap()),
                Some(Line::Eof) => break,
                Some(other) => panic!("{other:?}"),
                None => {
                    r.fill().unwrap();
                }
            }
        }
        assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "partial-then-more"]);
    }
}
