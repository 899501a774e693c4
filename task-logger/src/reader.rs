//! Reading a task log back, tolerating what a crash or a full disk can leave behind.
//!
//! Execution and event records are returned; lines that are not JSON, not records of a known
//! type, or from a newer format version are skipped and reported, never fatal; a last line
//! without `\n` (a write in progress) is skipped too.

use crate::record::{
    ContextRecord, EgressRecord, EventRecord, ExecutionRecord, FileRecord, InstallRecord,
    SessionRecord, FORMAT_VERSION, RECORD_TYPE_CONTEXT, RECORD_TYPE_EGRESS, RECORD_TYPE_EVENT,
    RECORD_TYPE_EXECUTION, RECORD_TYPE_FILE, RECORD_TYPE_INSTALL, RECORD_TYPE_SESSION,
};
use std::io;
use std::path::Path;

/// A line [`read_records`] did not return as a record.
#[derive(Debug, Clone, PartialEq)]
pub struct SkippedLine {
    /// 1-based line number.
    pub line: usize,
    /// Why it was skipped.
    pub reason: String,
}

/// What [`read_records`] found.
#[derive(Debug, Default)]
pub struct ReadOutcome {
    /// The execution records, in file order.
    pub records: Vec<ExecutionRecord<'static>>,
    /// The event records, in file order.
    pub events: Vec<EventRecord<'static>>,
    /// The context records, in file order.
    pub contexts: Vec<ContextRecord<'static>>,
    /// The session records, in file order.
    pub sessions: Vec<SessionRecord<'static>>,
    /// The file records, in file order.
    pub files: Vec<FileRecord<'static>>,
    /// The install records, in file order.
    pub installs: Vec<InstallRecord<'static>>,
    /// The egress records, in file order.
    pub egress: Vec<EgressRecord<'static>>,
    /// Lines that were not returned, with the reason.
    pub skipped: Vec<SkippedLine>,
}

/// Reads every execution record of the log at `path`.
pub fn read_records(path: &Path) -> io::Result<ReadOutcome> {
    let bytes = std::fs::read(path)?;
    Ok(parse_records(&bytes))
}

