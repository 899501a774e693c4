//! Turning a cell's result into an MCP tool result: one text block a model reads well, image
//! blocks, and `structuredContent`, all within the output budget.
//!
//! # The budget
//! stdout, stderr and the final value's repr share `max_chars` characters. Parts that fit in
//! an equal share stay whole and leave the rest to the others; a part over its share keeps
//! its head (3/5) and tail (2/5), cut at line ends where one is near, with a marker between
//! them that says which characters were cut and how to read them with `read_output`. The
//! full text of a cut part goes to the [`OutputStore`]; the JSONL log always has everything.
//! `structuredContent` is the same result object as the JSON-RPC front's with the same cut
//! texts, plus `output_cut` saying what was cut.

use super::store::{OutputStore, StreamName};
use flowrepl_protocol::{ExecuteResult, Image, ImageInfo};
use rmcp::model::{CallToolResult, ContentBlock, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::sync::Mutex;

/// Characters set aside for a cut marker.
const MARKER_RESERVE: usize = 260;
/// A cut part keeps at least this many characters.
const MIN_KEEP: usize = 80;

/// One part of the output that was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct CutInfo {
    /// Which part.
    pub stream: StreamName,
    /// Characters in the whole part.
    pub total_chars: usize,
    /// Characters kept at the start.
    pub head_chars: usize,
    /// Characters kept at the end.
    pub tail_chars: usize,
    /// The first cut character: `read_output`'s `offset` for the cut text.
    pub cut_from: usize,
}

/// The shape of `execute_code`'s `structuredContent` (for its `outputSchema`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct McpExecuteResult {
    /// The result, as the JSON-RPC front returns it (texts cut to the budget).
    #[serde(flatten)]
    pub result: ExecuteResult,
    /// The parts that were cut to the budget; empty when everything fit.
    pub output_cut: Vec<CutInfo>,
}

/// `execute_code`'s and `wait_cell`'s `structuredContent` for a cell still running when the
/// call answered (`wait_s` passed).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunningCell {
    /// Always true: the cell goes on; `wait_cell` with `cell` collects its result.
    pub running: bool,
    /// The cell's id for `wait_cell`.
    pub cell: u64,
    /// Seconds since the call arrived.
    pub elapsed_s: f64,
    /// Still waiting for earlier calls to finish (it has not started).
    pub queued: bool,
    /// The end of what it has printed so far (within the output budget).
    pub stdout: String,
    /// The end of its stderr so far.
    pub stderr: String,
    /// Bytes it has printed to stdout so far.
    pub stdout_bytes: u64,
    /// Bytes it has printed to stderr so far.
    pub stderr_bytes: u64,
}

/// What comes next for a cell still running, as its text says it.
pub enum Next {
    /// `wait_cell` collects it.
    WaitCell,
    /// An MCP task ends with its result.
    Task,
}

/// The text of a cell still running: its state, what comes next, the end of its output.
pub fn running_text(cell: &RunningCell, next: Next) -> String {
    let mut text = if cell.queued {
        format!(
            "Cell {id} is still waiting for earlier calls after {s:.0} s.",
            id = cell.cell,
            s = cell.elapsed_s
        )
    } else {
        format!(
            "Cell {id} is still running after {s:.0} s.",
            id = cell.cell,
            s = cell.elapsed_s
        )
    };
    match next {
        Next::WaitCell => {
            let _ = write!(
                text,
                " It goes on: call wait_cell with cell={id} for its result (interrupt stops it).",
                id = cell.cell
            );
        }
        Next::Task => {
            text.push_str(" It goes on; this task ends with its result (tasks/cancel stops it).")
        }
    }
    for (name, part, total) in [
        ("stdout", &cell.stdout, cell.stdout_bytes),
        ("stderr", &cell.stderr, cell.stderr_bytes),
    ] {
        if total == 0 {
            continue;
        }
        let earlier = total.saturating_sub(part.len() as u64);
        let _ = write!(text, "\n[{name} so far: {total} bytes");
        if earlier > 0 {
            let _ = write!(text, ", the last {} shown", part.len());
        }
        let _ = write!(text, "]\n{part}");
    }
    text
}

/// The tool result of a cell still running (see [`RunningCell`]).
pub fn running_result(cell: RunningCell) -> CallToolResult {
    let text = running_text(&cell, Next::WaitCell);
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = serde_json::to_value(&cell).ok();
    r.is_error = Some(false);
    r
}

