//! `flow.event` inside a cell (issue 10): p50 of 2,000 calls, net of the timing itself, in
//! both modes. Target: ≤ 5 µs. (That a cell without events pays nothing is the A/B of
//! `--baseline` against a build without `flow`.)

use crate::peer::{kernel_cmd, request, Peer};
use crate::stats::{ok_reply, target};
use crate::Args;
use std::path::Path;

const CELL: &str = r#"import time
pc = time.perf_counter_ns
ts, base = [], []
for i in range(2000):
    t0 = pc(); flow.event('x'); ts.append(pc() - t0)
for i in range(2000):
    t0 = pc(); base.append(pc() - t0)
ts.sort(); base.sort()
(ts[1000] - base[1000]) / 1000"#;

/// Measures and prints the figure for each mode.
pub fn run(args: &Args, logs: &Path) {
    println!("\nflow events (issue 10)\n");
    for (label, worker) in [("in-process", false), ("worker", true)] {
        let mut k = Peer::spawn(kernel_cmd(&args.kernel, logs, worker), true);
        k.round_trip(&request(CELL));
        ok_reply(&k);
        let us: f64 = k.reply()["result"]["result"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("a number");
        target(&format!("flow.event('x') p50 µs, {label}"), us, 5.0, false);
    }
}
