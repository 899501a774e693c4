//! A sandboxed worker's stderr: a pipe the kernel reads and copies to its own diagnostics
//! stream, each line marked as the worker's, at most [`MAX_BYTES`] over the worker's life.
//!
//! Handing the worker the kernel's own stderr would let a cell (which can reach every
//! descriptor of its process) truncate the diagnostics file, or append lines that read as the
//! kernel's, without bound. Through the relay it can only add marked lines, up to the cap;
//! what comes after is read and dropped (so the worker never blocks on a full pipe), with one
//! line saying so.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::sync::mpsc;
use std::time::Duration;

/// What the relay copies over a worker's life; the rest is dropped.
pub const MAX_BYTES: u64 = 1 << 20;

/// A line longer than this is cut (it is still one line in the diagnostics).
const MAX_LINE: usize = 16 << 10;

/// The relay of one worker's stderr.
#[derive(Debug)]
pub struct Relay {
    done: mpsc::Receiver<()>,
}

impl Relay {
    /// A pipe for the worker's stderr (the returned write end, for `Command::stderr`) and the
    /// thread that copies its lines to `diagnostics`, marked `[worker <pid>]` once the pid
    /// is known (`pid` is filled after the spawn).
    pub fn start(diagnostics: File) -> io::Result<(Relay, std::os::fd::OwnedFd, PidCell)> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let pid = PidCell::default();
        let shown = pid.clone();
        let (tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("flowrepl-worker-stderr".into())
            .spawn(move || {
                copy(File::from(read), diagnostics, &shown);
                let _ = tx.send(());
            })?;
        Ok((Relay { done }, write, pid))
    }

    /// Waits (at most `wait`) for the worker's last lines: the pipe ends when the worker and
    /// what it started have closed it.
    pub fn finish(&self, wait: Duration) {
        let _ = self.done.recv_timeout(wait);
    }
}

/// The worker's pid, set once it is known.
#[derive(Debug, Clone, Default)]
pub struct PidCell(std::sync::Arc<std::sync::atomic::AtomicI32>);

impl PidCell {
    /// Sets it.
    pub fn set(&self, pid: libc::pid_t) {
        self.0.store(pid, std::sync::atomic::Ordering::Relaxed);
    }
}

fn copy(from: File, mut to: File, pid: &PidCell) {
    let mut from = BufReader::new(from);
    let mut copied = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        match io::Read::take(&mut from, MAX_LINE as u64).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if copied > MAX_BYTES {
            continue;
        }
        copied += line.len() as u64;
        let who = pid.0.load(std::sync::atomic::Ordering::Relaxed);
        let mut out = format!("[worker {who}] ").into_bytes();
        if copied > MAX_BYTES {
            out.extend_from_slice(
                format!("(more than {MAX_BYTES} bytes on its stderr: the rest is dropped)\n")
                    .as_bytes(),
            );
        } else {
            out.extend_from_slice(&line);
            if !line.ends_with(b"\n") {
                out.push(b'\n');
            }
        }
        let _ = to.write_all(&out);
    }
}
