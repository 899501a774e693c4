//! Everything the kernel needs to know at start, from the command line and the environment.

use flowrepl_cli::args::Cli;
use flowrepl_cli::choice::{Choice, Executor};
use flowrepl_protocol::call::DEFAULT_TIMEOUT_MS;
use std::path::PathBuf;

/// The default cell timeout in drop-in mode: its clients give up after 300 s, so a cell that
/// times out (and, in worker mode, is killed within the 2 s grace period) is still answered.
pub const DROPIN_TIMEOUT_MS: u64 = 295_000;

/// Who this session belongs to, from the Flow backend's environment.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `FLOW_PLAN_ID`, default `local`.
    pub plan_id: String,
    /// `FLOW_TASK_ID`, default `adhoc`.
    pub task_id: String,
    /// `FLOW_TASK_NAME`.
    pub task_name: Option<String>,
    /// Unique per kernel run.
    pub session_id: String,
}

fn env_var(k: &str) -> Option<String> {
    std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
}

pub use flowrepl_task_logger::path::plan_and_task_from_env;

impl Identity {
    /// Reads the `FLOW_*` variables. Values that are not UTF-8 are converted lossily.
    pub fn from_env() -> Identity {
        let (plan_id, task_id) = plan_and_task_from_env();
        Identity {
            plan_id,
            task_id,
            task_name: env_var(flowrepl_task_logger::TASK_NAME_ENV),
            session_id: uuid::Uuid::new_v4().to_string(),
        }
    }
}

/// `--store` and `--lease-s`.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// The store's URL.
    pub url: String,
    /// The task's lease.
    pub lease: std::time::Duration,
    /// At most this many bytes of them (0: none are kept).
    pub workspace_max_bytes: u64,
    /// `--store-sync`: a cell is answered once its record is in the store.
    pub sync: bool,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Session identity.
    pub identity: Identity,
    /// The JSONL file of this task.
    pub log_file: PathBuf,
    /// Default cell timeout.
    pub default_timeout_ms: u64,
    /// Longest request line.
    pub max_request_bytes: usize,
    /// Output limit per stream and cell.
    pub max_output_bytes: u64,
    /// Whether records are written (`--no-log` turns it off).
    pub logging: bool,
    /// The python to emulate.
    pub python: PathBuf,
    /// Why it was chosen.
    pub python_source: flowrepl_pythons::Source,
    /// What runs cells for its version.
    pub executor: Executor,
    /// Worker mode, when set.
    pub worker: Option<WorkerConfig>,
    /// After SIGINT, how long a cell has to stop: then worker mode kills the worker, and
    /// in-process mode answers `CellNotStopped`.
    pub kill_grace: std::time::Duration,
    /// `flowrepl mcp`, when serving MCP.
    pub mcp: Option<flowrepl_cli::args::McpArgs>,
    /// What the session starts from (drop-in `sys.argv` and `sys.path[0]`, startup files).
    pub setup: flowrepl_exec::setup::SessionSetup,
    /// The client is the original system's (drop-in mode, `--compat json-repl`): failing
    /// `execute` calls are answered as JSON-RPC errors, replies are ASCII (it decodes each
    /// pipe read on its own), and approvals are unavailable (it cannot answer them).
    pub json_repl_client: bool,
    /// Environment variables that carry drop-in interpreter flags to Python.
    pub python_env: Vec<(&'static str, String)>,
    /// Checkpoints of the namespace beside the task log; `None` with `FLOWREPL_CHECKPOINTS=off`.
    pub checkpoints: Option<flowrepl_exec::setup::CheckpointConfig>,
    /// The task's checkpoint folder (`<log_dir>/<plan>/<task>.checkpoints`).
    pub checkpoint_root: PathBuf,
    /// `--resume`: start from the automatic checkpoint, if there is one.
    pub resume: bool,
    /// `--store`: where the task's state is kept besides this disk.
    pub store: Option<StoreSettings>,
    /// The task's workspace (absolute): the sandbox's `--workspace`; unsandboxed, `--workspace`
    /// if given, else the current directory. Clients' files go there; `--store` keeps its
    /// files with each state.
    pub workspace: PathBuf,
    /// `--max-file-bytes` and `--max-workspace-mb`.
    pub file_limits: flowrepl_files::Limits,
    /// Checkpoints a sandboxed session wrote may be restored: this session is sandboxed too,
    /// or `--trust-sandboxed-checkpoints`.
    pub trust_sandboxed_checkpoints: bool,
    /// The operator's package policy (`--packages`, `--uv`, `--index-url`, ...).
    pub packages: flowrepl_packages::Policy,
    /// The `flowrepl-worker` executable (worker mode's, and the one that runs package builds
    /// confined), whether or not worker mode is on.
    pub worker_exe: PathBuf,
}

