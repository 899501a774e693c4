//! The stop ladder of a worker cell, as a pure function of times (no process, no clock).
//!
//! 1. The worker's own monitor sends SIGINT when the cell's timeout passes; an `interrupt`
//!    request sends SIGINT from the kernel.
//! 2. A cell that has not ended `grace` after its timeout, or `grace` after the first
//!    interrupt, is killed (SIGKILL to the worker's process group).
//!
//! Between those moments the kernel waits on the worker's pipe; [`Ladder::step`] says for how
//! long, so that an interrupt requested from another thread is noticed within
//! [`INTERRUPT_CHECK`].
//!
//! While the cell waits for an approval its timeout is on hold ([`Ladder::hold`]), as the
//! worker's own deadline is: the kill moves on by the time held. An interrupt still kills.
//!
//! While an interrupt is pending, SIGINT is sent again every [`RESEND`]: one that reached the
//! worker just before its cell began (the kernel marks the cell running before it writes the
//! Execute frame) was discarded there as a stale signal of an earlier cell.

use std::time::{Duration, Instant};

/// While no interrupt is pending, the request thread looks for one this often.
pub const INTERRUPT_CHECK: Duration = Duration::from_millis(100);
/// While an interrupt is pending, SIGINT is sent again this often.
pub const RESEND: Duration = Duration::from_millis(250);
/// After the kill, how long to wait for the pipe to close.
const AFTER_KILL: Duration = Duration::from_secs(1);
/// The shortest wait (a zero poll would spin).
const MIN_WAIT: Duration = Duration::from_millis(1);

/// Why the ladder killed a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Its timeout passed and SIGINT did not stop it.
    Timeout,
    /// An interrupt was requested and SIGINT did not stop it.
    Interrupt,
}

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read the pipe for at most this long, then ask again.
    Wait(Duration),
    /// Send SIGINT to the worker again (the interrupt may have been lost), then ask again.
    Resend,
    /// Kill the worker's process group now.
    Kill(KillReason),
}

/// One running cell's ladder.
#[derive(Debug, Clone, Copy)]
pub struct Ladder {
    kill_at: Instant,
    grace: Duration,
    killed: Option<KillReason>,
    /// The last SIGINT re-sent for a pending interrupt.
    resent_at: Option<Instant>,
    /// Since when the timeout is on hold.
    held_since: Option<Instant>,
}

impl Ladder {
    /// A cell started at `started` with `timeout`; SIGINT gets `grace` to work.
    pub fn new(started: Instant, timeout: Duration, grace: Duration) -> Ladder {
        Ladder {
            kill_at: started + timeout + grace,
            grace,
            killed: None,
            resent_at: None,
            held_since: None,
        }
    }

    /// Puts the timeout on hold (`held`: the cell waits for a person) or takes it off hold,
    /// moving the kill on by the time held.
    pub fn hold(&mut self, now: Instant, held: bool) {
        match (held, self.held_since) {
            (true, None) => self.held_since = Some(now),
            (false, Some(since)) => {
                self.kill_at += now.saturating_duration_since(since);
                self.held_since = None;
            }
            _ => {}
        }
    }

    /// Whether (and why) the ladder has killed the cell.
    pub fn killed(&self) -> Option<KillReason> {
        self.killed
    }

