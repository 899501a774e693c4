//! A pseudo-terminal a test gives a kernel as its controlling terminal (the kernel's own
//! stdin and stdout stay pipes), to show what a cell can or cannot do to a user's terminal.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The terminal's two ends: the test keeps the master, the kernel gets the slave's path.
pub struct Pty {
    master: OwnedFd,
    /// The slave's path (`/dev/pts/N`).
    pub slave: CString,
}

impl Pty {
    /// A new pseudo-terminal.
    pub fn open() -> Pty {
        // SAFETY: the posix_openpt family on a descriptor we own; ptsname_r writes into a
        // live buffer of the length given.
        unsafe {
            let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
            let master = OwnedFd::from_raw_fd(fd);
            assert_eq!(libc::grantpt(fd), 0);
            assert_eq!(libc::unlockpt(fd), 0);
            let mut buf = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(fd, buf.as_mut_ptr(), buf.len()), 0);
            let slave = std::ffi::CStr::from_ptr(buf.as_ptr()).to_owned();
            Pty { master, slave }
        }
    }

    /// What the terminal shows (echoes) within `wait`, read from the master.
    pub fn shown(&self, wait: Duration) -> Vec<u8> {
        let fd = self.master.as_raw_fd();
        let end = Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return out;
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as libc::c_int) };
            if n <= 0 {
                continue;
            }
            let mut buf = [0u8; 1024];
            // SAFETY: reads into a live buffer of its length.
            let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if got <= 0 {
                return out;
            }
            out.extend_from_slice(&buf[..got as usize]);
        }
    }
}

/// Between fork and exec: a new session whose controlling terminal is `slave`.
///
/// # Safety
/// Only async-signal-safe calls; to be called in a `pre_exec` closure.
pub unsafe fn take_as_controlling_terminal(slave: &CString) -> std::io::Result<()> {
    // SAFETY: as documented; setsid, open, ioctl and close on our own descriptors.
    unsafe {
        if libc::setsid() < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = libc::open(slave.as_ptr(), libc::O_RDWR);
        if fd < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::close(fd);
    }
    Ok(())
}
