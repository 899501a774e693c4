//! Namespaces: a user namespace (which lets an unprivileged process make the others), a
//! network namespace of its own, an IPC namespace, and a mount namespace whose root is new:
//! only what a cell needs, bound from the host (see `private_mounts`).
//!
//! The PID namespace comes next, in [`crate::processes`] (it splits the process).

use flowrepl_protocol::sandbox::{Network, SandboxLayer, SandboxPolicy};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The user namespace.
pub const USER: &str = "user_namespace";
/// The network namespace.
pub const NETWORK: &str = "network_namespace";
/// The IPC namespace.
pub const IPC: &str = "ipc_namespace";
/// The mount namespace.
pub const MOUNT: &str = "mount_namespace";

/// A protection of the mount namespace ([`crate::PROTECTIONS`]): every folder between a
/// writable folder and a hidden or protected path inside it (`.flowrepl` above the log
/// folder `./.flowrepl/logs`) is bound onto itself, and so is a mount point, which a cell can
/// neither rename nor remove (`EBUSY`): the kernel's paths there keep naming what it made.
pub const PINS: &str = "pinned_folders";
/// A protection: what the kernel runs or reads at a later start
/// ([`SandboxPolicy::protected`]: a `./.venv`, the package layer, its own executables) bound
/// read-only where it lies inside a writable folder.
pub const PROTECTED: &str = "read_only_tools";
/// A protection: the kernel's settings read-only whatever else holds: `/proc/sys`,
/// `/proc/sysrq-trigger`, `/proc/irq`, `/proc/bus` (as bubblewrap covers them), and every
/// mount under a read-only bind (`/sys/fs/cgroup` under `/sys`) read-only too.
pub const KERNEL_FILES: &str = "read_only_kernel_files";
/// A protection: `/sys` is a sysfs of the sandbox's own network namespace (its
/// `/sys/class/net` lists only `lo`), read-only, instead of the host's.
pub const SYSFS: &str = "private_sysfs";
/// A protection: `/etc` holds only what Python and its usual libraries read
/// ([`crate::files::etc_allowed`]), instead of the host's `/etc` minus its best-known
/// secrets.
pub const ETC: &str = "etc_allow_list";

/// Enters the namespaces `policy` asks for; one report per namespace.
pub fn enter(policy: &SandboxPolicy, skip: &dyn Fn(&str) -> bool) -> Vec<SandboxLayer> {
    if skip(USER) {
        return [USER, NETWORK, IPC, MOUNT]
            .into_iter()
            .map(crate::skipped)
            .collect();
    }
    let want_net = policy.network != Network::Host && !skip(NETWORK);
    let want_mount = !skip(MOUNT);
    let want_ipc = !skip(IPC);
    let mut flags = CloneFlags::CLONE_NEWUSER;
    for (want, flag) in [
        (want_net, CloneFlags::CLONE_NEWNET),
        (want_ipc, CloneFlags::CLONE_NEWIPC),
        (want_mount, CloneFlags::CLONE_NEWNS),
    ] {
        if want {
            flags |= flag;
        }
    }
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let entered = unshare(flags)
        .map_err(|e| format!("the host refused unshare(CLONE_NEWUSER|...): {e}"))
        .and_then(|()| map_ids(uid.as_raw(), gid.as_raw()));
    let mut out = vec![crate::layer(
        USER,
        true,
        entered.clone().map(|()| {
            format!("uid {uid} and gid {gid} mapped to themselves; no capability outside")
        }),
    )];
    out.push(match policy.network {
        Network::Host => crate::network_kept(NETWORK),
        Network::None => crate::unless_skipped(NETWORK, skip, || {
            entered
                .clone()
                .map(|()| "a network namespace of its own: only lo, down".into())
        }),
        Network::Proxy => crate::unless_skipped(NETWORK, skip, || {
            entered.clone().and_then(|()| crate::proxy::loopback_up()).map(|()| {
                "a network namespace of its own: only lo, where the kernel's egress proxy is the one way out".into()
            })
        }),
    });
    out.push(crate::unless_skipped(IPC, skip, || {
        entered
            .clone()
            .map(|()| "System V IPC and POSIX message queues of its own".into())
    }));
    let own_net = want_net && entered.is_ok();
    out.push(crate::unless_skipped(MOUNT, skip, || {
        entered.and_then(|()| private_mounts(policy, own_net, skip))
    }));
    out
}

