//! Limits on output.

use flowrepl_tests::Kernel;
use std::os::unix::fs::MetadataExt;

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
    // Measure while the cell still runs: after it, reading the output releases it anyway.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let held = capture_bytes_held(k.pid());
    let r = k.recv()["result"].clone();
    assert_eq!(r["timed_out"], true);
    let out = r["stdout"].as_str().unwrap();
    assert!(out.len() < 1_100_000, "{}", out.len());
    assert!(
        held < 300_000_000,
        "capture memory not released while the cell ran: {held} bytes"
    );
}

#[test]
fn a_background_writer_between_cells_is_bounded_too() {
    let mut k = Kernel::options()
        .env("FLOWREPL_MAX_OUTPUT_BYTES", "1000000")
        .start();
    // `yes` keeps the cell's fd 1 and writes as fast as it can, between cells too.
    k.ok("import subprocess; p = subprocess.Popen(['yes'])");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let held = capture_bytes_held(k.pid());
    let r = k.ok("p.kill(); p.wait()");
    assert!(
        held < 300_000_000,
        "output between cells not bounded: {held} bytes"
    );
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.starts_with("y\ny\n") && out.contains("bytes of output dropped here"),
        "{}",
        &out[..100]
    );
    assert!(out.len() < 1_100_000);
    // Later cells are clean again.
    assert_eq!(k.ok("print('after')")["stdout"], "after\n");
}
