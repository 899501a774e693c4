//! Output that the budget cut from a tool result, kept for `read_output`.
//!
//! Only cut streams are kept (a stream that fit was returned whole), oldest cells forgotten
//! first once the total passes the limit (`FLOWREPL_MCP_KEEP_OUTPUT_MB`). Offsets and lengths
//! count characters (Unicode scalar values), as the budget does; pure-ASCII text, the usual
//! case, is sliced without a scan.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// Locks a shared store (a panic elsewhere leaves it usable: it holds only text).
pub fn locked(store: &Mutex<OutputStore>) -> MutexGuard<'_, OutputStore> {
    store.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which part of a cell's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamName {
    /// What the cell printed (fd 1).
    Stdout,
    /// fd 2, with the traceback when the cell raised.
    Stderr,
    /// The `repr` of the final expression's value.
    Result,
}

impl StreamName {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
            StreamName::Result => "result",
        }
    }
}

#[derive(Debug)]
struct Entry {
    cell: u64,
    stream: StreamName,
    text: String,
    chars: usize,
}

/// One page of kept output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Page {
    /// The cell.
    pub execution_count: u64,
    /// The stream.
    pub stream: StreamName,
    /// First character returned.
    pub offset: usize,
    /// Characters returned.
    pub length: usize,
    /// Characters in the whole stream.
    pub total_chars: usize,
    /// Where the next page starts; null at the end.
    pub next_offset: Option<usize>,
    /// The characters.
    pub text: String,
}

/// Why a page cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    /// No such cell yet.
    #[error("there is no cell {cell} yet (cells so far: {last})")]
    NoSuchCell {
        /// Asked for.
        cell: u64,
        /// The latest cell.
        last: u64,
    },
    /// Not kept: returned whole, or forgotten.
    #[error("the {stream} of cell {cell} is not held: only output that was cut (and figures past the image limit) is kept, and only the most recent {limit_mb} MiB of it (a stream that fit was returned whole; every cell's full output is in the task log)")]
    NotHeld {
        /// Asked for.
        cell: u64,
        /// Asked for.
        stream: String,
        /// The store's size.
        limit_mb: usize,
    },
    /// Offset past the end.
    #[error("offset {offset} is past the end: the {stream} of cell {cell} has {total} characters")]
    PastEnd {
        /// Asked for.
        cell: u64,
        /// Asked for.
        stream: &'static str,
        /// Asked for.
        offset: usize,
        /// Its length.
        total: usize,
    },
}

/// A figure past the image limit: its place and its PNG, base64.
#[derive(Debug)]
struct Figure {
    cell: u64,
    n: usize,
    data: String,
}

/// The kept output.
#[derive(Debug)]
pub struct OutputStore {
    entries: VecDeque<Entry>,
    figures: VecDeque<Figure>,
    bytes: usize,
    limit: usize,
    last_cell: u64,
}

impl OutputStore {
    /// A store holding at most `limit_bytes` of text.
    pub fn new(limit_bytes: usize) -> OutputStore {
        OutputStore {
            entries: VecDeque::new(),
            figures: VecDeque::new(),
            bytes: 0,
            limit: limit_bytes,
            last_cell: 0,
        }
    }

    /// Notes that `cell` ran (so that asking for a later one says "no such cell").
    pub fn saw_cell(&mut self, cell: u64) {
        self.last_cell = self.last_cell.max(cell);
    }

    /// Keeps a cut stream of `chars` characters, forgetting the oldest to stay in the limit.
    /// A text larger than the whole limit is not kept.
    pub fn insert(&mut self, cell: u64, stream: StreamName, text: String, chars: usize) {
        self.saw_cell(cell);
        if text.len() > self.limit {
            return;
        }
        self.bytes += text.len();
        self.entries.push_back(Entry {
            cell,
            stream,
            text,
            chars,
        });
        self.forget_oldest();
    }

    /// Forgets the oldest cells' output until the total is within the limit.
    fn forget_oldest(&mut self) {
        while self.bytes > self.limit {
            let text = self.entries.front().map(|e| e.cell);
            let figure = self.figures.front().map(|f| f.cell);
            let forgot = match (text, figure) {
                (Some(t), Some(f)) if f < t => self.figures.pop_front().map(|f| f.data.len()),
                (Some(_), _) => self.entries.pop_front().map(|e| e.text.len()),
                (None, Some(_)) => self.figures.pop_front().map(|f| f.data.len()),
                (None, None) => None,
            };
            match forgot {
                Some(n) => self.bytes -= n,
                None => break,
            }
        }
    }

    /// Keeps figure `n` of `cell` (a PNG, base64), past the image limit.
    pub fn insert_figure(&mut self, cell: u64, n: usize, data: String) {
        self.saw_cell(cell);
        if data.len() > self.limit {
            return;
        }
        self.bytes += data.len();
        self.figures.push_back(Figure { cell, n, data });
        self.forget_oldest();
    }

