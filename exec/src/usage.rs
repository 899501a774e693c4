//! Per-cell resource use: CPU time and peak RSS of the process that runs the cell.
//!
//! At the start of a cell the process's RSS high-water mark is reset (`echo 5 >
//! /proc/self/clear_refs`, through a descriptor kept open: under a microsecond) and
//! `getrusage` is read; at the end `getrusage` again. `ru_maxrss` is then the peak since the
//! reset. Limit: Linux also folds in the high-water mark of threads that exited, as it was
//! when they exited, so after a thread exits the figure cannot drop below the peak at that
//! time. CPU time counts all threads of the process, not child processes.

use flowrepl_protocol::ResourceUsage;
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Reads resource use around cells.
#[derive(Debug)]
pub struct UsageMeter {
    clear_refs: Option<File>,
    pid: u32,
}

/// Readings at the start of a cell.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    cpu_ms: f64,
}

/// CPU time (user + system, all threads) and peak RSS in KiB of this process.
fn rusage() -> (f64, u64) {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let ms = |t: TimeVal| t.tv_sec() as f64 * 1000.0 + t.tv_usec() as f64 / 1000.0;
            (
                ms(u.user_time()) + ms(u.system_time()),
                u.max_rss().max(0) as u64,
            )
        }
        Err(_) => (0.0, 0),
    }
}

impl UsageMeter {
    /// Opens `/proc/self/clear_refs` (if it cannot be, peaks are lifetime peaks); `pid` is
    /// this process's id as the kernel knows it.
    pub fn new(pid: u32) -> UsageMeter {
        UsageMeter {
            clear_refs: std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/self/clear_refs")
                .ok(),
            pid,
        }
    }

    /// Resets the RSS peak and reads the CPU time.
    pub fn begin(&self) -> Mark {
        if let Some(f) = &self.clear_refs {
            let _ = f.write_at(b"5", 0);
        }
        Mark { cpu_ms: rusage().0 }
    }

    /// What was used since `mark`, and the process's CPU time so far in milliseconds (from
    /// the same reading).
    pub fn end(&self, mark: Mark) -> (ResourceUsage, f64) {
        let (cpu_ms, peak_rss_kb) = rusage();
        let usage = ResourceUsage {
            pid: self.pid,
            cpu_ms: ((cpu_ms - mark.cpu_ms).max(0.0) * 1000.0).round() / 1000.0,
            peak_rss_kb,
        };
        (usage, cpu_ms)
    }

    /// CPU time of the process so far, in milliseconds.
    pub fn cpu_total_ms(&self) -> f64 {
        rusage().0
    }
}
