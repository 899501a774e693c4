//! One install: requirements checked, resolved (the shared cache first, the index only when
//! the cache cannot answer), installed into a new generation, switched in whole.

use crate::layer::{modules_of, read_state, write_json, Layer, LayerState, STATE_VERSION};
use crate::policy::{normalize, Policy, PolicyError, Requirement};
use crate::run::{run, Ran};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What installs the packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tool {
    /// uv at this path.
    Uv(PathBuf),
    /// pip, in the task's interpreter (`python -m pip`): no uv was found.
    Pip,
}

impl Tool {
    /// Its name in replies and records.
    pub fn name(&self) -> &'static str {
        match self {
            Tool::Uv(_) => "uv",
            Tool::Pip => "pip",
        }
    }
}

/// Runs a command confined: the builds of `--packages-build` (a build backend is arbitrary
/// code). The kernel's is the sandbox's worker binary (`flowrepl-worker --confined-exec`),
/// whose only network is an egress proxy allowing the index's hosts.
pub trait Confine: Send + Sync + std::fmt::Debug {
    /// `cmd` (program and arguments) wrapped to run confined, in `workdir`, writing there and
    /// to `writable` only, reaching `hosts` only (`host:port`, [`Policy::index_hosts`]);
    /// `Err`: it cannot be confined on this host (why).
    fn confine(
        &self,
        cmd: &Command,
        workdir: &Path,
        writable: &[PathBuf],
        hosts: &[String],
    ) -> Result<Confined, String>;
}

/// A command wrapped by [`Confine`], and what must live while it runs.
pub struct Confined {
    /// What to run.
    pub command: Command,
    /// Kept until the command has ended, then dropped (its network's egress proxy).
    pub keep: Option<Box<dyn std::any::Any + Send>>,
}

impl From<Command> for Confined {
    fn from(command: Command) -> Confined {
        Confined {
            command,
            keep: None,
        }
    }
}

/// Whose cache an installer links layers from: one shared cache per trust level.
///
/// Layers are hard links into the shared cache, so a cell that can write its layer's files
/// writes the cache's. Sandboxed cells cannot (the layer is read-only inside); cells without
/// the sandbox can. So sandboxed tasks share one cache, which only their installs fill and
/// no writable layer links to, and tasks without the sandbox share another: what a cell
/// without the sandbox changes in its layer reaches only tasks without the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// The task's cells run in the sandbox.
    Sandboxed,
    /// They do not.
    Unsandboxed,
}

impl Trust {
    /// Its cache's folder name under the cache root, and its name in a layer's state.
    pub fn name(self) -> &'static str {
        match self {
            Trust::Sandboxed => "sandboxed",
            Trust::Unsandboxed => "unsandboxed",
        }
    }
}

/// One try of the installer: from the cache alone or the index; with the venv's versions
/// as constraints or not; wheels only (outside, with the shared cache) or builds allowed
/// (confined, with a cache of the task's own, so that a build cannot plant wheels in the
/// shared one).
#[derive(Debug, Clone, Copy)]
struct Try {
    offline: bool,
    constrained: bool,
    build: bool,
}

/// Why an install did not happen. The layer is as it was.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// `--packages off`.
    #[error("installing packages is off on this kernel (the operator's --packages off)")]
    Off,
    /// A requirement the policy refuses.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Nothing asked for.
    #[error("no packages named: pass packages, e.g. [\"pandas>=2\"]")]
    Empty,
    /// Too many requirements in one call.
    #[error("{0} requirements in one call; at most {max}", max = flowrepl_protocol::packages::MAX_REQUIREMENTS)]
    TooMany(usize),
    /// The requirements could not be resolved (unknown names, conflicts, no wheel).
    #[error("the packages could not be resolved; the layer is unchanged.\n{0}")]
    Resolve(String),
    /// The installer failed.
    #[error("the install failed; the layer is unchanged.\n{0}")]
    Install(String),
    /// The deadline passed; the installer's processes were killed.
    #[error("the install did not finish within {0:?} (the operator's --packages-timeout-s) and was stopped; the layer is unchanged")]
    Timeout(Duration),
    /// The installer could not be started.
    #[error("cannot run {0}: {1}")]
    Spawn(String, std::io::Error),
    /// Builds are allowed but cannot be confined here.
    #[error("a build needs the sandbox, which cannot be applied here: {0}")]
    Unconfined(String),
    /// The layer's folder could not be written.
    #[error("the package layer: {0}")]
    Io(#[from] std::io::Error),
}

