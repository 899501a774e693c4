//! Limits on output.

use flowrepl_tests::Kernel;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// Bytes a cell wrote to stdout, from its kept output and the drop marker.
fn bytes_written(out: &str) -> u64 {
    let dropped = out
        .split("[flowrepl: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    dropped + out.len() as u64
}

/// The most the capture file may hold while a writer runs at `rate` bytes/s: the kept output
/// plus what can be written between two releases of memory (`lag`, a few monitor ticks),
/// with 2 MB of slack. Without the releases it would hold everything written.
fn allowed(limit: u64, rate: f64, lag: Duration) -> u64 {
    2 * limit + (2 << 20) + (rate * lag.as_secs_f64()) as u64
}

/// Memory held by the kernel's stdout capture file: its allocated blocks (released ranges do
/// not count). The file is never mapped, so RSS would not show it.
fn capture_bytes_held(pid: u32) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/fd/1"))
        .unwrap()
        .blocks()
        * 512
}

#[test]
fn output_over_the_limit_keeps_head_and_tail() {
    let mut k = Kernel::options()
        .env("FLOWREPL_MAX_OUTPUT_BYTES", "100000")
        .start();
    let r = k.ok("for i in range(200_000):\n    print(f'line {i}')");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with("line 0\nline 1\n"));
    assert!(out.ends_with("line 199999\n"));
    assert!(out.contains("bytes of output dropped here"), "marker");
    assert!(out.len() < 100_000, "{}", out.len());
    assert!(
        r["warnings"][0].as_str().unwrap().contains("dropped"),
        "{r}"
    );
    // The next cell is unaffected.
    assert_eq!(k.ok("print('small')")["stdout"], "small\n");
}

#[test]
fn a_runaway_print_loop_holds_bounded_memory() {
    let mut k = Kernel::options()
        .env("FLOWREPL_MAX_OUTPUT_BYTES", "1000000")
        .start();
    // Gigabytes of output in a few seconds; without the limit the memfd would hold it all.
    let req = serde_json::json!({"jsonrpc": "2.0", "id": "loop", "method": "execute_code", "params": {
        "code": "import os\nchunk = b'y' * 65536 + b'\\n'\nwhile True:\n    os.write(1, chunk)",
        "timeout_ms": 4000
    }});
    k.send_raw(format!("{req}\n").as_bytes());
    k.wait_busy();
    // Measure while the cell still runs: after it, reading the output releases it anyway.
    std::thread::sleep(Duration::from_secs(2));
    let held = capture_bytes_held(k.pid());
    let r = k.recv()["result"].clone();
    assert_eq!(r["timed_out"], true);
    let out = r["stdout"].as_str().unwrap();
    assert!(out.len() < 1_100_000, "{}", out.len());
    // Running, the monitor releases memory every 50 ms tick; allow 5 ticks of lag.
    let rate = bytes_written(out) as f64 / 4.0;
    let bound = allowed(1_000_000, rate, Duration::from_millis(250));
    assert!(
        held < bound,
        "capture memory not released while the cell ran: {held} bytes held, at most {bound} allowed ({rate:.0} bytes/s written)"
    );
}

#[test]
fn a_background_writer_between_cells_is_bounded_too() {
    let mut k = Kernel::options()
        .env("FLOWREPL_MAX_OUTPUT_BYTES", "1000000")
        .start();
    // `yes` keeps the cell's fd 1 and writes as fast as it can, between cells too.
    k.ok("import subprocess; p = subprocess.Popen(['yes'])");
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let held = capture_bytes_held(k.pid());
    let r = k.ok("p.kill(); p.wait()");
    let out = r["stdout"].as_str().unwrap();
    // Idle, the monitor ticks once a second; allow 1.5 s of lag (without the releases the
    // file would hold all 3 s).
    let rate = bytes_written(out) as f64 / started.elapsed().as_secs_f64();
    let bound = allowed(1_000_000, rate, Duration::from_millis(1500));
    assert!(
        held < bound,
        "output between cells not bounded: {held} bytes held, at most {bound} allowed ({rate:.0} bytes/s written)"
    );
    assert!(
        out.starts_with("y\ny\n") && out.contains("bytes of output dropped here"),
        "{}",
        &out[..100]
    );
    assert!(out.len() < 1_100_000);
    // Later cells are clean again.
    assert_eq!(k.ok("print('after')")["stdout"], "after\n");
}
