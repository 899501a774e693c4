//! Removing a folder tree that someone else filled (a sandboxed cell's private `/tmp`), with
//! no limit on its depth.
//!
//! `std::fs::remove_dir_all` (tried first) keeps a descriptor per level: a deep tree fails
//! with EMFILE and stays on disk. Here the tree is flattened instead: each folder's
//! sub-folders are renamed to the top of the tree (one `renameat`, the same file system),
//! its other entries unlinked, and the emptied folder removed; at most two descriptors are
//! open at any time, and each folder is visited once. A folder whose mode keeps its owner out
//! is given `0700` first.

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

/// Removes `root` and everything in it, however deep. `Ok` when it is gone (or was not there).
/// The standard library's removal first (the usual shallow tree), this one where it fails.
pub fn remove_tree(root: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(root) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => flatten_and_remove(root),
    }
}

/// The removal by flattening (see the module's docs).
fn flatten_and_remove(root: &Path) -> io::Result<()> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let top = match Dir::open(root, flags, Mode::empty()) {
        Ok(d) => d,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(nix::errno::Errno::ENOTDIR) | Err(nix::errno::Errno::ELOOP) => {
            return std::fs::remove_file(root)
        }
        Err(e) => return Err(e.into()),
    };
    let mut hoisted: u64 = 0;
    // The folders still to empty: names directly under `root`.
    let mut queue: Vec<CString> = names(&top)?
        .into_iter()
        .filter_map(|(name, is_dir)| match is_dir {
            true => Some(name),
            false => {
                let _ = unlink(top.as_fd(), &name, false);
                None
            }
        })
        .collect();
    while let Some(name) = queue.pop() {
        let dir = match open_sub(top.as_fd(), &name, flags) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        for (entry, is_dir) in names(&dir)? {
            if is_dir {
                hoisted += 1;
                let to = CString::new(format!(".flowrepl-rm-{hoisted}")).expect("no NUL");
                nix::fcntl::renameat(dir.as_fd(), entry.as_c_str(), top.as_fd(), to.as_c_str())?;
                queue.push(to);
            } else {
                unlink(dir.as_fd(), &entry, false)?;
            }
        }
        drop(dir);
        unlink(top.as_fd(), &name, true)?;
    }
    drop(top);
    std::fs::remove_dir(root)
}

/// The entries of `dir` (not `.` and `..`), each with whether it is a folder (not a link to
/// one).
fn names(dir: &Dir) -> io::Result<Vec<(CString, bool)>> {
    let fd = dir.as_raw_fd();
    // A second handle for reading, so that `dir` itself stays usable for the *at calls.
    let mut reader = Dir::openat(
        // SAFETY: `dir` is open for the whole call.
        unsafe { BorrowedFd::borrow_raw(fd) },
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for entry in reader.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            Some(t) => t == Type::Directory,
            None => nix::sys::stat::fstatat(
                // SAFETY: as above.
                unsafe { BorrowedFd::borrow_raw(fd) },
                name,
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
        };
        out.push((name.to_owned(), is_dir));
    }
    Ok(out)
}

/// Opens the folder `name` in `parent`, making it `0700` first when its mode keeps us out.
fn open_sub(parent: BorrowedFd<'_>, name: &CString, flags: OFlag) -> io::Result<Dir> {
    match Dir::openat(parent, name.as_c_str(), flags, Mode::empty()) {
        Err(nix::errno::Errno::EACCES) => {
            nix::sys::stat::fchmodat(
                parent,
                name.as_c_str(),
                Mode::S_IRWXU,
                nix::sys::stat::FchmodatFlags::FollowSymlink,
            )?;
            Ok(Dir::openat(parent, name.as_c_str(), flags, Mode::empty())?)
        }
        r => Ok(r?),
    }
}

fn unlink(dir: BorrowedFd<'_>, name: &CString, is_dir: bool) -> io::Result<()> {
    let how = if is_dir {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    match nix::unistd::unlinkat(dir, name.as_c_str(), how) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree deeper than a process may hold descriptors for: the standard library's removal
    /// fails (EMFILE) and leaves it; this one removes it.
    #[test]
    fn removes_a_tree_deeper_than_the_descriptor_limit() {
        let base = std::env::temp_dir().join(format!("flowrepl-tree-test-{}", std::process::id()));
        let make = |root: &Path| {
            std::fs::create_dir_all(root).unwrap();
            let mut dir =
                Dir::open(root, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
            for i in 0..3000 {
                nix::sys::stat::mkdirat(dir.as_fd(), "d", Mode::S_IRWXU).unwrap();
                if i % 100 == 0 {
                    std::fs::write(format!("/proc/self/fd/{}/f", dir.as_raw_fd()), "x").unwrap();
                }
                dir = Dir::openat(
                    dir.as_fd(),
                    "d",
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
                .unwrap();
            }
            // One folder its owner cannot enter, one link out of the tree.
            nix::sys::stat::mkdirat(dir.as_fd(), "locked", Mode::empty()).unwrap();
            nix::unistd::symlinkat("/etc", dir.as_fd(), "out").unwrap();
        };
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 1024, hard)
            .unwrap();
        let std_way = base.join("std");
        make(&std_way);
        assert!(std::fs::remove_dir_all(&std_way).is_err());
        assert!(std_way.exists());
        // (remove_dir_all may have taken part of it: what is left is still deep.)
        flatten_and_remove(&base).unwrap();
        assert!(!base.exists());
        assert!(Path::new("/etc").is_dir());
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, soft, hard)
            .unwrap();
        remove_tree(&base).unwrap();
    }
}