impl InstallError {
    /// The caller's doing (a refusal or a resolution that failed), not the kernel's.
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            InstallError::Io(_) | InstallError::Spawn(..) | InstallError::Unconfined(_)
        )
    }
}

/// What an install did.
#[derive(Debug, Clone)]
pub struct Installed {
    /// The layer now.
    pub state: LayerState,
    /// What it added or changed, `name==version`.
    pub added: Vec<String>,
    /// The top-level modules of what it added or changed.
    pub modules: Vec<String>,
    /// Resolved from the shared cache alone.
    pub from_cache: bool,
    /// The installer's output.
    pub output: String,
    /// The requirements of this call whose environment markers excluded them (`foo;
    /// python_version < "3"` on Python 3): nothing was installed for them.
    pub excluded: Vec<String>,
}

/// A new generation an installer filled.
struct Populated {
    generation: PathBuf,
    /// The installer's output.
    output: String,
    /// From the shared cache alone.
    from_cache: bool,
}

/// Installs into one task's layer.
#[derive(Debug)]
pub struct Installer {
    policy: Policy,
    tool: Tool,
    python: PathBuf,
    layer: Layer,
    state_file: PathBuf,
    confine: Option<Box<dyn Confine>>,
    progress: Arc<Mutex<String>>,
    trust: Trust,
    /// The shared cache of `trust`.
    cache: PathBuf,
}

/// The task's interpreter's own `site-packages` folders (a venv's, or the installation's).
fn site_packages(python: &Path) -> Vec<PathBuf> {
    let Some(prefix) = python.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let Ok(libs) = std::fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    libs.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect()
}

/// The distributions installed in `folders`: normalized name → version.
fn installed_in(folders: &[PathBuf]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for f in folders {
        for e in std::fs::read_dir(f).into_iter().flatten().flatten() {
            let file = e.file_name();
            let Some(dist) = file.to_str().and_then(|n| n.strip_suffix(".dist-info")) else {
                continue;
            };
            if let Some((name, version)) = dist.rsplit_once('-') {
                out.entry(normalize(name))
                    .or_insert_with(|| version.to_owned());
            }
        }
    }
    out
}

