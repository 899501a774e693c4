//! Per-cell resource use: CPU time and peak RSS of the process that runs the cell.
//!
//! At the start of a cell the process's RSS high-water mark is reset (`echo 5 >
//! /proc/self/clear_refs`, through a descriptor kept open: under a microsecond) and
//! `getrusage` is read; at the end `getrusage` again. `ru_maxrss` is then the peak since the
//! reset. Limit: Linux also folds in the high-water mark of threads that exited, as it was
//! when they exited, so after a thread exits the figure cannot drop below the peak at that
//! time. CPU time counts all threads of the process, not child processes.

use flowrepl_protocol::ResourceUsage;
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

fn rusage() -> libc::rusage {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills `ru`; RUSAGE_SELF cannot fail.
    unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    }
}

fn cpu_ms(ru: &libc::rusage) -> f64 {
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

impl Default for UsageMeter {
    fn default() -> Self {
        UsageMeter::new()
    }
}

impl UsageMeter {
    /// Opens `/proc/self/clear_refs` (if it cannot be, peaks are lifetime peaks).
    pub fn new() -> UsageMeter {
        UsageMeter {
            clear_refs: std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/self/clear_refs")
                .ok(),
            pid: std::process::id(),
        }
    }

    /// Resets the RSS peak and reads the CPU time.
    pub fn begin(&self) -> Mark {
        if let Some(f) = &self.clear_refs {
            let _ = f.write_at(b"5", 0);
        }
        Mark {
            cpu_ms: cpu_ms(&rusage()),
        }
    }

    /// What was used since `mark`.
    pub fn end(&self, mark: Mark) -> ResourceUsage {
        let ru = rusage();
        ResourceUsage {
            pid: self.pid,
            cpu_ms: ((cpu_ms(&ru) - mark.cpu_ms).max(0.0) * 1000.0).round() / 1000.0,
            peak_rss_kb: ru.ru_maxrss.max(0) as u64,
        }
    }

    /// CPU time of the process so far, in milliseconds.
    pub fn cpu_total_ms(&self) -> f64 {
        cpu_ms(&rusage())
    }
}