/// The cell of a [`running_result`] (also one relayed from another kernel as JSON), else
/// `None`.
pub fn running_cell(result: &CallToolResult) -> Option<RunningCell> {
    let s = result.structured_content.as_ref()?;
    if s.get("running")?.as_bool()? {
        serde_json::from_value(s.clone()).ok()
    } else {
        None
    }
}

/// A part of the output after budgeting.
struct Part {
    stream: StreamName,
    cut: Option<(String, CutInfo)>,
}

/// How many characters each part may keep: parts under an equal share stay whole, the rest
/// share what is left.
fn allowances(lens: &[usize], budget: usize) -> Vec<usize> {
    let mut out = lens.to_vec();
    if lens.iter().sum::<usize>() <= budget {
        return out;
    }
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| lens[i]);
    let mut left = budget;
    for (k, &i) in order.iter().enumerate() {
        let share = left / (lens.len() - k);
        out[i] = lens[i].min(share);
        left -= out[i];
    }
    out
}

fn byte_at(s: &str, chars: usize, n: usize) -> usize {
    if chars == s.len() {
        n
    } else {
        s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
    }
}

/// Keeps the head and tail of `s` (`chars` characters) in about `keep` characters; None
/// when that would keep everything anyway (a short text with a small allowance).
fn cut_text(
    s: &str,
    chars: usize,
    keep: usize,
    cell: u64,
    stream: StreamName,
    page: usize,
) -> Option<(String, CutInfo)> {
    let keep = keep.saturating_sub(MARKER_RESERVE).max(MIN_KEEP);
    if keep + MARKER_RESERVE >= chars {
        return None;
    }
    let head_n = keep * 3 / 5;
    let tail_n = keep - head_n;
    let b = s.as_bytes();
    let mut head_end = byte_at(s, chars, head_n);
    let mut tail_start = byte_at(s, chars, chars - tail_n);
    // Prefer whole lines when a line end is near the cut.
    let lo = head_end - head_end / 5;
    if let Some(p) = memchr::memrchr(b'\n', &b[lo..head_end]) {
        head_end = lo + p + 1;
    }
    let hi = tail_start + (b.len() - tail_start) / 5;
    if let Some(p) = memchr::memchr(b'\n', &b[tail_start..hi]) {
        tail_start += p + 1;
    }
    let ascii = chars == s.len();
    let head_chars = if ascii {
        head_end
    } else {
        s[..head_end].chars().count()
    };
    let tail_chars = if ascii {
        b.len() - tail_start
    } else {
        s[tail_start..].chars().count()
    };
    let cut_to = chars - tail_chars;
    let mut out = String::with_capacity(head_end + (b.len() - tail_start) + MARKER_RESERVE);
    out.push_str(&s[..head_end]);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let name = stream.as_str();
    let _ = writeln!(
        out,
        "[flowrepl: {} of {chars} characters of {name} were cut here (characters {head_chars} to {cut_to}); read them with read_output(execution_count={cell}, stream=\"{name}\", offset={head_chars}, length={page})]",
        cut_to - head_chars
    );
    out.push_str(&s[tail_start..]);
    Some((
        out,
        CutInfo {
            stream,
            total_chars: chars,
            head_chars,
            tail_chars,
            cut_from: head_chars,
        },
    ))
}

/// Cuts the parts of `r` that are over the budget; keeps their full text in `store`.
fn budget_parts(r: &ExecuteResult, max_chars: usize, store: &Mutex<OutputStore>) -> Vec<Part> {
    let texts = [
        (StreamName::Stdout, r.stdout.as_str()),
        (StreamName::Stderr, r.stderr.as_str()),
        (StreamName::Result, r.report.result.as_deref().unwrap_or("")),
    ];
    // Fast path: bytes bound characters.
    if texts.iter().map(|(_, t)| t.len()).sum::<usize>() <= max_chars {
        return Vec::new();
    }
    let lens: Vec<usize> = texts.iter().map(|(_, t)| t.chars().count()).collect();
    let allowed = allowances(&lens, max_chars);
    let mut parts = Vec::new();
    for (((stream, text), &len), &allow) in texts.iter().zip(&lens).zip(&allowed) {
        if len <= allow {
            continue;
        }
        let Some(cut) = cut_text(text, len, allow, r.execution_count, *stream, max_chars) else {
            continue;
        };
        let mut st = super::store::locked(store);
        st.insert(r.execution_count, *stream, (*text).to_owned(), len);
        parts.push(Part {
            stream: *stream,
            cut: Some(cut),
        });
    }
    parts
}

