//! The worker's sandbox: layers applied in `flowrepl-worker` before Python starts, each
//! reported as the host enforced it ([`flowrepl_protocol::sandbox::SandboxReport`]).
//!
//! # Layers, in the order they are applied
//! - [`terminal`]: no controlling terminal (the kernel started the worker in a session of
//!   its own; checked here), so no input pushed into the user's terminal.
//! - [`namespaces`]: a user namespace, and in it a network namespace of its own (only `lo`,
//!   down: no TCP even to the host's 127.0.0.1), an IPC namespace and a mount namespace with
//!   a new root: the system, the interpreter and the workspace bound from the host, the
//!   kernel's private folder as `/tmp`, nothing else (no home, no host socket).
//! - [`processes`]: a PID namespace under an init of its own, with its own `/proc`: no view
//!   of or signal to any process outside, and nothing started in it outlives the worker.
//! - [`environment`]: only the variables a cell needs (the kernel clears the rest when it
//!   starts the worker; here `HOME` and `TMPDIR` are pointed inside and the result checked).
//! - [`proxy`] (`--sandbox-net=allow:…`): `lo` up, and the egress proxy's listening socket
//!   made in the namespace and handed to the kernel, which decides every connection by name;
//!   `HTTP(S)_PROXY` set for cells.
//! - [`files`]: Landlock: the system, the interpreter and the venv readable, the workspace,
//!   `/tmp` and the checkpoint folder writable, nothing else; TCP bind and connect denied
//!   when the network is off (with the proxy: connect only to its port); signals and
//!   abstract Unix sockets scoped to the sandbox.
//! - [`capabilities`]: none held, the bounding set empty (a kernel run as root on a host
//!   without user namespaces would otherwise give cells every capability of root).
//! - [`syscalls`]: seccomp: what sandboxes are escaped through (`io_uring_*`, `ptrace`,
//!   `process_vm_*`, `bpf`, mounts, new namespaces, `keyctl`, `perf_event_open`, the
//!   terminal ioctls that inject input, ...), and
//!   sockets other than `AF_UNIX` when the network is off (and `AF_INET*` with the proxy). Last, since it forbids what the
//!   layers before it use.
//!
//! A layer the host refuses (no user namespaces in some containers, an older Landlock ABI) is
//! reported as not enforced with the host's reason, and the rest still apply; with
//! `strict`, [`apply`] fails instead. Nothing is ever reported that was not applied.
#![warn(missing_docs)]

pub mod capabilities;
pub mod environment;
pub mod exec;
pub mod files;
pub mod namespaces;
pub mod processes;
pub mod proxy;
pub mod syscalls;
pub mod terminal;

use flowrepl_protocol::sandbox::{Network, SandboxLayer, SandboxPolicy, SandboxReport};

/// Every layer, by the name reports use.
pub const LAYERS: [&str; 12] = [
    terminal::LAYER,
    namespaces::USER,
    namespaces::NETWORK,
    namespaces::IPC,
    namespaces::MOUNT,
    processes::LAYER,
    environment::LAYER,
    files::FILESYSTEM,
    files::NETWORK,
    files::SCOPES,
    capabilities::LAYER,
    syscalls::LAYER,
];

/// Protections within the mount namespace that `FLOWREPL_SANDBOX_SKIP` can also leave out,
/// one at a time (the tests show each is what stops its attempt); never with `strict`, and
/// the mount namespace's report then names what was left out.
pub const PROTECTIONS: [&str; 5] = [
    namespaces::PINS,
    namespaces::PROTECTED,
    namespaces::KERNEL_FILES,
    namespaces::SYSFS,
    namespaces::ETC,
];

/// Whether `FLOWREPL_SANDBOX_SKIP` may name `name`: a layer or a protection.
pub fn skippable(name: &str) -> bool {
    LAYERS.contains(&name) || PROTECTIONS.contains(&name)
}

/// The exit code of a worker whose `strict` sandbox is missing a layer: the kernel then exits
/// 2 itself, with the worker's line.
pub const REFUSED_EXIT: u8 = 78;

/// The sandbox refused to start: `strict`, and the host did not enforce every layer asked
/// for; or a promise no layer in force can keep (the log folder inside the workspace with no
/// mount namespace to hide it).
#[derive(Debug, thiserror::Error)]
#[error("{}: {} not enforced on this host ({})", if .report.level == "strict" { "--sandbox=strict" } else { "--sandbox" }, .missing.join(", "), .why.join("; "))]
pub struct Refused {
    /// The missing layers.
    pub missing: Vec<String>,
    /// Why, one per layer.
    pub why: Vec<String>,
    /// The whole report.
    pub report: Box<SandboxReport>,
}

/// A confined worker.
#[derive(Debug)]
pub struct Confined {
    /// What the host enforced.
    pub report: SandboxReport,
    /// The worker's pid as the kernel knows it (in the PID namespace, the process that
    /// returns from [`apply`] has another).
    pub pid: u32,
}

