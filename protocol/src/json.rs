//! A fast JSON writer for the one reply whose size matters: `execute_code`'s result.
//!
//! serde_json escapes strings one byte at a time through a lookup table (about 0.4 ms per
//! MB of plain text here), and a cell's stdout can be megabytes. [`write_str`] finds the only
//! bytes JSON must escape (`"`, `\`, and controls below 0x20) 64 bytes at a time (SSE2 on
//! x86_64: 85 µs per MB of plain text, 140 µs with a newline every 38 bytes; a memcpy is
//! 40 µs) and copies clean runs whole. [`write_execute_response`] writes the whole response
//! with it. Its output is the same JSON, byte for byte, as serde_json's for the same value;
//! the tests below compare the two.

use crate::execute::ExecuteResult;
use crate::jsonrpc::Id;

/// Bytes looked at per step of [`write_str`].
const BLOCK: usize = 64;

/// Bit `i` set iff `block[i]` needs escaping in a JSON string (`"`, `\`, or below 0x20).
/// SSE2, which every x86_64 CPU has: four 16-byte compares per block.
#[cfg(target_arch = "x86_64")]
#[inline]
fn escape_mask(block: &[u8; BLOCK]) -> u64 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    // SAFETY: SSE2 is part of the x86_64 baseline; each unaligned 16-byte load reads inside
    // `block` (offsets 0, 16, 32 and 48 of 64 bytes).
    unsafe {
        let controls = _mm_set1_epi8(0x1f);
        let quote = _mm_set1_epi8(b'"' as i8);
        let backslash = _mm_set1_epi8(b'\\' as i8);
        let lane = |offset: usize| {
            let v = _mm_loadu_si128(block.as_ptr().add(offset).cast());
            // max(v, 0x1f) == 0x1f exactly when v <= 0x1f (unsigned).
            let low = _mm_cmpeq_epi8(_mm_max_epu8(v, controls), controls);
            let special = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
            u64::from(_mm_movemask_epi8(_mm_or_si128(low, special)) as u16)
        };
        lane(0) | lane(16) << 16 | lane(32) << 32 | lane(48) << 48
    }
}

/// The same mask, eight bytes at a time (exact: no carry crosses a byte).
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn escape_mask(block: &[u8; BLOCK]) -> u64 {
    escape_mask_words(block)
}

/// [`escape_mask`] without SIMD (other targets; compared with the SSE2 one in the tests).
#[cfg(any(not(target_arch = "x86_64"), test))]
fn escape_mask_words(block: &[u8; BLOCK]) -> u64 {
    const LO: u64 = 0x0101_0101_0101_0101;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // High bit of each byte of `x` that is zero.
    let zero = |x: u64| !(((x & LOW7).wrapping_add(LOW7)) | x | LOW7);
    let mut mask = 0;
    for (k, word) in block.chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        let hits = zero(w & (LO * 0xe0))
            | zero(w ^ (LO * u64::from(b'"')))
            | zero(w ^ (LO * u64::from(b'\\')));
        // One bit per byte: the high bits, gathered.
        for byte in 0..8 {
            mask |= ((hits >> (byte * 8 + 7)) & 1) << (k * 8 + byte);
        }
    }
    mask
}

#[inline]
fn escape_byte(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match b {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        0x08 => out.extend_from_slice(b"\\b"),
        0x0c => out.extend_from_slice(b"\\f"),
        _ => out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[(b >> 4) as usize],
            HEX[(b & 15) as usize],
        ]),
    }
}

