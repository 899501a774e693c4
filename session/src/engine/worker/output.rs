//! A cell's output out of the capture files the kernel holds, and the progress tail.

use super::pump::Collecting;
use super::Worker;
use flowrepl_exec::tail::{last_line, TAIL_BYTES};
use std::os::fd::AsFd;

impl Worker {
    /// What the cell wrote that did not arrive as Output frames (`received` bytes per stream
    /// did), read from the kernel's handle on the capture files up to `ends` (a worker's
    /// Done) or to their current size (a worker that died), with the output limit applied as
    /// the worker applies it: the kept head, the marker, the last quarter. One `pread` per
    /// range, straight into the buffer the reply is made from.
    pub(super) fn read_output(&self, received: [usize; 2], ends: Option<[u64; 2]>) -> [Vec<u8>; 2] {
        use flowrepl_exec::capture::{drop_marker, file_size, kept_ranges, pread_into};
        let Some(p) = self.state.process() else {
            return Default::default();
        };
        let max = self.spawn.max_output_bytes;
        let mut out: [Vec<u8>; 2] = Default::default();
        for i in 0..2 {
            let fd = p.capture[i].as_fd();
            // The ends a Done frame says are the worker's word (a cell can forge frames): never
            // past what the capture file really holds.
            let real = match file_size(fd) {
                Ok(s) => s,
                Err(_) => continue,
            };
            let size = ends.map_or(real, |e| e[i].min(real));
            let start = self.capture_next[i].min(size);
            let from = start.saturating_add(received[i] as u64);
            let read = |buf: &mut Vec<u8>, a: u64, b: u64| {
                if b <= a {
                    return;
                }
                let at = buf.len();
                buf.resize(at + (b - a) as usize, 0);
                let mut n = 0;
                while at + n < buf.len() {
                    match pread_into(fd, &mut buf[at + n..], a + n as u64) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                }
                buf.truncate(at + n);
            };
            if size.saturating_sub(start) <= max {
                read(&mut out[i], from, size);
            } else {
                let (head_end, tail_start) = kept_ranges(start, size, max);
                read(&mut out[i], from, head_end);
                out[i].extend_from_slice(drop_marker(tail_start - head_end, max).as_bytes());
                read(&mut out[i], tail_start.max(from), size);
            }
        }
        out
    }

    /// `claimed` capture offsets (from a Ready or Done frame: the worker's word) cut to what
    /// the capture files really hold.
    pub(super) fn real_capture_ends(&self, claimed: [u64; 2]) -> [u64; 2] {
        let Some(p) = self.state.process() else {
            return [0; 2];
        };
        std::array::from_fn(|i| {
            flowrepl_exec::capture::file_size(p.capture[i].as_fd()).map_or(0, |s| claimed[i].min(s))
        })
    }

    /// Publishes the running cell's output so far to [`WorkerControl::output_tail`].
    pub(super) fn update_tail(&self, c: &Collecting) {
        let mut st = self.control.lock();
        for (i, bytes) in [&c.stdout, &c.stderr].into_iter().enumerate() {
            if st.tail.bytes[i] != bytes.len() as u64 {
                st.tail.bytes[i] = bytes.len() as u64;
                st.tail.last_line[i] = last_line(&bytes[bytes.len().saturating_sub(TAIL_BYTES)..]);
            }
        }
    }
}
