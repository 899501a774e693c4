//! Noticing that an open log file lost its name, without a system call per record.
//!
//! A task log deleted while a kernel holds it open would swallow every later record unseen.
//! Asking the file (`fstat`, `nlink == 0`) before each append costs a system call on every
//! cell's path (measured: +2.3 µs on `x = 1`, client and kernel sharing a CPU). Instead, an
//! inotify watch on the file (`IN_ATTRIB`: the link count changed; `IN_DELETE_SELF`,
//! `IN_MOVE_SELF`) is read by a small thread that raises a flag; an append looks at the flag
//! (an atomic load) and asks the file only when it is up.
//!
//! The event is queued by the unlink itself, so the flag is up as soon as the thread is
//! scheduled (microseconds): a record appended within that window can still go to the
//! deleted file. Where inotify is not available (its limits reached), [`NameWatch::new`]
//! fails and the caller asks the file before every append instead.

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Raises a flag when a watched file's link count changes or it is moved or deleted.
#[derive(Debug)]
pub(crate) struct NameWatch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    inotify: Inotify,
    /// The watch of the current file.
    wd: Mutex<Option<WatchDescriptor>>,
    /// Something happened to the file since the last [`NameWatch::take`].
    flag: AtomicBool,
    /// The owner is gone: the thread ends at its next event.
    closed: AtomicBool,
    /// The thread could not read its events: every append must ask the file.
    broken: AtomicBool,
}

const MASK: AddWatchFlags = AddWatchFlags::IN_ATTRIB
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF);

impl NameWatch {
    /// Watches `path` (an existing file) from a thread of its own.
    pub(crate) fn new(path: &Path) -> io::Result<NameWatch> {
        let inner = Arc::new(Inner {
            inotify: Inotify::init(InitFlags::IN_CLOEXEC)?,
            wd: Mutex::new(None),
            flag: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        });
        let watch = NameWatch { inner };
        watch.rearm(path)?;
        let inner = Arc::clone(&watch.inner);
        std::thread::Builder::new()
            .name("flowrepl-log-watch".into())
            .spawn(move || inner.run())?;
        Ok(watch)
    }

    /// Watches `path` (a file made again at the same path) instead of the file before.
    pub(crate) fn rearm(&self, path: &Path) -> io::Result<()> {
        let wd = self.inner.inotify.add_watch(path, MASK)?;
        let old = self.inner.lock().replace(wd);
        if let Some(old) = old.filter(|&o| o != wd) {
            // A watch already gone is an error we do not need.
            let _ = self.inner.inotify.rm_watch(old);
        }
        Ok(())
    }

    /// Whether something happened to the file since the last call (always, once the watch
    /// broke).
    pub(crate) fn take(&self) -> bool {
        let i = &self.inner;
        i.broken.load(Ordering::Acquire)
            || (i.flag.load(Ordering::Acquire) && i.flag.swap(false, Ordering::AcqRel))
    }
}

impl Drop for NameWatch {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        if let Some(wd) = self.inner.lock().take() {
            // Removing the watch queues IN_IGNORED, which wakes the thread to end.
            let _ = self.inner.inotify.rm_watch(wd);
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<WatchDescriptor>> {
        self.wd.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        loop {
            // Blocks until events come.
            let read = self.inotify.read_events();
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            match read {
                Err(Errno::EINTR) => continue,
                Err(_) => {
                    // Cannot watch any more: have every append ask the file.
                    self.broken.store(true, Ordering::Release);
                    return;
                }
                // Any event (a removed watch's IN_IGNORED included) is a reason to look.
                Ok(_) => self.flag.store(true, Ordering::Release),
            }
        }
    }
}
