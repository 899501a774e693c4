//! Landlock: which files the sandbox may read and write, TCP, and the scopes (signals and
//! abstract Unix sockets).
//!
//! Readable: the system (`/usr`, `/lib*`, `/bin`, `/sbin`, `/etc` without its secrets,
//! `/proc`, `/sys`, a few devices), the interpreter's prefixes, the venv and the Python
//! library ([`SandboxPolicy::readable`]). Writable: the workspace, the private `/tmp`, the
//! checkpoint folder ([`SandboxPolicy::writable`]), and with the mount namespace the private
//! `/dev/shm` and `/var/tmp`. Nothing else: the user's home, other users' files, the task log
//! and the rest of the log folder are neither readable nor writable. Landlock checks at
//! `open()` and on every path walk's result, so a symlink or a hard link made in the workspace
//! that leads outside opens nothing outside (a hard link to a file needs the right to the
//! file where it is, and cross-directory links are `LANDLOCK_ACCESS_FS_REFER`-checked).

use flowrepl_protocol::sandbox::{Network, SandboxLayer, SandboxPolicy};
use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus,
    NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::{Path, PathBuf};

/// The filesystem rules.
pub const FILESYSTEM: &str = "landlock_filesystem";
/// TCP bind and connect denied (with the egress proxy: connect only to its port).
pub const NETWORK: &str = "landlock_network";
/// Signals and abstract Unix sockets scoped to the sandbox.
pub const SCOPES: &str = "landlock_scopes";

/// The newest ABI these rules are written for.
const ABI_USED: ABI = ABI::V6;

/// System folders readable (and executable).
pub(crate) const SYSTEM: [&str; 8] = [
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/sys",
];

/// Entries of `/etc` a user expects hidden (password hashes, sudo rules, host keys).
pub(crate) const ETC_HIDDEN: [&str; 8] = [
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "security",
];

/// What of `/etc` the sandbox holds (with the mount namespace, the only entries of its
/// `/etc`; for Landlock, the only ones readable): what CPython and the libraries cells use
/// read there. Certificates (not `ssl/private`), the resolver's and the name service's
/// files, the time zone, users and groups (names only: no `shadow`), MIME types and magic,
/// fonts, the dynamic linker's cache, `alternatives` (links `/usr/bin` programs go through),
/// the OS's name and version, Debian's `python3*` folders (its `sitecustomize`). Not the
/// other services' configuration, keys or credentials (`pip.conf`, `ssh`, `npmrc`, ...).
pub const ETC_ALLOWED: [&str; 41] = [
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "debian_version",
    "fonts",
    "gai.conf",
    "group",
    "host.conf",
    "hostname",
    "hosts",
    "ImageMagick-6",
    "ImageMagick-7",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "locale.conf",
    "localtime",
    "lsb-release",
    "magic",
    "magic.mime",
    "mailcap",
    "matplotlibrc",
    "mime.types",
    "mtab",
    "networks",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "pki/tls/certs",
    "pki/ca-trust",
    "protocols",
    "resolv.conf",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
];

/// The entries of [`ETC_ALLOWED`] this host has, and its `/etc/python3*` folders.
pub fn etc_allowed() -> Vec<PathBuf> {
    let etc = Path::new("/etc");
    let mut out: Vec<PathBuf> = ETC_ALLOWED
        .iter()
        .map(|e| etc.join(e))
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    out.extend(
        std::fs::read_dir(etc)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path()),
    );
    out
}

