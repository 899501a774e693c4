//! `flowrepl`: finds the Python the user means and runs the kernel built for its version.
//!
//! One kernel binary embeds one CPython `major.minor` (pyo3 builds against one interpreter),
//! so one build makes a kernel per version: `flowrepl-kernel` (and `flowrepl-worker`) next to
//! this launcher for the build's own Python, and one per other CPython 3.10+ found on the
//! machine under `<target>/flowrepl-python/<version>/<profile>/` (`kernel/build.rs`).
//!
//! The launcher resolves the interpreter ([`flowrepl_pythons::resolve`]: `--python`,
//! `$VIRTUAL_ENV`, its own venv, the `python3` on `PATH`, the build's), then replaces itself
//! (`exec`) with that version's kernel, passing the same arguments and the choice in
//! `FLOWREPL_PYTHON` and `FLOWREPL_PYTHON_SOURCE`. Nothing runs between the two but the
//! resolution (a few file reads): no Python, no thread, no byte on stdout. An interpreter it
//! cannot serve is a one-line error on stderr and exit code 2.

use crate::args::{env, Cli};
use flowrepl_pythons::{Interpreter, Request, Version};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The kernel executable's name.
pub const KERNEL_EXE: &str = "flowrepl-kernel";

/// What the build that made these binaries knows (the kernel package's build script sets
/// it; this crate is built without Python).
#[derive(Debug, Clone, Copy)]
pub struct Build {
    /// The interpreter the build's own kernel embeds (next to the launcher).
    pub python: &'static str,
    /// Its `major.minor.micro`.
    pub python_version: &'static str,
    /// Where the build put the kernels of other Python versions.
    pub kernels_dir: Option<&'static str>,
    /// The build's profile (`debug`, `release`).
    pub kernels_profile: Option<&'static str>,
    /// The MCP server's tools, for `--help` (asked only then).
    pub mcp_tools: fn() -> Vec<String>,
}

impl Build {
    /// The interpreter the build's own kernel embeds, and its version.
    pub fn python(&self) -> (PathBuf, Option<Version>) {
        (
            PathBuf::from(self.python),
            Version::parse(self.python_version),
        )
    }
}

/// The kernels this build can start, by version (the build's own first).
pub fn kernels(build: &Build) -> Vec<(Version, PathBuf)> {
    let mut out = Vec::new();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    if let (Some(dir), (_, Some(v))) = (&exe_dir, build.python()) {
        let k = dir.join(KERNEL_EXE);
        if k.is_file() {
            out.push((v, k));
        }
    }
    if let (Some(root), Some(profile)) = (build.kernels_dir, build.kernels_profile) {
        if let Ok(entries) = std::fs::read_dir(root) {
            let mut more: Vec<(Version, PathBuf)> = entries
                .flatten()
                .filter_map(|e| {
                    let v = Version::parse(e.file_name().to_str()?)?;
                    let k = e.path().join(profile).join(KERNEL_EXE);
                    k.is_file().then_some((v, k))
                })
                .filter(|(v, _)| !out.iter().any(|(have, _)| have == v))
                .collect();
            more.sort();
            out.extend(more);
        }
    }
    out
}

/// The kernel for `version`, or why there is none.
fn kernel_for(build: &Build, version: Version) -> Result<PathBuf, String> {
    let all = kernels(build);
    if let Some((_, k)) = all.iter().find(|(v, _)| *v == version) {
        return Ok(k.clone());
    }
    let have: Vec<String> = all.iter().map(|(v, _)| v.to_string()).collect();
    Err(format!(
        "this flowrepl build has no kernel for Python {version} (it has {}); rebuild flowrepl (`cargo build --release`) on a machine where CPython {version} with its shared library is installed, or install it into a Python {version} venv with `pip install`",
        if have.is_empty() { "none".into() } else { have.join(", ") }
    ))
}

/// The interpreter the user means.
pub fn choose(cli: &Cli, build: &Build) -> Result<Interpreter, flowrepl_pythons::PythonError> {
    let (python, _) = build.python();
    flowrepl_pythons::resolve(&Request::from_env(cli.python.clone(), Some(python)))
}

/// Runs the launcher: resolve, then `exec` the kernel. Returns only on failure.
pub fn main(build: &Build) -> ExitCode {
    let cli = Cli::from_args(build.mcp_tools);
    if let Some(crate::args::Command::Log(args)) = &cli.command {
        return crate::logcmd::run(&cli.log_globals(), args);
    }
    let interpreter = match choose(&cli, build) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("flowrepl: {e}");
            return ExitCode::from(2);
        }
    };
    let kernel = match kernel_for(build, interpreter.version) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("flowrepl: {e}");
            return ExitCode::from(2);
        }
    };
    let err = std::process::Command::new(&kernel)
        .args(std::env::args_os().skip(1))
        .env(env::PYTHON, &interpreter.program)
        .env(env::PYTHON_SOURCE, interpreter.source.as_str())
        .exec();
    eprintln!("flowrepl: cannot start {}: {err}", kernel.display());
    ExitCode::from(1)
}