/// Events shown in the text block; the rest are in `structuredContent`.
const MAX_EVENTS_IN_TEXT: usize = 50;

/// The text block: stdout, then stderr (with the traceback) under a label, then the events
/// (one line each, at most [`MAX_EVENTS_IN_TEXT`]), `Out[n]:`, warnings and the images'
/// captions.
fn text_block(
    r: &ExecuteResult,
    stdout: &str,
    stderr: &str,
    result: Option<&str>,
    max_images: usize,
) -> String {
    let mut t = String::with_capacity(stdout.len() + stderr.len() + 64);
    let end_line = |t: &mut String| {
        if !t.is_empty() && !t.ends_with('\n') {
            t.push('\n');
        }
    };
    t.push_str(stdout);
    if !stderr.is_empty() {
        end_line(&mut t);
        t.push_str("[stderr]\n");
        t.push_str(stderr);
    }
    for e in r.events.iter().take(MAX_EVENTS_IN_TEXT) {
        end_line(&mut t);
        match &e.step {
            Some(step) => write!(t, "[event {} in {step}] {} {}", e.seq, e.name, e.data.get()),
            None => write!(t, "[event {}] {} {}", e.seq, e.name, e.data.get()),
        }
        .expect("writing to a String");
    }
    if r.events.len() > MAX_EVENTS_IN_TEXT {
        end_line(&mut t);
        let more = r.events.len() - MAX_EVENTS_IN_TEXT;
        let _ = write!(t, "[{more} more events in structuredContent.events]");
    }
    if let Some(v) = result {
        end_line(&mut t);
        let _ = write!(t, "Out[{}]: {v}", r.execution_count);
    }
    if let Some(restored) = &r.restored {
        end_line(&mut t);
        let _ = write!(
            t,
            "[restored] {}",
            flowrepl_session::engine::restored_message(restored)
        );
    }
    for w in &r.report.warnings {
        end_line(&mut t);
        let _ = write!(t, "[warning] {w}");
    }
    for (n, i) in r.images.iter().enumerate() {
        end_line(&mut t);
        let how = if n < max_images {
            "returned as an image block"
        } else {
            "past the image limit: returned as a resource_link"
        };
        let _ = write!(
            t,
            "[image: {}, {}x{} PNG, {how}]",
            i.source, i.width, i.height
        );
    }
    if t.is_empty() {
        let _ = write!(t, "[cell {} ran: no output]", r.execution_count);
    }
    t
}

/// What a result may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The output budget, in characters.
    pub max_chars: usize,
    /// Images put in the result; those past it are kept and linked.
    pub max_images: usize,
}

