//! Limits on output.

use flowrepl_tests::Kernel;

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
    // About 1 GB of output in a few seconds; without the limit the memfd would hold it all.
    let r = k.execute_params(serde_json::json!({
        "code": "import os\nchunk = b'y' * 65536 + b'\\n'\nwhile True:\n    os.write(1, chunk)",
        "timeout_ms": 3000
    }));
    assert_eq!(r["timed_out"], true);
    let out = r["stdout"].as_str().unwrap();
    assert!(out.len() < 1_100_000, "{}", out.len());
    let status = std::fs::read_to_string(format!("/proc/{}/status", k.pid())).unwrap();
    let shmem_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("RssShmem:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        shmem_kb < 300_000,
        "capture memory not released: {shmem_kb} kB"
    );
}
