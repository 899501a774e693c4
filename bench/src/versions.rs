//! Every CPython version the build serves: cold start against a plain Python REPL of the same
//! version, and in-process `x = 1` against the same figure on 3.11, measured interleaved in one
//! run (one interpreter per version: the first [`flowrepl_pythons::discover`] finds).

use crate::peer::{kernel_cmd, request, Peer};
use crate::stats::{measure, ok_reply, stats, target};
use crate::Args;
use flowrepl_pythons::Version;
use std::path::Path;
use std::process::Command;

/// Measures and prints the per-version table.
pub fn run(args: &Args, logs: &Path) {
    let (n_small, _, n_start) = args.counts();
    let mut found = flowrepl_pythons::discover();
    found.dedup_by_key(|f| f.version);
    let mut rows = Vec::new();
    for f in &found {
        let kernel = || {
            let mut c = kernel_cmd(&args.kernel, logs, false);
            c.arg("--python").arg(&f.program);
            c
        };
        // A build without a kernel for this version says so at start: leave it out.
        let probe = kernel().output().ok();
        if probe.is_some_and(|o| o.status.code() == Some(2)) {
            println!("  Python {}: no kernel in this build; skipped", f.version);
            continue;
        }
        let (mut k_start, mut repl_start) = (Vec::new(), Vec::new());
        for _ in 0..n_start {
            k_start.push(Peer::spawn(kernel(), true).start.as_secs_f64() * 1e3);
            let mut c = Command::new(&f.program);
            c.arg(args.bench_dir.join("plain_repl.py"));
            repl_start.push(Peer::spawn(c, true).start.as_secs_f64() * 1e3);
        }
        let mut k = Peer::spawn(kernel(), true);
        let small = stats(measure(
            &mut k,
            &request("x = 1"),
            300,
            n_small / 2,
            &ok_reply,
        ));
        rows.push((
            f.version,
            stats(k_start).p50,
            stats(repl_start).p50,
            small.p50,
        ));
    }
    println!("\nPython versions (in-process; cold start in ms, x = 1 in µs)");
    println!(
        "{:<10} {:>12} {:>12} {:>8} {:>10} {:>9}",
        "", "cold start", "plain REPL", "/REPL", "x = 1 p50", "/3.11"
    );
    let base = rows
        .iter()
        .find(|r| {
            r.0 == Version {
                major: 3,
                minor: 11,
            }
        })
        .map(|r| r.3);
    for (v, ks, rs, x) in &rows {
        let vs_base = base.map_or("-".to_owned(), |b| format!("{:.2}x", x / b));
        println!(
            "{:<10} {ks:>12.1} {rs:>12.1} {:>7.2}x {x:>10.1} {vs_base:>9}",
            format!("{v}"),
            ks / rs
        );
    }
    for (v, ks, rs, x) in &rows {
        target(
            &format!("cold start, Python {v} / plain REPL of {v}"),
            ks / rs,
            1.0,
            false,
        );
        if let (Some(b), true) = (base, v.minor >= 12) {
            target(
                &format!("x = 1 on Python {v} / on 3.11"),
                x / b,
                1.10,
                false,
            );
        }
    }
}