/// Applies every layer of `policy` to this process, which must be single-threaded (a user
/// namespace cannot be entered otherwise) and must not have started Python. With the PID
/// namespace, only the process that will run Python returns (see [`processes`]).
pub fn apply(policy: &SandboxPolicy) -> Result<Confined, Refused> {
    if policy.strict && !policy.skip.is_empty() {
        // The kernel refuses this at its start; a worker started so by anything else refuses
        // too, before it confines anything.
        return Err(Refused {
            missing: policy.skip.clone(),
            why: vec!["strict refuses FLOWREPL_SANDBOX_SKIP".into()],
            report: Box::new(report(
                policy,
                policy.skip.iter().map(|l| skipped(l)).collect(),
            )),
        });
    }
    let skip = |layer: &str| policy.skip.iter().any(|s| s == layer);
    if !skip(namespaces::PROTECTED) {
        // No layer can help here: refused at any level, before anything is confined.
        if let Some(why) = files::writable_inside_protected(policy) {
            return Err(Refused {
                missing: vec![namespaces::MOUNT.into()],
                why: vec![why],
                report: Box::new(report(policy, Vec::new())),
            });
        }
    }
    let terminal = terminal::check(&skip);
    let mut layers = namespaces::enter(policy, &skip);
    layers.insert(0, terminal);
    // Before the PID namespace splits this process: neither the relay nor init gets the
    // listening socket or the kernel's channel.
    let proxy = match policy.network {
        Network::Proxy => match proxy::hand_over() {
            Ok(port) => Some(port),
            Err(why) => {
                return Err(Refused {
                    missing: vec![namespaces::NETWORK.into()],
                    why: vec![format!("the egress proxy: {why}")],
                    report: Box::new(report(policy, layers)),
                })
            }
        },
        _ => None,
    };
    let mount_ns = layers
        .iter()
        .any(|l| l.layer == namespaces::MOUNT && l.enforced);
    let entered = processes::enter(mount_ns, &skip);
    layers.push(entered.report);
    if mount_ns && !skip(namespaces::KERNEL_FILES) {
        // Whichever `/proc` is in place now (the PID namespace's own, or the host's where it
        // is refused): the kernel's settings in it read-only. (Not before: a `/proc` with
        // parts covered would make the PID namespace's fresh mount "too revealing".)
        if let Err(why) = namespaces::cover_proc() {
            return Err(Refused {
                missing: vec![namespaces::MOUNT.into()],
                why: vec![why],
                report: Box::new(report(policy, layers)),
            });
        }
    }
    layers.push(environment::settle(policy, mount_ns, &skip));
    if let Some(port) = proxy {
        proxy::set_variables(port);
    }
    if !mount_ns && !skip(files::FILESYSTEM) {
        // Landlock can only grant: what lies inside the writable workspace cannot be taken
        // out of it. Without the mount namespace to cover it, the task log and the
        // checkpoint folders would be writable from a cell: refuse, whatever the level.
        if let Some(why) = files::exposed(policy) {
            return Err(Refused {
                missing: vec![files::FILESYSTEM.into()],
                why: vec![why],
                report: Box::new(report(policy, layers)),
            });
        }
    }
    layers.extend(files::restrict(policy, mount_ns, proxy, &skip));
    layers.push(capabilities::drop_all(&skip));
    layers.push(syscalls::install(policy, &skip));
    let report = report(policy, layers);
    let missing: Vec<&SandboxLayer> = report.missing().collect();
    if policy.strict && !missing.is_empty() {
        return Err(Refused {
            missing: missing.iter().map(|l| l.layer.clone()).collect(),
            why: missing
                .iter()
                .map(|l| format!("{}: {}", l.layer, l.detail))
                .collect(),
            report: Box::new(report.clone()),
        });
    }
    Ok(Confined {
        report,
        pid: entered.pid,
    })
}

/// The report of `layers` under `policy`.
fn report(policy: &SandboxPolicy, layers: Vec<SandboxLayer>) -> SandboxReport {
    SandboxReport {
        level: if policy.strict {
            "strict"
        } else {
            "best-effort"
        }
        .into(),
        network: policy.network.name().into(),
        rules: Vec::new(),
        layers,
    }
}

/// A layer's report.
pub(crate) fn layer(name: &str, wanted: bool, outcome: Result<String, String>) -> SandboxLayer {
    let (enforced, detail) = match outcome {
        Ok(d) => (true, d),
        Err(e) => (false, e),
    };
    SandboxLayer {
        layer: name.into(),
        enforced,
        wanted,
        detail,
    }
}

/// A layer left out on purpose (`FLOWREPL_SANDBOX_SKIP`).
pub(crate) fn skipped(name: &str) -> SandboxLayer {
    layer(name, false, Err("skipped (FLOWREPL_SANDBOX_SKIP)".into()))
}

/// A layer the policy asks for: [`skipped`] when `skip` leaves it out, else applied by `apply`.
pub(crate) fn unless_skipped(
    name: &str,
    skip: &dyn Fn(&str) -> bool,
    apply: impl FnOnce() -> Result<String, String>,
) -> SandboxLayer {
    if skip(name) {
        skipped(name)
    } else {
        layer(name, true, apply())
    }
}

/// A network layer `--sandbox-net` does not ask for.
pub(crate) fn network_kept(name: &str) -> SandboxLayer {
    layer(
        name,
        false,
        Err("not asked for: --sandbox-net keeps the host's network".into()),
    )
}
