//! The latest output of a running cell, for progress reports (MCP `notifications/progress`).
//!
//! In-process, [`crate::monitor::Interrupter::output_tail`] reads the end of the capture files; in
//! worker mode the kernel keeps one from the Output frames it receives. Either way the reader
//! compares byte counts between two looks to tell which stream moved.

/// How many bytes at the end of a stream are searched for its last line.
pub const TAIL_BYTES: usize = 1024;
/// Longest line reported, in characters (longer lines keep their end).
pub const MAX_LINE_CHARS: usize = 160;

/// What a running cell has written so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputTail {
    /// Bytes written to stdout and stderr by the cell so far.
    pub bytes: [u64; 2],
    /// The last non-blank line of each stream (`\n` or `\r` ends a line, so progress bars
    /// report their latest state), if any.
    pub last_line: [Option<String>; 2],
    /// The end of each stream, when asked for (`recent` bytes; invalid UTF-8, including a
    /// sequence cut by the window, is replaced).
    pub recent: [String; 2],
}

impl OutputTail {
    /// The line to show after a look that followed `previous`: from the stream that moved
    /// since (stderr wins a tie, where progress bars write), else the latest of either.
    pub fn latest_line(&self, previous: &OutputTail) -> Option<&str> {
        let moved = |i: usize| self.bytes[i] > previous.bytes[i];
        let pick = if moved(1) || (!moved(0) && self.last_line[0].is_none()) {
            1
        } else {
            0
        };
        self.last_line[pick].as_deref()
    }
}

/// Reads stream `i` of a running cell into `tail`: the capture file `fd`, where the cell's
/// output starts at `start`; its last line, and its last `recent` bytes when asked.
pub fn read_stream(
    tail: &mut OutputTail,
    i: usize,
    fd: std::os::fd::BorrowedFd<'_>,
    start: u64,
    recent: usize,
) {
    use crate::capture::{file_size, pread_into};
    let Ok(size) = file_size(fd) else { return };
    tail.bytes[i] = size.saturating_sub(start);
    let window = TAIL_BYTES.max(recent) as u64;
    let from = size.saturating_sub(window).max(start);
    let mut buf = vec![0u8; (size - from) as usize];
    let Ok(n) = pread_into(fd, &mut buf, from) else {
        return;
    };
    buf.truncate(n);
    tail.last_line[i] = last_line(&buf[buf.len().saturating_sub(TAIL_BYTES)..]);
    if recent > 0 {
        tail.recent[i] =
            String::from_utf8_lossy(&buf[buf.len().saturating_sub(recent)..]).into_owned();
    }
}

/// The last non-blank line in `bytes` (the end of a stream), cut to [`MAX_LINE_CHARS`].
/// Invalid UTF-8 (including a sequence cut by the window) is replaced.
pub fn last_line(bytes: &[u8]) -> Option<String> {
    let line = bytes
        .split(|&b| b == b'\n' || b == b'\r')
        .rev()
        .find(|l| l.iter().any(|b| !b.is_ascii_whitespace()))?;
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    let count = text.chars().count();
    Some(if count <= MAX_LINE_CHARS {
        text.to_owned()
    } else {
        let start = text
            .char_indices()
            .nth(count - (MAX_LINE_CHARS - 1))
            .map_or(0, |(i, _)| i);
        format!("…{}", &text[start..])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_line_skips_blank_and_reads_carriage_returns() {
        assert_eq!(last_line(b""), None);
        assert_eq!(last_line(b"\n \n"), None);
        assert_eq!(last_line(b"a\nb\n\n").as_deref(), Some("b"));
        assert_eq!(last_line(b"step 1\rstep 2\r").as_deref(), Some("step 2"));
        assert_eq!(last_line(b"x\n  partial").as_deref(), Some("partial"));
        let long = "é".repeat(500);
        let got = last_line(long.as_bytes()).unwrap();
        assert_eq!(got.chars().count(), MAX_LINE_CHARS);
        assert!(got.starts_with('…'));
    }

    #[test]
    fn latest_line_follows_the_stream_that_moved() {
        let before = OutputTail {
            bytes: [10, 5],
            last_line: [Some("out".into()), Some("err".into())],
            ..OutputTail::default()
        };
        let mut now = before.clone();
        assert_eq!(now.latest_line(&before), Some("out"));
        now.bytes[1] = 6;
        assert_eq!(now.latest_line(&before), Some("err"));
        now.bytes = [11, 5];
        assert_eq!(now.latest_line(&before), Some("out"));
    }

    #[test]
    fn read_stream_reads_the_cell_s_part_and_its_end() {
        use std::io::Write as _;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"an earlier cell\nline 1\nline 2\n").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&f);
        let mut tail = OutputTail::default();
        read_stream(&mut tail, 0, fd, 16, 0);
        assert_eq!(tail.bytes[0], 14);
        assert_eq!(tail.last_line[0].as_deref(), Some("line 2"));
        assert_eq!(tail.recent[0], "");
        read_stream(&mut tail, 1, fd, 16, 8);
        assert_eq!(tail.recent[1], "\nline 2\n");
        read_stream(&mut tail, 1, fd, 16, 1000);
        assert_eq!(
            tail.recent[1], "line 1\nline 2\n",
            "never before the cell's start"
        );
    }
}