impl Config {
    /// Figure collection limits (MCP mode with images on).
    pub fn image_limits(&self) -> Option<flowrepl_exec::setup::ImageLimits> {
        let m = self.mcp.as_ref()?;
        (m.max_images > 0).then_some(flowrepl_exec::setup::ImageLimits {
            max_images: m.max_images,
            max_pixels: m.max_image_pixels,
        })
    }

    /// An egress proxy for this task under `rules`: its records in the task log, under the
    /// task's identity (a worker's cells, or a confined build).
    pub fn egress_proxy(
        &self,
        rules: std::sync::Arc<flowrepl_egress::Rules>,
    ) -> flowrepl_egress::proxy::ProxyConfig {
        flowrepl_egress::proxy::ProxyConfig {
            rules,
            log: self.logging.then(|| self.log_file.clone()),
            who: flowrepl_egress::Who {
                plan_id: self.identity.plan_id.clone(),
                task_id: self.identity.task_id.clone(),
                task_name: self.identity.task_name.clone(),
                session_id: self.identity.session_id.clone(),
            },
        }
    }
}

/// Resource limits applied to the worker only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// RLIMIT_AS in MiB.
    pub memory_mb: Option<u64>,
    /// RLIMIT_CPU per cell, in seconds (re-armed by the worker before each cell).
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_NPROC.
    pub max_procs: Option<u64>,
}

/// Worker mode settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The `flowrepl-worker` executable.
    pub exe: PathBuf,
    /// Limits of the worker.
    pub limits: Limits,
    /// `--sandbox`: how the worker is confined.
    pub sandbox: Option<SandboxConfig>,
}

/// `--sandbox` and its options (docs/sandbox.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// `--sandbox=strict`: every layer, or no session.
    pub strict: bool,
    /// `--sandbox-net`: none, the host's, or only the egress proxy's hosts.
    pub network: flowrepl_egress::SandboxNet,
    /// The one folder cells may write, and their working directory (absolute).
    pub workspace: PathBuf,
    /// Layers left out (`FLOWREPL_SANDBOX_SKIP`).
    pub skip: Vec<String>,
    /// The log folder, hidden from cells (absolute).
    pub log_dir: PathBuf,
}

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Worker mode was asked for but the worker executable is missing.
    #[error("worker mode: {0} not found (build it with `cargo build --release`, or set FLOWREPL_WORKER_BIN)")]
    WorkerMissing(String),
    /// The log directory cannot be made absolute (no working directory).
    #[error("cannot resolve the log directory")]
    LogDir(#[source] std::io::Error),
    /// The task's workspace cannot be resolved.
    #[error("cannot resolve the task's workspace")]
    Unresolved(#[source] std::io::Error),
    /// `--sandbox-net=allow:` without `--sandbox`.
    #[error(
        "--sandbox-net=allow:... needs --sandbox (without it cells have the host's whole network)"
    )]
    NetWithoutSandbox,
    /// `--workspace` is not a folder.
    #[error("--workspace {0}: not a folder")]
    Workspace(String),
    /// `FLOWREPL_SANDBOX_SKIP` names a layer that does not exist.
    #[error("FLOWREPL_SANDBOX_SKIP: no sandbox layer or protection {0:?} (there are: {1})")]
    SandboxLayer(String, String),
    /// `--sandbox=strict` with layers left out: strict means every layer.
    #[error("--sandbox=strict refuses FLOWREPL_SANDBOX_SKIP ({0}): strict means every layer; use --sandbox to leave layers out")]
    StrictSkip(String),
    /// A `--startup` file is missing.
    #[error("startup file {0} not found")]
    StartupMissing(String),
    /// The package policy cannot be used (an allow list that cannot be read).
    #[error(transparent)]
    Packages(#[from] flowrepl_packages::PolicyError),
}

