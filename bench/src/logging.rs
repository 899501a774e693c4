//! The cost of the task log per cell: `x = 1` with the log against `--no-log`, interleaved in
//! rounds (both kernels alive, alternating which goes first), in one run.

use crate::peer::{kernel_cmd, request, Peer};
use crate::stats::{measure, ok_reply, stats, target};
use crate::Args;
use std::path::Path;

/// Measures and prints the logging overhead.
pub fn run(args: &Args, logs: &Path) {
    let rounds = if args.quick { 4 } else { 10 };
    let n = if args.quick { 500 } else { 2000 };
    let small = request("x = 1");
    let mut with_log = Peer::spawn(kernel_cmd(&args.kernel, logs, false), true);
    let mut cmd = kernel_cmd(&args.kernel, logs, false);
    cmd.arg("--no-log");
    let mut without = Peer::spawn(cmd, true);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let one = |p: &mut Peer, into: &mut Vec<f64>| {
            into.extend(measure(p, &small, 100, n, &ok_reply));
        };
        if r % 2 == 0 {
            one(&mut with_log, &mut a);
            one(&mut without, &mut b);
        } else {
            one(&mut without, &mut b);
            one(&mut with_log, &mut a);
        }
    }
    let (a, b) = (stats(a), stats(b));
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
