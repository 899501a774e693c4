//! The cell monitor: one thread, started once, that watches a running cell.
//!
//! It ticks every [`TICK`] (or at the deadline) and, while a cell runs,
//! - when the cell's timeout passes, sends SIGINT to the executing thread with
//!   `pthread_kill`. Python's handler turns it into `KeyboardInterrupt` there, which also
//!   breaks `time.sleep` and other blocking calls. If the cell swallows the interrupt, it is
//!   sent again every second;
//! - when a cell's output passes the per-stream limit, releases the middle of it (see
//!   [`crate::capture`]), so a runaway `print` loop cannot exhaust memory.
//!
//! While the cell waits for a person (`flow.request_approval`), its deadline is on hold
//! ([`CellClock::hold`]): the time spent waiting does not count against its timeout.
//!
//! Between cells it keeps applying the output limit to what background threads and child
//! processes write, ticking once a second after a second without cells.
//!
//! Starting a cell costs no syscall and wakes nothing: [`Monitor::begin`] only records the
//! cell; the next tick sees it (and sleeps exactly until the deadline from then on). Only a
//! timeout shorter than a tick, or a monitor ticking slowly (no cell for a second), gets an
//! explicit wake-up. Waking the thread on every cell cost ~8% of the kernel's CPU time on
//! `x = 1` and a cross-CPU wake-up.
//!
//! SIGINT is blocked on this thread, so signals aimed at the process land on the Python side.
//! The state lives behind one mutex that both threads hold only briefly; a signal is only
//! ever sent while the cell it was meant for is still marked running, and [`Monitor::end`]
//! reports whether one was sent so the executor can absorb a late one.

use crate::capture::{file_size, kept_ranges, punch_hole};
use crate::sink::Streamer;
use crate::tail::{read_stream, OutputTail};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often the monitor looks at a running cell.
pub const TICK: Duration = Duration::from_millis(50);
/// Idle ticks before the monitor slows down to [`SLOW_TICK`].
const IDLE_TICKS_BEFORE_SLOW: u32 = 20;
/// How often an idle monitor looks at output written between cells (by background threads
/// or child processes), which the output limit bounds too.
const SLOW_TICK: Duration = Duration::from_secs(1);
const RESEND: Duration = Duration::from_secs(1);
use flowrepl_os::{lock, PAGE};
use nix::sys::pthread::pthread_kill;
use nix::sys::signal::Signal;

#[derive(Debug)]
struct State {
    running: bool,
    deadline: Instant,
    /// When SIGINT was last sent for the running cell because its timeout passed.
    fired_at: Option<Instant>,
    /// SIGINT was sent to the running cell on request ([`Interrupter::interrupt`]).
    interrupted: bool,
    /// When the first SIGINT (timeout or request) was sent to the running cell.
    first_sent: Option<Instant>,
    /// Holds on the running cell's deadline, and since when it is held.
    holds: u32,
    held_since: Option<Instant>,
    /// Per stream: where the running cell's output starts, and up to where its dropped
    /// middle has been released.
    starts: Vec<u64>,
    released: Vec<u64>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    streams: Vec<Arc<OwnedFd>>,
    target: nix::sys::pthread::Pthread,
    max_output_bytes: u64,
    /// The monitor ticks slowly and must be woken to see a cell in time.
    slow: AtomicBool,
    /// Worker mode: output is streamed on every tick while a cell runs.
    streamer: Option<Arc<Streamer>>,
}