/// Devices readable and writable.
pub(crate) const DEVICES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Restricts this process (and every process it starts) to `policy`'s files; one report per
/// Landlock layer. `proxy`: the egress proxy's port, the one TCP connect allowed.
pub fn restrict(
    policy: &SandboxPolicy,
    mount_ns: bool,
    proxy: Option<u16>,
    skip: &dyn Fn(&str) -> bool,
) -> Vec<SandboxLayer> {
    if skip(FILESYSTEM) {
        return vec![
            crate::skipped(FILESYSTEM),
            crate::skipped(NETWORK),
            crate::skipped(SCOPES),
        ];
    }
    let deny_tcp = policy.network != Network::Host && !skip(NETWORK);
    let scoped = !skip(SCOPES);
    let read: Vec<PathBuf> = SYSTEM
        .iter()
        .map(PathBuf::from)
        .chain(if skip(crate::namespaces::ETC) {
            etc_entries()
        } else {
            etc_allowed()
        })
        .chain(std::iter::once(PathBuf::from("/proc")))
        .chain(policy.readable.iter().cloned())
        .filter(|p| p.exists())
        .collect();
    // With the mount namespace these are private to the sandbox; without it they are the
    // host's, and only the kernel's private folder stands for `/tmp`.
    let private: &[&str] = if mount_ns {
        &["/tmp", "/dev/shm", "/var/tmp"]
    } else {
        &[]
    };
    let write: Vec<PathBuf> = std::iter::once(policy.workspace.clone())
        .chain(policy.writable.iter().cloned())
        .chain(std::iter::once(policy.tmp.clone()))
        .chain(private.iter().chain(&DEVICES).map(PathBuf::from))
        // The worker resets its peak RSS per cell there (`usage`).
        .chain(std::iter::once(PathBuf::from("/proc/self/clear_refs")))
        .filter(|p| p.exists())
        .collect();
    let outcome = (|| -> Result<landlock::RestrictionStatus, landlock::RulesetError> {
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(ABI_USED))?;
        if deny_tcp {
            ruleset = ruleset.handle_access(AccessNet::from_all(ABI_USED))?;
        }
        if scoped {
            ruleset = ruleset.scope(Scope::from_all(ABI_USED))?;
        }
        let mut created = ruleset
            .create()?
            .add_rules(path_beneath_rules(&read, AccessFs::from_read(ABI_USED)))?
            .add_rules(path_beneath_rules(&write, AccessFs::from_all(ABI_USED)))?;
        if let (true, Some(port)) = (deny_tcp, proxy) {
            created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
        }
        created.restrict_self()
    })();
    let status = match outcome {
        Ok(s) => s,
        Err(e) => {
            let why = format!("Landlock refused the ruleset: {e}");
            return vec![
                crate::layer(FILESYSTEM, true, Err(why.clone())),
                crate::layer(NETWORK, deny_tcp, Err(why.clone())),
                crate::layer(SCOPES, scoped, Err(why)),
            ];
        }
    };
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => Some(effective_abi),
        _ => None,
    };
    let enforced = status.ruleset != RulesetStatus::NotEnforced;
    let have = |min: ABI, what: &str| -> Result<String, String> {
        match abi {
            Some(a) if enforced && a >= min => Ok(format!("Landlock ABI {}: {what}", a as i32)),
            Some(a) if enforced => Err(format!(
                "this kernel's Landlock ABI is {}; {what} needs ABI {}",
                a as i32, min as i32
            )),
            _ => Err(format!(
                "Landlock is not enforced here ({:?})",
                status.landlock
            )),
        }
    };
    vec![
        crate::layer(
            FILESYSTEM,
            true,
            have(
                ABI::V1,
                &format!(
                    "readable: the system and {}; writable: {}",
                    policy
                        .readable
                        .iter()
                        .filter(|p| p.exists())
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    write
                        .iter()
                        .filter(|p| !p.starts_with("/dev/") && !p.starts_with("/proc/"))
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        ),
        match (policy.network, proxy) {
            (Network::Host, _) => crate::network_kept(NETWORK),
            (_, Some(port)) => crate::unless_skipped(NETWORK, skip, || {
                have(
                    ABI::V4,
                    &format!("TCP bind denied, connect only to the egress proxy's port {port}"),
                )
            }),
            (_, None) => crate::unless_skipped(NETWORK, skip, || {
                have(ABI::V4, "TCP bind and connect denied")
            }),
        },
        crate::unless_skipped(SCOPES, skip, || {
            have(
                ABI::V6,
                "no signal to, and no abstract Unix socket of, a process outside",
            )
        }),
    ]
}

/// The entries of `/etc` but [`ETC_HIDDEN`].
fn etc_entries() -> Vec<PathBuf> {
    std::fs::read_dir("/etc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !ETC_HIDDEN.iter().any(|h| e.file_name() == *h))
        .map(|e| e.path())
        .collect()
}

/// The installation prefix above `dir` (a resolved interpreter's folder): the first of its
/// ancestors with a standard library (`lib/python3.*/os.py`), as CPython's own search finds
/// it.
pub fn python_prefix(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|a| {
            std::fs::read_dir(a.join("lib")).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    e.file_name().to_string_lossy().starts_with("python3")
                        && e.path().join("os.py").is_file()
                })
            })
        })
        .map(Path::to_path_buf)
}