/// Maps this process's uid and gid to themselves in its new user namespace (only its creator
/// may, once).
fn map_ids(uid: u32, gid: u32) -> Result<(), String> {
    let write = |file: &str, text: String| {
        std::fs::write(file, text).map_err(|e| format!("cannot write {file}: {e}"))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1"))
}

/// What one mount of the new root does, at a path of the new root.
enum Op {
    /// The host's file or folder (opened before anything was covered), read-only.
    ReadOnly(OwnedFd),
    /// The host's file or folder, writable.
    Writable(OwnedFd),
    /// A symlink, as the host has it (`/bin` → `usr/bin`).
    Symlink(PathBuf),
    /// An empty file of the new root's own, mode 0 (a file of the host's hidden: no rule
    /// of Landlock's names it, so it is not even opened).
    Blank,
    /// An empty tmpfs with this mode, read-only when `ro`.
    Empty(&'static str, bool),
    /// A sysfs of this network namespace, read-only; the host's (this descriptor) bound
    /// read-only where the host refuses it.
    Sysfs(OwnedFd),
    /// The new root's own folder at this path (made if missing) bound onto itself: a mount
    /// point, which a cell can neither rename nor remove ([`PINS`]).
    Pin,
}

/// The mount namespace's view of the files: a new root (a tmpfs) that holds what a cell needs
/// and nothing else, as bubblewrap builds one: the system folders, `/etc` without its secrets,
/// `/sys`, the interpreter's prefixes, the venv, the Python library and the support cache
/// ([`SandboxPolicy::readable`]) bound read-only; the workspace and the checkpoint folder
/// ([`SandboxPolicy::writable`]) writable; the kernel's private folder as `/tmp`; a `/dev`
/// of a few devices; empty `/run`, `/var/tmp`, `/dev/shm`; the host's `/proc` until the PID
/// namespace mounts its own. What is not mounted does not exist inside: the user's home,
/// `/var`, `/srv`, `/mnt`, the log folder, every Unix socket of the host (Landlock does not
/// cover `connect()` to a path). Each host path keeps its own path. Then `pivot_root`, and
/// the host's root is detached.
fn private_mounts(
    policy: &SandboxPolicy,
    own_net: bool,
    skip: &dyn Fn(&str) -> bool,
) -> Result<String, String> {
    let err = |what: &str, e: nix::Error| format!("{what}: {e}");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| err("cannot make / private", e))?;
    let ops = plan(policy, own_net, skip)?;
    // The new root is built on a tmpfs over the host's /tmp (in this namespace only; the
    // private folder was opened above); on any failure it is detached again, and the host's
    // view stays as it was.
    let staging = Path::new("/tmp");
    mount(
        Some("tmpfs"),
        staging,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )
    .map_err(|e| err("cannot mount the new root's tmpfs", e))?;
    let mut notes = Vec::new();
    let built = build(staging, &ops, &mut notes).and_then(|()| pivot(staging, &policy.workspace));
    if let Err(e) = built {
        let _ = nix::mount::umount2(staging, nix::mount::MntFlags::MNT_DETACH);
        return Err(e);
    }
    let binds = ops
        .iter()
        .filter(|(_, op)| matches!(op, Op::ReadOnly(_) | Op::Writable(_)))
        .count();
    notes.extend(
        crate::PROTECTIONS
            .iter()
            .filter(|p| skip(p))
            .map(|p| format!("{p} skipped (FLOWREPL_SANDBOX_SKIP)")),
    );
    let etc = if skip(ETC) {
        "/etc without its secrets"
    } else {
        "of /etc only what Python reads (certificates, resolver, time zone, users, ...)"
    };
    Ok(format!(
        "a new root of {binds} binds: the system, {etc}, the interpreter and the venv read-only (also where they lie in the workspace), /proc/sys read-only; the workspace, the checkpoint folder and a private /tmp writable, the folders above the log folder in it fixed in place; nothing else of the host's files (home, /var, /run, the log folder, Unix sockets) exists inside{}",
        if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        }
    ))
}

