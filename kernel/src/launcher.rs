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

use crate::cli::Cli;
use flowrepl_pythons::{Interpreter, Request, Version};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Environment variable naming the interpreter chosen (also `--python`'s).
pub const PYTHON_ENV: &str = "FLOWREPL_PYTHON";
/// Environment variable naming why it was chosen ([`flowrepl_pythons::Source::as_str`]).
pub const PYTHON_SOURCE_ENV: &str = "FLOWREPL_PYTHON_SOURCE";
/// Where the build put the kernels of other Python versions.
const KERNELS_DIR: Option<&str> = option_env!("FLOWREPL_KERNELS_DIR");
/// The build's profile (`debug`, `release`).
const KERNELS_PROFILE: Option<&str> = option_env!("FLOWREPL_KERNELS_PROFILE");
/// The kernel executable's name.
pub const KERNEL_EXE: &str = "flowrepl-kernel";

/// The interpreter this build embeds (next to the launcher).
pub fn build_python() -> (PathBuf, Option<Version>) {
    (
        PathBuf::from(flowrepl_worker::interpreter::BUILD_PYTHON),
        Version::parse(flowrepl_worker::interpreter::BUILD_PYTHON_VERSION),
    )
}

/// The kernels this build can start, by version (the build's own first).
pub fn kernels() -> Vec<(Version, PathBuf)> {
    let mut out = Vec::new();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    if let (Some(dir), (_, Some(v))) = (&exe_dir, build_python()) {
        let k = dir.join(KERNEL_EXE);
        if k.is_file() {
            out.push((v, k));
        }
    }
    if let (Some(root), Some(profile)) = (KERNELS_DIR, KERNELS_PROFILE) {
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
fn kernel_for(version: Version) -> Result<PathBuf, String> {
    let all = kernels();
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
pub fn choose(cli: &Cli) -> Result<Interpreter, flowrepl_pythons::PythonError> {
    let (build, _) = build_python();
    flowrepl_pythons::resolve(&Request::from_env(cli.python.clone(), Some(build)))
}

/// Runs the launcher: resolve, then `exec` the kernel. Returns only on failure.
/// `mcp_tools` names the MCP tools for `--help`.
pub fn main(mcp_tools: fn() -> Vec<String>) -> ExitCode {
    let cli = Cli::from_args(mcp_tools);
    if let Some(crate::cli::Command::Log(args)) = &cli.command {
        return crate::logcmd::run(&cli.log_globals(), args);
    }
    let interpreter = match choose(&cli) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("flowrepl: {e}");
            return ExitCode::from(2);
        }
    };
    let kernel = match kernel_for(interpreter.version) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("flowrepl: {e}");
            return ExitCode::from(2);
        }
    };
    let err = std::process::Command::new(&kernel)
        .args(std::env::args_os().skip(1))
        .env(PYTHON_ENV, &interpreter.program)
        .env(PYTHON_SOURCE_ENV, interpreter.source.as_str())
        .exec();
    eprintln!("flowrepl: cannot start {}: {err}", kernel.display());
    ExitCode::from(1)
}
