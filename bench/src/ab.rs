//! `--baseline OLD`: an interleaved A/B of two kernel builds on the same cells, in one run.
//! Each round starts both kernels (in a rotating order, so that machine noise hits both
//! alike) in each mode and measures cold start, `x = 1` and a 1 MB print; the table gives the
//! medians over all rounds and the new/old ratio.

use crate::peer::{kernel_cmd, request, Peer};
use crate::stats::{measure, ok_reply, stats};
use crate::Args;
use std::path::Path;

const METRICS: [&str; 6] = [
    "cold start, in-process (ms)",
    "cold start, worker (ms)",
    "x = 1 p50, in-process (µs)",
    "x = 1 p50, worker (µs)",
    "1 MB print p50, in-process (µs)",
    "1 MB print p50, worker (µs)",
];

/// Samples of one kernel build, per metric.
type Samples = [Vec<f64>; 6];

fn one_round(kernel: &Path, logs: &Path, n_small: usize, n_big: usize, into: &mut Samples) {
    let small = request("x = 1");
    let big = request("print('a' * 1_000_000)");
    for (m, worker) in [(0, false), (1, true)] {
        let mut k = Peer::spawn(kernel_cmd(kernel, logs, worker), true);
        into[m].push(k.start.as_secs_f64() * 1e3);
        into[2 + m].extend(measure(&mut k, &small, 200, n_small, &ok_reply));
        into[4 + m].extend(measure(&mut k, &big, 3, n_big, &ok_reply));
    }
}

/// Measures `args.kernel` against `baseline` and prints the table.
pub fn run(args: &Args, baseline: &Path, logs: &Path) {
    let rounds = if args.quick { 4 } else { 10 };
    let (n_small, n_big) = if args.quick { (300, 5) } else { (1000, 15) };
    let mut old: Samples = Default::default();
    let mut new: Samples = Default::default();
    for r in 0..rounds {
        if r % 2 == 0 {
            one_round(baseline, logs, n_small, n_big, &mut old);
            one_round(&args.kernel, logs, n_small, n_big, &mut new);
        } else {
            one_round(&args.kernel, logs, n_small, n_big, &mut new);
            one_round(baseline, logs, n_small, n_big, &mut old);
        }
    }
    println!(
        "A/B, interleaved, {rounds} rounds: old = {}, new = {}\n",
        baseline.display(),
        args.kernel.display()
    );
    println!("{:<34} {:>11} {:>11} {:>9}", "", "old", "new", "new/old");
    for (i, name) in METRICS.iter().enumerate() {
        let o = stats(std::mem::take(&mut old[i])).p50;
        let n = stats(std::mem::take(&mut new[i])).p50;
        println!("{name:<34} {o:>11.1} {n:>11.1} {:>8.2}x", n / o);
    }
}