/// Opens every host path the new root holds (before anything is covered) and orders the
/// mounts outer paths first, so that a folder covered or bound inside another comes after it.
fn plan(
    policy: &SandboxPolicy,
    own_net: bool,
    skip: &dyn Fn(&str) -> bool,
) -> Result<Vec<(PathBuf, Op)>, String> {
    let open = |p: &Path| -> Result<OwnedFd, String> {
        nix::fcntl::open(
            p,
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| format!("cannot open {}: {e}", p.display()))
    };
    let real = |p: &Path| std::fs::canonicalize(p).ok();
    let mut ops: Vec<(PathBuf, Op)> = Vec::new();
    for dir in crate::files::SYSTEM.iter().map(Path::new) {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(dir)
                    .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
                ops.push((dir.to_path_buf(), Op::Symlink(target)));
            }
            Ok(m) if m.is_dir() && dir == Path::new("/sys") && own_net && !skip(SYSFS) => {
                ops.push((dir.to_path_buf(), Op::Sysfs(open(dir)?)))
            }
            Ok(m) if m.is_dir() => ops.push((dir.to_path_buf(), Op::ReadOnly(open(dir)?))),
            _ => {}
        }
    }
    if skip(ETC) {
        ops.push(("/etc".into(), Op::ReadOnly(open(Path::new("/etc"))?)));
        for hidden in crate::files::ETC_HIDDEN {
            let path = Path::new("/etc").join(hidden);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => ops.push((path, Op::Empty("0755", true))),
                Ok(m) if m.is_file() => ops.push((path, Op::Blank)),
                _ => {}
            }
        }
    } else {
        let allowed = crate::files::etc_allowed();
        for path in &allowed {
            let Ok(m) = std::fs::symlink_metadata(path) else {
                continue;
            };
            if m.file_type().is_symlink() {
                // Kept a link where what it leads to is inside too (`/etc/localtime` into
                // `/usr/share/zoneinfo`: its name is the zone's); else what it leads to, bound.
                let target = std::fs::read_link(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                match real(path) {
                    Some(t) if visible_inside(&t, &allowed) => {
                        ops.push((path.clone(), Op::Symlink(target)))
                    }
                    Some(_) => ops.push((path.clone(), Op::ReadOnly(open(path)?))),
                    None => {}
                }
            } else {
                ops.push((path.clone(), Op::ReadOnly(open(path)?)));
            }
        }
    }
    // The host's /proc, until the PID namespace's init mounts its own over it.
    ops.push(("/proc".into(), Op::Writable(open(Path::new("/proc"))?)));
    ops.push(("/dev".into(), Op::Empty("0755", false)));
    for dev in crate::files::DEVICES {
        if Path::new(dev).exists() {
            ops.push((dev.into(), Op::Writable(open(Path::new(dev))?)));
        }
    }
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        ops.push((link.into(), Op::Symlink(target.into())));
    }
    for empty in ["/dev/shm", "/var/tmp"] {
        ops.push((empty.into(), Op::Empty("1777", false)));
    }
    ops.push(("/run".into(), Op::Empty("0755", false)));
    let tmp = real(&policy.tmp).unwrap_or_else(|| policy.tmp.clone());
    ops.push(("/tmp".into(), Op::Writable(open(&tmp)?)));
    let writable: Vec<PathBuf> = std::iter::once(&policy.workspace)
        .chain(&policy.writable)
        .filter_map(|p| real(p))
        .collect();
    let system_ro = |p: &Path| {
        crate::files::SYSTEM
            .iter()
            .chain(&["/etc"])
            .any(|s| p.starts_with(s))
    };
    let readable: Vec<PathBuf> = policy.readable.iter().filter_map(|p| real(p)).collect();
    let hidden: Vec<PathBuf> = policy.hidden.iter().filter_map(|p| real(p)).collect();
    let protected: Vec<PathBuf> = policy.protected.iter().filter_map(|p| real(p)).collect();
    // Strictly inside a writable folder: the one it is in.
    let in_writable = |p: &Path| {
        writable
            .iter()
            .filter(|w| p.starts_with(w) && p != w.as_path())
            .max_by_key(|w| w.components().count())
            .cloned()
    };
    let covered = |p: &Path| hidden.iter().any(|h| p.starts_with(h));
    // Bound read-only inside a writable folder (a `./.venv`): what the kernel runs later.
    let guarded: Vec<(PathBuf, PathBuf)> = if skip(PROTECTED) {
        Vec::new()
    } else {
        protected
            .iter()
            .filter(|p| !covered(p) && !system_ro(p))
            .filter_map(|p| in_writable(p).map(|w| (p.clone(), w)))
            .collect()
    };
    for p in &readable {
        // Already visible: inside a system folder, or inside a writable folder (where it
        // stays writable, as Landlock's rules are a union; unless it is protected, bound
        // read-only below), unless a hidden folder covers it there (the task's package layer
        // inside the log folder inside the workspace).
        if system_ro(p) || (!covered(p) && in_writable(p).is_some()) {
            continue;
        }
        ops.push((p.clone(), Op::ReadOnly(open(p)?)));
    }
    for w in &writable {
        ops.push((w.clone(), Op::Writable(open(w)?)));
    }
    for (p, _) in &guarded {
        ops.push((p.clone(), Op::ReadOnly(open(p)?)));
    }
    // The log folder, where it is inside a folder bound here (the default layout puts it in
    // the workspace): covered, and the checkpoint folder inside it bound back after.
    for h in hidden {
        if writable
            .iter()
            .chain(&readable)
            .any(|w| h.starts_with(w) && h != *w)
        {
            ops.push((h, Op::Empty("0700", false)));
        }
    }
    // The folders between a writable folder (the workspace, the private `/tmp`) and what is
    // mounted inside it (the log folder's cover, a guarded venv, the checkpoint folder, a
    // workspace under `/tmp`), each made a mount point: a cell cannot rename `.flowrepl` away
    // from above the log folder and make a folder of its own where the kernel looks next, nor
    // move a mount its worker writes through.
    if !skip(PINS) {
        let roots: Vec<PathBuf> = writable
            .iter()
            .cloned()
            .chain(std::iter::once(PathBuf::from("/tmp")))
            .collect();
        let mounted: Vec<PathBuf> = ops.iter().map(|(p, _)| p.clone()).collect();
        let mut pins = std::collections::BTreeSet::new();
        for target in &mounted {
            let Some(root) = roots
                .iter()
                .filter(|r| target.starts_with(r) && target != *r)
                .max_by_key(|r| r.components().count())
            else {
                continue;
            };
            for a in target.ancestors().skip(1) {
                if a == root.as_path() {
                    break;
                }
                let taken =
                    mounted.iter().any(|m| m == a) || guarded.iter().any(|(g, _)| a.starts_with(g));
                if !taken {
                    pins.insert(a.to_path_buf());
                }
            }
        }
        ops.extend(pins.into_iter().map(|a| (a, Op::Pin)));
    }
    ops.sort_by_key(|(p, _)| p.components().count());
    Ok(ops)
}

