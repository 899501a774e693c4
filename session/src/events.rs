//! A cell's events, in order: those it reported through `flow` (with the bytes of stdout
//! written before each) and the `MCP::<name> {json}` lines it printed (which stay in stdout).
//! A line whose JSON does not parse is an event all the same, `{"raw": "<text>"}`, with a
//! warning.

use flowrepl_protocol::{CellEvent, Event, EventData};

/// The prefix of an event line in a cell's stdout.
pub const LINE_PREFIX: &str = "MCP::";

/// Whether `stdout` may hold an event line: a SIMD search, built once (about 29 µs per MB
/// of output on the reference machine, the price of `MCP::` lines for every cell).
fn may_have_lines(stdout: &str) -> bool {
    static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
        std::sync::OnceLock::new();
    FINDER
        .get_or_init(|| memchr::memmem::Finder::new(LINE_PREFIX))
        .find(stdout.as_bytes())
        .is_some()
}

/// Numbers the cell's events 1, 2, … in the order they happened: `flow` events and `MCP::`
/// lines merged by their place in stdout (an event reported right after a line was printed
/// comes after it). Lines get the current time as their timestamp. A cell with neither costs
/// one search of its stdout.
pub fn assemble(reported: Vec<CellEvent>, stdout: &str, warnings: &mut Vec<String>) -> Vec<Event> {
    if reported.is_empty() && !may_have_lines(stdout) {
        return Vec::new();
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut lines = event_lines(stdout, &now, warnings).into_iter().peekable();
    let mut events = Vec::with_capacity(reported.len());
    for r in reported {
        while let Some((_, line)) = lines.next_if(|(offset, _)| *offset < r.offset) {
            events.push(line);
        }
        events.push(Event {
            seq: 0,
            name: r.name,
            data: r.data,
            timestamp: r.timestamp,
            step: r.step,
        });
    }
    events.extend(lines.map(|(_, e)| e));
    for (i, e) in events.iter_mut().enumerate() {
        e.seq = i as u64 + 1;
    }
    events
}

/// The `MCP::` lines of `stdout`, each with the byte offset where it starts.
fn event_lines(stdout: &str, now: &str, warnings: &mut Vec<String>) -> Vec<(u64, Event)> {
    let mut out = Vec::new();
    let mut offset = 0;
    for line in stdout.split_inclusive('\n') {
        let start = offset as u64;
        offset += line.len();
        let Some(rest) = line
            .trim_end_matches(['\n', '\r'])
            .strip_prefix(LINE_PREFIX)
        else {
            continue;
        };
        let (name, json) = rest.split_once(' ').unwrap_or((rest, ""));
        if name.is_empty() {
            continue;
        }
        let json = json.trim();
        let data = match serde_json::from_str::<serde_json::Value>(if json.is_empty() {
            "{}"
        } else {
            json
        }) {
            Ok(v) if v.is_object() => EventData::from_json(v.to_string()),
            _ => {
                warnings.push(format!(
                    "stdout line {LINE_PREFIX}{name}: its data is not a JSON object; kept as raw text"
                ));
                EventData::from_json(serde_json::json!({ "raw": json }).to_string())
            }
        };
        let Ok(data) = data else { continue };
        out.push((
            start,
            Event {
                seq: 0,
                name: name.to_owned(),
                data,
                timestamp: now.to_owned(),
                step: None,
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(name: &str, offset: u64) -> CellEvent {
        CellEvent {
            name: name.into(),
            data: EventData::from_json("{}".into()).unwrap(),
            timestamp: "t".into(),
            step: None,
            offset,
        }
    }

    #[test]
    fn lines_and_reported_events_merge_by_place_in_stdout() {
        let stdout = "a\nMCP::first {\"n\": 1}\nb\nMCP::broken {oops\nMCP::bare\n";
        // reported after "a\n" was printed (2 bytes) and after the first line (23 bytes)
        let mut warnings = Vec::new();
        let events = assemble(
            vec![reported("r1", 2), reported("r2", 23)],
            stdout,
            &mut warnings,
        );
        let names: Vec<_> = events.iter().map(|e| (e.seq, e.name.as_str())).collect();
        assert_eq!(
            names,
            [
                (1, "r1"),
                (2, "first"),
                (3, "r2"),
                (4, "broken"),
                (5, "bare")
            ]
        );
        assert_eq!(events[1].data.get(), r#"{"n":1}"#);
        assert_eq!(events[3].data.get(), r#"{"raw":"{oops"}"#);
        assert_eq!(events[4].data.get(), "{}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(assemble(Vec::new(), "no events\n", &mut warnings).is_empty());
    }
}
