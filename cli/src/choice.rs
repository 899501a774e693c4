//! Which Python versions this build serves, and with what.
//!
//! pyo3 builds against one CPython `major.minor`, so the executor is built once per version
//! as a shared library (`libflowrepl_pylib.so`, the `pylib` crate): the build's own version
//! next to the `flowrepl` executable, and one per other CPython 3.10+ found on the machine
//! under `<target>/flowrepl-python/<version>/<profile>/` (`pylib/build.rs`). A `pip install`
//! links its one version into the kernel instead ([`Build::linked`]).
//!
//! The kernel resolves the interpreter ([`choose`]: `--python`, `$VIRTUAL_ENV`, its own
//! venv, the `python3` on `PATH`, the build's), then takes the library of that version
//! ([`serving`]), before it loads any Python. An interpreter it cannot serve is a one-line
//! error on stderr and exit code 2.

use crate::args::Cli;
use flowrepl_pythons::{Interpreter, Request, Version};
use std::path::{Path, PathBuf};

/// The Python library's file name (cargo's name for the `flowrepl-pylib` cdylib).
pub const LIBRARY_FILE: &str = "libflowrepl_pylib.so";

/// What the build that made these binaries knows (the kernel package's build script sets
/// it; this crate is built without Python).
#[derive(Debug, Clone, Copy)]
pub struct Build {
    /// The interpreter the build was made with: the one served when nothing else is asked.
    pub python: &'static str,
    /// Its `major.minor.micro`.
    pub python_version: &'static str,
    /// Its executor is linked into the kernel (`static-python`): the only version served.
    pub linked: bool,
    /// Where the build put the libraries of other Python versions.
    pub versions_dir: Option<&'static str>,
    /// The build's profile (`debug`, `release`).
    pub profile: Option<&'static str>,
    /// The MCP servers' tools, for `--help` (asked only then).
    pub tools: crate::args::ToolNames,
}

impl Build {
    /// The build's interpreter, and its version.
    pub fn python(&self) -> (PathBuf, Option<Version>) {
        (
            PathBuf::from(self.python),
            Version::parse(self.python_version),
        )
    }
}

/// How a version is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executor {
    /// By the executor linked into the kernel.
    Linked,
    /// By this Python library.
    Library(PathBuf),
}

impl Executor {
    /// The library to load (`None`: the linked executor).
    pub fn library(&self) -> Option<&Path> {
        match self {
            Executor::Linked => None,
            Executor::Library(path) => Some(path),
        }
    }
}

/// The versions this build serves, and how (the build's own first).
pub fn versions(build: &Build) -> Vec<(Version, Executor)> {
    let mut out = Vec::new();
    let own = build.python().1;
    if build.linked {
        out.extend(own.map(|v| (v, Executor::Linked)));
        return out;
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    if let (Some(dir), Some(v)) = (&exe_dir, own) {
        let lib = dir.join(LIBRARY_FILE);
        if lib.is_file() {
            out.push((v, Executor::Library(lib)));
        }
    }
    if let (Some(root), Some(profile)) = (build.versions_dir, build.profile) {
        if let Ok(entries) = std::fs::read_dir(root) {
            let mut more: Vec<(Version, Executor)> = entries
                .flatten()
                .filter_map(|e| {
                    let v = Version::parse(e.file_name().to_str()?)?;
                    let lib = e.path().join(profile).join(LIBRARY_FILE);
                    lib.is_file().then_some((v, Executor::Library(lib)))
                })
                .filter(|(v, _)| !out.iter().any(|(have, _)| have == v))
                .collect();
            more.sort_by_key(|(v, _)| *v);
            out.extend(more);
        }
    }
    out
}

/// How `version` is served, or why it is not (one line for the user).
pub fn serving(build: &Build, version: Version) -> Result<Executor, String> {
    let all = versions(build);
    if let Some((_, e)) = all.iter().find(|(v, _)| *v == version) {
        return Ok(e.clone());
    }
    let have: Vec<String> = all.iter().map(|(v, _)| v.to_string()).collect();
    Err(format!(
        "this flowrepl build does not serve Python {version} (it serves {}); rebuild flowrepl (`cargo build --release`) on a machine where CPython {version} with its shared library is installed, or install it into a Python {version} venv with `pip install`",
        if have.is_empty() { "none".into() } else { have.join(", ") }
    ))
}

/// The interpreter the user means, and what serves its version.
#[derive(Debug, Clone)]
pub struct Choice {
    /// The interpreter (or venv) cells run in.
    pub interpreter: Interpreter,
    /// What serves its version.
    pub executor: Executor,
}

/// Why the interpreter the user means cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ChoiceError {
    /// It is not a usable CPython 3.10+.
    #[error(transparent)]
    Python(#[from] flowrepl_pythons::PythonError),
    /// This build has no executor for its version.
    #[error("{0}")]
    NotServed(String),
}

/// The interpreter the user means and what serves it: decided before any Python is loaded
/// (a few file reads and the interpreter's version).
pub fn choose(cli: &Cli, build: &Build) -> Result<Choice, ChoiceError> {
    let (python, _) = build.python();
    let interpreter =
        flowrepl_pythons::resolve(&Request::from_env(cli.python.clone(), Some(python)))?;
    let executor = serving(build, interpreter.version).map_err(ChoiceError::NotServed)?;
    Ok(Choice {
        interpreter,
        executor,
    })
}
