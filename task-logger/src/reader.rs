//! Reading a task log back, tolerating what a crash or a full disk can leave behind.
//!
//! Execution and event records are returned; lines that are not JSON, not records of a known
//! type, or from a newer format version are skipped and reported, never fatal; a last line
//! without `\n` (a write in progress) is skipped too.

use crate::record::{
    ContextRecord, EventRecord, ExecutionRecord, SessionRecord, FORMAT_VERSION,
    RECORD_TYPE_CONTEXT, RECORD_TYPE_EVENT, RECORD_TYPE_EXECUTION, RECORD_TYPE_SESSION,
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
    /// Lines that were not returned, with the reason.
    pub skipped: Vec<SkippedLine>,
}

/// Reads every execution record of the log at `path`.
pub fn read_records(path: &Path) -> io::Result<ReadOutcome> {
    let bytes = std::fs::read(path)?;
    Ok(parse_records(&bytes))
}

/// Parses the contents of a log.
pub fn parse_records(bytes: &[u8]) -> ReadOutcome {
    let mut out = ReadOutcome::default();
    let mut rest = bytes;
    let mut line_no = 0;
    while !rest.is_empty() {
        line_no += 1;
        let (line, complete) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                let line = &rest[..i];
                rest = &rest[i + 1..];
                (line, true)
            }
            None => {
                let line = rest;
                rest = &[];
                (line, false)
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let skip = |reason: String| SkippedLine {
            line: line_no,
            reason,
        };
        if !complete {
            out.skipped.push(skip("incomplete last line".into()));
            continue;
        }
        let newer = |version: u32| {
            skip(format!(
                "format version {version} is newer than {FORMAT_VERSION}"
            ))
        };
        match serde_json::from_slice::<ExecutionRecord<'_>>(line) {
            Ok(rec) if rec.kind != RECORD_TYPE_EXECUTION => out
                .skipped
                .push(skip(format!("record type {:?}", rec.kind))),
            Ok(rec) if rec.version > FORMAT_VERSION => out.skipped.push(newer(rec.version)),
            Ok(rec) => out.records.push(into_owned(rec)),
            Err(e) => match serde_json::from_slice::<EventRecord<'static>>(line) {
                Ok(ev)
                    if ev.head.kind == RECORD_TYPE_EVENT && ev.head.version <= FORMAT_VERSION =>
                {
                    out.events.push(ev)
                }
                Ok(ev) if ev.head.kind == RECORD_TYPE_EVENT => {
                    out.skipped.push(newer(ev.head.version))
                }
                _ => match serde_json::from_slice::<ContextRecord<'static>>(line) {
                    Ok(c)
                        if c.head.kind == RECORD_TYPE_CONTEXT
                            && c.head.version <= FORMAT_VERSION =>
                    {
                        out.contexts.push(c)
                    }
                    _ => match serde_json::from_slice::<SessionRecord<'static>>(line) {
                        Ok(s) if s.kind == RECORD_TYPE_SESSION && s.version <= FORMAT_VERSION => {
                            out.sessions.push(s)
                        }
                        _ => out.skipped.push(skip(format!("not a record: {e}"))),
                    },
                },
            },
        }
    }
    out
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
/// it is not a JSON object (then [`last_context`] can recover it from the log).
pub fn load_context(log: &Path) -> io::Result<Option<String>> {
    match std::fs::read_to_string(context_path(log)) {
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
    use std::io::{Read, Seek, SeekFrom};
    const CHUNK: u64 = 1 << 20;
    const PREFIX: &[u8] = b"{\"type\":\"context\"";
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
            if !line.starts_with(PREFIX) {
                continue;
            }
            #[derive(serde::Deserialize)]
            struct Ctx {
                version: u32,
                context: serde_json::Value,
            }
            if let Ok(c) = serde_json::from_slice::<Ctx>(line) {
                if c.version <= FORMAT_VERSION && c.context.is_object() {
                    return Ok(Some(c.context.to_string()));
                }
            }
        }
        tail = buf[..body_from].to_vec();
        end = start;
    }
    Ok(None)
}

fn into_owned(r: ExecutionRecord<'_>) -> ExecutionRecord<'static> {
    use std::borrow::Cow::Owned;
    let own = |c: std::borrow::Cow<'_, str>| Owned(c.into_owned());
    ExecutionRecord {
        kind: own(r.kind),
        version: r.version,
        plan_id: own(r.plan_id),
        task_id: own(r.task_id),
        task_name: r.task_name.map(own),
        session_id: own(r.session_id),
        execution_count: r.execution_count,
        timestamp: own(r.timestamp),
        elapsed_ms: r.elapsed_ms,
        code: own(r.code),
        stdout: own(r.stdout),
        stderr: own(r.stderr),
        success: r.success,
        error_type: r.error_type.map(own),
        error_message: r.error_message.map(own),
        result: r.result.map(own),
        timed_out: r.timed_out,
        interrupted: r.interrupted,
        stopped_by: r.stopped_by.map(own),
        added_vars: Owned(r.added_vars.into_owned()),
        removed_vars: Owned(r.removed_vars.into_owned()),
        added_imports: Owned(r.added_imports.into_owned()),
        mode: own(r.mode),
        warnings: Owned(r.warnings.into_owned()),
        pid: r.pid,
        cpu_ms: r.cpu_ms,
        peak_rss_kb: r.peak_rss_kb,
        state_lost: r.state_lost,
        images: Owned(r.images.into_owned()),
        events: Owned(r.events.into_owned()),
    }
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
