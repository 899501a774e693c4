//! A worker's capture files as the kernel holds them: a cell's output read out of them, and
//! where the next cell's output starts.

use flowrepl_exec::capture::{drop_marker, file_size, kept_ranges, pread_into};
use std::os::fd::{AsFd, OwnedFd};

/// One worker's capture files (stdout, stderr): made by the kernel and handed over as the
/// worker's fds 3 and 4, so that what a dying worker had not sent can still be read.
#[derive(Debug)]
pub(super) struct Capture {
    /// The files.
    pub(super) files: [OwnedFd; 2],
    /// Where the next cell's output starts in them (the worker's word, from its Ready or Done
    /// frame: every reader cuts it to the files' real size).
    pub(super) next: [u64; 2],
    /// The output limit per stream and cell, applied as the worker applies it.
    max_output: u64,
}

impl Capture {
    /// The files, the next cell's output at their start.
    pub(super) fn new(files: [OwnedFd; 2], max_output: u64) -> Capture {
        Capture {
            files,
            next: [0; 2],
            max_output,
        }
    }

    /// What the cell wrote that did not arrive as Output frames (`received` bytes per stream
    /// did), read up to `ends` (a worker's Done) or to the files' current size (a worker
    /// that died), with the output limit applied as the worker applies it: the kept head,
    /// the marker, the last quarter. One `pread` per range, straight into the buffer the
    /// reply is made from.
    pub(super) fn read_output(&self, received: [usize; 2], ends: Option<[u64; 2]>) -> [Vec<u8>; 2] {
        let max = self.max_output;
        let mut out: [Vec<u8>; 2] = Default::default();
        for i in 0..2 {
            let fd = self.files[i].as_fd();
            // The ends a Done frame says are the worker's word (a cell can forge frames): never
            // past what the capture file really holds.
            let real = match file_size(fd) {
                Ok(s) => s,
                Err(_) => continue,
            };
            let size = ends.map_or(real, |e| e[i].min(real));
            let start = self.next[i].min(size);
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

    /// The output limit per stream and cell.
    pub(super) fn max_output(&self) -> u64 {
        self.max_output
    }

    /// `claimed` offsets (from a Ready or Done frame: the worker's word) cut to what the
    /// files really hold.
    pub(super) fn real_ends(&self, claimed: [u64; 2]) -> [u64; 2] {
        std::array::from_fn(|i| file_size(self.files[i].as_fd()).map_or(0, |s| claimed[i].min(s)))
    }
}