/// Handle to the monitor thread. Create it on the thread that executes cells.
#[derive(Debug)]
pub struct Monitor {
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

impl Monitor {
    /// Starts the monitor for cells run on the calling thread.
    pub fn start(
        streams: Vec<Arc<OwnedFd>>,
        max_output_bytes: u64,
        streamer: Option<Arc<Streamer>>,
    ) -> std::io::Result<Monitor> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                running: false,
                deadline: Instant::now(),
                fired_at: None,
                interrupted: false,
                first_sent: None,
                holds: 0,
                held_since: None,
                starts: vec![0; streams.len()],
                released: vec![0; streams.len()],
            }),
            streams,
            target: nix::sys::pthread::pthread_self(),
            max_output_bytes,
            slow: AtomicBool::new(false),
            streamer,
        });
        let s = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("flowrepl-monitor".into())
            .spawn(move || run(&s))?;
        Ok(Monitor { shared, thread })
    }

    /// A cell starts now; `starts` are the streams' current read offsets.
    pub fn begin(&self, timeout: Duration, starts: &[u64]) {
        {
            let mut st = lock(&self.shared.state);
            st.running = true;
            st.deadline = Instant::now() + timeout;
            st.fired_at = None;
            st.interrupted = false;
            st.first_sent = None;
            st.holds = 0;
            st.held_since = None;
            st.starts.copy_from_slice(starts);
            st.released.copy_from_slice(starts);
        }
        // SeqCst pairs with the monitor's store-then-recheck before it parks for good.
        if timeout < TICK || self.shared.slow.load(Ordering::SeqCst) {
            self.thread.thread().unpark();
        }
    }

    /// The cell ended; says whether SIGINT was sent to it, and why.
    pub fn end(&self) -> Stopped {
        let mut st = lock(&self.shared.state);
        st.running = false;
        Stopped {
            timeout: st.fired_at.take().is_some(),
            interrupt: std::mem::take(&mut st.interrupted),
        }
    }

    /// After the cell's output was read: output from `cursors` on is unread (background
    /// writers may add to it before the next cell), and the limit applies to it.
    pub fn idle_from(&self, cursors: &[u64]) {
        let mut st = lock(&self.shared.state);
        st.starts.copy_from_slice(cursors);
        st.released.copy_from_slice(cursors);
    }

    /// A handle other threads use to interrupt the running cell.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter {
            shared: Arc::clone(&self.shared),
        }
    }

    /// A handle that holds the running cell's deadline while it waits for a person.
    pub fn clock(&self) -> CellClock {
        CellClock {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Holds the running cell's deadline: time spent under a hold does not count against the
/// cell's timeout.
#[derive(Debug, Clone)]
pub struct CellClock {
    shared: Arc<Shared>,
}

impl CellClock {
    /// Holds the deadline until the returned guard is dropped (holds nest).
    pub fn hold(&self) -> Held<'_> {
        let mut st = lock(&self.shared.state);
        if st.running {
            if st.holds == 0 {
                st.held_since = Some(Instant::now());
            }
            st.holds += 1;
        }
        Held {
            clock: self,
            active: st.running,
        }
    }
}

/// A hold on the running cell's deadline ([`CellClock::hold`]); dropping it moves the
/// deadline on by the time held.
#[derive(Debug)]
pub struct Held<'a> {
    clock: &'a CellClock,
    active: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        let mut st = lock(&self.clock.shared.state);
        if st.holds == 0 {
            return; // the cell ended and the next one reset the holds
        }
        st.holds -= 1;
        if st.holds == 0 {
            if let Some(since) = st.held_since.take() {
                st.deadline += since.elapsed();
            }
        }
    }
}

/// Why SIGINT was sent to a cell (both can be true).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Its timeout passed.
    pub timeout: bool,
    /// An interrupt was requested.
    pub interrupt: bool,
}

impl Stopped {
    /// Whether SIGINT was sent at all.
    pub fn any(self) -> bool {
        self.timeout || self.interrupt
    }
}

/// Interrupts the running cell from any thread: SIGINT to the executing thread, so the cell
/// gets `KeyboardInterrupt`. Sent under the same lock as the timeout's, so it can never hit
/// a cell other than the one running when it was asked for.
#[derive(Debug, Clone)]
pub struct Interrupter {
    shared: Arc<Shared>,
}

