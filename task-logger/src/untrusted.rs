//! Opening files in a folder a cell can write (the task's checkpoint folder is bound
//! writable into the sandbox): whatever is there may have been planted to hang or exhaust
//! the kernel, which reads it outside the sandbox. A FIFO would block an `open` or a `read`
//! for ever, a symlink could lead to `/dev/zero` or to a file of the user's, a huge file would
//! be read into memory.
//!
//! So every open here is relative to a folder opened without following a symlink
//! (`O_NOFOLLOW` on each component below the trusted root), non-blocking, close-on-exec; what
//! it opened must be a regular file (`fstat`, after the open, so nothing can be swapped in
//! between), and readers take at most a stated number of bytes.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, Mode, SFlag};

/// Opens `root/sub/file` (`sub` and `file` are single names) for reading: `root` is trusted,
/// `sub` must be a real directory and `file` a regular file, neither a symlink. `Ok(None)`:
/// one of them does not exist.
pub fn open_beneath(root: &Path, sub: &str, file: &str) -> io::Result<Option<File>> {
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    let dir = match openat(
        AT_FDCWD,
        &root.join(sub),
        flags | OFlag::O_DIRECTORY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) | Err(nix::errno::Errno::ENOTDIR) => {
            return Err(not_regular(
                &root.join(sub),
                "not a directory (or a symlink)",
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let path = root.join(sub).join(file);
    let fd: OwnedFd = match openat(&dir, file, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) => return Err(not_regular(&path, "a symlink")),
        Err(e) => return Err(e.into()),
    };
    let kind = SFlag::from_bits_truncate(fstat(&fd)?.st_mode) & SFlag::S_IFMT;
    if kind != SFlag::S_IFREG {
        return Err(not_regular(&path, "not a regular file"));
    }
    // (O_NONBLOCK stays set: reads of a regular file never block.)
    Ok(Some(File::from(fd)))
}

/// Reads at most `limit` bytes of `f`: more is an error (`InvalidData`), not a partial read.
pub fn read_bounded(f: File, limit: u64, path: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    f.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is larger than {limit} bytes", path.display()),
        ));
    }
    Ok(out)
}

fn not_regular(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what}; refusing to read it", path.display()),
    )
}
