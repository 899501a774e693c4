//! Namespaces: a user namespace (which lets an unprivileged process make the others), a
//! network namespace of its own, an IPC namespace, and a mount namespace with a private
//! `/tmp` and an empty `/run`, `/var/tmp` and `/dev/shm`.
//!
//! The PID namespace comes next, in [`crate::processes`] (it splits the process).

use flowrepl_protocol::sandbox::{SandboxLayer, SandboxPolicy};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The user namespace.
pub const USER: &str = "user_namespace";
/// The network namespace.
pub const NETWORK: &str = "network_namespace";
/// The IPC namespace.
pub const IPC: &str = "ipc_namespace";
/// The mount namespace.
pub const MOUNT: &str = "mount_namespace";

/// Folders of the host replaced by an empty tmpfs in the mount namespace (sockets and shared
/// memory of other processes live there).
const EMPTIED: [&str; 3] = ["/run", "/var/tmp", "/dev/shm"];

/// Enters the namespaces `policy` asks for; one report per namespace.
pub fn enter(policy: &SandboxPolicy, skip: &dyn Fn(&str) -> bool) -> Vec<SandboxLayer> {
    if skip(USER) {
        return [USER, NETWORK, IPC, MOUNT]
            .into_iter()
            .map(crate::skipped)
            .collect();
    }
    let want_net = !policy.network && !skip(NETWORK);
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
    out.push(if policy.network {
        crate::network_kept(NETWORK)
    } else {
        crate::unless_skipped(NETWORK, skip, || {
            entered
                .clone()
                .map(|()| "a network namespace of its own: only lo, down".into())
        })
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

/// In the new mount namespace: nothing propagates back to the host; `/tmp` is the kernel's
/// private folder; [`EMPTIED`] folders and the policy's hidden ones (the log folder) are
/// covered by an empty tmpfs; what the sandbox must still reach under them (the workspace,
/// the venv, the checkpoint folder) is bound back at its own path, outer paths first.
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
    let real = |p: &Path| std::fs::canonicalize(p).ok();
    let emptied: Vec<PathBuf> = EMPTIED
        .iter()
        .map(PathBuf::from)
        .chain(policy.hidden.iter().filter_map(|p| real(p)))
        .filter(|d| d.is_dir())
        .collect();
    let covered: Vec<PathBuf> = std::iter::once(PathBuf::from("/tmp"))
        .chain(emptied.iter().cloned())
        .collect();
    // Opened before anything is covered: the paths to bind back, by fd.
    let mut ops: Vec<(PathBuf, Option<OwnedFd>)> =
        emptied.iter().map(|d| (d.clone(), None)).collect();
    let tmp = real(&policy.tmp).unwrap_or_else(|| policy.tmp.clone());
    for p in std::iter::once(&policy.workspace)
        .chain(&policy.writable)
        .chain(&policy.readable)
    {
        let Some(path) = real(p) else { continue };
        if covered.iter().any(|c| path.starts_with(c)) && !path.starts_with(&tmp) {
            let fd = nix::fcntl::open(
                &path,
                nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| err(&format!("cannot open {}", path.display()), e))?;
            ops.push((path, Some(fd)));
        }
    }
    // Outer paths first, so that what is bound back inside a covered folder stays visible.
    ops.sort_by_key(|(p, _)| p.components().count());
    mount(
        Some(&tmp),
        "/tmp",
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| err("cannot bind the private /tmp", e))?;
    let (mut covers, mut binds) = (0, 0);
    for (path, fd) in &ops {
        match fd {
            None => {
                // Under the private /tmp it no longer exists, and nothing of it is visible.
                if !path.is_dir() {
                    continue;
                }
                let mode = if path == Path::new("/run") {
                    "0755"
                } else {
                    "1777"
                };
                mount(
                    Some("tmpfs"),
                    path,
                    Some("tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(format!("mode={mode}").as_str()),
                )
                .map_err(|e| err(&format!("cannot cover {}", path.display()), e))?;
                covers += 1;
            }
            Some(fd) => {
                if fd_is_dir(fd) {
                    std::fs::create_dir_all(path)
                } else {
                    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))
                        .and_then(|()| std::fs::File::create(path).map(drop))
                }
                .map_err(|e| format!("cannot make {}: {e}", path.display()))?;
                mount(
                    Some(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str()),
                    path,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(|e| err(&format!("cannot bind {} back", path.display()), e))?;
                binds += 1;
            }
        }
    }
    Ok(format!(
        "/tmp is private; {covers} folder(s) covered (/run, /var/tmp, /dev/shm, the log folder); {binds} path(s) bound back"
    ))
}

fn fd_is_dir(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}
