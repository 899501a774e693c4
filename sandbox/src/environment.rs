//! The environment a sandboxed worker keeps: what a cell needs, not the kernel's other
//! variables (tokens, keys, the user's settings). The kernel starts the worker with only
//! [`kept`] of its own; the worker then points `HOME` and `TMPDIR` inside the sandbox
//! ([`settle`]) and checks that nothing else came through.

use flowrepl_protocol::sandbox::{SandboxLayer, SandboxPolicy};
use std::ffi::OsString;

/// The layer's name.
pub const LAYER: &str = "environment";

/// Variables kept by name.
const KEPT: [&str; 15] = [
    "PATH",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "FLOW_PLAN_ID",
    "FLOW_TASK_ID",
    "FLOW_TASK_NAME",
    flowrepl_os::logging::LOG_ENV,
    flowrepl_exec::setup::SUPPORT_CACHE_ENV,
    "MPLBACKEND",
    "VIRTUAL_ENV",
    "HOME",
    "TMPDIR",
    "RUST_BACKTRACE",
];

/// Variables kept by prefix: the locale, and `PYTHON*` (the kernel sets drop-in flags and
/// `PYTHONPATH` there).
const KEPT_PREFIXES: [&str; 2] = ["LC_", "PYTHON"];

/// Whether `name` is kept.
pub fn is_kept(name: &str) -> bool {
    KEPT.contains(&name) || KEPT_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The kernel's variables a sandboxed worker starts with.
pub fn kept() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| k.to_str().is_some_and(is_kept))
        .collect()
}

/// Points `HOME` and `TMPDIR` inside the sandbox and checks the rest. Runs while the process
/// is single-threaded (it sets variables).
pub fn settle(policy: &SandboxPolicy, mount_ns: bool, skip: &dyn Fn(&str) -> bool) -> SandboxLayer {
    if skip(LAYER) {
        return crate::skipped(LAYER);
    }
    let tmp = if mount_ns {
        std::path::PathBuf::from("/tmp")
    } else {
        policy.tmp.clone()
    };
    let home = tmp.join("home");
    if let Err(e) = std::fs::create_dir_all(&home) {
        return crate::layer(
            LAYER,
            true,
            Err(format!("cannot make {}: {e}", home.display())),
        );
    }
    // SAFETY (of the environment): the worker has one thread here, before Python starts.
    std::env::set_var("HOME", &home);
    std::env::set_var("TMPDIR", &tmp);
    let foreign: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| {
            let k = k.to_string_lossy().into_owned();
            (!is_kept(&k)).then_some(k)
        })
        .collect();
    crate::layer(
        LAYER,
        true,
        if foreign.is_empty() {
            Ok(format!(
                "only PATH, the locale, TERM, TZ, FLOW_*, PYTHON*, VIRTUAL_ENV, MPLBACKEND; HOME={}",
                home.display()
            ))
        } else {
            Err(format!(
                "the worker was started with {}",
                foreign.join(", ")
            ))
        },
    )
}
