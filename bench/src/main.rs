//! flowrepl's benchmark: every figure next to its anchors, measured in one run on this
//! machine, with the ratio the core kernel issue sets as a target.
//!
//! Anchors: a raw pipe ping-pong between two processes (this binary in `echo` mode: the
//! floor for any request/reply over pipes) and a plain Python NDJSON REPL
//! (`bench/plain_repl.py`: exec + redirect_stdout, no diff, no log). Run it with `bench/run`.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
    start: Duration,
}

impl Peer {
    fn spawn(mut cmd: Command, wait_ready: bool) -> Peer {
        let t = Instant::now();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            stdin,
            stdout,
            line: Vec::with_capacity(2 << 20),
            start: Duration::ZERO,
        };
        if wait_ready {
            p.read_line();
            assert!(
                p.line_str().contains("__READY__"),
                "no ready line: {}",
                p.line_str()
            );
        }
        p.start = t.elapsed();
        p
    }

    fn read_line(&mut self) {
        self.line.clear();
        let n = self.stdout.read_until(b'\n', &mut self.line).expect("read");
        assert!(n > 0, "peer closed its stdout");
    }

    fn line_str(&self) -> &str {
        std::str::from_utf8(&self.line).unwrap_or("<not utf-8>")
    }

    /// Sends a request line and waits for the whole reply line; returns the round trip.
    fn round_trip(&mut self, req: &[u8]) -> Duration {
        let t = Instant::now();
        self.stdin.write_all(req).unwrap();
        self.read_line();
        t.elapsed()
    }

    fn reply(&self) -> Value {
        serde_json::from_slice(&self.line).expect("reply is JSON")
    }

    fn rss_kb(&self) -> u64 {
        rss_of(self.child.id())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn request(code: &str) -> Vec<u8> {
    let mut v = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "execute_code", "params": {"code": code}
    }))
    .unwrap();
    v.push(b'\n');
    v
}

#[derive(Clone, Copy)]
struct Stats {
    p50: f64,
    p99: f64,
    mean: f64,
}

fn stats(mut us: Vec<f64>) -> Stats {
    us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    Stats {
        p50: at(0.5),
        p99: at(0.99),
        mean: us.iter().sum::<f64>() / us.len() as f64,
    }
}

/// Round trips of `req` in microseconds, after `warm` unmeasured ones. Checks each reply
/// with `check` (outside the timed part).
fn measure(p: &mut Peer, req: &[u8], warm: usize, n: usize, check: &dyn Fn(&Peer)) -> Vec<f64> {
    for _ in 0..warm {
        p.round_trip(req);
        check(p);
    }
    (0..n)
        .map(|_| {
            let d = p.round_trip(req);
            check(p);
            d.as_secs_f64() * 1e6
        })
        .collect()
}

fn ok_reply(p: &Peer) {
    let v = p.reply();
    assert_eq!(v["result"]["success"], true, "cell failed: {v}");
}

fn no_check(_: &Peer) {}

struct Args {
    kernel: PathBuf,
    bench_dir: PathBuf,
    quick: bool,
}

fn parse_args() -> Option<Args> {
    let mut a = std::env::args().skip(1);
    let mut args = Args {
        kernel: PathBuf::from("target/release/flowrepl"),
        bench_dir: PathBuf::from("bench"),
        quick: false,
    };
    while let Some(x) = a.next() {
        match x.as_str() {
            "echo" => return None,
            "--kernel" => args.kernel = a.next().expect("--kernel PATH").into(),
            "--bench-dir" => args.bench_dir = a.next().expect("--bench-dir PATH").into(),
            "--quick" => args.quick = true,
            other => panic!("unknown argument {other}"),
        }
    }
    Some(args)
}

/// `echo` mode: the raw pipe peer. Replies to each line with the same line, or with `N`
/// bytes when the line is `SIZE N`.
fn echo() {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut line = Vec::new();
    let mut big = Vec::new();
    let mut r = stdin.lock();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line).unwrap() == 0 {
            return;
        }
        if let Some(n) = line.strip_prefix(b"SIZE ") {
            let n: usize = std::str::from_utf8(n).unwrap().trim().parse().unwrap();
            big.clear();
            big.resize(n, b'a');
            big.push(b'\n');
            out.write_all(&big).unwrap();
        } else {
            out.write_all(&line).unwrap();
        }
        out.flush().unwrap();
    }
}

fn real_python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn kernel_cmd(kernel: &Path, logs: &Path) -> Command {
    let mut c = Command::new(kernel);
    c.env("FLOWREPL_LOG_DIR", logs).env("FLOWREPL_LOG", "warn");
    c
}

fn main() {
    let Some(args) = parse_args() else {
        echo();
        return;
    };
    let python = real_python();
    let logs = std::env::temp_dir().join(format!("flowrepl-bench-{}", std::process::id()));
    let (n_small, n_big, n_start) = if args.quick {
        (1000, 20, 5)
    } else {
        (5000, 100, 15)
    };
    let small = request("x = 1");
    let big = request("print('a' * 1_000_000)");

    // Cold starts, interleaved so that machine noise hits both alike.
    let mut starts = (Vec::new(), Vec::new());
    for _ in 0..n_start {
        starts.0.push(
            Peer::spawn(kernel_cmd(&args.kernel, &logs), true)
                .start
                .as_secs_f64()
                * 1e3,
        );
        let mut c = Command::new(&python);
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
    let mut c = Command::new(&python);
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
    let mut k = Peer::spawn(kernel_cmd(&args.kernel, &logs), true);
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
        let out = Command::new(&python)
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
    let target = |name: &str, value: f64, limit: f64, higher_is_better: bool| {
        let pass = if higher_is_better {
            value >= limit
        } else {
            value <= limit
        };
        let op = if higher_is_better { ">=" } else { "<=" };
        println!(
            "  [{}] {name}: {value:.2} {op} {limit}",
            if pass { "PASS" } else { "MISS" }
        );
    };
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

    worker_section(
        &args,
        &python,
        &logs,
        n_small,
        n_big,
        &pipe_small,
        &repl_big,
    );
    let _ = std::fs::remove_dir_all(&logs);
}

fn print_target(name: &str, value: f64, limit: f64) {
    println!(
        "  [{}] {name}: {value:.2} <= {limit}",
        if value <= limit { "PASS" } else { "MISS" }
    );
}

/// VmRSS of a process, in KiB (0 if it is gone).
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Worker mode (issue 3): the same cells through the kernel and a `flowrepl-worker`.
fn worker_section(
    args: &Args,
    python: &str,
    logs: &Path,
    n_small: usize,
    n_big: usize,
    pipe_small: &Stats,
    repl_big: &Stats,
) {
    let small = request("x = 1");
    let big = request("print('a' * 1_000_000)");
    let crash = request("import os; os._exit(1)");
    let mut cmd = kernel_cmd(&args.kernel, logs);
    cmd.env("USE_SUBPROCESS_WORKER", "1");
    let mut k = Peer::spawn(cmd, true);
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
    print_target(
        "worker x = 1 p50 / raw pipe p50",
        w_small.p50 / pipe_small.p50,
        2.5,
    );
    print_target(
        "worker 1 MB print p50 / plain REPL p50",
        w_big.p50 / repl_big.p50,
        0.7,
    );
    print_target(
        "crash -> next good reply p50 / python -c pass p50",
        recover.p50 / py_start.p50,
        5.0,
    );
}
