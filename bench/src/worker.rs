//! Worker mode (USE_SUBPROCESS_WORKER=1): the same cells through the kernel and a
//! `flowrepl-worker`, crash recovery, and idle memory.

use crate::kernel::Anchors;
use crate::peer::{kernel_cmd, request, rss_of, Peer};
use crate::stats::{measure, ok_reply, stats, target};
use crate::Args;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn worker_target(name: &str, value: f64, limit: f64) {
    target(name, value, limit, false);
}

/// Worker mode (issue 3): the same cells through the kernel and a `flowrepl-worker`.
pub fn run(args: &Args, python: &str, logs: &Path, anchors: &Anchors) {
    let (n_small, n_big, _) = args.counts();
    let (pipe_small, repl_big) = (&anchors.pipe_small, &anchors.repl_big);
    let small = request("x = 1");
    let big = request("print('a' * 1_000_000)");
    let crash = request("import os; os._exit(1)");
    let mut k = Peer::spawn(kernel_cmd(&args.kernel, logs, true), true);
    let ready: Value = serde_json::from_slice(&k.line).unwrap();
    let worker_pid = ready["params"]["worker_pid"].as_u64().unwrap() as u32;
    std::thread::sleep(Duration::from_millis(200));
    let rss_idle = k.rss_kb() + rss_of(worker_pid);
    let w_small = stats(measure(&mut k, &small, 500, n_small, &ok_reply));
    let w_big = stats(measure(&mut k, &big, 5, n_big, &ok_reply));
    let n_crash = if args.quick { 5 } else { 15 };
    let mut recover = Vec::new();
    for _ in 0..n_crash {
        let t = Instant::now();
        k.round_trip(&crash);
        assert_eq!(k.reply()["result"]["error"]["type"], "WorkerDied");
        k.round_trip(&small);
        ok_reply(&k);
        recover.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(k);
    let recover = stats(recover);
    let mut py_start = Vec::new();
    for _ in 0..n_crash {
        let t = Instant::now();
        let st = Command::new(python).args(["-c", "pass"]).status().unwrap();
        assert!(st.success());
        py_start.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let py_start = stats(py_start);
    let bare = {
        let mut c = Command::new(python);
        c.args([
            "-c",
            "import sys; print('ready', flush=True); sys.stdin.read()",
        ]);
        let mut p = Peer::spawn(c, false);
        p.read_line();
        std::thread::sleep(Duration::from_millis(100));
        p.rss_kb()
    };

    println!("\nworker mode (USE_SUBPROCESS_WORKER=1; µs unless noted)\n");
    println!(
        "{:<34} {:>11} {:>11} {:>11} {:>9}",
        "", "flowrepl", "anchor", "", "ratio"
    );
    let row = |name: &str, v: f64, anchor: f64, what: &str| {
        println!(
            "{name:<34} {v:>11.1} {anchor:>11.1} {what:>11} {:>8.2}x",
            v / anchor
        );
    };
    row(
        "x = 1 round trip p50",
        w_small.p50,
        pipe_small.p50,
        "raw pipe",
    );
    row(
        "x = 1 round trip p99",
        w_small.p99,
        pipe_small.p99,
        "raw pipe",
    );
    row(
        "1 MB print round trip p50",
        w_big.p50,
        repl_big.p50,
        "plain REPL",
    );
    row(
        "crash -> next good reply p50",
        recover.p50,
        py_start.p50,
        "python -c",
    );
    row(
        "RSS idle, kernel + worker (MB)",
        rss_idle as f64 / 1024.0,
        bare as f64 / 1024.0,
        "bare python",
    );
    println!("\ntargets (worker mode issue):");
    worker_target(
        "worker x = 1 p50 / raw pipe p50",
        w_small.p50 / pipe_small.p50,
        2.5,
    );
    worker_target(
        "worker 1 MB print p50 / plain REPL p50",
        w_big.p50 / repl_big.p50,
        0.7,
    );
    worker_target(
        "crash -> next good reply p50 / python -c pass p50",
        recover.p50 / py_start.p50,
        5.0,
    );
}