/// Why `path` must not be made readable: it is `/`, or the user's home or a folder that holds
/// it (every file of the user's would be readable).
pub fn too_wide(path: &Path) -> Option<&'static str> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if real == Path::new("/") {
        return Some("it is /");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let home = std::fs::canonicalize(&home).unwrap_or(home);
    home.starts_with(&real)
        .then_some("it is the user's home, or holds it")
}

/// The prefix of the libpython mapped in this process (the worker loads its Python library,
/// and with it libpython, before it confines itself): the embedded interpreter finds its
/// standard library there when its program's own prefix has none of its version (a
/// `--python /bin/python3` served by a library built against another installation).
pub fn libpython_prefix() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libpython3"))
        })?;
    python_prefix(Path::new(lib).parent()?)
}

/// Why the sandbox cannot keep what the kernel runs from a cell whatever the host enforces:
/// a writable folder (the workspace, the checkpoint folder) lies inside one of
/// [`SandboxPolicy::protected`] (a server's task whose workspace is `venv/bin` of the
/// interpreter it serves). System folders (`/usr`, ...) are left out: the interpreter's
/// prefix may be `/usr`, which holds everything.
pub fn writable_inside_protected(policy: &SandboxPolicy) -> Option<String> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let protected: Vec<PathBuf> = policy
        .protected
        .iter()
        .map(|p| real(p))
        .filter(|p| !SYSTEM.iter().any(|s| p.starts_with(s)) && p != Path::new("/"))
        .collect();
    std::iter::once(&policy.workspace)
        .chain(&policy.writable)
        .map(|w| real(w))
        .find_map(|w| {
            protected.iter().find(|p| w.starts_with(p)).map(|p| {
                format!(
                    "the writable {} lies inside {}, which the kernel runs outside the sandbox (an interpreter, its venv, the kernel's own folder): a cell could replace it; put the workspace elsewhere",
                    w.display(),
                    p.display()
                )
            })
        })
}

/// Why the hidden folders (the log folder) cannot be kept from a cell without the mount
/// namespace: one of them is inside a writable folder (the default layout puts
/// `./.flowrepl/logs` inside the workspace, the current folder).
pub fn exposed(policy: &SandboxPolicy) -> Option<String> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let writable: Vec<PathBuf> = std::iter::once(&policy.workspace)
        .chain(&policy.writable)
        .map(|p| real(p))
        .collect();
    let inside = |p: &Path| {
        writable
            .iter()
            .find(|w| p.starts_with(w) && p != w.as_path())
            .cloned()
    };
    let hidden = policy.hidden.iter().map(|h| real(h)).find_map(|h| {
        writable.iter().find(|w| h.starts_with(w)).map(|w| {
            format!(
                "the log folder {} is inside the writable {} and the mount namespace that would hide it is not in force: a cell could write the task log; put the log folder (FLOWREPL_LOG_DIR) or the workspace (--workspace) elsewhere",
                h.display(),
                w.display()
            )
        })
    });
    hidden.or_else(|| {
        policy.protected.iter().map(|p| real(p)).find_map(|p| {
            inside(&p).map(|w| {
                format!(
                    "{} is inside the writable {} and the mount namespace that would make it read-only is not in force: a cell could change what the kernel runs outside the sandbox (a venv's interpreter, its site-packages); put the venv or the workspace (--workspace) elsewhere",
                    p.display(),
                    w.display()
                )
            })
        })
    })
}