#[inline]
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Appends `s` as a JSON string literal.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    let mut clean_from = 0;
    let mut blocks = b.chunks_exact(BLOCK);
    for (n, block) in blocks.by_ref().enumerate() {
        let mut hits = escape_mask(block.try_into().expect("BLOCK bytes"));
        while hits != 0 {
            let at = n * BLOCK + hits.trailing_zeros() as usize;
            out.extend_from_slice(&b[clean_from..at]);
            escape_byte(out, b[at]);
            clean_from = at + 1;
            hits &= hits - 1;
        }
    }
    let tail = b.len() - blocks.remainder().len();
    for (j, &c) in blocks.remainder().iter().enumerate() {
        if needs_escape(c) {
            out.extend_from_slice(&b[clean_from..tail + j]);
            escape_byte(out, c);
            clean_from = tail + j + 1;
        }
    }
    out.extend_from_slice(&b[clean_from..]);
    out.push(b'"');
}

fn write_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => write_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_list(out: &mut Vec<u8>, items: &[String]) {
    out.push(b'[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, s);
    }
    out.push(b']');
}

/// Floats exactly as serde_json writes them (shortest round-trip form; null if not finite).
fn write_f64(out: &mut Vec<u8>, v: f64) {
    serde_json::to_writer(&mut *out, &v).expect("writing to a Vec cannot fail");
}

/// Appends `{"jsonrpc":"2.0","id":…,"result":{…}}` for an `execute_code` reply.
pub fn write_execute_response(out: &mut Vec<u8>, id: &Id, r: &ExecuteResult) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    serde_json::to_writer(&mut *out, id).expect("ids serialize");
    out.extend_from_slice(b",\"result\":");
    write_result(out, r);
    out.push(b'}');
}

/// Appends `{"jsonrpc":"2.0","id":…,"error":{"code":-32603,"message":…,"data":{…}}}`: a
/// failed cell answered as the original `json_repl_session.py` did (compatibility mode),
/// with the whole result as `data`.
pub fn write_execute_error(out: &mut Vec<u8>, id: &Id, message: &str, r: &ExecuteResult) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    serde_json::to_writer(&mut *out, id).expect("ids serialize");
    let code = crate::ErrorCode::InternalError.code();
    out.extend_from_slice(format!(",\"error\":{{\"code\":{code},\"message\":").as_bytes());
    write_str(out, message);
    out.extend_from_slice(b",\"data\":");
    write_result(out, r);
    out.extend_from_slice(b"}}");
}

