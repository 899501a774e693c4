//! Capturing fds 1 and 2 at the file-descriptor level, with no thread and no copy per cell.
//!
//! Each stream is a `memfd` opened `O_APPEND` and `dup2`'d onto fd 1 or 2 for the life of the
//! process. Writers never block (a file, unlike a pipe, has no 64 KB buffer to drain), so there
//! is nothing to drain concurrently and no deadlock to avoid; after a cell the executor reads
//! what was appended since the last read with `pread`. Reading does not move the shared file
//! offset, so a background child that keeps writing simply appends; its bytes are reported
//! with the next cell. Consumed ranges are released with `FALLOC_FL_PUNCH_HOLE`, so memory
//! tracks the unread output only.
//!
//! Limit: past `max` bytes per stream and cell, only the first half and the last quarter of
//! the limit are reported, with a marker saying how much was dropped; while the cell runs the
//! [`crate::monitor`] releases the memory of the dropped middle, so a runaway `print` loop
//! holds about `max` bytes (plus what it writes in one 100 ms tick), not everything.

use crate::stdio::dup2;
use nix::fcntl::{fcntl, FallocateFlags, FcntlArg, OFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Of a cell's output `[start, size)` over the limit `max`: where the kept head ends and the
/// kept tail starts.
pub fn kept_ranges(start: u64, size: u64, max: u64) -> (u64, u64) {
    (start + max / 2, size - max / 4)
}

/// The line put where the output limit dropped `dropped` bytes.
pub fn drop_marker(dropped: u64, max: u64) -> String {
    format!("\n[flowrepl: {dropped} bytes of output dropped here: the cell wrote more than {max} bytes]\n")
}

/// A stream's bytes as text: invalid UTF-8 is replaced with U+FFFD, with a warning naming
/// the stream (`label`).
pub fn decode_output(bytes: Vec<u8>, label: &str, warnings: &mut Vec<String>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            warnings.push(format!(
                "{label} was not valid UTF-8; invalid bytes were replaced with U+FFFD"
            ));
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        }
    }
}

/// Appends a traceback to a cell's stderr, on a line of its own.
pub fn append_traceback(stderr: &mut String, traceback: &str) {
    if !stderr.is_empty() && !stderr.ends_with('\n') {
        stderr.push('\n');
    }
    stderr.push_str(traceback);
}