impl Interrupter {
    /// Interrupts the running cell; false if no cell is running.
    pub fn interrupt(&self) -> bool {
        let mut st = lock(&self.shared.state);
        if !st.running {
            return false;
        }
        // `target` is the executing thread, alive for the process's life.
        let _ = pthread_kill(self.shared.target, Signal::SIGINT);
        st.interrupted = true;
        st.first_sent.get_or_insert_with(Instant::now);
        true
    }

    /// While a cell runs: what it has written so far, the last line of each stream and its
    /// last `recent` bytes (see [`crate::tail::read_stream`]). None when no cell runs.
    pub fn output_tail(&self, recent: usize) -> Option<OutputTail> {
        let starts = {
            let st = lock(&self.shared.state);
            if !st.running {
                return None;
            }
            [st.starts[0], st.starts[1]]
        };
        let mut tail = OutputTail::default();
        for (i, fd) in self.shared.streams.iter().take(2).enumerate() {
            read_stream(&mut tail, i, fd.as_fd(), starts[i], recent);
        }
        Some(tail)
    }

    /// While a cell runs that has been sent SIGINT (timeout or request): when the first one
    /// was sent. A cell still running long after is not responding to signals.
    pub fn sigint_since(&self) -> Option<Instant> {
        let st = lock(&self.shared.state);
        if st.running {
            st.first_sent
        } else {
            None
        }
    }
}

fn run(shared: &Shared) {
    flowrepl_os::block_sigint();
    let mut idle_ticks = 0;
    loop {
        let mut running = false;
        let wait = {
            let mut st = lock(&shared.state);
            let st = &mut *st;
            // Output past the limit is released whether a cell runs or not: a background
            // `yes` started by a cell writes between cells too.
            limit_output(shared, &st.starts, &mut st.released);
            if st.running {
                running = true;
                idle_ticks = 0;
                let now = Instant::now();
                if st.holds == 0 && now >= st.deadline {
                    let due = st.fired_at.is_none_or(|t| now.duration_since(t) >= RESEND);
                    if due {
                        let _ = pthread_kill(shared.target, Signal::SIGINT);
                        st.fired_at = Some(now);
                        st.first_sent.get_or_insert(now);
                    }
                }
                let until_deadline = st.deadline.saturating_duration_since(now);
                if until_deadline.is_zero() || st.holds > 0 {
                    TICK
                } else {
                    TICK.min(until_deadline)
                }
            } else if idle_ticks < IDLE_TICKS_BEFORE_SLOW {
                idle_ticks += 1;
                TICK
            } else {
                shared.slow.store(true, Ordering::SeqCst);
                // A cell may have begun before the flag was visible: look once more.
                if st.running {
                    shared.slow.store(false, Ordering::SeqCst);
                    continue;
                }
                SLOW_TICK
            }
        };
        // Outside the state lock: sending may wait for the kernel to read.
        if let (true, Some(streamer)) = (running, &shared.streamer) {
            streamer.pump();
        }
        thread::park_timeout(wait);
        if shared.slow.swap(false, Ordering::SeqCst) {
            idle_ticks = 0;
        }
    }
}

/// Releases the memory of the part of each stream's output that will be dropped anyway.
fn limit_output(shared: &Shared, starts: &[u64], released: &mut [u64]) {
    let max = shared.max_output_bytes;
    for ((fd, &start), done) in shared.streams.iter().zip(starts).zip(released) {
        let fd = fd.as_fd();
        let Ok(size) = file_size(fd) else { continue };
        if size.saturating_sub(start) <= max {
            continue;
        }
        let (head_end, tail_start) = kept_ranges(start, size, max);
        // Whole pages strictly inside the dropped range only: the kept bytes stay intact.
        let from = head_end.div_ceil(PAGE).max(done.div_ceil(PAGE)) * PAGE;
        let to = tail_start / PAGE * PAGE;
        if to > from && punch_hole(fd, from, to).is_ok() {
            *done = to;
        }
    }
}
