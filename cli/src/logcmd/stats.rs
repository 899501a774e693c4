//! `flowrepl log stats` (and the light record view `ls` shares): one pass over the files,
//! reading only the fields a summary needs (the code and output of a cell are skipped, not
//! copied), so a gigabyte of log streams through in constant memory besides one `f32` per
//! cell for the percentiles.

use super::table::{head, ms, paint, table, Colour};
use super::{each_line, print_json, say, scoped_files, LogCmdError, Read, Scope};
use flowrepl_task_logger::FORMAT_VERSION;
use serde::Deserialize;
use serde_json::json;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// The fields of any record a summary reads.
#[derive(Debug, Deserialize)]
pub(super) struct Light<'a> {
    #[serde(rename = "type", borrow)]
    pub kind: Cow<'a, str>,
    #[serde(default)]
    pub version: u32,
    #[serde(borrow)]
    pub plan_id: Cow<'a, str>,
    #[serde(borrow)]
    pub task_id: Cow<'a, str>,
    #[serde(borrow)]
    pub session_id: Cow<'a, str>,
    #[serde(default)]
    pub execution_count: Option<u64>,
    #[serde(default, borrow)]
    pub timestamp: Option<Cow<'a, str>>,
    #[serde(default)]
    pub success: Option<bool>,
    #[serde(default)]
    pub elapsed_ms: Option<f64>,
    #[serde(default)]
    pub cpu_ms: Option<f64>,
    #[serde(default)]
    pub peak_rss_kb: Option<u64>,
    #[serde(default, borrow)]
    pub error_type: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub added_imports: Vec<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub code: Option<Cow<'a, str>>,
    /// Event records: the event's name.
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    /// Session records: `start` or `end`.
    #[serde(default, borrow)]
    pub event: Option<Cow<'a, str>>,
}

/// Calls `f` for every record of `file` in the light view, reporting skipped lines. Returns
/// the number of lines skipped.
pub(super) fn each_light(file: &Path, mut f: impl FnMut(&Light<'_>)) -> usize {
    each_line(file, |no, line, skips| {
        match serde_json::from_slice::<Light<'_>>(line) {
            Ok(r) if r.version > FORMAT_VERSION => skips.skip(
                file,
                no,
                &format!(
                    "format version {} is newer than {FORMAT_VERSION}",
                    r.version
                ),
            ),
            Ok(r) => f(&r),
            Err(e) => skips.skip(file, no, &format!("not a record: {e}")),
        }
    })
}

/// How many slowest cells a summary names.
const SLOWEST: usize = 5;
/// How many error types, modules and event names it lists.
const TOP: usize = 10;

#[derive(Default)]
struct Summary {
    files: usize,
    records: usize,
    skipped: usize,
    cells: u64,
    failures: u64,
    elapsed: Vec<f32>,
    elapsed_total: f64,
    cpu_total: f64,
    cpu: Vec<f32>,
    peak_rss_kb: u64,
    errors: HashMap<String, u64>,
    imports: HashMap<String, u64>,
    events: HashMap<String, u64>,
    sessions: u64,
    /// (elapsed, plan, task, session, execution_count, code head), slowest first.
    slowest: Vec<(f64, String, String, String, u64, String)>,
    first: Option<String>,
    last: Option<String>,
}

impl Summary {
    fn add(&mut self, r: &Light<'_>) {
        self.records += 1;
        if let Some(t) = &r.timestamp {
            if self.first.as_deref().is_none_or(|f| **t < *f) {
                self.first = Some(t.to_string());
            }
            if self.last.as_deref().is_none_or(|l| **t > *l) {
                self.last = Some(t.to_string());
            }
        }
        match &*r.kind {
            "execution" => {
                self.cells += 1;
                if r.success == Some(false) {
                    self.failures += 1;
                    let kind = r.error_type.as_deref().unwrap_or("?");
                    *self.errors.entry(kind.to_owned()).or_default() += 1;
                }
                let e = r.elapsed_ms.unwrap_or(0.0);
                self.elapsed.push(e as f32);
                self.elapsed_total += e;
                if let Some(c) = r.cpu_ms {
                    self.cpu.push(c as f32);
                    self.cpu_total += c;
                }
                self.peak_rss_kb = self.peak_rss_kb.max(r.peak_rss_kb.unwrap_or(0));
                // Top-level packages, once per cell: `numpy`, not each of its submodules.
                let mut tops: Vec<&str> = r
                    .added_imports
                    .iter()
                    .map(|m| m.split('.').next().unwrap_or(m))
                    .filter(|m| !m.starts_with('_'))
                    .collect();
                tops.sort_unstable();
                tops.dedup();
                for top in tops {
                    if let Some(n) = self.imports.get_mut(top) {
                        *n += 1;
                    } else {
                        self.imports.insert(top.to_owned(), 1);
                    }
                }
                let slow_enough =
                    self.slowest.len() < SLOWEST || self.slowest.last().is_some_and(|s| e > s.0);
                if slow_enough {
                    let code = head(r.code.as_deref().unwrap_or(""), 1, 60);
                    self.slowest.push((
                        e,
                        r.plan_id.to_string(),
                        r.task_id.to_string(),
                        r.session_id.to_string(),
                        r.execution_count.unwrap_or(0),
                        code,
                    ));
                    self.slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
                    self.slowest.truncate(SLOWEST);
                }
            }
            "event" => {
                if let Some(n) = &r.name {
                    if let Some(c) = self.events.get_mut(&**n) {
                        *c += 1;
                    } else {
                        self.events.insert(n.to_string(), 1);
                    }
                }
            }
            "session" if r.event.as_deref() == Some("start") => self.sessions += 1,
            _ => {}
        }
    }
}