/// Whether a link into `target` (resolved) leads somewhere the new root holds.
fn visible_inside(target: &Path, etc: &[PathBuf]) -> bool {
    crate::files::SYSTEM
        .iter()
        .chain(&["/proc"])
        .any(|s| target.starts_with(s))
        || etc.iter().any(|a| target.starts_with(a))
}

/// Mounts `ops` under `root`; what fell back is added to `notes`.
fn build(root: &Path, ops: &[(PathBuf, Op)], notes: &mut Vec<String>) -> Result<(), String> {
    let err = |what: &str, p: &Path, e: nix::Error| format!("{what} {}: {e}", p.display());
    let ro = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
    for (path, op) in ops {
        let at = root.join(path.strip_prefix("/").unwrap_or(path));
        let bind = |fd: &OwnedFd| -> Result<(), String> {
            let parent = at.parent().unwrap_or(root);
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot make {}: {e}", parent.display()))?;
            if fd_is_dir(fd) {
                std::fs::create_dir_all(&at).map(drop)
            } else if at.exists() {
                Ok(())
            } else {
                std::fs::File::create(&at).map(drop)
            }
            .map_err(|e| format!("cannot make {}: {e}", at.display()))?;
            mount(
                Some(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str()),
                &at,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(|e| err("cannot bind", path, e))
        };
        match op {
            Op::ReadOnly(fd) => {
                bind(fd)?;
                read_only(&at)
                    .map_err(|e| format!("cannot make {} read-only: {e}", path.display()))?;
            }
            Op::Sysfs(fd) => {
                std::fs::create_dir_all(&at)
                    .map_err(|e| format!("cannot make {}: {e}", at.display()))?;
                let own = mount(
                    Some("sysfs"),
                    &at,
                    Some("sysfs"),
                    MsFlags::MS_RDONLY
                        | MsFlags::MS_NOSUID
                        | MsFlags::MS_NODEV
                        | MsFlags::MS_NOEXEC,
                    None::<&str>,
                );
                if let Err(e) = own {
                    notes.push(format!(
                        "the host refused a sysfs of this network namespace ({e}): /sys is the host's, read-only, and /sys/class/net names the host's interfaces"
                    ));
                    bind(fd)?;
                    read_only(&at)
                        .map_err(|e| format!("cannot make {} read-only: {e}", path.display()))?;
                }
            }
            Op::Writable(fd) => bind(fd)?,
            Op::Pin => {
                std::fs::create_dir_all(&at)
                    .map_err(|e| format!("cannot make {}: {e}", at.display()))?;
                mount(
                    Some(&at),
                    &at,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(|e| err("cannot pin", path, e))?;
            }
            Op::Blank => {
                let blank = root.join(".blank");
                if !blank.exists() {
                    std::fs::File::create(&blank)
                        .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o000)))
                        .map_err(|e| format!("cannot make {}: {e}", blank.display()))?;
                }
                mount(
                    Some(&blank),
                    &at,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(|e| err("cannot hide", path, e))?;
                mount(None::<&str>, &at, None::<&str>, ro, None::<&str>)
                    .map_err(|e| err("cannot make read-only", path, e))?;
            }
            Op::Symlink(target) => {
                let parent = at.parent().unwrap_or(root);
                std::fs::create_dir_all(parent)
                    .and_then(|()| std::os::unix::fs::symlink(target, &at))
                    .map_err(|e| format!("cannot link {}: {e}", path.display()))?;
            }
            Op::Empty(mode, read_only) => {
                std::fs::create_dir_all(&at)
                    .map_err(|e| format!("cannot make {}: {e}", at.display()))?;
                mount(
                    Some("tmpfs"),
                    &at,
                    Some("tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(format!("mode={mode}").as_str()),
                )
                .map_err(|e| err("cannot cover", path, e))?;
                if *read_only {
                    mount(
                        None::<&str>,
                        &at,
                        None::<&str>,
                        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                        None::<&str>,
                    )
                    .map_err(|e| err("cannot make read-only", path, e))?;
                }
            }
        }
    }
    Ok(())
}

/// Makes `root` the root (`pivot_root` with the old root stacked under it, then detached),
/// read-only, and `workspace` the working folder again.
fn pivot(root: &Path, workspace: &Path) -> Result<(), String> {
    let err = |what: &str, e: nix::Error| format!("{what}: {e}");
    nix::unistd::chdir(root).map_err(|e| err("cannot enter the new root", e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| err("pivot_root", e))?;
    nix::mount::umount2(".", nix::mount::MntFlags::MNT_DETACH)
        .map_err(|e| err("cannot detach the host's root", e))?;
    nix::unistd::chdir("/").map_err(|e| err("chdir /", e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| err("cannot make the new root read-only", e))?;
    let ws = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    nix::unistd::chdir(&ws).map_err(|e| err("cannot enter the workspace", e))
}

/// Makes the mount at `at` and every mount under it read-only: `mount_setattr(2)` with
/// `AT_RECURSIVE` (Linux 5.12), else each of them remounted, keeping the flags it has (which
/// a user namespace may not drop: `nosuid`, `nodev`, `noexec` of the host's mounts).
pub(crate) fn read_only(at: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    /// `struct mount_attr` (linux/mount.h).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const AT_RECURSIVE: libc::c_int = 0x8000;
    let path = std::ffi::CString::new(at.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is a NUL-terminated string and `attr` a `struct mount_attr` of the size
    // passed, both alive for the call; nix has no wrapper for mount_setattr.
    let done = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if done == 0 {
        return Ok(());
    }
    let errno = nix::errno::Errno::last();
    if errno != nix::errno::Errno::ENOSYS {
        return Err(format!("mount_setattr: {errno}"));
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    let mut under: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|m| m.starts_with(at))
        .collect();
    under.sort();
    under.dedup();
    for m in under {
        let kept = nix::sys::statvfs::statvfs(&m)
            .map(|st| {
                use nix::sys::statvfs::FsFlags;
                let f = st.flags();
                [
                    (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                    (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                    (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
                    (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
                    (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
                    (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
                ]
                .into_iter()
                .filter(|(st, _)| f.contains(*st))
                .fold(MsFlags::empty(), |acc, (_, ms)| acc | ms)
            })
            .unwrap_or(MsFlags::empty());
        mount(
            None::<&str>,
            &m,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | kept,
            None::<&str>,
        )
        .map_err(|e| format!("remount {}: {e}", m.display()))?;
    }
    Ok(())
}

/// A mount point as `/proc/self/mountinfo` writes it (space, tab, newline and backslash as
/// `\ooo`).
fn unescape_mountinfo(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The parts of the `/proc` in place that change the host's kernel, made read-only (as
/// bubblewrap covers them): `/proc/sys` (a cell with uid 0 in its namespace, mapped to a root
/// kernel's uid, could write `kernel/core_pattern` or the hostname), `/proc/sysrq-trigger`,
/// `/proc/irq`, `/proc/bus`. Called in the Python process once the PID namespace has its
/// own `/proc` (or where it has none, over the host's).
pub fn cover_proc() -> Result<(), String> {
    for part in ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"] {
        let p = Path::new(part);
        if !p.exists() {
            continue;
        }
        mount(
            Some(p),
            p,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| format!("cannot cover {part}: {e}"))?;
        read_only(p).map_err(|e| format!("cannot make {part} read-only: {e}"))?;
    }
    Ok(())
}

fn fd_is_dir(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}