/// Builds the `execute_code` tool result. `r` is left as it came (it goes to the log after).
pub fn execute_result(
    r: &mut ExecuteResult,
    mut images: Vec<Image>,
    limits: Limits,
    store: &Mutex<OutputStore>,
    task: &crate::files::TaskRef,
) -> CallToolResult {
    let max_chars = limits.max_chars;
    super::store::locked(store).saw_cell(r.execution_count);
    let mut parts = budget_parts(r, max_chars, store);
    let take = |parts: &mut Vec<Part>, s: StreamName| {
        parts
            .iter_mut()
            .find(|p| p.stream == s)
            .and_then(|p| p.cut.take())
    };
    let cut_stdout = take(&mut parts, StreamName::Stdout);
    let cut_stderr = take(&mut parts, StreamName::Stderr);
    let cut_result = take(&mut parts, StreamName::Result);
    let text = text_block(
        r,
        cut_stdout.as_ref().map_or(&r.stdout, |c| &c.0),
        cut_stderr.as_ref().map_or(&r.stderr, |c| &c.0),
        match &cut_result {
            Some(c) => Some(c.0.as_str()),
            None => r.report.result.as_deref(),
        },
        limits.max_images,
    );
    // structuredContent: the same object with the cut texts swapped in for the moment.
    let mut output_cut = Vec::new();
    let mut saved_stdout = None;
    let mut saved_stderr = None;
    let mut saved_result = None;
    if let Some((s, info)) = cut_stdout {
        saved_stdout = Some(std::mem::replace(&mut r.stdout, s));
        output_cut.push(info);
    }
    if let Some((s, info)) = cut_stderr {
        saved_stderr = Some(std::mem::replace(&mut r.stderr, s));
        output_cut.push(info);
    }
    if let Some((s, info)) = cut_result {
        saved_result = r.report.result.replace(s);
        output_cut.push(info);
    }
    let saved_traceback = r.report.error.as_mut().and_then(|e| {
        let chars = e.traceback.chars().count();
        if chars <= max_chars {
            return None;
        }
        let (cut, _) = cut_text(
            &e.traceback,
            chars,
            max_chars / 2,
            r.execution_count,
            StreamName::Stderr,
            max_chars,
        )?;
        Some(std::mem::replace(&mut e.traceback, cut))
    });
    let mut structured = serde_json::to_value(&*r).unwrap_or_default();
    if let serde_json::Value::Object(o) = &mut structured {
        o.insert(
            "output_cut".into(),
            serde_json::to_value(&output_cut).unwrap_or_default(),
        );
    }
    if let Some(s) = saved_stdout {
        r.stdout = s;
    }
    if let Some(s) = saved_stderr {
        r.stderr = s;
    }
    if saved_result.is_some() {
        r.report.result = saved_result;
    }
    if let (Some(t), Some(e)) = (saved_traceback, r.report.error.as_mut()) {
        e.traceback = t;
    }
    let mut content = Vec::with_capacity(1 + images.len());
    content.push(ContentBlock::text(text));
    // Each cut stream, whole, one read away.
    for info in &output_cut {
        let bytes = match info.stream {
            StreamName::Stdout => r.stdout.len(),
            StreamName::Stderr => r.stderr.len(),
            StreamName::Result => r.report.result.as_deref().map_or(0, str::len),
        };
        let mut link = Resource::new(
            task.output_uri(r.execution_count, info.stream.as_str()),
            format!("cell {} {}", r.execution_count, info.stream.as_str()),
        );
        link.description = Some(format!(
            "the whole {} of cell {} ({} characters); resources/read gives it at once, read_output a page at a time",
            info.stream.as_str(),
            r.execution_count,
            info.total_chars
        ));
        link.mime_type = Some("text/plain".into());
        link.size = Some(bytes as u64);
        content.push(ContentBlock::resource_link(link));
    }
    // Figures past the image limit: kept, and linked.
    let past = images.split_off(images.len().min(limits.max_images));
    for i in images {
        let ImageInfo { mime, .. } = i.info;
        content.push(ContentBlock::image(i.data, mime));
    }
    if !past.is_empty() {
        let mut kept = super::store::locked(store);
        for (n, i) in past.into_iter().enumerate() {
            let n = n + 1 + limits.max_images;
            let part = format!("figure-{n}");
            let mut link = Resource::new(
                task.output_uri(r.execution_count, &part),
                format!("cell {} image {n} ({})", r.execution_count, i.info.source),
            );
            link.description = Some(format!(
                "{}x{} {} past the limit of {} images per cell; resources/read gives it",
                i.info.width, i.info.height, i.info.mime, limits.max_images
            ));
            link.mime_type = Some(i.info.mime.clone());
            link.size = Some(i.info.bytes);
            content.push(ContentBlock::resource_link(link));
            kept.insert_figure(r.execution_count, n, i.data);
        }
    }
    let mut out = CallToolResult::success(content);
    out.structured_content = Some(structured);
    out.is_error = Some(!r.success);
    out
}

/// A page of kept output as a tool result: the characters, then a line saying where they
/// are and where the next page starts.
pub fn page_text(p: &super::store::Page) -> String {
    let mut t = String::with_capacity(p.text.len() + 160);
    t.push_str(&p.text);
    if !t.ends_with('\n') {
        t.push('\n');
    }
    let _ = write!(
        t,
        "[flowrepl: characters {} to {} of {} of the {} of cell {}; ",
        p.offset,
        p.offset + p.length,
        p.total_chars,
        p.stream.as_str(),
        p.execution_count
    );
    match p.next_offset {
        Some(n) => {
            let _ = write!(t, "{} more from offset {n}]", p.total_chars - n);
        }
        None => t.push_str("that is the end]"),
    }
    t
}

