//! Lines of at most a given length from an async reader, as the MCP front reads its client and
//! `serve` reads its kernels: a line over the limit is read to its end without being stored
//! (only its length and head, [`OversizedLine`], so that its `id` can still be answered), and
//! memory stays bounded by the limit however long the line.

use flowrepl_protocol::jsonrpc::OversizedLine;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// One line read.
#[derive(Debug)]
pub enum Line {
    /// A whole line within the limit, without its `\n`.
    Whole(Vec<u8>),
    /// A line over the limit: its length and head.
    Over(OversizedLine),
}

/// Bounded lines from `R`. Cancel-safe: a line being read when [`BoundedLines::next`] is
/// cancelled (rmcp polls its transport inside `select!`) is kept for the next call.
pub struct BoundedLines<R> {
    read: BufReader<R>,
    line: Vec<u8>,
    over: Option<OversizedLine>,
    max: usize,
}

impl<R: AsyncRead + Unpin> BoundedLines<R> {
    /// Lines of at most `max` bytes (without the `\n`).
    pub fn new(read: R, max: usize) -> Self {
        BoundedLines {
            read: BufReader::with_capacity(256 << 10, read),
            line: Vec::new(),
            over: None,
            max,
        }
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The next line; `None` at the end of the input.
    pub async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(None);
            }
            let newline = memchr::memchr(b'\n', available);
            let take = newline.map_or(available.len(), |i| i + 1);
            let content = &available[..newline.unwrap_or(available.len())];
            if let Some(over) = &mut self.over {
                over.push(content);
            } else if self.line.len() + content.len() > self.max {
                // Drops the buffered part (memory stays bounded by the limit).
                let mut over = OversizedLine::new(&std::mem::take(&mut self.line));
                over.push(content);
                self.over = Some(over);
            } else {
                self.line.extend_from_slice(content);
            }
            self.read.consume(take);
            if newline.is_some() {
                return Ok(Some(match self.over.take() {
                    Some(over) => Line::Over(over),
                    None => Line::Whole(std::mem::take(&mut self.line)),
                }));
            }
        }
    }

    /// Gives back a line's buffer for the next line (a big one is dropped).
    pub fn recycle(&mut self, mut line: Vec<u8>) {
        if line.capacity() <= (1 << 20) && self.line.is_empty() {
            line.clear();
            self.line = line;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_over_the_limit_keep_only_their_length_and_head() {
        let input = format!("short\n{}\nafter\nno newline", "x".repeat(100));
        let mut lines = BoundedLines::new(input.as_bytes(), 10);
        assert!(matches!(lines.next().await.unwrap(), Some(Line::Whole(l)) if l == b"short"));
        match lines.next().await.unwrap() {
            Some(Line::Over(o)) => assert_eq!(o.len, 100),
            other => panic!("{other:?}"),
        }
        assert!(matches!(lines.next().await.unwrap(), Some(Line::Whole(l)) if l == b"after"));
        // A last line without its newline is not a line.
        assert!(lines.next().await.unwrap().is_none());
    }
}
