//! `--sandbox`: the policy a worker is confined by, from the session's configuration, the
//! private folder that becomes its `/tmp`, and the worker's environment. The layers are applied by the worker itself
//! (`flowrepl-sandbox`), before Python starts.

use super::process::SpawnConfig;
use crate::config::SandboxConfig;
use flowrepl_exec::setup::SessionSetup;
use flowrepl_protocol::sandbox::SandboxPolicy;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a sandboxed worker may read beyond the system: the interpreter's prefixes (the venv,
/// the installation it was made from, as named and as resolved), the Python library, the
/// session's startup files and drop-in script folder, `PYTHONPATH`.
fn readable(python: &Path, python_lib: Option<&Path>, setup: &SessionSetup) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut prefix_of = |exe: &Path| {
        if exe.is_dir() {
            out.push(exe.to_path_buf());
        } else if let Some(p) = exe.parent().and_then(Path::parent) {
            out.push(p.to_path_buf());
        }
    };
    prefix_of(python);
    if let Ok(real) = std::fs::canonicalize(python) {
        prefix_of(&real);
    }
    let venv = if python.is_dir() {
        Some(python.to_path_buf())
    } else {
        python
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
    };
    if let Some(cfg) = venv.map(|v| v.join("pyvenv.cfg")) {
        let home = std::fs::read_to_string(cfg).ok().and_then(|text| {
            text.lines()
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == "home")
                .map(|(_, v)| PathBuf::from(v.trim()))
        });
        if let Some(home) = home {
            for h in [Some(home.clone()), std::fs::canonicalize(&home).ok()]
                .into_iter()
                .flatten()
            {
                out.extend(h.parent().map(Path::to_path_buf));
            }
        }
    }
    out.extend(python_lib.map(Path::to_path_buf));
    // The compiled support code (read only: a cell must not plant code that a kernel outside
    // the sandbox would load).
    out.extend(flowrepl_exec::setup::support_cache_dir().filter(|d| d.is_dir()));
    out.extend(setup.startup.iter().cloned());
    out.extend(setup.path0.iter().cloned());
    if let Some(pp) = std::env::var_os("PYTHONPATH") {
        out.extend(std::env::split_paths(&pp).filter(|p| p.is_absolute()));
    }
    out.sort();
    out.dedup();
    out
}

/// Readies `cmd` to start a sandboxed worker: its private folder (its `/tmp`, removed with
/// the returned value), the checkpoint folder made so that it can be granted, a cleared
/// environment, the workspace as its working directory; and the policy it applies.
pub fn prepare(
    cmd: &mut Command,
    sandbox: &SandboxConfig,
    spawn: &SpawnConfig,
) -> io::Result<(SandboxPolicy, tempfile::TempDir)> {
    let tmp = tempfile::Builder::new()
        .prefix("flowrepl-sandbox-")
        .tempdir()?;
    // When it cannot be made (a full or read-only disk), the worker says so at its first
    // checkpoint, as without the sandbox.
    let checkpoints = spawn
        .snapshots
        .as_ref()
        .map(|s| s.root.as_path())
        .filter(|root| flowrepl_task_logger::snapshot::open_root(root).is_ok());
    let policy = SandboxPolicy {
        strict: sandbox.strict,
        network: sandbox.network,
        workspace: sandbox.workspace.clone(),
        writable: checkpoints.map(Path::to_path_buf).into_iter().collect(),
        readable: readable(&spawn.python, spawn.python_lib.as_deref(), &spawn.setup),
        hidden: vec![sandbox.log_dir.clone()],
        tmp: tmp.path().to_path_buf(),
        skip: sandbox.skip.clone(),
    };
    // Only what a cell needs of the kernel's environment (the worker checks it).
    if !sandbox
        .skip
        .iter()
        .any(|l| l == flowrepl_sandbox::environment::LAYER)
    {
        cmd.env_clear().envs(flowrepl_sandbox::environment::kept());
    }
    if let Some(cache) = flowrepl_exec::setup::support_cache_dir() {
        // Its HOME will point inside the sandbox: the cache stays the user's.
        cmd.env(flowrepl_exec::setup::SUPPORT_CACHE_ENV, cache);
    }
    cmd.current_dir(&sandbox.workspace);
    Ok((policy, tmp))
}