    /// What to do at `now`, given when an interrupt was first requested (if one was). A
    /// [`Step::Kill`] is returned once; after it, waits are for the pipe to close.
    pub fn step(&mut self, now: Instant, interrupted_at: Option<Instant>) -> Step {
        if self.killed.is_some() {
            return Step::Wait(AFTER_KILL);
        }
        let reason = if self.held_since.is_none() && now >= self.kill_at {
            Some(KillReason::Timeout)
        } else if interrupted_at.is_some_and(|t| now >= t + self.grace) {
            Some(KillReason::Interrupt)
        } else {
            None
        };
        if let Some(r) = reason {
            self.killed = Some(r);
            return Step::Kill(r);
        }
        let until_next = match interrupted_at {
            Some(t) => {
                let last = self.resent_at.map_or(t, |r| r.max(t));
                if now >= last + RESEND {
                    self.resent_at = Some(now);
                    return Step::Resend;
                }
                (t + self.grace)
                    .min(last + RESEND)
                    .saturating_duration_since(now)
            }
            None => INTERRUPT_CHECK,
        };
        let wait = match self.held_since {
            Some(_) => until_next,
            None => until_next.min(self.kill_at.saturating_duration_since(now)),
        };
        Step::Wait(wait.max(MIN_WAIT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn ladder(t0: Instant) -> Ladder {
        Ladder::new(t0, 1000 * MS, 200 * MS)
    }

    #[test]
    fn waits_in_short_steps_until_timeout_plus_grace_then_kills_once() {
        let t0 = Instant::now();
        let mut l = ladder(t0);
        assert_eq!(l.step(t0, None), Step::Wait(INTERRUPT_CHECK));
        // Close to the deadline the wait is cut to end exactly at it.
        assert_eq!(l.step(t0 + 1150 * MS, None), Step::Wait(50 * MS));
        assert_eq!(l.killed(), None);
        assert_eq!(
            l.step(t0 + 1200 * MS, None),
            Step::Kill(KillReason::Timeout)
        );
        assert_eq!(l.killed(), Some(KillReason::Timeout));
        assert_eq!(l.step(t0 + 1300 * MS, None), Step::Wait(AFTER_KILL));
    }

    #[test]
    fn an_interrupt_gets_the_grace_period_then_the_kill() {
        let t0 = Instant::now();
        let mut l = ladder(t0);
        let asked = t0 + 100 * MS;
        assert_eq!(l.step(asked, Some(asked)), Step::Wait(200 * MS));
        assert_eq!(l.step(asked + 150 * MS, Some(asked)), Step::Wait(50 * MS));
        assert_eq!(
            l.step(asked + 200 * MS, Some(asked)),
            Step::Kill(KillReason::Interrupt)
        );
        assert_eq!(l.killed(), Some(KillReason::Interrupt));
    }

    #[test]
    fn a_pending_interrupt_is_resent_until_the_kill() {
        let t0 = Instant::now();
        let mut l = Ladder::new(t0, 60_000 * MS, 1000 * MS);
        let asked = t0;
        assert_eq!(l.step(asked, Some(asked)), Step::Wait(RESEND));
        assert_eq!(l.step(asked + RESEND, Some(asked)), Step::Resend);
        assert_eq!(l.step(asked + RESEND, Some(asked)), Step::Wait(RESEND));
        assert_eq!(l.step(asked + 2 * RESEND + MS, Some(asked)), Step::Resend);
        assert_eq!(l.step(asked + 760 * MS, Some(asked)), Step::Resend);
        // The wait never passes the kill (next re-send at 1010 ms, the kill at 1000 ms).
        assert_eq!(l.step(asked + 900 * MS, Some(asked)), Step::Wait(100 * MS));
        assert_eq!(
            l.step(asked + 1000 * MS, Some(asked)),
            Step::Kill(KillReason::Interrupt)
        );
    }

    #[test]
    fn the_timeout_wins_when_it_comes_first() {
        let t0 = Instant::now();
        let mut l = ladder(t0);
        let asked = t0 + 1100 * MS; // grace would end at 1300, the timeout's at 1200
        assert_eq!(l.step(asked, Some(asked)), Step::Wait(100 * MS));
        assert_eq!(
            l.step(t0 + 1200 * MS, Some(asked)),
            Step::Kill(KillReason::Timeout)
        );
    }

    #[test]
    fn time_on_hold_does_not_count_but_an_interrupt_still_kills() {
        let t0 = Instant::now();
        let mut l = ladder(t0);
        l.hold(t0 + 500 * MS, true);
        assert_eq!(l.step(t0 + 5000 * MS, None), Step::Wait(INTERRUPT_CHECK));
        l.hold(t0 + 5000 * MS, false);
        // 4.5 s were held: the kill moves from 1.2 s to 5.7 s.
        assert_eq!(l.step(t0 + 5600 * MS, None), Step::Wait(INTERRUPT_CHECK));
        assert_eq!(
            l.step(t0 + 5700 * MS, None),
            Step::Kill(KillReason::Timeout)
        );
        let mut l = ladder(t0);
        l.hold(t0, true);
        let asked = t0 + 3000 * MS;
        assert_eq!(
            l.step(asked + 200 * MS, Some(asked)),
            Step::Kill(KillReason::Interrupt)
        );
    }

    #[test]
    fn never_a_zero_wait() {
        let t0 = Instant::now();
        let mut l = Ladder::new(t0, Duration::ZERO, Duration::from_nanos(10));
        assert_eq!(l.step(t0, None), Step::Wait(MIN_WAIT));
        let mut l = ladder(t0);
        let asked = t0;
        assert_eq!(
            l.step(t0 + 200 * MS - Duration::from_nanos(1), Some(asked)),
            Step::Wait(MIN_WAIT)
        );
    }
}
