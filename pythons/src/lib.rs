//! Which CPython flowrepl serves, decided without loading any Python.
//!
//! - [`resolve`]: the interpreter a user means, in this order: `--python` (an interpreter or a
//!   venv directory), `$VIRTUAL_ENV`, the venv flowrepl itself is installed in, the `python3`
//!   a shell would run (`PATH`, seeing through pyenv's shims), the interpreter flowrepl was
//!   built against. The answer says which rule chose it ([`Source`]).
//! - [`detect`]: an interpreter's version, from its venv's `pyvenv.cfg` or its file name
//!   (`python3.12`), else by running it once. Python 2, CPython before 3.10, PyPy, a broken
//!   venv or a file that is not Python are one-line [`PythonError`]s.
//! - [`discover`]: every supported CPython installed on the machine (pyenv, `/usr/bin`,
//!   `/usr/local/bin`), for the build and the tests.
//!
//! Size: one job (which interpreter) in about 470 lines, the rest its unit tests; the
//! resolution order reads top to bottom in one file on purpose.
#![warn(missing_docs)]

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The oldest CPython 3 minor version supported.
pub const MIN_MINOR: u32 = 10;
/// The newest CPython 3 minor version supported.
pub const MAX_MINOR: u32 = 14;

/// A Python `major.minor` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// 3.
    pub major: u32,
    /// 12 for 3.12.
    pub minor: u32,
}

impl Version {
    /// Whether flowrepl serves it.
    pub fn is_supported(self) -> bool {
        self.major == 3 && (MIN_MINOR..=MAX_MINOR).contains(&self.minor)
    }