    /// Figure `n` of `cell` (a PNG, base64).
    pub fn figure(&self, cell: u64, n: usize) -> Result<&str, ReadError> {
        self.known(cell)?;
        self.figures
            .iter()
            .find(|f| f.cell == cell && f.n == n)
            .map(|f| f.data.as_str())
            .ok_or(ReadError::NotHeld {
                cell,
                stream: format!("figure {n}"),
                limit_mb: self.limit >> 20,
            })
    }

    /// The whole of a kept stream.
    pub fn whole(&self, cell: u64, stream: StreamName) -> Result<&str, ReadError> {
        self.known(cell)?;
        self.entries
            .iter()
            .rev()
            .find(|e| e.cell == cell && e.stream == stream)
            .map(|e| e.text.as_str())
            .ok_or(ReadError::NotHeld {
                cell,
                stream: stream.as_str().to_owned(),
                limit_mb: self.limit >> 20,
            })
    }

    fn known(&self, cell: u64) -> Result<(), ReadError> {
        if cell == 0 || cell > self.last_cell {
            return Err(ReadError::NoSuchCell {
                cell,
                last: self.last_cell,
            });
        }
        Ok(())
    }

    /// Characters `[offset, offset + length)` of a kept stream.
    pub fn read(
        &self,
        cell: u64,
        stream: StreamName,
        offset: usize,
        length: usize,
    ) -> Result<Page, ReadError> {
        self.known(cell)?;
        let e = self
            .entries
            .iter()
            .rev()
            .find(|e| e.cell == cell && e.stream == stream)
            .ok_or(ReadError::NotHeld {
                cell,
                stream: stream.as_str().to_owned(),
                limit_mb: self.limit >> 20,
            })?;
        if offset > e.chars || (offset == e.chars && e.chars > 0) {
            return Err(ReadError::PastEnd {
                cell,
                stream: stream.as_str(),
                offset,
                total: e.chars,
            });
        }
        let end = offset.saturating_add(length).min(e.chars);
        let text = char_slice(&e.text, e.chars, offset, end);
        Ok(Page {
            execution_count: cell,
            stream,
            offset,
            length: end - offset,
            total_chars: e.chars,
            next_offset: (end < e.chars).then_some(end),
            text: text.to_owned(),
        })
    }
}

/// Characters `[from, to)` of `s`, which has `chars` characters.
pub fn char_slice(s: &str, chars: usize, from: usize, to: usize) -> &str {
    if chars == s.len() {
        return &s[from..to];
    }
    let byte = |n: usize| s.char_indices().nth(n).map_or(s.len(), |(i, _)| i);
    let start = byte(from);
    let end = start
        + s[start..]
            .char_indices()
            .nth(to - from)
            .map_or(s.len() - start, |(i, _)| i);
    &s[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_through_ascii_and_unicode() {
        let mut st = OutputStore::new(1 << 20);
        st.insert(2, StreamName::Stdout, "abcdef".into(), 6);
        st.insert(3, StreamName::Stderr, "αβγδ".into(), 4);
        let p = st.read(2, StreamName::Stdout, 2, 3).unwrap();
        assert_eq!((p.text.as_str(), p.next_offset), ("cde", Some(5)));
        let p = st.read(2, StreamName::Stdout, 5, 100).unwrap();
        assert_eq!((p.text.as_str(), p.next_offset, p.length), ("f", None, 1));
        let p = st.read(3, StreamName::Stderr, 1, 2).unwrap();
        assert_eq!(p.text, "βγ");
        assert!(matches!(
            st.read(2, StreamName::Stdout, 6, 1),
            Err(ReadError::PastEnd { total: 6, .. })
        ));
        assert!(matches!(
            st.read(2, StreamName::Stderr, 0, 1),
            Err(ReadError::NotHeld { .. })
        ));
        assert!(matches!(
            st.read(9, StreamName::Stdout, 0, 1),
            Err(ReadError::NoSuchCell { last: 3, .. })
        ));
    }

    #[test]
    fn forgets_oldest_first() {
        let mut st = OutputStore::new(10);
        st.insert(1, StreamName::Stdout, "12345678".into(), 8);
        st.insert(2, StreamName::Stdout, "abcd".into(), 4);
        assert!(st.read(1, StreamName::Stdout, 0, 1).is_err());
        assert_eq!(st.read(2, StreamName::Stdout, 0, 9).unwrap().text, "abcd");
        st.insert(3, StreamName::Stdout, "x".repeat(11), 11);
        assert!(st.read(3, StreamName::Stdout, 0, 1).is_err());
        assert_eq!(st.read(2, StreamName::Stdout, 0, 9).unwrap().text, "abcd");
    }
}