/// Characters `[from, to)` of `s`, for tests.
#[cfg(test)]
fn slice(s: &str, from: usize, to: usize) -> &str {
    super::store::char_slice(s, s.chars().count(), from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowances_give_small_parts_their_whole() {
        assert_eq!(allowances(&[10, 20, 30], 100), vec![10, 20, 30]);
        assert_eq!(allowances(&[10, 1000, 5000], 300), vec![10, 145, 145]);
        assert_eq!(allowances(&[0, 1000, 0], 300), vec![0, 300, 0]);
        assert_eq!(allowances(&[1000, 1000, 1000], 300), vec![100, 100, 100]);
    }

    #[test]
    fn cut_keeps_head_and_tail_and_names_the_gap() {
        let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let chars = text.chars().count();
        let (cut, info) = cut_text(&text, chars, 1000, 4, StreamName::Stdout, 20000).unwrap();
        assert!(cut.starts_with("line 0\n"));
        assert!(cut.ends_with("line 1999\n"));
        assert!(cut.chars().count() <= 1000 + 40, "{}", cut.chars().count());
        // Whole lines on both sides of the marker.
        let marker = cut.lines().find(|l| l.starts_with("[flowrepl:")).unwrap();
        assert!(marker.contains(&format!("offset={}", info.cut_from)));
        assert!(marker.contains("execution_count=4"));
        assert_eq!(
            &text[..info.head_chars],
            &cut[..info.head_chars],
            "head is verbatim"
        );
        assert!(text[..info.head_chars].ends_with('\n'));
        assert!(info.head_chars + info.tail_chars < chars);
        assert_eq!(
            &text[chars - info.tail_chars..],
            &cut[cut.len() - info.tail_chars..]
        );
    }

    #[test]
    fn short_texts_are_never_cut_into_overlapping_halves() {
        for chars in [1, 70, 200, 339, 340, 341, 400] {
            let text = "x".repeat(chars);
            match cut_text(&text, chars, 20, 1, StreamName::Stdout, 200) {
                None => assert!(chars <= MIN_KEEP + MARKER_RESERVE, "{chars}"),
                Some((cut, info)) => {
                    assert!(
                        info.head_chars + info.tail_chars < chars,
                        "{chars}: {info:?}"
                    );
                    assert!(cut.len() < chars + MARKER_RESERVE);
                }
            }
        }
    }

    #[test]
    fn budget_keeps_everything_retrievable() {
        let store = Mutex::new(OutputStore::new(1 << 20));
        let mut r: ExecuteResult = serde_json::from_value(serde_json::json!({
            "success": true, "stdout": "o".repeat(3000), "stderr": "e".repeat(90),
            "result": "r".repeat(3000), "error": null, "execution_count": 7,
            "elapsed_ms": 1.0, "mode": "in_process", "timed_out": false,
            "added_vars": [], "removed_vars": [], "added_imports": [],
            "variable_count": 0, "timestamp": "t", "warnings": [],
            "debug_info": {"execution": "success", "execution_mode": "in_process",
                           "elapsed_ms": 1.0}
        }))
        .unwrap();
        let before = r.clone();
        let task = crate::files::TaskRef {
            plan: "p".into(),
            task: "t".into(),
        };
        let limits = Limits {
            max_chars: 1000,
            max_images: 8,
        };
        let out = execute_result(&mut r, Vec::new(), limits, &store, &task);
        let links: Vec<String> = out
            .content
            .iter()
            .filter_map(|c| c.as_resource_link().map(|l| l.uri.clone()))
            .collect();
        assert_eq!(
            links,
            [
                "flowrepl://output/p/t/7/stdout",
                "flowrepl://output/p/t/7/result"
            ]
        );
        assert_eq!(r, before, "the result is given back unchanged for the log");
        let sc = out.structured_content.unwrap();
        let cuts = sc["output_cut"].as_array().unwrap();
        assert_eq!(cuts.len(), 2, "{cuts:?}");
        assert_eq!(sc["stderr"], "e".repeat(90), "a small part stays whole");
        let st = store.lock().unwrap();
        for c in cuts {
            let stream = serde_json::from_value(c["stream"].clone()).unwrap();
            let from = c["cut_from"].as_u64().unwrap() as usize;
            let page = st.read(7, stream, from, 10_000).unwrap();
            assert_eq!(page.total_chars, 3000);
        }
        let ContentBlock::Text(t) = &out.content[0] else {
            panic!("text first")
        };
        assert!(
            t.text.chars().count() < 1000 + 2 * MARKER_RESERVE,
            "{}",
            t.text.len()
        );
    }

    #[test]
    fn cut_counts_characters_not_bytes() {
        let text = "é".repeat(5000);
        let (cut, info) = cut_text(&text, 5000, 1000, 1, StreamName::Stderr, 500).unwrap();
        assert_eq!(info.total_chars, 5000);
        assert_eq!(
            slice(&text, 0, info.head_chars),
            slice(&cut, 0, info.head_chars)
        );
        assert!(cut.contains(&format!("offset={}", info.head_chars)));
    }
}