    /// Reads `3.12`, `3.12.1` or `3.12.1.final.0`.
    pub fn parse(s: &str) -> Option<Version> {
        let mut parts = s.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts
            .next()?
            .trim_end_matches(|c: char| !c.is_ascii_digit());
        Some(Version {
            major,
            minor: minor.parse().ok()?,
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why this interpreter was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--python` (or `FLOWREPL_PYTHON`).
    Flag,
    /// `$VIRTUAL_ENV`.
    VirtualEnv,
    /// flowrepl is installed in this venv.
    OwnVenv,
    /// The `python3` on `PATH`.
    Path,
    /// The interpreter flowrepl was built against.
    Build,
}

impl Source {
    /// Its stable name (in `status` and `ready`).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::VirtualEnv => "virtual_env",
            Source::OwnVenv => "own_venv",
            Source::Path => "path",
            Source::Build => "build",
        }
    }

    /// The source named by [`Source::as_str`].
    pub fn from_name(s: &str) -> Option<Source> {
        [
            Source::Flag,
            Source::VirtualEnv,
            Source::OwnVenv,
            Source::Path,
            Source::Build,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// An interpreter flowrepl can serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// What the session emulates: a venv's `bin/python`, or a base interpreter.
    pub program: PathBuf,
    /// Its version.
    pub version: Version,
    /// Why it was chosen.
    pub source: Source,
}

/// Why an interpreter cannot be served. Each message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PythonError {
    /// Nothing at that path.
    #[error("python interpreter not found: {0}")]
    NotFound(PathBuf),
    /// Something that is not a Python interpreter.
    #[error("{path} is not a Python interpreter ({why})")]
    NotPython {
        /// The file.
        path: PathBuf,
        /// What happened when it was asked.
        why: String,
    },
    /// A Python flowrepl does not serve.
    #[error("{path} is {what}; flowrepl supports CPython 3.{MIN_MINOR} to 3.{MAX_MINOR}")]
    Unsupported {
        /// The interpreter.
        path: PathBuf,
        /// "Python 2.7", "CPython 3.9", "PyPy (Python 3.10)".
        what: String,
    },
    /// A venv whose base interpreter is gone.
    #[error("the venv {venv} is broken: its base interpreter directory {home} no longer exists; recreate the venv")]
    BrokenVenv {
        /// The venv.
        venv: PathBuf,
        /// Its `home` in `pyvenv.cfg`.
        home: PathBuf,
    },
    /// No interpreter anywhere.
    #[error("no Python found: give one with --python (an interpreter or a venv)")]
    NoneFound,
}

/// What [`resolve`] looks at (the process's environment, or a test's).
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// `--python`.
    pub explicit: Option<PathBuf>,
    /// `$VIRTUAL_ENV`.
    pub virtual_env: Option<OsString>,
    /// flowrepl's own executable (a venv's `bin/` when installed with pip).
    pub own_exe: Option<PathBuf>,
    /// `$PATH`.
    pub path: Option<OsString>,
    /// `$PYENV_VERSION`.
    pub pyenv_version: Option<OsString>,
    /// The working directory (for pyenv's `.python-version`).
    pub cwd: Option<PathBuf>,
    /// The interpreter flowrepl was built against.
    pub build: Option<PathBuf>,
}

impl Request {
    /// The request of this process, with `--python` and the build's interpreter.
    pub fn from_env(explicit: Option<PathBuf>, build: Option<PathBuf>) -> Request {
        Request {
            explicit,
            virtual_env: std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()),
            own_exe: std::env::current_exe().ok(),
            path: std::env::var_os("PATH"),
            pyenv_version: std::env::var_os("PYENV_VERSION").filter(|v| !v.is_empty()),
            cwd: std::env::current_dir().ok(),
            build,
        }
    }
}

/// The interpreter `req` means (see the crate docs for the order).
pub fn resolve(req: &Request) -> Result<Interpreter, PythonError> {
    let accept = |program: PathBuf, source: Source| -> Result<Interpreter, PythonError> {
        let version = detect(&program)?;
        Ok(Interpreter {
            program,
            version,
            source,
        })
    };
    if let Some(p) = &req.explicit {
        return accept(program_of(p), Source::Flag);
    }
    if let Some(v) = &req.virtual_env {
        return accept(program_of(Path::new(v)), Source::VirtualEnv);
    }
    if let Some(venv) = req.own_exe.as_deref().and_then(venv_of_exe) {
        return accept(program_of(&venv), Source::OwnVenv);
    }
    // The shell's python3, if it is one flowrepl serves; else the build's.
    if let Some(p) = find_python3(req) {
        if let Ok(i) = accept(p, Source::Path) {
            if i.version.is_supported() {
                return Ok(i);
            }
        }
    }
    match &req.build {
        Some(b) => accept(b.clone(), Source::Build),
        None => Err(PythonError::NoneFound),
    }
}

/// `bin/python` of a venv directory, else the path itself.
fn program_of(p: &Path) -> PathBuf {
    if p.is_dir() {
        let bin = p.join("bin");
        for name in ["python", "python3"] {
            if bin.join(name).exists() {
                return bin.join(name);
            }
        }
        return bin.join("python");
    }
    p.to_path_buf()
}

/// The venv an executable sits in (`<venv>/bin/flowrepl` with `<venv>/pyvenv.cfg`).
fn venv_of_exe(exe: &Path) -> Option<PathBuf> {
    let venv = exe.parent()?.parent()?;
    venv.join("pyvenv.cfg")
        .is_file()
        .then(|| venv.to_path_buf())
}

/// What a venv's `pyvenv.cfg` says.
#[derive(Debug, Default, PartialEq, Eq)]
struct VenvCfg {
    home: Option<PathBuf>,
    version: Option<Version>,
    implementation: Option<String>,
}

/// `home` of the venv `venv`'s `pyvenv.cfg`: the folder of the interpreter it was made from.
pub fn venv_home(venv: &Path) -> Option<PathBuf> {
    read_venv_cfg(venv)?.home
}

fn read_venv_cfg(venv: &Path) -> Option<VenvCfg> {
    let text = std::fs::read_to_string(venv.join("pyvenv.cfg")).ok()?;
    Some(parse_venv_cfg(&text))
}

fn parse_venv_cfg(text: &str) -> VenvCfg {
    let mut cfg = VenvCfg::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "home" => cfg.home = Some(PathBuf::from(v)),
            "version" | "version_info" => cfg.version = cfg.version.or(Version::parse(v)),
            "implementation" => cfg.implementation = Some(v.to_owned()),
            _ => {}
        }
    }
    cfg
}

/// The version of the interpreter `program` (a venv's `bin/python`, or a base interpreter),
/// or why flowrepl cannot serve it.
pub fn detect(program: &Path) -> Result<Version, PythonError> {
    let unsupported = |what: String| PythonError::Unsupported {
        path: program.to_path_buf(),
        what,
    };
    let venv = program.parent().and_then(Path::parent);
    if let Some((venv, cfg)) = venv.and_then(|v| read_venv_cfg(v).map(|c| (v, c))) {
        if let Some(home) = cfg.home.filter(|h| !h.exists()) {
            return Err(PythonError::BrokenVenv {
                venv: venv.to_path_buf(),
                home,
            });
        }
        if !program.exists() {
            return Err(PythonError::NotFound(program.to_path_buf()));
        }
        if let Some(i) = cfg
            .implementation
            .filter(|i| !i.eq_ignore_ascii_case("cpython"))
        {
            return Err(unsupported(format!("a {i} venv")));
        }
        if let Some(v) = cfg.version {
            return check_version(program, "CPython", v);
        }
    }
    if !program.exists() {
        return Err(PythonError::NotFound(program.to_path_buf()));
    }
    let real = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    if let Some(name) = real.file_name().and_then(OsStr::to_str) {
        if let Some((implementation, v)) = version_from_name(name) {
            return check_version(program, implementation, v);
        }
    }
    let (implementation, v) = probe(program)?;
    check_version(program, &implementation, v)
}

fn check_version(program: &Path, implementation: &str, v: Version) -> Result<Version, PythonError> {
    if !implementation.eq_ignore_ascii_case("cpython") {
        return Err(PythonError::Unsupported {
            path: program.to_path_buf(),
            what: format!("{implementation} (Python {v})"),
        });
    }
    if v.major == 2 {
        return Err(PythonError::Unsupported {
            path: program.to_path_buf(),
            what: format!("Python {v}"),
        });
    }
    if !v.is_supported() {
        return Err(PythonError::Unsupported {
            path: program.to_path_buf(),
            what: format!("CPython {v}"),
        });
    }
    Ok(v)
}

/// `python3.12` → CPython 3.12; `pypy3.10` → PyPy 3.10; other names say nothing.
fn version_from_name(name: &str) -> Option<(&'static str, Version)> {
    let (implementation, rest) = if let Some(r) = name.strip_prefix("python") {
        ("CPython", r)
    } else if let Some(r) = name.strip_prefix("pypy") {
        ("PyPy", r)
    } else {
        return None;
    };
    let v = Version::parse(rest)?;
    // "python3.12" names a version; "python3.12-config" or "python3.12d" do not.
    (format!("{v}") == rest).then_some((implementation, v))
}

/// Runs the interpreter once to ask (`-I -S`: no site, no environment; works in Python 2).
fn probe(program: &Path) -> Result<(String, Version), PythonError> {
    const ASK: &str = "import sys\nimpl = getattr(sys, 'implementation', None)\nname = impl.name if impl else 'cpython'\nsys.stdout.write('%s %d.%d\\n' % (name, sys.version_info[0], sys.version_info[1]))\n";
    let not_python = |why: String| PythonError::NotPython {
        path: program.to_path_buf(),
        why,
    };
    let mut child = Command::new(program)
        .args(["-I", "-S", "-c", ASK])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| not_python(format!("cannot run it: {e}")))?;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(not_python("it did not answer within 10 s".into()));
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| not_python(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    match (words.next(), words.next().and_then(Version::parse)) {
        (Some(name), Some(v)) if out.status.success() => {
            let implementation = match name {
                "cpython" => "CPython",
                "pypy" => "PyPy",
                other => other,
            };
            Ok((implementation.to_owned(), v))
        }
        _ => Err(not_python(format!(
            "asking it for its version failed ({})",
            out.status
        ))),
    }
}

/// The `python3` a shell would run: the first on `PATH`, with a pyenv shim resolved the way
/// pyenv resolves it (`$PYENV_VERSION`, else `.python-version` here or above, else the global
/// version file; `system` means the next `python3` on `PATH`).
fn find_python3(req: &Request) -> Option<PathBuf> {
    let path = req.path.as_ref()?;
    for dir in std::env::split_paths(path) {
        let candidate = dir.join("python3");
        if !is_executable(&candidate) {
            continue;
        }
        match pyenv_root_of_shims(&dir) {
            None => return Some(candidate),
            Some(root) => match pyenv_choice(req, &root) {
                Some(p) => return Some(p),
                None => continue, // "system": the next python3 on PATH
            },
        }
    }
    None
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `<root>` when `dir` is pyenv's `<root>/shims`.
fn pyenv_root_of_shims(dir: &Path) -> Option<PathBuf> {
    let root = dir.parent()?;
    (dir.file_name()? == "shims" && root.join("versions").is_dir()).then(|| root.to_path_buf())
}

/// The interpreter pyenv would run for `python3`, or `None` for `system`.
fn pyenv_choice(req: &Request, root: &Path) -> Option<PathBuf> {
    let from_file = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| t.split_whitespace().next().map(str::to_owned))
    };
    let name = req
        .pyenv_version
        .as_ref()
        .and_then(|v| v.to_str())
        .and_then(|v| v.split(':').next().map(str::to_owned))
        .or_else(|| {
            req.cwd.as_deref().and_then(|cwd| {
                cwd.ancestors()
                    .find_map(|d| from_file(d.join(".python-version")))
            })
        })
        .or_else(|| from_file(root.join("version")))?;
    if name == "system" {
        return None;
    }
    // A version is a folder's name in `<root>/versions`, never a path: a `.python-version`
    // in the workspace (a cell can write one) must not lead the kernel to run an interpreter
    // of the cell's making (`../../../workspace/x`), as pyenv itself refuses since 2.3.3.
    if name.contains('/') || name.starts_with('.') || name.contains('\0') {
        return None;
    }
    let versions = root.join("versions");
    let dir = if versions.join(&name).is_dir() {
        versions.join(&name)
    } else {
        // A prefix such as "3.12" means the newest 3.12.x installed.
        let mut matches: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(&versions)
            .ok()?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                let rest = n.strip_prefix(&name)?.strip_prefix('.')?;
                let key = rest
                    .split('.')
                    .map(|p| p.parse().ok())
                    .collect::<Option<Vec<u32>>>()?;
                Some((key, e.path()))
            })
            .collect();
        matches.sort();
        matches.pop()?.1
    };
    let p = dir.join("bin/python3");
    is_executable(&p).then_some(p)
}

/// An interpreter found on the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its executable (`.../bin/python3.12`).
    pub program: PathBuf,
    /// Its version.
    pub version: Version,
}

/// Every supported CPython installed here: pyenv's versions (`$PYENV_ROOT`, else
/// `~/.pyenv`), then `/usr/local/bin` and `/usr/bin`, one per executable, ordered by version
/// then in that order.
pub fn discover() -> Vec<Found> {
    let mut dirs = Vec::new();
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(root) = pyenv {
        if let Ok(entries) = std::fs::read_dir(root.join("versions")) {
            let mut vs: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
            vs.sort();
            dirs.extend(vs);
        }
    }
    dirs.push(PathBuf::from("/usr/local/bin"));
    dirs.push(PathBuf::from("/usr/bin"));
    let mut found: Vec<Found> = Vec::new();
    let mut seen = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| matches!(version_from_name(n), Some(("CPython", _))))
            .collect();
        names.sort();
        for name in names {
            let program = dir.join(&name);
            let real = std::fs::canonicalize(&program).unwrap_or_else(|_| program.clone());
            if seen.contains(&real) || !is_executable(&program) {
                continue;
            }
            seen.push(real);
            if let Ok(version) = detect(&program) {
                found.push(Found { program, version });
            }
        }
    }
    found.sort_by_key(|f| f.version);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> Version {
        Version { major: 3, minor }
    }

    #[test]
    fn versions_from_names_and_configs() {
        assert_eq!(version_from_name("python3.12"), Some(("CPython", v(12))));
        assert_eq!(version_from_name("pypy3.10"), Some(("PyPy", v(10))));
        assert_eq!(version_from_name("python3.12-config"), None);
        assert_eq!(version_from_name("python3"), None);
        assert_eq!(Version::parse("3.12.1.final.0"), Some(v(12)));
        let cfg = parse_venv_cfg(
            "home = /opt/py/bin\nimplementation = CPython\nversion_info = 3.13.0.final.0\n",
        );
        assert_eq!(cfg.version, Some(v(13)));
        assert_eq!(cfg.home, Some(PathBuf::from("/opt/py/bin")));
        assert!(!Version { major: 2, minor: 7 }.is_supported());
        assert!(!v(9).is_supported() && v(10).is_supported() && v(14).is_supported());
    }

    #[test]
    fn pyenv_shims_are_seen_through() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for ver in ["3.11.7", "3.12.1", "3.12.9"] {
            let bin = r.join("versions").join(ver).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            let p = bin.join("python3");
            std::fs::write(&p, "").unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::create_dir_all(r.join("shims")).unwrap();
        std::fs::write(r.join("version"), "3.11.7\n").unwrap();
        let project = r.join("project/sub");
        std::fs::create_dir_all(&project).unwrap();
        let mut req = Request {
            cwd: Some(project.clone()),
            ..Default::default()
        };
        let pick =
            |req: &Request| pyenv_choice(req, r).map(|p| p.strip_prefix(r).unwrap().to_path_buf());
        assert_eq!(
            pick(&req),
            Some(PathBuf::from("versions/3.11.7/bin/python3"))
        );
        std::fs::write(r.join("project/.python-version"), "3.12\n").unwrap();
        assert_eq!(
            pick(&req),
            Some(PathBuf::from("versions/3.12.9/bin/python3"))
        );
        req.pyenv_version = Some("system".into());
        assert_eq!(pick(&req), None);
        req.pyenv_version = Some("3.12.1:3.11.7".into());
        assert_eq!(
            pick(&req),
            Some(PathBuf::from("versions/3.12.1/bin/python3"))
        );
        // A cell's `.python-version` naming a path to an interpreter of its own making: the
        // name leads to an executable (what pyenv before 2.3.3 ran), and it is refused.
        req.pyenv_version = None;
        let planted = r.join("project/evil/bin");
        std::fs::create_dir_all(&planted).unwrap();
        std::fs::copy(
            r.join("versions/3.11.7/bin/python3"),
            planted.join("python3"),
        )
        .unwrap();
        for name in ["../project/evil", "./../project/evil", "/abs/evil", ".."] {
            std::fs::write(r.join("project/.python-version"), format!("{name}\n")).unwrap();
            if name.starts_with("..") && name.len() > 2 {
                assert!(is_executable(
                    &r.join("versions").join(name).join("bin/python3")
                ));
            }
            assert_eq!(pick(&req), None, "{name}");
        }
    }

    #[test]
    fn broken_and_foreign_venvs_are_named() {
        let d = tempfile::tempdir().unwrap();
        let venv = d.path().join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(
            venv.join("pyvenv.cfg"),
            "home = /nonexistent/bin\nversion = 3.12.1\n",
        )
        .unwrap();
        let err = detect(&program_of(&venv)).unwrap_err();
        assert!(matches!(err, PythonError::BrokenVenv { .. }), "{err}");
        std::fs::write(
            venv.join("pyvenv.cfg"),
            format!(
                "home = {}\nimplementation = PyPy\nversion_info = 3.10.14\n",
                d.path().display()
            ),
        )
        .unwrap();
        std::fs::write(venv.join("bin/python"), "").unwrap();
        let err = detect(&program_of(&venv)).unwrap_err().to_string();
        assert!(
            err.contains("PyPy") && err.contains("3.10 to 3.14"),
            "{err}"
        );
        let err = detect(Path::new("/nonexistent/python3")).unwrap_err();
        assert_eq!(err, PythonError::NotFound("/nonexistent/python3".into()));
    }
}
