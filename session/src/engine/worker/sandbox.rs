//! `--sandbox`: the policy a worker is confined by, from the session's configuration, the
//! private folder that becomes its `/tmp`, and the worker's environment. The layers are applied by the worker itself
//! (`flowrepl-sandbox`), before Python starts.

use super::SpawnConfig;
use crate::config::SandboxConfig;
use flowrepl_exec::setup::SessionSetup;
use flowrepl_protocol::sandbox::SandboxPolicy;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a sandboxed worker may read beyond the system: [`protected`], and the session's
/// startup files, drop-in script folder and `PYTHONPATH` (the user's own code, which stays
/// writable where it lies in the workspace: only the worker runs it). Never `/`, the user's
/// home or a folder above it ([`flowrepl_sandbox::files::too_wide`]): those are left out,
/// with a warning.
pub(crate) fn readable(
    python: &Path,
    python_lib: Option<&Path>,
    setup: &SessionSetup,
) -> Vec<PathBuf> {
    let mut out = protected(python, python_lib, setup);
    out.extend(setup.startup.iter().cloned());
    out.extend(setup.path0.iter().cloned());
    if let Some(pp) = std::env::var_os("PYTHONPATH") {
        out.extend(std::env::split_paths(&pp).filter(|p| p.is_absolute()));
    }
    out.retain(|p| match flowrepl_sandbox::files::too_wide(p) {
        Some(why) => {
            tracing::warn!(path = %p.display(), "not made readable in the sandbox: {why}");
            false
        }
        None => true,
    });
    out.sort();
    out.dedup();
    out
}

/// What the kernel itself, outside the sandbox, runs or reads by path at a later start, and
/// so what no cell may change ([`SandboxPolicy::protected`]): the interpreter's installation
/// (the venv, and the prefix of the Python it was made from, found as CPython finds it: from
/// the resolved program up to the first folder with a `lib/python3.*/os.py`; the kernel
/// probes it, the installer runs it), the Python library, the support-code cache, the task's
/// package layer.
fn protected(python: &Path, python_lib: Option<&Path>, setup: &SessionSetup) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let venv = if python.is_dir() {
        Some(python.to_path_buf())
    } else {
        python
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
    }
    .filter(|v| v.join("pyvenv.cfg").is_file());
    let base_from = match &venv {
        Some(v) => {
            out.push(v.clone());
            flowrepl_pythons::venv_home(v).unwrap_or_else(|| v.join("bin"))
        }
        None => python.parent().map_or_else(PathBuf::new, Path::to_path_buf),
    };
    // The program as resolved (`/bin/python3` is `/usr/bin/python3.11`), then its folder's.
    for start in [
        std::fs::canonicalize(python)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf)),
        std::fs::canonicalize(&base_from).ok(),
    ]
    .into_iter()
    .flatten()
    {
        out.extend(flowrepl_sandbox::files::python_prefix(&start));
    }
    out.extend(python_lib.map(Path::to_path_buf));
    // The compiled support code (a cell must not plant code that a kernel outside the
    // sandbox would load).
    out.extend(flowrepl_exec::setup::support_cache_dir().filter(|d| d.is_dir()));
    // The task's package layer, read-only: its whole folder (not the `current` link, which a
    // bind would follow to the generation of the moment), so that each install's switch is
    // seen inside.
    out.extend(
        setup
            .packages
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf),
    );
    out.retain(|p| flowrepl_sandbox::files::too_wide(p).is_none());
    out.sort();
    out.dedup();
    out
}

/// A sandboxed worker's private folder (its `/tmp`), removed when this value drops, however
/// deep the tree a cell left in it ([`flowrepl_os::tree::remove_tree`]).
#[derive(Debug)]
pub struct PrivateTmp(PathBuf);

impl PrivateTmp {
    /// Its path on the host.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        if let Err(e) = flowrepl_os::tree::remove_tree(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "a sandboxed worker's private folder could not be removed");
        }
    }
}

/// The private folders' names in the host's temporary folder: this prefix, the kernel's pid,
/// `-`, a random part.
const TMP_PREFIX: &str = "flowrepl-sandbox-";

/// Removes the private folders of kernels that are gone (killed before they could remove
/// them): those of this user named for a pid no process has. Once per kernel, before its
/// first sandboxed worker.
fn sweep_leftovers() {
    let me = nix::unistd::geteuid().as_raw();
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TMP_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let mine = e
            .metadata()
            .is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == me);
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if mine && gone && pid > 0 {
            if let Err(err) = flowrepl_os::tree::remove_tree(&e.path()) {
                tracing::warn!(path = %e.path().display(), error = %err, "a dead kernel's sandbox folder could not be removed");
            }
        }
    }
}

/// Readies `cmd` to start a sandboxed worker: its private folder (its `/tmp`, removed with
/// the returned value), the checkpoint folder made so that it can be granted, a cleared
/// environment, the workspace as its working directory; and the policy it applies.
pub fn prepare(
    cmd: &mut Command,
    sandbox: &SandboxConfig,
    spawn: &SpawnConfig,
) -> io::Result<(SandboxPolicy, PrivateTmp)> {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_leftovers);
    // 0700: only this user (and inside, only the worker) reaches what cells put there.
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{TMP_PREFIX}{}-", std::process::id()))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .map(|t| PrivateTmp(t.keep()))?;
    // When it cannot be made (a full or read-only disk), the worker says so at its first
    // checkpoint, as without the sandbox.
    let checkpoints = spawn
        .checkpoints
        .as_ref()
        .map(|s| s.root.as_path())
        .filter(|root| flowrepl_task_logger::checkpoint::open_root(root).is_ok());
    if let Some(root) = checkpoints {
        // From now on the task's checkpoints hold what sandboxed cells made: a kernel without
        // the sandbox does not restore them unless told to.
        let mark = flowrepl_task_logger::checkpoint::sandboxed_mark(root);
        if !mark.exists() {
            if let Err(e) = std::fs::write(
                &mark,
                "checkpoints of this task were written by a sandboxed session\n",
            ) {
                tracing::warn!(path = %mark.display(), error = %e, "cannot mark the task's checkpoints as written by a sandboxed session");
            }
        }
    }
    let policy = SandboxPolicy {
        strict: sandbox.strict,
        network: sandbox.network.network(),
        workspace: sandbox.workspace.clone(),
        writable: checkpoints.map(Path::to_path_buf).into_iter().collect(),
        readable: readable(&spawn.python, spawn.python_lib.as_deref(), &spawn.setup),
        hidden: vec![sandbox.log_dir.clone()],
        protected: protected(&spawn.python, spawn.python_lib.as_deref(), &spawn.setup)
            .into_iter()
            // The kernel's own executables: it starts the next worker from there (a checkout
            // used as the workspace holds `target/`).
            .chain(
                std::env::current_exe()
                    .ok()
                    .and_then(|e| e.parent().map(Path::to_path_buf)),
            )
            .chain(spawn.exe.parent().map(Path::to_path_buf))
            .collect(),
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