/// The `q` quantile of `v` (sorted in place), or 0.
fn quantile(v: &mut [f32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable_by(f32::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize] as f64
}

fn top(map: HashMap<String, u64>, key: &str) -> Vec<serde_json::Value> {
    let mut v: Vec<(String, u64)> = map.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter()
        .take(TOP)
        .map(|(k, n)| json!({ key: k, "count": n }))
        .collect()
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// `stats`.
pub fn run(log_dir: &Path, scope: &Scope) -> Result<Read, LogCmdError> {
    let files = scoped_files(log_dir, scope)?;
    let mut s = Summary {
        files: files.len(),
        ..Summary::default()
    };
    for f in &files {
        s.skipped += each_light(f, |r| s.add(r));
    }
    let records = s.records;
    let p50 = quantile(&mut s.elapsed, 0.5);
    let p95 = quantile(&mut s.elapsed, 0.95);
    let max = s.elapsed.last().copied().unwrap_or(0.0) as f64;
    let cpu_p50 = quantile(&mut s.cpu, 0.5);
    let doc = json!({
        "log_dir": log_dir,
        "plan_id": scope.plan,
        "task_id": scope.task,
        "files": s.files,
        "records": s.records,
        "skipped_lines": s.skipped,
        "sessions": s.sessions,
        "cells": s.cells,
        "failures": s.failures,
        "success_rate": if s.cells > 0 { round3(1.0 - s.failures as f64 / s.cells as f64) } else { 0.0 },
        "elapsed_ms": {"p50": round3(p50), "p95": round3(p95), "max": round3(max), "total": round3(s.elapsed_total)},
        "cpu_ms": {"p50": round3(cpu_p50), "total": round3(s.cpu_total)},
        "peak_rss_kb_max": s.peak_rss_kb,
        "first": s.first,
        "last": s.last,
        "top_errors": top(s.errors, "error_type"),
        "slowest": s.slowest.iter().map(|(e, p, t, sess, n, code)| json!({
            "plan_id": p, "task_id": t, "session_id": sess, "execution_count": n,
            "elapsed_ms": round3(*e), "code": code,
        })).collect::<Vec<_>>(),
        "imports": top(s.imports, "module"),
        "events": top(s.events, "name"),
    });
    if scope.json {
        print_json(&doc)?;
    } else {
        print_people(&doc)?;
    }
    Ok(Read::from_count(records))
}

/// The summary for people.
fn print_people(d: &serde_json::Value) -> Result<(), LogCmdError> {
    let mut lines = Vec::new();
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    let f = |a: &str, b: &str| d[a][b].as_f64().unwrap_or(0.0);
    let scope = match (d["plan_id"].as_str(), d["task_id"].as_str()) {
        (Some(p), Some(t)) => format!("plan {p}, task {t}"),
        (Some(p), None) => format!("plan {p}"),
        _ => "every plan".to_owned(),
    };
    lines.push(format!(
        "{} ({} files, {} records, {} sessions)",
        paint(&scope, Colour::Bold),
        n("files"),
        n("records"),
        n("sessions")
    ));
    let failures = n("failures");
    let failed = format!("{failures} failed");
    lines.push(format!(
        "cells: {}, {}, success rate {:.1}%",
        n("cells"),
        if failures > 0 {
            paint(&failed, Colour::Red)
        } else {
            paint(&failed, Colour::Green)
        },
        d["success_rate"].as_f64().unwrap_or(0.0) * 100.0
    ));
    lines.push(format!(
        "elapsed: p50 {}, p95 {}, max {}, total {}",
        ms(f("elapsed_ms", "p50")),
        ms(f("elapsed_ms", "p95")),
        ms(f("elapsed_ms", "max")),
        ms(f("elapsed_ms", "total"))
    ));
    lines.push(format!(
        "cpu: p50 {}, total {}; peak RSS {:.1} MB",
        ms(f("cpu_ms", "p50")),
        ms(f("cpu_ms", "total")),
        n("peak_rss_kb_max") as f64 / 1024.0
    ));
    if let (Some(a), Some(b)) = (d["first"].as_str(), d["last"].as_str()) {
        lines.push(format!("activity: {a} to {b}"));
    }
    let list = |title: &str, key: &str, name: &str| -> Option<String> {
        let items = d[key].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if items.is_empty() {
            return None;
        }
        let text: Vec<String> = items
            .iter()
            .map(|i| format!("{} ({})", i[name].as_str().unwrap_or("?"), i["count"]))
            .collect();
        Some(format!("{title}: {}", text.join(", ")))
    };
    lines.extend(list("errors", "top_errors", "error_type"));
    lines.extend(list("imports", "imports", "module"));
    lines.extend(list("events", "events", "name"));
    let slowest = d["slowest"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if !slowest.is_empty() {
        let mut t = table(&["elapsed", "plan", "task", "cell", "code"]);
        for s in slowest {
            t.add_row(vec![
                ms(s["elapsed_ms"].as_f64().unwrap_or(0.0)),
                s["plan_id"].as_str().unwrap_or("").to_owned(),
                s["task_id"].as_str().unwrap_or("").to_owned(),
                format!(
                    "{} ({})",
                    s["execution_count"],
                    super::short_id(s["session_id"].as_str().unwrap_or(""))
                ),
                s["code"].as_str().unwrap_or("").to_owned(),
            ]);
        }
        lines.push(format!("slowest cells:\n{t}"));
    }
    say(lines.join("\n"))
}
