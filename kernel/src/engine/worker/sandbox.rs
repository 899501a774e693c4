//! `--sandbox`: the policy a worker is confined by, from the session's configuration, and the
//! private folder that becomes its `/tmp`. The layers are applied by the worker itself
//! (`flowrepl-sandbox`), before Python starts.

use crate::config::SandboxConfig;
use flowrepl_exec::setup::SessionSetup;
use flowrepl_protocol::sandbox::SandboxPolicy;
use std::path::{Path, PathBuf};

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

/// The policy for a worker of these settings; `tmp` is its private folder.
pub fn policy(
    sandbox: &SandboxConfig,
    python: &Path,
    python_lib: Option<&Path>,
    setup: &SessionSetup,
    snapshot_root: Option<&Path>,
    tmp: &Path,
) -> SandboxPolicy {
    SandboxPolicy {
        strict: sandbox.strict,
        network: sandbox.network,
        workspace: sandbox.workspace.clone(),
        writable: snapshot_root.map(Path::to_path_buf).into_iter().collect(),
        readable: readable(python, python_lib, setup),
        hidden: vec![sandbox.log_dir.clone()],
        tmp: tmp.to_path_buf(),
        skip: sandbox.skip.clone(),
    }
}

/// A private folder for one worker: its `/tmp` (and `HOME` under it), removed when the
/// worker is gone.
pub fn private_tmp() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("flowrepl-sandbox-")
        .tempdir()
}
