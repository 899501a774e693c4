//! What the task log and checkpoints cost per cell: `x = 1` with each on against off, in
//! interleaved rounds (both kernels alive, alternating which goes first), in one run.

use crate::peer::{kernel_cmd, request, Peer};
use crate::stats::{measure, ok_reply, stats, target, Stats};
use crate::Args;
use std::path::Path;
use std::process::Command;

/// `x = 1` round trips of kernels `a` and `b`, interleaved: (a's, b's).
pub(crate) fn interleaved(args: &Args, a: Command, b: Command) -> (Stats, Stats, usize, usize) {
    let rounds = if args.quick { 4 } else { 10 };
    let n = if args.quick { 500 } else { 2000 };
    let small = request("x = 1");
    let mut a = Peer::spawn(a, true);
    let mut b = Peer::spawn(b, true);
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let one = |p: &mut Peer, into: &mut Vec<f64>| {
            into.extend(measure(p, &small, 100, n, &ok_reply));
        };
        if r % 2 == 0 {
            one(&mut a, &mut sa);
            one(&mut b, &mut sb);
        } else {
            one(&mut b, &mut sb);
            one(&mut a, &mut sa);
        }
    }
    (stats(sa), stats(sb), rounds, n)
}

/// Measures and prints the logging overhead.
pub fn run(args: &Args, logs: &Path) {
    let mut without = kernel_cmd(&args.kernel, logs, false);
    without.arg("--no-log");
    let (a, b, rounds, n) = interleaved(args, kernel_cmd(&args.kernel, logs, false), without);
    println!("\ntask log cost per cell (x = 1 round trip, µs, {rounds} interleaved rounds of {n})");
    println!("{:<24} {:>10} {:>10}", "", "p50", "p99");
    println!("{:<24} {:>10.1} {:>10.1}", "with the log", a.p50, a.p99);
    println!("{:<24} {:>10.1} {:>10.1}", "--no-log", b.p50, b.p99);
    println!("{:<24} {:>10.1}", "difference", a.p50 - b.p50);
    target(
        "logging overhead per cell, p50 µs",
        a.p50 - b.p50,
        5.0,
        false,
    );
}

/// Measures and prints what automatic checkpoints cost `x = 1`, in both modes: on-success
/// against off, then every-cell against on-success.
pub fn checkpoints(args: &Args, logs: &Path) {
    println!("\ncheckpoints' cost per cell (x = 1 round trip, µs, FLOWREPL_CHECKPOINTS=on-success against off, interleaved)");
    let ratios = policy_ab(args, logs, "on-success", "off");
    for (mode, r) in ratios {
        target(
            &format!("x = 1 with checkpoints / without, p50, {mode}"),
            r,
            1.10,
            false,
        );
    }
    println!("\nevery-cell against on-success (x = 1 round trip back to back, µs, interleaved: every-cell writes before the next cell starts)");
    policy_ab(args, logs, "every-cell", "on-success");
}

/// One interleaved A/B of `x = 1` per mode between checkpoint policies `a` and `b`: prints a
/// table, returns the p50 ratios by mode.
fn policy_ab(args: &Args, logs: &Path, a: &str, b: &str) -> Vec<(&'static str, f64)> {
    println!(
        "{:<12} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "",
        format!("{a} p50"),
        format!("{b} p50"),
        format!("{a} p99"),
        format!("{b} p99"),
        "ratio"
    );
    let mut ratios = Vec::new();
    for (mode, worker) in [("in-process", false), ("worker", true)] {
        let mut first = kernel_cmd(&args.kernel, logs, worker);
        first.env("FLOWREPL_CHECKPOINTS", a);
        let mut second = kernel_cmd(&args.kernel, logs, worker);
        second.env("FLOWREPL_CHECKPOINTS", b);
        let (x, y, _, _) = interleaved(args, first, second);
        println!(
            "{mode:<12} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>7.2}x",
            x.p50,
            y.p50,
            x.p99,
            y.p99,
            x.p50 / y.p50
        );
        ratios.push((mode, x.p50 / y.p50));
    }
    ratios
}
