//! The JSON-RPC kernel in-process against the raw pipe and a plain Python NDJSON REPL
//! (`bench/plain_repl.py`: exec + redirect_stdout, no diff, no log).

use crate::peer::{kernel_cmd, request, Peer};
use crate::stats::{measure, no_check, ok_reply, stats, target, Stats};
use crate::Args;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The anchors the worker section compares against.
pub struct Anchors {
    /// Raw pipe, `x = 1`-sized line.
    pub pipe_small: Stats,
    /// Plain REPL, 1 MB print.
    pub repl_big: Stats,
}

/// Measures and prints the in-process figures; returns the anchors for the worker section.
pub fn run(args: &Args, python: &str, logs: &Path) -> Anchors {
    let (n_small, n_big, n_start) = args.counts();
    let small = request("x = 1");
    let big = request("print('a' * 1_000_000)");

    // Cold starts, interleaved so that machine noise hits both alike.
    let mut starts = (Vec::new(), Vec::new());
    for _ in 0..n_start {
        starts.0.push(
            Peer::spawn(kernel_cmd(&args.kernel, logs, false), true)
                .start
                .as_secs_f64()
                * 1e3,
        );
        let mut c = Command::new(python);
        c.arg(args.bench_dir.join("plain_repl.py"));
        starts
            .1
            .push(Peer::spawn(c, true).start.as_secs_f64() * 1e3);
    }

    // The floor: raw pipe ping-pong.
    let mut echo_cmd = Command::new(std::env::current_exe().unwrap());
    echo_cmd.arg("echo");
    let mut pipe = Peer::spawn(echo_cmd, false);
    let pipe_small = stats(measure(&mut pipe, &small, 500, n_small, &no_check));
    let pipe_big = stats(measure(&mut pipe, b"SIZE 1000000\n", 5, n_big, &no_check));
    drop(pipe);

    // The plain Python REPL.
    let mut c = Command::new(python);
    c.arg(args.bench_dir.join("plain_repl.py"));
    let mut repl = Peer::spawn(c, true);
    let repl_rss_idle = repl.rss_kb();
    let repl_small = stats(measure(&mut repl, &small, 500, n_small, &ok_reply));
    let repl_big = stats(measure(&mut repl, &big, 5, n_big, &ok_reply));
    let t = Instant::now();
    measure(&mut repl, &small, 0, n_small, &no_check);
    let repl_rate = n_small as f64 / t.elapsed().as_secs_f64();
    drop(repl);

    // flowrepl.
    let mut k = Peer::spawn(kernel_cmd(&args.kernel, logs, false), true);
    let k_rss_idle = k.rss_kb();
    let phases = std::cell::RefCell::new(Vec::new());
    let k_small = stats(measure(&mut k, &small, 500, n_small, &|p: &Peer| {
        let v = p.reply();
        assert_eq!(v["result"]["success"], true, "cell failed: {v}");
        let d = &v["result"]["debug_info"];
        let ph = &d["phases_us"];
        let f = |k: &str| ph[k].as_f64().unwrap();
        phases.borrow_mut().push([
            f("compile"),
            f("exec"),
            f("capture"),
            f("diff"),
            d["elapsed_ms"].as_f64().unwrap() * 1000.0,
        ]);
    }));
    let phases = phases.into_inner();
    let phase_p50 = |i: usize| stats(phases.iter().map(|p| p[i]).collect()).p50;
    let k_big = stats(measure(&mut k, &big, 5, n_big, &ok_reply));
    let t = Instant::now();
    measure(&mut k, &small, 0, n_small, &no_check);
    let k_rate = n_small as f64 / t.elapsed().as_secs_f64();
    k.round_trip(&request(
        "for i in range(10_000):\n    globals()[f'g{i}'] = i",
    ));
    ok_reply(&k);
    let diffs = std::cell::RefCell::new(Vec::new());
    let k_10k = stats(measure(&mut k, &small, 200, n_small / 2, &|p: &Peer| {
        let v = p.reply();
        assert_eq!(v["result"]["variable_count"], 10_002, "{v}");
        diffs.borrow_mut().push(
            v["result"]["debug_info"]["phases_us"]["diff"]
                .as_f64()
                .unwrap(),
        );
    }));
    let k_diff = stats(diffs.into_inner());
    let k_rss_after = k.rss_kb();
    drop(k);
    let py_cycle: f64 = {
        let out = Command::new(python)
            .arg(args.bench_dir.join("diff_cycle.py"))
            .args(["10000", if args.quick { "500" } else { "2000" }])
            .output()
            .expect("diff_cycle.py");
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .expect("diff_cycle.py output")
    };

    let start_k = stats(starts.0);
    let start_repl = stats(starts.1);
    println!(
        "flowrepl bench ({} x=1 round trips, {} 1 MB prints, {} cold starts; µs unless noted)\n",
        n_small, n_big, n_start
    );
    println!(
        "{:<34} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "", "flowrepl", "raw pipe", "plain REPL", "/pipe", "/REPL"
    );
    let row = |name: &str, k: f64, pipe: Option<f64>, repl: Option<f64>| {
        let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        let r = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.2}x", k / v));
        println!(
            "{name:<34} {k:>11.1} {:>11} {:>11} {:>9} {:>9}",
            f(pipe),
            f(repl),
            r(pipe),
            r(repl)
        );
    };
    row(
        "x = 1 round trip p50",
        k_small.p50,
        Some(pipe_small.p50),
        Some(repl_small.p50),
    );
    row(
        "x = 1 round trip p99",
        k_small.p99,
        Some(pipe_small.p99),
        Some(repl_small.p99),
    );
    row(
        "1 MB print round trip p50",
        k_big.p50,
        Some(pipe_big.p50),
        Some(repl_big.p50),
    );
    row(
        "1 MB print round trip p99",
        k_big.p99,
        Some(pipe_big.p99),
        Some(repl_big.p99),
    );
    row(
        "x = 1 with 10k globals p50",
        k_10k.p50,
        Some(pipe_small.p50),
        Some(repl_small.p50),
    );
    row(
        "x = 1 with 10k globals p99",
        k_10k.p99,
        Some(pipe_small.p99),
        Some(repl_small.p99),
    );
    println!(
        "{:<34} {:>11.1} {:>11} {:>11.1} {:>9} {:>8.3}x",
        "diff cost, 10k globals p50",
        k_diff.p50,
        "-",
        py_cycle,
        "-",
        k_diff.p50 / py_cycle
    );
    println!(
        "{:<34} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "  (REPL column: Python set-diff cycle)", "", "", "", "", ""
    );
    row(
        "cold start to ready p50 (ms)",
        start_k.p50,
        None,
        Some(start_repl.p50),
    );
    row("sequential execs/s", k_rate, None, Some(repl_rate));
    row(
        "RSS idle (MB)",
        k_rss_idle as f64 / 1024.0,
        None,
        Some(repl_rss_idle as f64 / 1024.0),
    );
    println!(
        "{:<34} {:>11.1}",
        "RSS after the runs (MB)",
        k_rss_after as f64 / 1024.0
    );
    println!(
        "{:<34} {:>11.1} {:>11.1} {:>11.1}",
        "x = 1 round trip mean", k_small.mean, pipe_small.mean, repl_small.mean
    );
    println!(
        "x = 1 inside the executor, p50 µs: compile {:.0}, exec {:.0}, capture {:.0}, diff {:.0}; whole cell {:.0}",
        phase_p50(0),
        phase_p50(1),
        phase_p50(2),
        phase_p50(3),
        phase_p50(4)
    );

    println!("\ntargets (core kernel issue):");
    target(
        "x = 1 p50 / raw pipe p50",
        k_small.p50 / pipe_small.p50,
        1.3,
        false,
    );
    target(
        "x = 1 p50 / plain REPL p50",
        k_small.p50 / repl_small.p50,
        0.6,
        false,
    );
    target(
        "1 MB print p50 / plain REPL p50",
        k_big.p50 / repl_big.p50,
        0.5,
        false,
    );
    target(
        "diff cost p50 / Python set-diff cycle p50",
        k_diff.p50 / py_cycle,
        0.25,
        false,
    );
    target(
        "cold start p50 / plain REPL start p50",
        start_k.p50 / start_repl.p50,
        1.0,
        false,
    );
    target("sequential execs/s", k_rate, 3000.0, true);
    Anchors {
        pipe_small,
        repl_big,
    }
}
