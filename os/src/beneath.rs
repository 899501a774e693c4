//! Files beneath a folder a cell can write, opened so that nothing it plants there leads
//! outside: the confinement of every path a client names in a task's workspace.
//!
//! Every path is resolved by the kernel with `openat2(2)` relative to the folder's descriptor,
//! with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` (Linux 5.6+): an
//! absolute path, a `..` that climbs out, or a symbolic link anywhere on the way (a cell can
//! plant one, or swap a file for one between a check and the open) fails at open time, not
//! by checking strings first. What is opened is checked after opening (`fstat` on the
//! descriptor): a file must be a regular file (a FIFO would block a reader, a device could be
//! anything; files are opened with `O_NONBLOCK`) with one link (a hard link a cell made to a
//! file outside the folder looks like a file inside it). Writes go to a temporary name beside
//! the target and are renamed over it, so a reader never sees half a file. Without `openat2`
//! (Linux before 5.6, or a seccomp filter refusing it) every call fails with
//! [`BeneathError::Unsupported`]: there is no weaker fallback.

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{Mode, SFlag};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a path beneath the folder was refused or could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum BeneathError {
    /// The path is not a relative path of plain names (empty, absolute, `.`/`..`, NUL).
    BadPath(String),
    /// Resolving it would leave the folder or follow a symbolic link.
    Escapes(String),
    /// There is nothing at the path.
    NotFound(String),
    /// It is not a regular file (a folder, FIFO, socket or device) where one is needed.
    NotAFile(String),
    /// A regular file with more than one link (it may be a file outside the folder).
    HardLinked(String),
    /// A name over `NAME_MAX` (255 bytes) or the path over `PATH_MAX` (4096 bytes with its
    /// NUL): the file system could not take it.
    TooLong(String),
    /// `openat2` is not available here.
    Unsupported,
    /// The file system failed.
    Io(String, std::io::Error),
}

impl std::fmt::Display for BeneathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BeneathError::BadPath(p) => write!(
                f,
                "{p:?} is not a path inside the workspace: use a relative path of names separated by '/', without '.', '..' or empty parts"
            ),
            BeneathError::Escapes(p) => write!(
                f,
                "{p:?} leads outside the workspace or through a symbolic link: refused"
            ),
            BeneathError::NotFound(p) => write!(f, "{p:?}: no such file in the workspace"),
            BeneathError::NotAFile(p) => write!(
                f,
                "{p:?} is not a regular file (a folder, FIFO, socket or device)"
            ),
            BeneathError::HardLinked(p) => write!(
                f,
                "{p:?} has more than one hard link (it may be a file outside the workspace): refused"
            ),
            BeneathError::TooLong(p) => write!(
                f,
                "{p:?}: a name is over {NAME_MAX} bytes or the path over {MAX_PATH} (the file system's limits)"
            ),
            BeneathError::Unsupported => write!(
                f,
                "confined file access needs openat2 (Linux 5.6 or newer), which this system refuses"
            ),
            BeneathError::Io(p, e) => write!(f, "{p:?}: {e}"),
        }
    }
}

impl std::error::Error for BeneathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BeneathError::Io(_, e) => Some(e),
            _ => None,
        }
    }
}

/// What a listing says of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name; a name that is not UTF-8 has each byte that is not part of a UTF-8 character
    /// written `\xNN` (and its bytes in `raw_name`).
    pub name: String,
    /// The name's bytes, when they are not UTF-8 (`name` is then only a readable form).
    pub raw_name: Option<Vec<u8>>,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its modification time, seconds since the epoch.
    pub mtime: i64,
}

/// A folder whose descriptor every path is resolved beneath.
#[derive(Debug)]
pub struct Beneath {
    dir: OwnedFd,
    path: PathBuf,
}

const RESOLVE: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS);

