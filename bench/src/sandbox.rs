//! `--sandbox`: what confinement costs, interleaved in one run (issue 23): a worker
//! sandboxed and not, from the same build. Worker start (a `restart`: the old worker stopped,
//! a new one spawned until it is ready), `x = 1`, and crash → next good reply; next to E2B's
//! published start (~150 ms) and a measured `bwrap` start when bwrap is installed.

use crate::peer::{kernel_cmd, request, Peer};
use crate::stats::{measure, ok_reply, stats, target};
use crate::Args;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const METRICS: [&str; 4] = [
    "cold start, kernel + worker (ms)",
    "worker restart -> ready (ms)",
    "x = 1 p50 (µs)",
    "crash -> next good reply p50 (ms)",
];

type Samples = [Vec<f64>; 4];

fn one_round(args: &Args, logs: &Path, sandboxed: bool, n_small: usize, into: &mut Samples) {
    let mut cmd = kernel_cmd(&args.kernel, logs, true);
    if sandboxed {
        cmd.arg("--sandbox").arg("--workspace").arg(logs);
    }
    let mut k = Peer::spawn(cmd, true);
    into[0].push(k.start.as_secs_f64() * 1e3);
    let restart = br#"{"jsonrpc":"2.0","id":7,"method":"restart"}
"#;
    for _ in 0..3 {
        into[1].push(k.round_trip(restart).as_secs_f64() * 1e3);
        assert_eq!(k.reply()["result"]["restarted"], true, "{}", k.reply());
    }
    into[2].extend(measure(&mut k, &request("x = 1"), 200, n_small, &ok_reply));
    let crash = request("import os; os._exit(1)");
    let small = request("x = 1");
    for _ in 0..3 {
        let t = Instant::now();
        k.round_trip(&crash);
        assert_eq!(k.reply()["result"]["error"]["type"], "WorkerDied");
        k.round_trip(&small);
        ok_reply(&k);
        into[3].push(t.elapsed().as_secs_f64() * 1e3);
    }
}

/// A `bwrap` sandbox's start (`true` in new namespaces with the system read-only), if bwrap is
/// installed: the p50 in ms.
fn bwrap_start() -> Option<f64> {
    let mut times = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        let st = Command::new("bwrap")
            .args([
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--unshare-all",
                "--die-with-parent",
                "true",
            ])
            .status()
            .ok()?;
        if !st.success() {
            return None;
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Some(stats(times).p50)
}

/// Measures and prints the table and the targets.
pub fn run(args: &Args, logs: &Path) {
    std::fs::create_dir_all(logs).unwrap();
    let rounds = if args.quick { 4 } else { 10 };
    let n_small = if args.quick { 300 } else { 1000 };
    let mut plain: Samples = Default::default();
    let mut boxed: Samples = Default::default();
    for r in 0..rounds {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for sandboxed in order {
            let into = if sandboxed { &mut boxed } else { &mut plain };
            one_round(args, logs, sandboxed, n_small, into);
        }
    }
    println!(
        "\nsandbox (--sandbox against the same worker without it; interleaved, {rounds} rounds)\n"
    );
    println!(
        "{:<36} {:>11} {:>11} {:>9}",
        "", "worker", "sandboxed", "ratio"
    );
    let mut p50 = [0.0; 4];
    let mut base = [0.0; 4];
    for (i, name) in METRICS.iter().enumerate() {
        base[i] = stats(std::mem::take(&mut plain[i])).p50;
        p50[i] = stats(std::mem::take(&mut boxed[i])).p50;
        println!(
            "{name:<36} {:>11.2} {:>11.2} {:>8.2}x",
            base[i],
            p50[i],
            p50[i] / base[i]
        );
    }
    println!(
        "{:<36} {:>11} {:>11.0}",
        "E2B sandbox start (published, ms)", "", 150.0
    );
    match bwrap_start() {
        Some(ms) => println!(
            "{:<36} {:>11} {:>11.2}",
            "bwrap --unshare-all true p50 (ms)", "", ms
        ),
        None => println!("{:<36} {:>11} {:>11}", "bwrap start", "", "not installed"),
    }
    println!("\ntargets (sandbox issue):");
    target(
        "sandboxed restart p50 / worker restart p50",
        p50[1] / base[1],
        1.3,
        false,
    );
    target(
        "sandboxed restart p50 - worker restart p50 (ms)",
        p50[1] - base[1],
        10.0,
        false,
    );
    target(
        "sandboxed x = 1 p50 / worker x = 1 p50",
        p50[2] / base[2],
        1.05,
        false,
    );
    target(
        "sandboxed crash -> next reply p50 (ms)",
        p50[3],
        150.0,
        false,
    );
}