/// Appends the result object. Same field order as serde: [`ExecuteResult`]'s fields, with its
/// [`crate::CellReport`]'s in its place.
fn write_result(out: &mut Vec<u8>, r: &ExecuteResult) {
    use std::io::Write as _;
    out.extend_from_slice(b"{\"success\":");
    out.extend_from_slice(if r.success { b"true" } else { b"false" });
    out.extend_from_slice(b",\"stdout\":");
    write_str(out, &r.stdout);
    out.extend_from_slice(b",\"stderr\":");
    write_str(out, &r.stderr);
    let c = &r.report;
    out.extend_from_slice(b",\"result\":");
    write_opt_str(out, c.result.as_deref());
    out.extend_from_slice(b",\"error\":");
    match &c.error {
        Some(e) => {
            out.extend_from_slice(b"{\"type\":");
            write_str(out, &e.kind);
            out.extend_from_slice(b",\"message\":");
            write_str(out, &e.message);
            out.extend_from_slice(b",\"traceback\":");
            write_str(out, &e.traceback);
            out.push(b'}');
        }
        None => out.extend_from_slice(b"null"),
    }
    let _ = write!(
        out,
        ",\"timed_out\":{},\"interrupted\":{}",
        c.timed_out, c.interrupted
    );
    out.extend_from_slice(b",\"added_vars\":");
    write_list(out, &c.added_vars);
    out.extend_from_slice(b",\"removed_vars\":");
    write_list(out, &c.removed_vars);
    out.extend_from_slice(b",\"rebound_vars\":");
    write_list(out, &c.rebound_vars);
    out.extend_from_slice(b",\"added_imports\":");
    write_list(out, &c.added_imports);
    let _ = write!(out, ",\"variable_count\":{}", c.variable_count);
    out.extend_from_slice(b",\"warnings\":");
    write_list(out, &c.warnings);
    let u = &c.usage;
    let _ = write!(out, ",\"usage\":{{\"pid\":{},\"cpu_ms\":", u.pid);
    write_f64(out, u.cpu_ms);
    let d = &c.debug_info;
    let _ = write!(
        out,
        ",\"peak_rss_kb\":{}}},\"debug_info\":{{\"execution\":\"{}\",\"execution_mode\":\"{}\",\"elapsed_ms\":",
        u.peak_rss_kb,
        d.execution.as_str(),
        d.execution_mode.as_str()
    );
    write_f64(out, d.elapsed_ms);
    let p = &d.phases_us;
    let _ = write!(
        out,
        ",\"phases_us\":{{\"compile\":{},\"exec\":{},\"capture\":{},\"diff\":{}}}}},\"execution_count\":{},\"elapsed_ms\":",
        p.compile, p.exec, p.capture, p.diff, r.execution_count
    );
    write_f64(out, r.elapsed_ms);
    let _ = write!(out, ",\"mode\":\"{}\",\"stopped_by\":", r.mode.as_str());
    match r.stopped_by {
        Some(s) => {
            let _ = write!(out, "\"{}\"", s.as_str());
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"timestamp\":");
    write_str(out, &r.timestamp);
    let _ = write!(out, ",\"state_lost\":{}", r.state_lost);
    if !r.images.is_empty() {
        out.extend_from_slice(b",\"images\":");
        // Rare and small: serde's output is the reference anyway.
        let _ = serde_json::to_writer(&mut *out, &r.images);
    }
    if !r.events.is_empty() {
        out.extend_from_slice(b",\"events\":");
        // Events are small JSON already; serde's output is the reference.
        let _ = serde_json::to_writer(&mut *out, &r.events);
    }
    if let Some(restored) = &r.restored {
        // Once per restore: serde writes the object, spliced in without its braces.
        if let Ok(obj) = serde_json::to_vec(restored) {
            if obj.len() > 2 {
                out.push(b',');
                out.extend_from_slice(&obj[1..obj.len() - 1]);
            }
        }
    }
    out.push(b'}');
}

/// Rewrites the non-ASCII characters of JSON text `json` as `\uXXXX` escapes (a pair of
/// surrogates beyond the Basic Multilingual Plane) into `out`; returns false, writing
/// nothing, when `json` is ASCII already. The result is the same JSON value: outside strings
/// JSON text is ASCII. For clients that decode each pipe read on its own (the original
/// system's `data.toString()` per 64 KiB chunk), where a character split across two reads
/// became U+FFFD: ASCII cannot be split.
pub fn to_ascii(json: &[u8], out: &mut Vec<u8>) -> bool {
    if json.is_ascii() {
        return false;
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let unit = |out: &mut Vec<u8>, u: u32| {
        let h = |shift: u32| HEX[((u >> shift) & 0xf) as usize];
        out.extend_from_slice(&[b'\\', b'u', h(12), h(8), h(4), h(0)]);
    };
    // At most three times as long (a 2-byte character becomes 6 bytes).
    out.reserve(json.len() * 3);
    let mut at = 0;
    while at < json.len() {
        let start = at;
        while at < json.len() && json[at] < 0x80 {
            at += 1;
        }
        out.extend_from_slice(&json[start..at]);
        if at == json.len() {
            break;
        }
        // One UTF-8 sequence (serde_json writes valid UTF-8; anything else becomes U+FFFD).
        let lead = json[at];
        let (len, first) = match lead {
            0xc0..=0xdf => (2, u32::from(lead & 0x1f)),
            0xe0..=0xef => (3, u32::from(lead & 0x0f)),
            0xf0..=0xf7 => (4, u32::from(lead & 0x07)),
            _ => (1, 0xfffd),
        };
        let tail = json.get(at + 1..at + len).unwrap_or(&[]);
        let c = if len == 1 || tail.len() + 1 != len || tail.iter().any(|b| b & 0xc0 != 0x80) {
            at += 1;
            0xfffd
        } else {
            at += len;
            tail.iter()
                .fold(first, |c, b| (c << 6) | u32::from(b & 0x3f))
        };
        if c >= 0x1_0000 {
            let c = c - 0x1_0000;
            unit(out, 0xd800 + (c >> 10));
            unit(out, 0xdc00 + (c & 0x3ff));
        } else {
            unit(out, c);
        }
    }
    true
}

#[cfg(test)]
mod tests {

    #[test]
    fn to_ascii_escapes_every_non_ascii_character_and_keeps_the_value() {
        let value = serde_json::json!({"stdout": "한글 é 😀 \" \\ plain", "k€y": 1});
        let json = serde_json::to_vec(&value).unwrap();
        let mut out = Vec::new();
        assert!(to_ascii(&json, &mut out));
        assert!(out.is_ascii());
        assert!(
            String::from_utf8_lossy(&out).contains(r"\ud83d\ude00"),
            "a surrogate pair"
        );
        let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, value);
        let mut none = Vec::new();
        assert!(!to_ascii(b"{\"a\":1}", &mut none));
        assert!(none.is_empty());
    }
    use super::*;
    use crate::execute::{CellReport, DebugInfo, ExecError, ExecutionKind, Mode, PhaseTimings};
    use crate::jsonrpc::Response;

    fn same_as_serde(s: &str) {
        let mut out = Vec::new();
        write_str(&mut out, s);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            serde_json::to_string(s).unwrap(),
            "{s:?}"
        );
    }

    #[test]
    fn strings_match_serde_json() {
        let all_bytes: String = (0u8..0x80).map(char::from).collect();
        for s in [
            "",
            "a",
            "plain ascii text that is longer than eight bytes",
            "\"",
            "\\",
            "\n",
            "\u{0}",
            "\u{1f}",
            "\u{7f}",
            "a\"b\\c\nd\re\tf\u{8}g\u{c}h",
            "한국어 ✓ 🐍 \u{fffd}",
            &all_bytes,
            "12345678\"",
            "1234567\"8",
            "\"1234567",
            "aaaaaaa\u{1}aaaaaaaa\u{1f}",
        ] {
            same_as_serde(s);
        }
        // Every position of an escape within a block, the tail after it, and across both.
        for pos in 0..150 {
            for c in ['"', '\\', '\n', '\u{0}', '\u{1f}', ' ', '\u{7f}', '\u{80}'] {
                let mut s: String = "x".repeat(150);
                s.replace_range(pos..pos + 1, &c.to_string());
                same_as_serde(&s);
                same_as_serde(&s[pos.min(10)..]);
            }
        }
        let dense: String = (0..1000).map(|i| char::from((i * 7 % 128) as u8)).collect();
        same_as_serde(&dense);
        same_as_serde(&"line of output\n".repeat(100));
        // Every position of an escape within a word.
        for pos in 0..17 {
            for c in [
                '"', '\\', '\n', '\u{0}', '\u{1f}', ' ', '!', '#', '[', ']', '\u{80}',
            ] {
                let mut s: String = "x".repeat(17);
                s.replace_range(pos..pos + 1, &c.to_string());
                same_as_serde(&s);
            }
        }
    }

    #[test]
    fn both_escape_masks_agree() {
        for byte in 0..=255u8 {
            for pos in 0..BLOCK {
                let mut block = [b'x'; BLOCK];
                block[pos] = byte;
                block[(pos + 17) % BLOCK] = byte.wrapping_add(1);
                let want = (0..BLOCK)
                    .filter(|&i| needs_escape(block[i]))
                    .fold(0u64, |m, i| m | 1 << i);
                assert_eq!(escape_mask(&block), want, "{byte:#x} at {pos}");
                assert_eq!(escape_mask_words(&block), want, "{byte:#x} at {pos}");
            }
        }
    }

    #[test]
    fn response_matches_serde_json() {
        let mut r = ExecuteResult {
            success: false,
            stdout: "out\n\"quoted\"".into(),
            stderr: "Traceback…\n".into(),
            report: CellReport {
                result: Some("'x'".into()),
                error: Some(ExecError {
                    kind: "ValueError".into(),
                    message: "bad \\ value".into(),
                    traceback: "Traceback…\n".into(),
                }),
                timed_out: true,
                interrupted: false,
                added_vars: vec!["a".into(), "작업".into()],
                removed_vars: vec![],
                rebound_vars: vec!["b".into()],
                added_imports: vec!["json".into(), "json.decoder".into()],
                variable_count: 3,
                warnings: vec!["w".into()],
                usage: crate::ResourceUsage {
                    pid: 4242,
                    cpu_ms: 0.031,
                    peak_rss_kb: 15012,
                },
                debug_info: DebugInfo {
                    execution: ExecutionKind::RuntimeError,
                    execution_mode: Mode::InProcess,
                    elapsed_ms: 1e-7,
                    phases_us: PhaseTimings {
                        compile: 1,
                        exec: 2,
                        capture: 3,
                        diff: 4,
                    },
                },
            },
            execution_count: 12,
            elapsed_ms: 0.123,
            mode: Mode::InProcess,
            stopped_by: Some(crate::StoppedBy::Interrupt),
            timestamp: "2026-11-22T02:14:11.123Z".into(),
            state_lost: true,
            images: vec![],
            events: vec![crate::Event {
                seq: 1,
                name: "loaded".into(),
                data: crate::EventData::from_json(r#"{"rows": 3, "ok": "é\n"}"#.into()).unwrap(),
                timestamp: "2026-11-22T02:14:11.124Z".into(),
                step: Some("load".into()),
            }],
            restored: None,
        };
        for id in [Id::Number(7.into()), Id::String("a\"b".into()), Id::Null] {
            for _ in 0..2 {
                let mut fast = Vec::new();
                write_execute_response(&mut fast, &id, &r);
                let slow = serde_json::to_vec(&Response::new(&id, &r)).unwrap();
                assert_eq!(
                    String::from_utf8(fast).unwrap(),
                    String::from_utf8(slow).unwrap()
                );
                let mut fast = Vec::new();
                write_execute_error(&mut fast, &id, "bad \"x\"", &r);
                #[derive(serde::Serialize)]
                struct Error<'a> {
                    code: i64,
                    message: &'a str,
                    data: &'a ExecuteResult,
                }
                #[derive(serde::Serialize)]
                struct Reply<'a> {
                    jsonrpc: &'a str,
                    id: &'a Id,
                    error: Error<'a>,
                }
                let slow = Reply {
                    jsonrpc: "2.0",
                    id: &id,
                    error: Error {
                        code: -32603,
                        message: "bad \"x\"",
                        data: &r,
                    },
                };
                assert_eq!(
                    String::from_utf8(fast).unwrap(),
                    serde_json::to_string(&slow).unwrap()
                );
                r.report.error = None;
                r.report.result = None;
                r.stopped_by = None;
                r.elapsed_ms = 12345.0;
                r.images.push(crate::ImageInfo {
                    mime: "image/png".into(),
                    width: 640,
                    height: 480,
                    bytes: 9000,
                    source: "figure 1".into(),
                });
                r.restored = Some(crate::RestoreReport {
                    restored: true,
                    checkpoint: "auto".into(),
                    checkpoint_execution_count: 11,
                    checkpoint_session_id: Some("s".into()),
                    restored_vars: vec!["a".into()],
                    lost_vars: [("g".to_owned(), "not saved: a generator".to_owned())].into(),
                    restore_ms: 1.5,
                });
            }
        }
    }
}
