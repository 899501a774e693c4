//! seccomp: the system calls sandboxes are escaped through, denied (`EPERM`), whatever the
//! other layers hold: `io_uring_*` (it reaches files and sockets without the calls the other
//! layers see), `ptrace` and `process_vm_*`, `bpf`, `perf_event_open`, the key store, mounts
//! and new namespaces (`unshare`, `setns`, `clone` with a `CLONE_NEW*` flag; `clone3`, whose
//! flags a filter cannot read, answers `ENOSYS` so that libc falls back to `clone`), module
//! and kexec loading; `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)`, which push input into a
//! terminal (whatever the host's `dev.tty.legacy_tiocsti`); and sockets of any family but
//! `AF_UNIX` when the network is off, or but `AF_UNIX`, `AF_INET` and `AF_INET6` with the
//! egress proxy (`EAFNOSUPPORT`: no netlink, no packet sockets).

use flowrepl_protocol::sandbox::{Network, SandboxLayer, SandboxPolicy};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// The layer's name.
pub const LAYER: &str = "seccomp";

/// Denied outright.
const DENIED: [i64; 33] = [
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_open_by_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
];

/// `clone` flags that make a namespace.
const NEW_NAMESPACES: [libc::c_int; 7] = [
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// `ioctl` requests refused on any descriptor: they push input into a terminal.
const TERMINAL_INJECTION: [libc::Ioctl; 2] = [libc::TIOCSTI, libc::TIOCLINUX];

/// Installs the filters (and `no_new_privs`, which they need).
pub fn install(policy: &SandboxPolicy, skip: &dyn Fn(&str) -> bool) -> SandboxLayer {
    if skip(LAYER) {
        return crate::skipped(LAYER);
    }
    crate::layer(
        LAYER,
        true,
        filters(policy.network).and_then(|programs| {
            for p in &programs {
                seccompiler::apply_filter(p)
                    .map_err(|e| format!("the host refused the filter: {e}"))?;
            }
            Ok(format!(
                "{} calls denied, clone with CLONE_NEW* denied, ioctl TIOCSTI and TIOCLINUX denied, clone3 ENOSYS{}",
                DENIED.len(),
                match policy.network {
                    Network::Host => "",
                    Network::None => ", sockets other than AF_UNIX EAFNOSUPPORT",
                    Network::Proxy =>
                        ", sockets other than AF_UNIX, AF_INET and AF_INET6 EAFNOSUPPORT",
                }
            ))
        }),
    )
}

/// The filters, each with one answer.
fn filters(network: Network) -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let cond =
        |arg, len, op, value| SeccompCondition::new(arg, len, op, value).map_err(|e| e.to_string());
    let rule = |c: SeccompCondition| SeccompRule::new(vec![c]).map_err(|e| e.to_string());
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|s| (*s, Vec::new())).collect();
    eperm.insert(
        libc::SYS_clone,
        NEW_NAMESPACES
            .iter()
            .map(|f| {
                rule(cond(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(*f as u64),
                    *f as u64,
                )?)
            })
            .collect::<Result<_, _>>()?,
    );
    eperm.insert(
        libc::SYS_ioctl,
        TERMINAL_INJECTION
            .iter()
            .map(|req| {
                // The kernel reads an ioctl's request as an unsigned int: its low 32 bits.
                rule(cond(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    u64::from(*req as u32),
                )?)
            })
            .collect::<Result<_, _>>()?,
    );
    let mut specs = vec![
        (eperm, libc::EPERM),
        (
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            libc::ENOSYS,
        ),
    ];
    let families: &[libc::c_int] = match network {
        Network::Host => &[],
        Network::None => &[libc::AF_UNIX],
        Network::Proxy => &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6],
    };
    if !families.is_empty() {
        // Refused when the domain is none of `families` (one rule: its conditions all hold).
        // The domain is an int: only its low 32 bits count.
        let conditions = families
            .iter()
            .map(|f| cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *f as u64))
            .collect::<Result<Vec<_>, _>>()?;
        specs.push((
            BTreeMap::from([(
                libc::SYS_socket,
                vec![SeccompRule::new(conditions).map_err(|e| e.to_string())?],
            )]),
            libc::EAFNOSUPPORT,
        ));
    }
    specs
        .into_iter()
        .map(|(rules, errno)| {
            let filter = SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(errno as u32),
                arch,
            )
            .map_err(|e| e.to_string())?;
            BpfProgram::try_from(filter).map_err(|e| e.to_string())
        })
        .collect()
}