/// One record of a known type, owned.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// `type: "execution"`.
    Execution(Box<ExecutionRecord<'static>>),
    /// `type: "event"`.
    Event(Box<EventRecord<'static>>),
    /// `type: "context"`.
    Context(Box<ContextRecord<'static>>),
    /// `type: "session"`.
    Session(Box<SessionRecord<'static>>),
    /// `type: "file"`.
    File(Box<FileRecord<'static>>),
    /// `type: "install"`.
    Install(Box<InstallRecord<'static>>),
    /// `type: "egress"`.
    Egress(Box<EgressRecord<'static>>),
}

/// Parses one line (without its `\n`): a record, or why it is not one this reader returns
/// (not JSON, an unknown type, a newer format version).
pub fn parse_line(line: &[u8]) -> Result<Record, String> {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
        #[serde(default)]
        version: u32,
    }
    // The type first: one small parse that ignores the rest, then the record of that type.
    let peek: Peek<'_> = serde_json::from_slice(line).map_err(|e| {
        if e.is_eof() {
            format!(
                "torn record: the line ends after {} bytes, inside the record (a write cut short by a full disk or a killed writer)",
                line.len()
            )
        } else {
            format!("not a record: {e}")
        }
    })?;
    if peek.version > FORMAT_VERSION {
        return Err(format!(
            "format version {} is newer than {FORMAT_VERSION}",
            peek.version
        ));
    }
    let bad = |e: serde_json::Error| format!("not a valid {} record: {e}", peek.kind);
    Ok(match &*peek.kind {
        // Cow fields without `borrow` deserialize owned: the record is 'static as read.
        RECORD_TYPE_EXECUTION => Record::Execution(Box::new(
            serde_json::from_slice::<ExecutionRecord<'static>>(line).map_err(bad)?,
        )),
        RECORD_TYPE_EVENT => Record::Event(Box::new(serde_json::from_slice(line).map_err(bad)?)),
        RECORD_TYPE_CONTEXT => {
            Record::Context(Box::new(serde_json::from_slice(line).map_err(bad)?))
        }
        RECORD_TYPE_SESSION => {
            Record::Session(Box::new(serde_json::from_slice(line).map_err(bad)?))
        }
        RECORD_TYPE_FILE => Record::File(Box::new(serde_json::from_slice(line).map_err(bad)?)),
        RECORD_TYPE_INSTALL => {
            Record::Install(Box::new(serde_json::from_slice(line).map_err(bad)?))
        }
        RECORD_TYPE_EGRESS => Record::Egress(Box::new(serde_json::from_slice(line).map_err(bad)?)),
        other => return Err(format!("record type {other:?}")),
    })
}

/// Calls `f(line_number, line)` for every complete line of `reader` (without its `\n`),
/// reading 1 MiB at a time (a line may be longer). Returns the number of a last line that
/// has no `\n` (a write in progress, or a torn write), which `f` does not see.
pub fn for_each_line(
    mut reader: impl std::io::Read,
    mut f: impl FnMut(usize, &[u8]),
) -> io::Result<Option<usize>> {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut start = 0; // where the current line begins in buf
    let mut line_no = 0;
    loop {
        if start > 0 && start * 2 >= buf.len() {
            buf.drain(..start);
            start = 0;
        }
        let len = buf.len();
        buf.resize(len + (1 << 20), 0);
        let n = loop {
            match reader.read(&mut buf[len..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let n = n.inspect_err(|_| buf.truncate(len))?;
        buf.truncate(len + n);
        if n == 0 {
            let rest = &buf[start..];
            return Ok((!rest.iter().all(u8::is_ascii_whitespace)).then_some(line_no + 1));
        }
        let mut search = len.max(start);
        while let Some(i) = memchr::memchr(b'\n', &buf[search..]) {
            let end = search + i;
            line_no += 1;
            f(line_no, &buf[start..end]);
            start = end + 1;
            search = start;
        }
    }
}

/// Parses the contents of a log.
pub fn parse_records(bytes: &[u8]) -> ReadOutcome {
    let mut out = ReadOutcome::default();
    let torn = for_each_line(bytes, |line_no, line| out.take(line_no, line))
        .expect("reading from memory cannot fail");
    if let Some(line) = torn {
        out.skipped.push(SkippedLine {
            line,
            reason: "incomplete last line".into(),
        });
    }
    out
}

impl ReadOutcome {
    /// Adds line `line_no` of a log.
    fn take(&mut self, line_no: usize, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match parse_line(line) {
            Ok(Record::Execution(r)) => self.records.push(*r),
            Ok(Record::Event(r)) => self.events.push(*r),
            Ok(Record::Context(r)) => self.contexts.push(*r),
            Ok(Record::Session(r)) => self.sessions.push(*r),
            Ok(Record::File(r)) => self.files.push(*r),
            Ok(Record::Install(r)) => self.installs.push(*r),
            Ok(Record::Egress(r)) => self.egress.push(*r),
            Err(reason) => self.skipped.push(SkippedLine {
                line: line_no,
                reason,
            }),
        }
    }
}

/// The file next to a task log that holds its current context: `<task>.context.json`.
pub fn context_path(log: &Path) -> std::path::PathBuf {
    log.with_extension("context.json")
}

/// Saves `json` (the task's whole context) as its current one: written to a temporary file
/// and renamed, so a reader sees the old or the new context, whole.
pub fn save_context(log: &Path, json: &str) -> io::Result<()> {
    let path = context_path(log);
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, &path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The task's current context, from its context file (see [`save_context`]): one small read,
/// whatever the size of the log. `None` when there is none (no context was ever set), or when
/// it is not a JSON object (then [`last_context`] can recover it from the log). A file larger
/// than [`MAX_CONTEXT_BYTES`](flowrepl_protocol::limits::MAX_CONTEXT_BYTES) is an error
/// (`InvalidData`), read no further: the kernel then starts from `{}` and says so.
pub fn load_context(log: &Path) -> io::Result<Option<String>> {
    let path = context_path(log);
    let limit = flowrepl_protocol::limits::MAX_CONTEXT_BYTES as u64;
    let read = std::fs::File::open(&path)
        .and_then(|f| crate::untrusted::read_bounded(f, limit, &path))
        .and_then(|bytes| {
            String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        });
    match read {
        Ok(text) => {
            let object = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text);
            Ok(object.is_ok().then_some(text))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The `context` of the last context record of the log at `path`, read backwards from the
/// end, looking at most `limit` bytes back. `None` when the file or such a record does not
/// exist there; a torn or unreadable line is passed over.
pub fn last_context(path: &Path, limit: u64) -> io::Result<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Ctx {
        version: u32,
        context: serde_json::Value,
    }
    last_line(path, b"{\"type\":\"context\"", limit, |line| {
        let c = serde_json::from_slice::<Ctx>(line).ok()?;
        (c.version <= FORMAT_VERSION && c.context.is_object()).then(|| c.context.to_string())
    })
}

/// The last line of the log at `path` that starts with `prefix` and that `accept` takes,
/// read backwards from the end, looking at most `limit` bytes back. `None` when the file or
/// such a line does not exist there; a torn line is passed over.
pub fn last_line<T>(
    path: &Path,
    prefix: &[u8],
    limit: u64,
    mut accept: impl FnMut(&[u8]) -> Option<T>,
) -> io::Result<Option<T>> {
    use std::io::{Read, Seek, SeekFrom};
    const CHUNK: u64 = 1 << 20;
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut end = file.seek(SeekFrom::End(0))?;
    let stop = end.saturating_sub(limit);
    // The bytes after the last newline seen so far belong to a line not yet complete.
    let mut tail: Vec<u8> = Vec::new();
    while end > stop {
        let start = end.saturating_sub(CHUNK).max(stop);
        let mut buf = vec![0u8; (end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf)?;
        buf.extend_from_slice(&tail);
        // Complete lines are those after the first newline (or all, at the file's start).
        let first_nl = if start == 0 {
            None
        } else {
            buf.iter().position(|&b| b == b'\n')
        };
        let body_from = first_nl.map_or(0, |i| i + 1);
        for line in buf[body_from..].split(|&b| b == b'\n').rev() {
            if line.starts_with(prefix) {
                if let Some(found) = accept(line) {
                    return Ok(Some(found));
                }
            }
        }
        tail = buf[..body_from].to_vec();
        end = start;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_torn_and_foreign_lines() {
        let good = serde_json::to_string(&crate::writer::tests_support::record(1)).unwrap();
        let newer = good.replace("\"version\":1", "\"version\":99");
        let other = good.replace("\"type\":\"execution\"", "\"type\":\"note\"");
        let text = format!(
            "{good}\nnot json\n{{\"a\":1}}\n\n{newer}\n{other}\n{good}\n{}",
            &good[..20]
        );
        let out = parse_records(text.as_bytes());
        assert_eq!(out.records.len(), 2);
        let lines: Vec<_> = out.skipped.iter().map(|s| s.line).collect();
        assert_eq!(lines, vec![2, 3, 5, 6, 8]);
    }

    #[test]
    fn the_last_context_is_found_from_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        assert_eq!(last_context(&path, u64::MAX).unwrap(), None);
        let ctx =
            |n: u32| format!("{{\"type\":\"context\",\"version\":1,\"context\":{{\"n\":{n}}}}}\n");
        let filler = format!(
            "{{\"type\":\"execution\",\"stdout\":\"{}\"}}\n",
            "x".repeat(700_000)
        );
        let mut text = ctx(1) + &filler + &ctx(2);
        for _ in 0..4 {
            text.push_str(&filler);
        }
        text.push_str("{\"type\":\"context\",\"vers"); // torn last line
        std::fs::write(&path, &text).unwrap();
        assert_eq!(
            last_context(&path, u64::MAX).unwrap().as_deref(),
            Some("{\"n\":2}")
        );
        // Looking back no further than the last megabyte: not there.
        assert_eq!(last_context(&path, 1 << 20).unwrap(), None);
        std::fs::write(&path, ctx(7)).unwrap();
        assert_eq!(
            last_context(&path, u64::MAX).unwrap().as_deref(),
            Some("{\"n\":7}")
        );
        // The context file is what a kernel starts from; a torn one is not used.
        assert_eq!(load_context(&path).unwrap(), None);
        save_context(&path, "{\"n\":8}").unwrap();
        assert_eq!(load_context(&path).unwrap().as_deref(), Some("{\"n\":8}"));
        std::fs::write(context_path(&path), "{\"n\":").unwrap();
        assert_eq!(load_context(&path).unwrap(), None);
    }

    #[test]
    fn ignores_unknown_fields() {
        let good = serde_json::to_string(&crate::writer::tests_support::record(1)).unwrap();
        let extended = good.replacen('{', "{\"future_field\":[1,2],", 1);
        let out = parse_records(format!("{extended}\n").as_bytes());
        assert_eq!(out.records.len(), 1, "{:?}", out.skipped);
    }
}
