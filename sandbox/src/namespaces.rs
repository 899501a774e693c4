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
    out.push(crate::unless_skipped(MOUNT, skip, || {
        entered.and_then(|()| private_mounts(policy))
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
fn private_mounts(policy: &SandboxPolicy) -> Result<String, String> {
    let err = |what: &str, e: nix::Error| format!("{what}: {e}");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| err("cannot make / private", e))?;
    let ops = plan(policy)?;
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
    let built = build(staging, &ops).and_then(|()| pivot(staging, &policy.workspace));
    if let Err(e) = built {
        let _ = nix::mount::umount2(staging, nix::mount::MntFlags::MNT_DETACH);
        return Err(e);
    }
    let binds = ops
        .iter()
        .filter(|(_, op)| matches!(op, Op::ReadOnly(_) | Op::Writable(_)))
        .count();
    Ok(format!(
        "a new root of {binds} binds: the system, /etc without its secrets, the interpreter and the venv read-only; the workspace, the checkpoint folder and a private /tmp writable; nothing else of the host's files (home, /var, /run, the log folder, Unix sockets) exists inside"
    ))
}

/// Opens every host path the new root holds (before anything is covered) and orders the
/// mounts outer paths first, so that a folder covered or bound inside another comes after it.
fn plan(policy: &SandboxPolicy) -> Result<Vec<(PathBuf, Op)>, String> {
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
            Ok(m) if m.is_dir() => ops.push((dir.to_path_buf(), Op::ReadOnly(open(dir)?))),
            _ => {}
        }
    }
    ops.push(("/etc".into(), Op::ReadOnly(open(Path::new("/etc"))?)));
    for hidden in crate::files::ETC_HIDDEN {
        let path = Path::new("/etc").join(hidden);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => ops.push((path, Op::Empty("0755", true))),
            Ok(m) if m.is_file() => ops.push((path, Op::Blank)),
            _ => {}
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
    for p in &readable {
        // Already visible: inside a system folder, or inside a writable folder (where it
        // stays writable, as Landlock's rules are a union), unless a hidden folder covers it
        // there (the task's package layer inside the log folder inside the workspace).
        let covered = hidden.iter().any(|h| p.starts_with(h));
        if system_ro(p) || (!covered && writable.iter().any(|w| p.starts_with(w))) {
            continue;
        }
        ops.push((p.clone(), Op::ReadOnly(open(p)?)));
    }
    for w in &writable {
        ops.push((w.clone(), Op::Writable(open(w)?)));
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
    ops.sort_by_key(|(p, _)| p.components().count());
    Ok(ops)
}

/// Mounts `ops` under `root`.
fn build(root: &Path, ops: &[(PathBuf, Op)]) -> Result<(), String> {
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
                mount(None::<&str>, &at, None::<&str>, ro, None::<&str>)
                    .map_err(|e| err("cannot make read-only", path, e))?;
            }
            Op::Writable(fd) => bind(fd)?,
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

fn fd_is_dir(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}
