//! `flowrepl log ls`: every task with its cells, failures, sessions and activity.

use super::stats::each_light;
use super::table::{paint, table, Colour};
use super::{print_json, say, scoped_files, LogCmdError, Read, Scope};
use serde_json::json;
use std::collections::HashSet;
use std::path::Path;

/// `ls`.
pub fn run(log_dir: &Path, scope: &Scope) -> Result<Read, LogCmdError> {
    let files = scoped_files(log_dir, scope)?;
    let mut tasks = Vec::new();
    let mut records = 0;
    for file in &files {
        let (mut plan, mut task) = (None, None);
        let (mut cells, mut failures, mut n) = (0u64, 0u64, 0usize);
        let mut sessions = HashSet::new();
        let (mut first, mut last): (Option<String>, Option<String>) = (None, None);
        let skipped = each_light(file, |r| {
            n += 1;
            plan.get_or_insert_with(|| r.plan_id.to_string());
            task.get_or_insert_with(|| r.task_id.to_string());
            if !sessions.contains(&*r.session_id) {
                sessions.insert(r.session_id.to_string());
            }
            if r.kind == "execution" {
                cells += 1;
                failures += u64::from(r.success == Some(false));
            }
            if let Some(t) = &r.timestamp {
                if first.as_deref().is_none_or(|f| **t < *f) {
                    first = Some(t.to_string());
                }
                if last.as_deref().is_none_or(|l| **t > *l) {
                    last = Some(t.to_string());
                }
            }
        });
        records += n;
        // Ids come from the records (the file names are their escaped forms).
        let stem = |p: Option<&std::ffi::OsStr>| {
            p.map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        tasks.push(json!({
            "plan_id": plan.unwrap_or_else(|| stem(file.parent().and_then(Path::file_name))),
            "task_id": task.unwrap_or_else(|| stem(file.file_stem())),
            "file": file,
            "records": n,
            "cells": cells,
            "failures": failures,
            "sessions": sessions.len(),
            "first": first,
            "last": last,
            "skipped_lines": skipped,
        }));
    }
    if scope.json {
        print_json(&json!({"log_dir": log_dir, "tasks": tasks}))?;
    } else if tasks.is_empty() {
        eprintln!("flowrepl log: no task logs in {}", log_dir.display());
    } else {
        let mut t = table(&[
            "plan", "task", "cells", "failed", "sessions", "first", "last",
        ]);
        for x in &tasks {
            let failed = x["failures"].as_u64().unwrap_or(0);
            let s = |k: &str| x[k].as_str().unwrap_or("-").to_owned();
            t.add_row(vec![
                s("plan_id"),
                s("task_id"),
                x["cells"].to_string(),
                if failed > 0 {
                    paint(&failed.to_string(), Colour::Red)
                } else {
                    failed.to_string()
                },
                x["sessions"].to_string(),
                s("first"),
                s("last"),
            ]);
        }
        say(t)?;
    }
    Ok(Read::from_count(records))
}