/// A pin `name==version`, split (name normalized).
fn pin(line: &str) -> Option<(String, String)> {
    let (name, version) = line.split_once("==")?;
    let (name, version) = (name.trim(), version.trim());
    (Requirement::parse(name).is_ok_and(|r| r.text == name)
        && !version.is_empty()
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-' | '_')))
    .then(|| (normalize(name), version.to_owned()))
}

impl Installer {
    /// An installer for the task whose log is `log_file`, installing for `python` (the
    /// task's interpreter), linking from the shared cache of `trust`. Finds the installer:
    /// `--uv`, else `uv` on `PATH`, else pip. Builds (`--packages-build`) run through
    /// `confine`.
    pub fn new(
        policy: Policy,
        python: PathBuf,
        log_file: &Path,
        trust: Trust,
        confine: Option<Box<dyn Confine>>,
    ) -> std::io::Result<Installer> {
        let tool = match &policy.uv {
            Some(p) if p.is_file() => Tool::Uv(p.clone()),
            Some(p) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("--uv {}: no such file", p.display()),
                ))
            }
            None => find_on_path("uv").map_or(Tool::Pip, Tool::Uv),
        };
        let layer = Layer::open(flowrepl_task_logger::path::packages_root(log_file))?;
        let root = policy.cache_root().unwrap_or_else(|| {
            // No home to keep it in: beside the logs.
            flowrepl_task_logger::path::log_dir_of(log_file)
                .unwrap_or(Path::new("."))
                .join("packages-cache")
        });
        Ok(Installer {
            policy,
            tool,
            python,
            layer,
            state_file: flowrepl_task_logger::path::packages_state(log_file),
            confine,
            progress: Arc::default(),
            trust,
            cache: root.join(trust.name()),
        })
    }

    /// Whose cache it links from.
    pub fn trust(&self) -> Trust {
        self.trust
    }

    /// The shared cache it installs from (of its trust level).
    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    /// Whether a layer holding `state` was linked from another trust level's cache (or
    /// from a cache not recorded): it must be rebuilt before this kernel uses it.
    pub fn foreign(&self, state: &LayerState) -> bool {
        state.cache.as_deref() != Some(self.trust.name())
    }

    /// The last line the running install's installer wrote (for progress reports).
    pub fn progress(&self) -> Arc<Mutex<String>> {
        Arc::clone(&self.progress)
    }

    /// The layer.
    pub fn layer(&self) -> &Layer {
        &self.layer
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// uv or pip.
    pub fn tool(&self) -> &Tool {
        &self.tool
    }

    /// The task's state: the state file, else, when `from_log` (this disk had no layer folder
    /// for the task: a fresh machine, or a deleted layer), the last successful install record
    /// of the log (a task brought here by its log). A disk that had the folder and no state
    /// file never installed anything for the task: its log (which can be gigabytes) is not
    /// read.
    pub fn task_state(
        &self,
        log_file: &Path,
        from_log: bool,
    ) -> Result<Option<LayerState>, String> {
        match read_state(&self.state_file) {
            Ok(Some(s)) => return Ok(Some(s)),
            Ok(None) if !from_log => return Ok(None),
            Ok(None) => {}
            Err(e) => return Err(format!("{}: {e}", self.state_file.display())),
        }
        let prefix = format!(
            "{{\"type\":\"{}\"",
            flowrepl_task_logger::RECORD_TYPE_INSTALL
        );
        flowrepl_task_logger::last_line(log_file, prefix.as_bytes(), 64 << 20, |line| {
            let r: flowrepl_task_logger::InstallRecord<'_> = serde_json::from_slice(line).ok()?;
            r.error.is_none().then_some(LayerState {
                version: STATE_VERSION,
                requirements: r.requirements,
                resolved: r.resolved,
                cache: None,
            })
        })
        .map_err(|e| format!("{}: {e}", log_file.display()))
    }

    /// Installs `packages` (with every requirement asked for before) into a new generation
    /// and switches to it.
    pub fn install(&self, packages: &[String]) -> Result<Installed, InstallError> {
        let deadline = Instant::now() + self.policy.timeout;
        flowrepl_os::lock(&self.progress).clear();
        if !self.policy.enabled {
            return Err(InstallError::Off);
        }
        if packages.is_empty() {
            return Err(InstallError::Empty);
        }
        if packages.len() > flowrepl_protocol::packages::MAX_REQUIREMENTS {
            return Err(InstallError::TooMany(packages.len()));
        }
        let asked = packages
            .iter()
            .map(|p| Requirement::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(allow) = &self.policy.allow {
            for r in &asked {
                allow.check(&r.name)?;
            }
        }
        let before = self.begin()?;
        let mut requirements: Vec<Requirement> = before
            .requirements
            .iter()
            .filter_map(|t| Requirement::parse(t).ok())
            .filter(|r| !asked.iter().any(|a| a.name == r.name))
            .collect();
        let marked: Vec<Requirement> = asked
            .iter()
            .filter(|r| r.text.contains(';'))
            .cloned()
            .collect();
        requirements.extend(asked);
        let venv = installed_in(&site_packages(&self.python));
        let (pins, from_cache) = self.resolve(&requirements, &venv, deadline)?;
        // A requirement with a marker that resolved to nothing: its marker excluded it.
        let excluded: Vec<String> = marked
            .into_iter()
            .filter(|r| !pins.iter().any(|(n, _)| *n == r.name))
            .map(|r| r.text)
            .collect();
        // What the venv has at the resolved version stays the venv's.
        let layer_pins: Vec<(String, String)> = pins
            .into_iter()
            .filter(|(n, v)| venv.get(n) != Some(v))
            .collect();
        if let Some(allow) = &self.policy.allow {
            for (n, _) in &layer_pins {
                allow.check(n).map_err(|e| match e {
                    PolicyError::NotAllowed(n, list) => PolicyError::NotAllowed(
                        format!("{n} (a dependency of what was asked for)"),
                        list,
                    ),
                    other => other,
                })?;
            }
        }
        let state = LayerState {
            version: STATE_VERSION,
            requirements: requirements.into_iter().map(|r| r.text).collect(),
            resolved: layer_pins
                .iter()
                .map(|(n, v)| format!("{n}=={v}"))
                .collect(),
            cache: Some(self.trust.name().to_owned()),
        };
        let mut installed = self.put(&before, state, from_cache, deadline)?;
        installed.excluded = excluded;
        Ok(installed)
    }

    /// Builds the layer `state` says (a task whose layer is missing or differs), installing
    /// its pins as they are. The pins are checked as a caller's would be.
    pub fn rebuild(&self, state: &LayerState) -> Result<Installed, InstallError> {
        let deadline = Instant::now() + self.policy.timeout;
        if !self.policy.enabled {
            return Err(InstallError::Off);
        }
        for r in &state.requirements {
            Requirement::parse(r)?;
        }
        let mut pins = Vec::new();
        for p in &state.resolved {
            let (n, _) = pin(p).ok_or_else(|| {
                InstallError::Policy(PolicyError::Bad(
                    p.clone(),
                    "a layer's entry is name==version",
                ))
            })?;
            if let Some(allow) = &self.policy.allow {
                allow.check(&n)?;
            }
            pins.push(p.clone());
        }
        let before = self.begin()?;
        let state = LayerState {
            version: STATE_VERSION,
            requirements: state.requirements.clone(),
            resolved: pins,
            cache: Some(self.trust.name().to_owned()),
        };
        self.put(&before, state, true, deadline)
    }

    /// The start of an install: the layer as it is, and (builds allowed) an empty folder for
    /// the builds.
    fn begin(&self) -> Result<LayerState, InstallError> {
        if self.policy.build {
            self.layer.fresh_build_dir()?;
        }
        Ok(self.layer.state().unwrap_or_default())
    }

    /// Installs `state`'s pins into a new generation, switches to it and writes the task's
    /// state; `resolved_from_cache`: the pins came from the cache alone.
    fn put(
        &self,
        before: &LayerState,
        mut state: LayerState,
        resolved_from_cache: bool,
        deadline: Instant,
    ) -> Result<Installed, InstallError> {
        let Populated {
            generation,
            output,
            from_cache,
        } = self.populate(&state.resolved, deadline)?;
        state.resolved.sort();
        let added: Vec<String> = state
            .resolved
            .iter()
            .filter(|p| !before.resolved.contains(p))
            .cloned()
            .collect();
        let names: Vec<String> = added
            .iter()
            .filter_map(|p| pin(p))
            .map(|(n, _)| n)
            .collect();
        let modules = modules_of(&generation, &names);
        if let Err(e) = self.layer.switch(&generation, &state) {
            self.layer.discard(&generation);
            return Err(e.into());
        }
        if let Err(e) = write_json(&self.state_file, &state) {
            tracing::warn!(error = %e, "the task's package state file was not written; its log's install record keeps the same");
        }
        Ok(Installed {
            state,
            added,
            modules,
            from_cache: resolved_from_cache && from_cache,
            output,
            excluded: Vec::new(),
        })
    }

    /// The tries, in order: wheels from the cache alone, then from the index (the venv's
    /// versions preferred, then not); with `--packages-build`, then builds, confined.
    fn tries(&self, constrain: bool) -> Vec<Try> {
        let mut out = Vec::new();
        let builds: &[bool] = if self.policy.build {
            &[false, true]
        } else {
            &[false]
        };
        for &build in builds {
            // The cache alone only for wheels (pip has no such mode): a build goes online.
            if !build && self.tool != Tool::Pip {
                out.push(Try {
                    offline: true,
                    constrained: constrain,
                    build,
                });
            }
            for constrained in [true, false] {
                if constrained && !constrain {
                    continue;
                }
                out.push(Try {
                    offline: false,
                    constrained,
                    build,
                });
            }
        }
        out
    }

    /// The pins for `requirements` (see [`Installer::tries`]). Whether the cache answered.
    fn resolve(
        &self,
        requirements: &[Requirement],
        venv: &BTreeMap<String, String>,
        deadline: Instant,
    ) -> Result<(Vec<(String, String)>, bool), InstallError> {
        let input: String = requirements
            .iter()
            .map(|r| format!("{}\n", r.text))
            .collect();
        let venv_pins: String = venv.iter().map(|(n, v)| format!("{n}=={v}\n")).collect();
        let mut last = String::new();
        for t in self.tries(!venv.is_empty()) {
            // A build's copy is in its own folder (all it can read of the kernel's files).
            let folder = if t.build {
                self.layer.build_dir()
            } else {
                self.layer.work()
            };
            let constraints = folder.join("venv-constraints.txt");
            if t.constrained {
                replace_file(&constraints, venv_pins.as_bytes())?;
            }
            let ran = match &self.tool {
                Tool::Uv(uv) => {
                    let mut cmd = self.uv(uv, "compile", t);
                    cmd.args(["--quiet", "--no-header", "--no-annotate", "-"]);
                    if t.constrained {
                        cmd.arg("--constraints").arg(&constraints);
                    }
                    self.run(cmd, Some(&input), deadline, t, &[])?
                }
                Tool::Pip => {
                    let report = folder.join("report.json");
                    let mut cmd = self.pip(t);
                    cmd.args(["--dry-run", "--ignore-installed", "--quiet", "--report"])
                        .arg(&report);
                    if t.constrained {
                        cmd.arg("--constraint").arg(&constraints);
                    }
                    cmd.args(requirements.iter().map(|r| &r.text));
                    let mut ran = self.run(cmd, None, deadline, t, &[])?;
                    if ran.ok {
                        ran.stdout = pip_report_pins(&report).unwrap_or_default();
                    }
                    ran
                }
            };
            if ran.ok {
                let pins: Option<Vec<_>> = ran
                    .stdout
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(pin)
                    .collect();
                return pins.map(|p| (p, t.offline)).ok_or_else(|| {
                    InstallError::Resolve(format!(
                        "unexpected output from {}:\n{}",
                        self.tool.name(),
                        ran.stdout
                    ))
                });
            }
            last = ran.stderr;
        }
        Err(InstallError::Resolve(last.trim().to_owned()))
    }

    /// A new generation holding exactly `pins` (no dependencies added), by the same tries.
    fn populate(&self, pins: &[String], deadline: Instant) -> Result<Populated, InstallError> {
        let generation = self.layer.new_generation()?;
        if pins.is_empty() {
            return Ok(Populated {
                generation,
                output: String::new(),
                from_cache: true,
            });
        }
        let mut last = String::new();
        for t in self.tries(false) {
            let mut cmd = match &self.tool {
                Tool::Uv(uv) => {
                    let mut cmd = self.uv(uv, "install", t);
                    if t.build {
                        // The task's cache and the generation are separate mounts inside.
                        cmd.args(["--link-mode", "copy"]);
                    }
                    cmd
                }
                Tool::Pip => self.pip(t),
            };
            cmd.arg("--target")
                .arg(&generation)
                .arg("--no-deps")
                .args(pins);
            let ran = match self.run(cmd, None, deadline, t, std::slice::from_ref(&generation)) {
                Ok(r) => r,
                Err(e) => {
                    self.layer.discard(&generation);
                    return Err(e);
                }
            };
            if ran.ok && t.build {
                // A build's code could write into the generation (uv installs from inside
                // its sandbox): a link or a FIFO there was not the wheel's.
                if let Some(what) = crate::layer::special_entry(&generation, 1_000_000) {
                    self.layer.discard(&generation);
                    return Err(InstallError::Install(format!(
                        "the build left {what} in the new layer, which no wheel holds: refused, the layer is unchanged"
                    )));
                }
            }
            if ran.ok {
                let _ = std::fs::remove_file(generation.join(".lock"));
                return Ok(Populated {
                    generation,
                    output: ran.stderr,
                    from_cache: t.offline,
                });
            }
            last = ran.stderr;
            // A half-written generation is not reused.
            self.layer.discard(&generation);
            std::fs::create_dir(&generation)?;
        }
        self.layer.discard(&generation);
        Err(InstallError::Install(last.trim().to_owned()))
    }

    /// The cache a try uses: the shared one of the task's trust level, or for builds the
    /// task's own.
    fn cache(&self, t: Try) -> PathBuf {
        if t.build {
            self.layer.build_dir().join("cache")
        } else {
            self.cache.clone()
        }
    }

    /// `uv pip <sub>`, with the operator's settings and nothing of the caller's: no config
    /// files (`--no-config`: a cell could write a `uv.toml` where uv would look), run in the
    /// layer's scratch folder, sdists refused unless builds are allowed.
    fn uv(&self, uv: &Path, sub: &str, t: Try) -> Command {
        let mut cmd = Command::new(uv);
        cmd.args(["pip", sub, "--no-config", "--python"])
            .arg(&self.python)
            .current_dir(self.layer.work());
        without_python_variables(&mut cmd);
        if !t.build {
            cmd.arg("--no-build");
        }
        if t.offline {
            cmd.arg("--offline");
        }
        self.sources(&mut cmd, t);
        cmd
    }

    /// Where packages come from, in the flags uv and pip share: the operator's indexes, and
    /// the try's cache.
    fn sources(&self, cmd: &mut Command, t: Try) {
        if let Some(u) = &self.policy.index_url {
            cmd.args(["--index-url", u]);
        }
        for u in &self.policy.extra_index_urls {
            cmd.args(["--extra-index-url", u]);
        }
        cmd.arg("--cache-dir").arg(self.cache(t));
    }

    /// `python -m pip install`, isolated from the user's pip configuration.
    fn pip(&self, t: Try) -> Command {
        let mut cmd = Command::new(&self.python);
        without_python_variables(&mut cmd);
        cmd.args([
            // Isolated: no `PYTHON*` variables, no user site, not the current folder first.
            "-I",
            "-m",
            "pip",
            "install",
            "--isolated",
            "--disable-pip-version-check",
            "--no-input",
        ])
        .current_dir(self.layer.work());
        if !t.build {
            cmd.args(["--only-binary", ":all:"]);
        }
        self.sources(&mut cmd, t);
        cmd
    }

    /// Runs one try's command (a build's confined, writing `writable` besides the scratch
    /// folder and its cache).
    fn run(
        &self,
        cmd: Command,
        input: Option<&str>,
        deadline: Instant,
        t: Try,
        writable: &[PathBuf],
    ) -> Result<Ran, InstallError> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let Confined { command, keep } = if t.build {
            let confine = self.confine.as_ref().ok_or_else(|| {
                InstallError::Unconfined("this kernel has no sandbox to run builds in".into())
            })?;
            let hosts = self
                .policy
                .index_hosts()
                .map_err(|e| InstallError::Unconfined(format!("a build's network: {e}")))?;
            confine
                .confine(&cmd, &self.layer.build_dir(), writable, &hosts)
                .map_err(InstallError::Unconfined)?
        } else {
            cmd.into()
        };
        let ran = run(command, input, deadline, &self.progress)
            .map_err(|e| InstallError::Spawn(program, e));
        // The build's network lives until it has ended.
        drop(keep);
        let ran = ran?;
        if ran.timed_out {
            return Err(InstallError::Timeout(self.policy.timeout));
        }
        Ok(ran)
    }
}

