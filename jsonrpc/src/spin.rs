//! Whether the request thread polls for the client's next request before it sleeps, decided
//! by measuring which is faster for this client.
//!
//! On these VMs a thread that sleeps costs 30–40 µs to wake when its vCPU has gone idle, so
//! polling for a while (yielding between looks) can halve a round trip. But a thread that
//! polls keeps its CPU busy, and a client that would otherwise share that CPU with the kernel
//! (a round trip of ~18 µs) is then woken on the other one. Which wins depends on the client:
//! measured, a Python client on plain pipes did best without polling (18.7 µs against 42),
//! the Rust bench client with it (15 µs against 77). So the front tries both, [`TRIAL`]
//! requests each, keeps the one whose median wait for the next request was shorter for
//! [`KEEP`] requests, and tries again. Waits over [`THINKING`] are a client thinking, not the
//! transport: they count for neither, and the next wait sleeps (polling would only burn CPU).

use std::time::Duration;

/// Requests per arm of a trial.
pub const TRIAL: usize = 16;
/// Requests between trials.
pub const KEEP: u32 = 1024;
/// A longer wait is the client's own time.
pub const THINKING: Duration = Duration::from_millis(1);

/// The measuring state.
#[derive(Debug, Clone)]
pub struct SpinChooser {
    /// `Some(n)`: trying; `n` waits measured so far (the first `TRIAL` polling, the rest not).
    trial: Option<usize>,
    samples: [[u32; TRIAL]; 2],
    /// What was chosen, and for how many more fast waits.
    chosen: bool,
    left: u32,
    /// The last wait was the client thinking.
    thinking: bool,
}

impl Default for SpinChooser {
    fn default() -> Self {
        SpinChooser {
            trial: Some(0),
            samples: [[0; TRIAL]; 2],
            chosen: false,
            left: 0,
            thinking: false,
        }
    }
}

impl SpinChooser {
    /// Whether the next wait polls first.
    pub fn spin(&self) -> bool {
        if self.thinking {
            return false;
        }
        match self.trial {
            Some(n) => n < TRIAL,
            None => self.chosen,
        }
    }

    /// How long the last wait for a request took.
    pub fn record(&mut self, wait: Duration) {
        self.thinking = wait > THINKING;
        if self.thinking {
            return;
        }
        let us = wait.as_micros().min(u32::MAX as u128) as u32;
        match &mut self.trial {
            Some(n) => {
                self.samples[*n / TRIAL][*n % TRIAL] = us;
                *n += 1;
                if *n == 2 * TRIAL {
                    let median = |s: &[u32; TRIAL]| {
                        let mut s = *s;
                        s.sort_unstable();
                        s[TRIAL / 2]
                    };
                    self.chosen = median(&self.samples[0]) < median(&self.samples[1]);
                    self.trial = None;
                    self.left = KEEP;
                }
            }
            None => {
                self.left = self.left.saturating_sub(1);
                if self.left == 0 {
                    self.trial = Some(0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: &mut SpinChooser, n: usize, spin_us: u64, sleep_us: u64) {
        for _ in 0..n {
            let us = if c.spin() { spin_us } else { sleep_us };
            c.record(Duration::from_micros(us));
        }
    }

    #[test]
    fn keeps_the_faster_way_and_tries_again() {
        let mut c = SpinChooser::default();
        run(&mut c, 2 * TRIAL, 15, 77);
        assert!(c.spin(), "polling was faster");
        run(&mut c, KEEP as usize, 15, 77);
        // A new trial, where sleeping is now faster.
        run(&mut c, 2 * TRIAL, 42, 18);
        assert!(!c.spin());
    }

    #[test]
    fn a_thinking_client_counts_for_nothing_and_is_not_polled_for() {
        let mut c = SpinChooser::default();
        assert!(c.spin());
        c.record(Duration::from_secs(2));
        assert!(!c.spin());
        c.record(Duration::from_micros(20));
        assert!(c.spin(), "the trial goes on");
    }
}