impl Config {
    /// The limits in force, as the session records say them.
    pub fn session_limits(&self) -> flowrepl_task_logger::SessionLimits {
        let worker = self.worker.as_ref().map(|w| w.limits).unwrap_or_default();
        flowrepl_task_logger::SessionLimits {
            timeout_ms: self.default_timeout_ms,
            max_output_bytes: self.max_output_bytes,
            max_request_bytes: self.max_request_bytes as u64,
            kill_grace_ms: self.kill_grace.as_millis() as u64,
            memory_mb: worker.memory_mb,
            cpu_seconds: worker.cpu_seconds,
            max_procs: worker.max_procs,
        }
    }

    /// Which front serves the session: `mcp`, `dropin` or `jsonrpc`.
    pub fn front(&self) -> &'static str {
        if self.mcp.is_some() {
            "mcp"
        } else if self.setup.argv.is_some() {
            "dropin"
        } else {
            "jsonrpc"
        }
    }

    /// `--sandbox` and its options, checked.
    fn sandbox(cli: &Cli, log_dir: &std::path::Path) -> Result<Option<SandboxConfig>, ConfigError> {
        use flowrepl_cli::args::SandboxLevel;
        let strict = match cli.sandbox {
            None | Some(SandboxLevel::Off) => {
                if let Some(flowrepl_egress::SandboxNet::Allow(_)) = &cli.sandbox_net {
                    // Without the sandbox cells have the host's network: rules would be a
                    // promise nothing keeps.
                    return Err(ConfigError::NetWithoutSandbox);
                }
                return Ok(None);
            }
            Some(SandboxLevel::BestEffort) => false,
            Some(SandboxLevel::Strict) => true,
        };
        let workspace = match &cli.workspace {
            Some(w) => w.clone(),
            None => std::env::current_dir()
                .map_err(|e| ConfigError::Workspace(format!("(the current directory: {e})")))?,
        };
        let workspace = std::fs::canonicalize(&workspace)
            .ok()
            .filter(|w| w.is_dir())
            .ok_or_else(|| ConfigError::Workspace(workspace.display().to_string()))?;
        let skip: Vec<String> = std::env::var(flowrepl_cli::env::SANDBOX_SKIP)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        if let Some(bad) = skip.iter().find(|l| !flowrepl_sandbox::skippable(l)) {
            return Err(ConfigError::SandboxLayer(
                bad.clone(),
                flowrepl_sandbox::LAYERS
                    .iter()
                    .chain(&flowrepl_sandbox::PROTECTIONS)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        if strict && !skip.is_empty() {
            return Err(ConfigError::StrictSkip(skip.join(",")));
        }
        Ok(Some(SandboxConfig {
            strict,
            network: cli.sandbox_net.clone().unwrap_or_default(),
            workspace,
            skip,
            log_dir: log_dir.to_path_buf(),
        }))
    }

    /// Resolves the command line and environment, for the interpreter chosen
    /// ([`flowrepl_cli::choice::choose`]).
    pub fn resolve(cli: &Cli, choice: Choice) -> Result<Config, ConfigError> {
        let worker_env = std::env::var("USE_SUBPROCESS_WORKER")
            .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
        let identity = Identity::from_env();
        // Absolute, so that a cell's os.chdir() cannot move where a reopened log goes.
        let log_dir = std::path::absolute(&cli.log_dir).map_err(ConfigError::LogDir)?;
        let log_file =
            flowrepl_task_logger::task_log_path(&log_dir, &identity.plan_id, &identity.task_id);
        let python_source = choice.interpreter.source;
        let python = choice.interpreter.program;
        let executor = choice.executor;
        let limits = Limits {
            memory_mb: cli.memory_mb,
            cpu_seconds: cli.cpu_seconds,
            max_procs: cli.max_procs,
        };
        let mut max_request_bytes = cli.max_request_bytes;
        let sandbox = Self::sandbox(cli, &log_dir)?;
        let sandboxed = sandbox.is_some();
        let worker_exe = match &cli.worker_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("flowrepl-worker")))
                .unwrap_or_else(|| PathBuf::from("flowrepl-worker")),
        };
        let worker = if cli.worker || worker_env || sandbox.is_some() {
            let exe = worker_exe.clone();
            if !exe.is_file() {
                return Err(ConfigError::WorkerMissing(exe.display().to_string()));
            }
            if max_request_bytes > flowrepl_protocol::frame::MAX_CELL_BYTES {
                max_request_bytes = flowrepl_protocol::frame::MAX_CELL_BYTES;
                tracing::warn!(
                    max_request_bytes,
                    "worker mode: FLOWREPL_MAX_REQUEST_BYTES is capped at the largest cell a worker frame carries"
                );
            }
            Some(WorkerConfig {
                exe,
                limits,
                sandbox,
            })
        } else {
            if limits != Default::default() {
                tracing::warn!("FLOWREPL_MEMORY_MB / FLOWREPL_CPU_SECONDS / FLOWREPL_MAX_PROCS apply to the worker only; they are ignored in-process");
            }
            None
        };
        let mut startup = Vec::new();
        match std::env::var_os("PYTHONSTARTUP").filter(|p| !p.is_empty()) {
            Some(p) if std::path::Path::new(&p).is_file() => startup.push(PathBuf::from(p)),
            Some(p) => tracing::warn!(
                path = %std::path::Path::new(&p).display(),
                "PYTHONSTARTUP names no file; ignored"
            ),
            None => {}
        }
        for f in &cli.startup {
            if !f.is_file() {
                return Err(ConfigError::StartupMissing(f.display().to_string()));
            }
            startup.push(f.clone());
        }
        // Absolute, so that a worker (or a cell's os.chdir) finds them.
        let startup = startup
            .into_iter()
            .map(|f| std::path::absolute(&f).unwrap_or(f))
            .collect();
        let dropin = cli.dropin.as_ref();
        let setup = flowrepl_exec::setup::SessionSetup {
            argv: dropin.map(|d| d.argv()),
            path0: dropin.map(|d| {
                let dir = d.script.parent().unwrap_or(std::path::Path::new(""));
                std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
            }),
            startup,
            packages: cli.packages.then(|| {
                flowrepl_task_logger::path::packages_root(&log_file)
                    .join(flowrepl_packages::layer::CURRENT)
            }),
            flow: flowrepl_exec::setup::FlowSetup {
                plan_id: Some(identity.plan_id.clone()),
                task_id: Some(identity.task_id.clone()),
                task_name: identity.task_name.clone(),
                session_id: Some(identity.session_id.clone()),
                context: task_context(&log_file),
            },
        };
        if let Some(d) = dropin {
            if !d.ignored.is_empty() {
                tracing::info!(ignored = ?d.ignored, "drop-in mode: interpreter options without effect on the session");
            }
        }
        let checkpoint_root = flowrepl_task_logger::checkpoint::checkpoint_root(&log_file);
        match flowrepl_task_logger::checkpoint::adopt_legacy_root(&log_file) {
            Ok(true) => tracing::info!(
                folder = %checkpoint_root.display(),
                "the task's checkpoint folder had its older name (.snapshot): renamed"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                error = %e,
                "the task's checkpoint folder of the older name (.snapshot) could not be renamed; its checkpoints are not used"
            ),
        }
        let checkpoints =
            (cli.checkpoints != flowrepl_protocol::CheckpointPolicy::Off).then(|| {
                flowrepl_exec::setup::CheckpointConfig {
                    root: checkpoint_root.clone(),
                    policy: cli.checkpoints,
                    max_bytes: cli.checkpoint_max_mb.saturating_mul(1 << 20),
                    untrusted: false,
                }
            });
        let worker_sandbox_workspace = worker
            .as_ref()
            .and_then(|w| w.sandbox.as_ref())
            .map(|s| s.workspace.clone());
        let packages = flowrepl_packages::Policy {
            enabled: cli.packages,
            uv: cli.uv.clone(),
            index_url: cli.index_url.clone(),
            extra_index_urls: cli.extra_index_url.clone(),
            allow: cli
                .packages_allow
                .as_deref()
                .map(flowrepl_packages::AllowList::load)
                .transpose()?,
            build: cli.packages_build,
            timeout: std::time::Duration::from_secs(cli.packages_timeout_s),
            cache_dir: cli.packages_cache.clone(),
        };
        let mut config = Config {
            packages,
            worker_exe,
            checkpoints,
            checkpoint_root,
            resume: cli.resume,
            trust_sandboxed_checkpoints: sandboxed || cli.trust_sandboxed_checkpoints,
            store: cli.store.as_ref().map(|url| StoreSettings {
                url: url.clone(),
                lease: std::time::Duration::from_secs(cli.lease_s),
                workspace_max_bytes: cli.store_workspace_mb.saturating_mul(1 << 20),
                sync: cli.store_sync,
            }),
            workspace: match (&worker_sandbox_workspace, &cli.workspace) {
                (Some(w), _) => w.clone(),
                (None, Some(w)) => std::path::absolute(w).map_err(ConfigError::Unresolved)?,
                (None, None) => std::env::current_dir().map_err(ConfigError::Unresolved)?,
            },
            file_limits: flowrepl_files::Limits {
                max_file_bytes: cli.max_file_bytes,
                max_workspace_bytes: cli.max_workspace_mb.saturating_mul(1 << 20),
            },
            setup,
            json_repl_client: dropin.is_some() || cli.compat.is_some(),
            python_env: dropin.map(|d| d.env.clone()).unwrap_or_default(),
            identity,
            worker,
            kill_grace: std::time::Duration::from_millis(cli.kill_grace_ms),
            log_file,
            default_timeout_ms: cli.timeout_ms.unwrap_or(if dropin.is_some() {
                DROPIN_TIMEOUT_MS
            } else {
                DEFAULT_TIMEOUT_MS
            }),
            max_request_bytes,
            max_output_bytes: cli.max_output_bytes,
            logging: !cli.no_log,
            python,
            python_source,
            executor,
            mcp: cli.command.as_ref().and_then(|c| match c {
                flowrepl_cli::args::Command::Mcp(m) => Some(m.clone()),
                _ => None,
            }),
        };
        config.read_task_files();
        Ok(config)
    }

    /// Reads what the configuration takes from the task's files (again, once a store brought
    /// them here): its context, and whether its checkpoints came from a sandboxed session.
    pub fn read_task_files(&mut self) {
        self.setup.flow.context = task_context(&self.log_file);
        if let Some(c) = &mut self.checkpoints {
            c.untrusted = !self.trust_sandboxed_checkpoints
                && flowrepl_task_logger::checkpoint::sandboxed_mark(&self.checkpoint_root).exists();
        }
    }
}

/// The task's context as its log has it last (`None`: none, or unreadable, which is said).
fn task_context(log_file: &std::path::Path) -> Option<String> {
    match flowrepl_task_logger::load_context(log_file) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "the task's context could not be read; starting from {{}}");
            None
        }
    }
}