/// The longest name a file system takes (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// The longest path, in bytes (`PATH_MAX` less its NUL).
pub const MAX_PATH: usize = 4095;
/// How much of a path a message shows.
const SHOWN_CHARS: usize = 200;

/// `path` as messages show it: its first 200 characters, then `…` if cut (a client can name
/// a path as long as its request; an answer never echoes it whole).
pub fn shown(path: &str) -> String {
    let mut chars = path.chars();
    let mut out: String = chars.by_ref().take(SHOWN_CHARS).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// Splits and checks a client's path: names separated by `/`, none empty, `.` or `..`, no NUL;
/// no name over [`NAME_MAX`] bytes, the whole at most [`MAX_PATH`].
pub fn check(path: &str) -> Result<Vec<&str>, BeneathError> {
    let bad = || BeneathError::BadPath(shown(path));
    if path.is_empty() || path.contains('\0') || path.starts_with('/') {
        return Err(bad());
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(bad());
    }
    if path.len() > MAX_PATH || parts.iter().any(|p| p.len() > NAME_MAX) {
        return Err(BeneathError::TooLong(shown(path)));
    }
    Ok(parts)
}

fn fail(path: &str, e: Errno) -> BeneathError {
    let path = shown(path);
    match e {
        // EXDEV: a `..` or an absolute link out; ELOOP: a symbolic link on the way.
        Errno::EXDEV | Errno::ELOOP => BeneathError::Escapes(path),
        Errno::ENOENT => BeneathError::NotFound(path),
        Errno::ENOSYS => BeneathError::Unsupported,
        Errno::ENOTDIR | Errno::EISDIR => BeneathError::NotAFile(path),
        Errno::ENAMETOOLONG => BeneathError::TooLong(path),
        e => BeneathError::Io(path, e.into()),
    }
}

static TEMP: AtomicU64 = AtomicU64::new(0);

/// What the temporary name of a file being written holds (`.<name>.flowrepl-<pid>-<n>`).
const TEMP_MARK: &str = ".flowrepl-";

/// The temporary files this process is writing now, by their folder (device, inode) and
/// name: listings leave out exactly these. A name is not enough (a cell can name its own file
/// like one, and it must be listed); the folder's identity and the name, held here while the
/// upload runs, are what a cell cannot forge.
static WRITING: std::sync::Mutex<Vec<(u64, u64, String)>> = std::sync::Mutex::new(Vec::new());

fn writing() -> std::sync::MutexGuard<'static, Vec<(u64, u64, String)>> {
    WRITING.lock().unwrap_or_else(|p| p.into_inner())
}

