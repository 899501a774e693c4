//! Timing samples and their summaries.

use crate::peer::Peer;

/// A summary of samples.
#[derive(Clone, Copy)]
pub struct Stats {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

/// Summarizes samples.
pub fn stats(mut us: Vec<f64>) -> Stats {
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
pub fn measure(p: &mut Peer, req: &[u8], warm: usize, n: usize, check: &dyn Fn(&Peer)) -> Vec<f64> {
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

/// The reply is a successful cell.
pub fn ok_reply(p: &Peer) {
    let v = p.reply();
    assert_eq!(v["result"]["success"], true, "cell failed: {v}");
}

/// No check.
pub fn no_check(_: &Peer) {}

/// Prints a target line: `[PASS]` or `[MISS]`.
pub fn target(name: &str, value: f64, limit: f64, higher_is_better: bool) {
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
}