/// Writes `bytes` to `path` as a new file: whatever was there (a link a build planted among
/// them) is removed first, never followed.
fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?
        .write_all(bytes)
}

/// The `name==version` lines of a pip `--report`.
fn pip_report_pins(report: &Path) -> Option<String> {
    let text = crate::layer::read_untrusted(report, 64 << 20)?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let mut out = String::new();
    for item in v.get("install")?.as_array()? {
        let meta = item.get("metadata")?;
        out.push_str(&format!(
            "{}=={}\n",
            meta.get("name")?.as_str()?,
            meta.get("version")?.as_str()?
        ));
    }
    Some(out)
}

/// `name` in a folder of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Leaves the kernel's `PYTHON*` variables out of an installer's environment: the installer
/// runs the task's interpreter outside the sandbox (uv to inspect it, pip as itself), and a
/// `PYTHONPATH` or `PYTHONSTARTUP` naming a folder in the workspace would have it import a
/// cell's `sitecustomize.py` there.
fn without_python_variables(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PYTHON") {
            cmd.env_remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_names_and_versions() {
        assert_eq!(
            pin("Tiny_Pkg==2.0"),
            Some(("tiny-pkg".into(), "2.0".into()))
        );
        assert_eq!(
            pin("x==1.0+local.1"),
            Some(("x".into(), "1.0+local.1".into()))
        );
        for bad in ["x", "x>=1", "x==", "-x==1", "x==1 ; y", "x @ http://a==1"] {
            assert_eq!(pin(bad), None, "{bad}");
        }
    }
}