/// The (device, inode) of an open folder.
fn identity(dir: &OwnedFd) -> Option<(u64, u64)> {
    nix::sys::stat::fstat(dir.as_fd())
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// Whether `name` in the folder `dir` is a temporary file this process is writing now
/// ([`Beneath::write`]).
fn is_ours(dir: Option<(u64, u64)>, name: &str) -> bool {
    dir.is_some_and(|(dev, ino)| {
        writing()
            .iter()
            .any(|(d, i, n)| *d == dev && *i == ino && n == name)
    })
}

/// `bytes` as text: UTF-8 as it is, every other byte as `\xNN`.
pub fn escaped_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

impl Beneath {
    /// The folder `path` (which must exist).
    pub fn open(path: &Path) -> Result<Beneath, BeneathError> {
        let dir = nix::fcntl::open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| BeneathError::Io(path.display().to_string(), e.into()))?;
        Ok(Beneath {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn at(&self, path: &str, flags: OFlag, mode: Mode) -> Result<OwnedFd, BeneathError> {
        // RESOLVE_NO_SYMLINKS refuses a link in every component, the last one too (ELOOP);
        // O_NOFOLLOW would turn a final link under O_DIRECTORY into ENOTDIR instead.
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .mode(mode)
            .resolve(RESOLVE);
        nix::fcntl::openat2(self.dir.as_fd(), path, how).map_err(|e| fail(path, e))
    }

    /// Opens the regular, singly linked file at `path` for reading; with its size.
    pub fn read(&self, path: &str) -> Result<(File, u64), BeneathError> {
        check(path)?;
        let fd = self.at(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())?;
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| fail(path, e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(BeneathError::NotAFile(shown(path)));
        }
        if st.st_nlink > 1 {
            return Err(BeneathError::HardLinked(shown(path)));
        }
        // Reads block as usual from here (O_NONBLOCK only kept a FIFO from blocking the open).
        let flags = nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_GETFL)
            .map_err(|e| fail(path, e))?;
        let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))
            .map_err(|e| fail(path, e))?;
        Ok((File::from(fd), st.st_size as u64))
    }

    /// Opens (making the missing ones, mode 0700) the folders of `parts` beneath this one.
    fn folder(&self, path: &str, parts: &[&str]) -> Result<OwnedFd, BeneathError> {
        let mut walked = String::new();
        for part in parts {
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(part);
            match self.at(&walked, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty()) {
                Ok(_) => {}
                Err(BeneathError::NotFound(_)) => {
                    let parent = self.parent_of(&walked)?;
                    match nix::sys::stat::mkdirat(parent.as_fd(), *part, Mode::S_IRWXU) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(fail(path, e)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if walked.is_empty() {
            return self.at(".", OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty());
        }
        self.at(&walked, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())
            .map_err(|e| match e {
                BeneathError::NotAFile(_) => BeneathError::NotAFile(shown(path)),
                e => e,
            })
    }

    fn parent_of(&self, walked: &str) -> Result<OwnedFd, BeneathError> {
        let parent = walked.rsplit_once('/').map_or(".", |(p, _)| p);
        self.at(parent, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())
    }

    /// Starts writing the file at `path` (its folders made as needed): the bytes go to a
    /// temporary name beside it until [`Writing::commit`] renames them into place.
    pub fn write(&self, path: &str) -> Result<Writing, BeneathError> {
        let parts = check(path)?;
        let (name, folders) = parts.split_last().expect("check gives at least one part");
        let dir = self.folder(path, folders)?;
        loop {
            let tmp = format!(
                ".{}{TEMP_MARK}{}-{}",
                name.chars().take(100).collect::<String>(),
                std::process::id(),
                TEMP.fetch_add(1, Ordering::Relaxed)
            );
            match nix::fcntl::openat(
                dir.as_fd(),
                tmp.as_str(),
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_WRONLY
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            ) {
                Ok(fd) => {
                    let id = identity(&dir);
                    if let Some((dev, ino)) = id {
                        writing().push((dev, ino, tmp.clone()));
                    }
                    return Ok(Writing {
                        file: File::from(fd),
                        dir,
                        id,
                        tmp,
                        name: (*name).to_owned(),
                        path: path.to_owned(),
                        done: false,
                    });
                }
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(fail(path, e)),
            }
        }
    }

    /// Removes the file at `path` (a folder is refused); says the disk space it freed (its
    /// allocated blocks, when it was its only link).
    pub fn remove(&self, path: &str) -> Result<u64, BeneathError> {
        let parts = check(path)?;
        let (name, folders) = parts.split_last().expect("check gives at least one part");
        let dir = self.folder_existing(path, folders)?;
        let st =
            nix::sys::stat::fstatat(dir.as_fd(), *name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| fail(path, e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            return Err(BeneathError::NotAFile(shown(path)));
        }
        nix::unistd::unlinkat(dir.as_fd(), *name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| fail(path, e))?;
        let regular = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG;
        Ok(if regular && st.st_nlink == 1 {
            (st.st_blocks as u64).saturating_mul(512)
        } else {
            0
        })
    }

    fn folder_existing(&self, path: &str, folders: &[&str]) -> Result<OwnedFd, BeneathError> {
        let joined = folders.join("/");
        let at = if joined.is_empty() {
            "."
        } else {
            joined.as_str()
        };
        self.at(at, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())
            .map_err(|e| match e {
                BeneathError::NotFound(_) => BeneathError::NotFound(shown(path)),
                e => e,
            })
    }

    /// The entries of the folder at `path` (`""`: this one), sorted by name; links are listed
    /// as links, never followed.
    pub fn list(&self, path: &str) -> Result<Vec<Entry>, BeneathError> {
        let folders = if path.is_empty() {
            Vec::new()
        } else {
            check(path)?
        };
        let fd = self.folder_existing(path, &folders)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| fail(path, e))?;
        let mut out = Vec::new();
        let fd = dir
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| BeneathError::Io(shown(path), e))?;
        let id = identity(&fd);
        for entry in dir.iter() {
            let entry = entry.map_err(|e| fail(path, e))?;
            let raw = entry.file_name();
            let (name, raw_name) = match raw.to_str() {
                Ok(n) => (n.to_owned(), None),
                Err(_) => (escaped_name(raw.to_bytes()), Some(raw.to_bytes().to_vec())),
            };
            if name == "." || name == ".." || is_ours(id, &name) {
                continue;
            }
            let Ok(st) =
                nix::sys::stat::fstatat(fd.as_fd(), raw, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let kind = match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFREG => "file",
                SFlag::S_IFDIR => "dir",
                SFlag::S_IFLNK => "symlink",
                _ => "other",
            };
            out.push(Entry {
                name,
                raw_name,
                kind,
                bytes: st.st_size as u64,
                mtime: st.st_mtime,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// A file being written beneath the folder: under a temporary name until committed; removed
/// if dropped uncommitted.
#[derive(Debug)]
pub struct Writing {
    file: File,
    dir: OwnedFd,
    /// The folder's (device, inode), under which the temporary name is registered.
    id: Option<(u64, u64)>,
    tmp: String,
    name: String,
    path: String,
    done: bool,
}

impl Writing {
    /// The file to write into.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Renames the written file into place (over a file there, never over a folder).
    pub fn commit(mut self) -> Result<(), BeneathError> {
        if let Ok(st) = nix::sys::stat::fstatat(
            self.dir.as_fd(),
            self.name.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
                return Err(BeneathError::NotAFile(self.path.clone()));
            }
        }
        nix::fcntl::renameat(
            self.dir.as_fd(),
            self.tmp.as_str(),
            self.dir.as_fd(),
            self.name.as_str(),
        )
        .map_err(|e| fail(&self.path, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if !self.done {
            let _ = nix::unistd::unlinkat(
                self.dir.as_fd(),
                self.tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        if let Some((dev, ino)) = self.id {
            let mut w = writing();
            if let Some(i) = w
                .iter()
                .position(|(d, n, t)| *d == dev && *n == ino && *t == self.tmp)
            {
                w.swap_remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    struct Setup {
        root: tempfile::TempDir,
        outside: tempfile::TempDir,
        b: Beneath,
    }

    fn setup() -> Setup {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"secret").unwrap();
        std::fs::write(root.path().join("inside"), b"inside").unwrap();
        let b = Beneath::open(root.path()).unwrap();
        Setup { root, outside, b }
    }

    fn read(b: &Beneath, path: &str) -> Result<Vec<u8>, BeneathError> {
        let (mut f, _) = b.read(path)?;
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        Ok(v)
    }

    #[test]
    fn paths_out_of_the_folder_are_refused_and_get_out_without_it() {
        let s = setup();
        let rel = format!(
            "../{}/secret",
            s.outside.path().file_name().unwrap().to_str().unwrap()
        );
        assert!(matches!(read(&s.b, &rel), Err(BeneathError::BadPath(_))));
        // Joined as a path, the same string climbs out.
        assert_eq!(std::fs::read(s.root.path().join(&rel)).unwrap(), b"secret");
        let abs = s.outside.path().join("secret").display().to_string();
        assert!(matches!(read(&s.b, &abs), Err(BeneathError::BadPath(_))));
        // Path::join with an absolute path replaces the folder altogether.
        assert_eq!(std::fs::read(s.root.path().join(&abs)).unwrap(), b"secret");
        for bad in ["", "a//b", "./inside", "a/.", "a\0b"] {
            assert!(
                matches!(check(bad), Err(BeneathError::BadPath(_))),
                "{bad:?}"
            );
        }
        assert_eq!(read(&s.b, "inside").unwrap(), b"inside");
    }

    #[test]
    fn links_a_cell_planted_are_refused_and_lead_out_without_it() {
        let s = setup();
        let secret = s.outside.path().join("secret");
        std::os::unix::fs::symlink(&secret, s.root.path().join("leak")).unwrap();
        std::os::unix::fs::symlink(s.outside.path(), s.root.path().join("sub")).unwrap();
        std::fs::hard_link(&secret, s.root.path().join("hard")).unwrap();
        assert!(matches!(read(&s.b, "leak"), Err(BeneathError::Escapes(_))));
        assert!(matches!(
            read(&s.b, "sub/secret"),
            Err(BeneathError::Escapes(_))
        ));
        assert!(matches!(
            read(&s.b, "hard"),
            Err(BeneathError::HardLinked(_))
        ));
        assert!(matches!(
            s.b.write("sub/planted"),
            Err(BeneathError::Escapes(_))
        ));
        assert!(!s.outside.path().join("planted").exists());
        // By path, each of them reads or writes outside.
        assert_eq!(
            std::fs::read(s.root.path().join("leak")).unwrap(),
            b"secret"
        );
        assert_eq!(
            std::fs::read(s.root.path().join("sub/secret")).unwrap(),
            b"secret"
        );
        assert_eq!(
            std::fs::read(s.root.path().join("hard")).unwrap(),
            b"secret"
        );
        std::fs::write(s.root.path().join("sub/planted"), b"x").unwrap();
        assert!(s.outside.path().join("planted").exists());
        // Removing a link removes the link, never what it points at.
        s.b.remove("leak").unwrap();
        assert!(secret.exists());
        // A write over a link replaces the link, never writes through it.
        std::os::unix::fs::symlink(&secret, s.root.path().join("over")).unwrap();
        let mut w = s.b.write("over").unwrap();
        w.file().write_all(b"mine").unwrap();
        w.commit().unwrap();
        assert_eq!(std::fs::read(&secret).unwrap(), b"secret");
        assert_eq!(read(&s.b, "over").unwrap(), b"mine");
    }

    #[test]
    fn a_fifo_is_refused_at_once_and_blocks_a_plain_open() {
        let s = setup();
        let fifo = s.root.path().join("pipe");
        nix::unistd::mkfifo(&fifo, Mode::S_IRWXU).unwrap();
        let started = Instant::now();
        assert!(matches!(read(&s.b, "pipe"), Err(BeneathError::NotAFile(_))));
        assert!(started.elapsed() < Duration::from_secs(1));
        // A plain open waits for a writer that never comes.
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || {
            let _ = File::open(&f);
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a plain open returned"
        );
        // Let it go.
        let _w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn a_swap_between_check_and_open_gains_nothing_and_does_without_it() {
        let s = setup();
        let root = s.root.path().to_path_buf();
        let secret = s.outside.path().join("secret");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapping = {
            let (root, secret, stop) = (root.clone(), secret.clone(), stop.clone());
            std::thread::spawn(move || {
                // The target is a regular file or a link outside, swapped as fast as renames go.
                let (file, link) = (root.join(".file"), root.join(".link"));
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::fs::write(&file, b"inside");
                    let _ = std::fs::rename(&file, root.join("target"));
                    let _ = std::os::unix::fs::symlink(&secret, &link);
                    let _ = std::fs::rename(&link, root.join("target"));
                }
            })
        };
        let until = Instant::now() + Duration::from_secs(5);
        let (mut confined, mut plain_leaked) = (0, false);
        while Instant::now() < until && (confined < 2000 || !plain_leaked) {
            if let Ok(v) = read(&s.b, "target") {
                assert_eq!(v, b"inside", "a confined read followed the swapped-in link");
                confined += 1;
            }
            // The check-then-open a string check would do: not a link, then read by path.
            let p = root.join("target");
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_file())
                && std::fs::read(&p).is_ok_and(|v| v == b"secret")
            {
                plain_leaked = true;
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapping.join().unwrap();
        assert!(confined > 0, "no confined read succeeded while swapping");
        assert!(
            plain_leaked,
            "the check-then-open never read the secret in 5 s"
        );
    }

    #[test]
    fn writes_are_whole_or_absent_and_folders_are_listed_without_following() {
        let s = setup();
        let mut w = s.b.write("data/new/table.csv").unwrap();
        w.file().write_all(b"k,v\n").unwrap();
        assert!(
            !s.root.path().join("data/new/table.csv").exists(),
            "visible before commit"
        );
        w.commit().unwrap();
        assert_eq!(read(&s.b, "data/new/table.csv").unwrap(), b"k,v\n");
        // Dropped uncommitted: nothing left, not even the temporary name.
        let w = s.b.write("data/new/gone.csv").unwrap();
        drop(w);
        let names: Vec<String> =
            s.b.list("data/new")
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .collect();
        assert_eq!(names, ["table.csv"]);
        std::os::unix::fs::symlink(s.outside.path(), s.root.path().join("out")).unwrap();
        let listed = s.b.list("").unwrap();
        let out = listed.iter().find(|e| e.name == "out").unwrap();
        assert_eq!(out.kind, "symlink");
        assert!(matches!(s.b.list("out"), Err(BeneathError::Escapes(_))));
        assert!(matches!(s.b.remove("data"), Err(BeneathError::NotAFile(_))));
        assert!(matches!(
            read(&s.b, "nothing"),
            Err(BeneathError::NotFound(_))
        ));
    }

    #[test]
    fn listings_hide_only_uploads_under_way_and_show_names_that_are_not_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let s = setup();
        let w = s.b.write("report.csv").unwrap();
        let on_disk: Vec<String> = std::fs::read_dir(s.root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let tmp = on_disk
            .iter()
            .find(|n| n.contains(TEMP_MARK))
            .unwrap()
            .clone();
        // A cell's own file with a name of the same shape, and a name that is not UTF-8.
        std::fs::write(s.root.path().join(".x.flowrepl-1-1"), b"mine").unwrap();
        std::fs::write(
            s.root.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9")),
            b"x",
        )
        .unwrap();
        let listed = s.b.list("").unwrap();
        let names: Vec<&str> = listed.iter().map(|e| e.name.as_str()).collect();
        assert!(!names.contains(&tmp.as_str()), "{names:?}");
        assert!(names.contains(&".x.flowrepl-1-1"), "{names:?}");
        let odd = listed.iter().find(|e| e.raw_name.is_some()).unwrap();
        assert_eq!(odd.name, "caf\\xe9");
        assert_eq!(odd.raw_name.as_deref(), Some(&b"caf\xe9"[..]));
        assert_eq!(odd.kind, "file");
        drop(w);
        assert!(!writing().iter().any(|(_, _, t)| *t == tmp));
        // Names and paths past the file system's limits, refused before any call.
        assert!(matches!(
            check(&"n".repeat(256)),
            Err(BeneathError::TooLong(_))
        ));
        assert!(check(&"n".repeat(255)).is_ok());
        let long = vec!["d".repeat(200); 21].join("/");
        let e = check(&long).unwrap_err();
        assert!(matches!(e, BeneathError::TooLong(_)));
        assert!(e.to_string().len() < 400, "{e}");
    }
}
