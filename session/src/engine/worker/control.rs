//! What other threads reach while a cell runs: the worker's pid, SIGINT to the running
//! cell, its output so far, the checkpoint's health.

use crate::engine::Control;
use flowrepl_exec::tail::{last_line, read_stream, OutputTail, TAIL_BYTES};
use flowrepl_os::lock;
use nix::sys::signal::Signal;
use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

#[derive(Debug, Default)]
pub(super) struct ControlState {
    pub(super) pid: Option<libc::pid_t>,
    pub(super) running: bool,
    pub(super) interrupted_at: Option<Instant>,
    /// The running cell's output so far, as far as Output frames brought it.
    pub(super) tail: OutputTail,
    /// The current worker's capture files (copies of the kernel's handles), and where the
    /// running cell's output starts in them: the tail is read from there on demand.
    pub(super) capture: Option<[std::os::fd::OwnedFd; 2]>,
    pub(super) cell_starts: [u64; 2],
    /// How the automatic checkpoint is doing, as the worker last said (`None`: off).
    pub(super) checkpoint: Option<flowrepl_protocol::CheckpointHealth>,
}

/// Shared with the fronts: the running worker's pid and the interrupt of the running cell.
#[derive(Debug, Default)]
pub struct WorkerControl {
    pub(super) state: Mutex<ControlState>,
}

impl ControlState {
    /// SIGINT to the worker if a cell runs. The worker is our unreaped child while
    /// `running`: its pid cannot have been reused.
    pub(super) fn signal_running(&self) -> bool {
        match self.pid.filter(|_| self.running) {
            Some(pid) => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGINT);
                true
            }
            None => false,
        }
    }
}

impl WorkerControl {
    pub(super) fn lock(&self) -> MutexGuard<'_, ControlState> {
        lock(&self.state)
    }

    /// Sends SIGINT again to the running cell (the stop ladder's re-send), under the same
    /// lock as [`Control::interrupt`].
    pub(super) fn signal_running(&self) {
        self.lock().signal_running();
    }

    /// Publishes the running cell's output so far (what Output frames brought) to
    /// [`Control::output_tail`].
    pub(super) fn publish_tail(&self, streams: [&[u8]; 2]) {
        let mut st = self.lock();
        for (i, bytes) in streams.into_iter().enumerate() {
            if st.tail.bytes[i] != bytes.len() as u64 {
                st.tail.bytes[i] = bytes.len() as u64;
                st.tail.last_line[i] = last_line(&bytes[bytes.len().saturating_sub(TAIL_BYTES)..]);
            }
        }
    }
}

impl Control for WorkerControl {
    /// SIGINT to the worker if a cell runs. Sent under the lock that [`Worker`](super::Worker) holds to mark
    /// the cell ended, so it never reaches a later cell (the worker discards a SIGINT that
    /// arrives between cells).
    fn interrupt(&self) -> bool {
        let mut st = self.lock();
        if !st.signal_running() {
            return false;
        }
        st.interrupted_at.get_or_insert_with(Instant::now);
        true
    }

    fn unstoppable_since(&self) -> Option<Instant> {
        None
    }

    fn checkpoint_health(&self) -> Option<flowrepl_protocol::CheckpointHealth> {
        self.lock().checkpoint.clone()
    }

    fn output_tail(&self, recent: usize) -> Option<OutputTail> {
        let st = self.lock();
        if !st.running {
            return None;
        }
        let mut tail = st.tail.clone();
        for (i, fd) in st.capture.iter().flatten().enumerate() {
            let fd = fd.as_fd();
            let moved = flowrepl_exec::capture::file_size(fd)
                .is_ok_and(|size| size.saturating_sub(st.cell_starts[i]) > tail.bytes[i]);
            if moved || recent > 0 {
                read_stream(&mut tail, i, fd, st.cell_starts[i], recent);
            }
        }
        Some(tail)
    }

    fn worker_pid(&self) -> Option<u32> {
        self.lock().pid.map(|p| p as u32)
    }
}