/// `pread` into `buf` at `offset`, retried on EINTR; the number of bytes read.
pub fn pread_into(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    loop {
        match nix::sys::uio::pread(fd, buf, offset as libc::off_t) {
            Err(nix::Error::EINTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Release consumed bytes once this many have accumulated.
const PUNCH_THRESHOLD: u64 = 1 << 20;
use flowrepl_os::PAGE;

/// One captured stream.
#[derive(Debug)]
pub struct Stream {
    memfd: Arc<OwnedFd>,
    target: RawFd,
    dev: u64,
    ino: u64,
    /// Bytes before this offset have been read.
    cursor: u64,
    /// Bytes before this offset have been released.
    punched: u64,
}

/// What [`Stream::collect`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    /// Bytes dropped because the cell exceeded the output limit.
    pub dropped: u64,
    /// The cell closed or replaced the fd, and it was pointed back at the capture file.
    pub restored_fd: bool,
}

/// `fstat` of a raw descriptor: the target fd (1 or 2) may have been closed by the cell, so
/// it is not borrowed as a `BorrowedFd` (which must be open); `EBADF` then says so.
fn fstat_raw(fd: RawFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills `st` on success and only reads `fd`.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: initialised by the successful call.
    Ok(unsafe { st.assume_init() })
}

/// Size of the file behind `fd`.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(nix::sys::stat::fstat(fd)?.st_size as u64)
}

/// Releases `[start, end)` of a memfd's memory; the file size does not change.
pub fn punch_hole(fd: BorrowedFd<'_>, start: u64, end: u64) -> io::Result<()> {
    if end <= start {
        return Ok(());
    }
    let mode = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(fd, mode, start as libc::off_t, (end - start) as libc::off_t)?;
    Ok(())
}

impl Stream {
    fn install(name: &CStr, target: RawFd, given: Option<OwnedFd>) -> io::Result<Stream> {
        let memfd = match given {
            Some(fd) => fd,
            None => memfd_create(name, MFdFlags::MFD_CLOEXEC)?,
        };
        // O_APPEND on the shared open file description: every writer (children included)
        // appends, whatever the offset.
        fcntl(&memfd, FcntlArg::F_SETFL(OFlag::O_APPEND))?;
        let st = nix::sys::stat::fstat(&memfd)?;
        dup2(memfd.as_fd(), target)?;
        Ok(Stream {
            memfd: Arc::new(memfd),
            target,
            dev: st.st_dev,
            ino: st.st_ino,
            cursor: 0,
            punched: 0,
        })
    }

    /// The capture file, for the monitor.
    pub fn memfd(&self) -> Arc<OwnedFd> {
        Arc::clone(&self.memfd)
    }

    /// Offset up to which output has been read: where the next cell's output starts.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Current size of the capture file, checking first that the target fd still points at
    /// it; if the cell closed or replaced it, it is pointed back.
    fn size_checked(&mut self, restored: &mut bool) -> io::Result<u64> {
        match fstat_raw(self.target) {
            Ok(st) if st.st_dev == self.dev && st.st_ino == self.ino => {
                return Ok(st.st_size as u64)
            }
            _ => {}
        }
        dup2(self.memfd.as_fd(), self.target)?;
        *restored = true;
        file_size(self.memfd.as_fd())
    }

    /// For streaming ([`crate::sink`]): the final size of the cell's output, with the same
    /// fd check as [`Stream::collect`]; the caller sends up to it, then calls
    /// [`Stream::advance`]. Also says whether the fd had to be restored.
    pub fn settle(&mut self) -> io::Result<(u64, bool)> {
        let mut restored = false;
        let size = self.size_checked(&mut restored)?;
        Ok((size, restored))
    }

    /// Output up to `to` was consumed (streamed).
    pub fn advance(&mut self, to: u64) {
        self.cursor = to;
        self.punched = self.punched.max(to / PAGE * PAGE);
    }

    /// Appends everything written since the last call to `out`. When that is more than `max`
    /// bytes, only the first `max / 2` and the last `max / 4` are kept, with a marker between.
    /// (The monitor releases memory only strictly inside the dropped range, so both kept parts
    /// are always intact.)
    pub fn collect(&mut self, out: &mut Vec<u8>, max: u64) -> io::Result<Collected> {
        let mut c = Collected::default();
        let size = self.size_checked(&mut c.restored_fd)?;
        if size - self.cursor > max {
            let (head_end, tail_start) = kept_ranges(self.cursor, size, max);
            self.read_range(self.cursor, head_end, out)?;
            c.dropped = tail_start - head_end;
            out.extend_from_slice(drop_marker(c.dropped, max).as_bytes());
            self.read_range(tail_start, size, out)?;
        } else {
            self.read_range(self.cursor, size, out)?;
        }
        self.cursor = size;
        if self.cursor - self.punched >= PUNCH_THRESHOLD {
            let end = self.cursor / PAGE * PAGE;
            punch_hole(self.memfd.as_fd(), self.punched, end)?;
            self.punched = end;
        }
        Ok(c)
    }

    fn read_range(&self, mut from: u64, to: u64, out: &mut Vec<u8>) -> io::Result<()> {
        if to <= from {
            return Ok(());
        }
        out.reserve((to - from) as usize);
        while from < to {
            let spare = out.spare_capacity_mut();
            let want = spare.len().min((to - from) as usize);
            // SAFETY: pread writes at most `want` bytes into the spare capacity.
            let n = unsafe {
                libc::pread(
                    self.memfd.as_raw_fd(),
                    spare.as_mut_ptr().cast(),
                    want,
                    from as libc::off_t,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if n == 0 {
                break;
            }
            // SAFETY: `n` bytes were initialised by pread.
            unsafe { out.set_len(out.len() + n as usize) };
            from += n as u64;
        }
        Ok(())
    }
}

/// Both captured streams.
#[derive(Debug)]
pub struct Capture {
    /// fd 1.
    pub stdout: Stream,
    /// fd 2.
    pub stderr: Stream,
}

impl Capture {
    /// Points fds 1 and 2 at capture files: `given` (worker mode: memfds the kernel made and
    /// keeps, so that it can read what a dying worker had not sent), else fresh ones. Call
    /// after [`crate::stdio::take_protocol_stdio`] has saved the originals.
    pub fn install(given: Option<[OwnedFd; 2]>) -> io::Result<Capture> {
        let [out, err] = match given {
            Some([o, e]) => [Some(o), Some(e)],
            None => [None, None],
        };
        Ok(Capture {
            stdout: Stream::install(c"flowrepl-stdout", 1, out)?,
            stderr: Stream::install(c"flowrepl-stderr", 2, err)?,
        })
    }

    /// The capture files' current read offsets: where the next cell's output starts.
    pub fn cursors(&self) -> [u64; 2] {
        [self.stdout.cursor(), self.stderr.cursor()]
    }
}
