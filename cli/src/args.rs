//! Command line and environment.

use crate::env;
use clap::Parser;
use std::path::PathBuf;

/// `--sandbox`: how the worker is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxLevel {
    /// Not confined.
    Off,
    /// Every layer the host accepts; the others are reported as not enforced.
    BestEffort,
    /// Every layer, or the kernel does not start (exit 2).
    Strict,
}

fn parse_sandbox_net(s: &str) -> Result<flowrepl_egress::SandboxNet, String> {
    flowrepl_egress::SandboxNet::parse(s)
}

fn parse_sandbox(s: &str) -> Result<SandboxLevel, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "1" | "on" | "true" | "yes" | "best-effort" => Ok(SandboxLevel::BestEffort),
        "strict" => Ok(SandboxLevel::Strict),
        "0" | "off" | "false" | "no" => Ok(SandboxLevel::Off),
        other => Err(format!("{other:?}: expected on, strict or off")),
    }
}

/// A persistent Python kernel speaking JSON-RPC 2.0, one JSON object per line on stdio.
///
/// Requests arrive on stdin, one reply per request leaves on stdout; nothing else is ever
/// written to stdout. Diagnostics go to stderr (filter with FLOWREPL_LOG, e.g. `debug`).
#[derive(Debug, Parser)]
#[command(name = "flowrepl", version, about)]
pub struct Cli {
    /// What to serve (default: the JSON-RPC kernel).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Directory of the per-task JSONL logs: `<log-dir>/<plan_id>/<task_id>.jsonl`.
    #[arg(
        global = true,
        long,
        env = "FLOWREPL_LOG_DIR",
        default_value = ".flowrepl/logs"
    )]
    pub log_dir: PathBuf,

    /// Python to serve: a CPython 3.10+ interpreter or a venv directory [default: $VIRTUAL_ENV,
    /// else the venv flowrepl is installed in, else the python3 on PATH, else the interpreter
    /// flowrepl was built against].
    #[arg(global = true, long, env = env::PYTHON, value_name = "PATH")]
    pub python: Option<PathBuf>,

    /// Default cell timeout in milliseconds, when a request gives no timeout_ms [default:
    /// 300000; 295000 in drop-in mode, under its clients' 300 s].
    #[arg(global = true, long, env = "FLOWREPL_TIMEOUT_MS",
          value_parser = clap::value_parser!(u64).range(1..=flowrepl_protocol::call::MAX_TIMEOUT_MS))]
    pub timeout_ms: Option<u64>,

    /// Answer a failing cell called as `execute` the way the original `json_repl_session.py`
    /// did: a JSON-RPC error -32603 with the whole result as `data` (on in drop-in mode).
    #[arg(global = true, long, value_enum, value_name = "CLIENT")]
    pub compat: Option<Compat>,

    /// A Python file to run in the session before it is ready, after $PYTHONSTARTUP (may be
    /// given more than once); the names it defines are the session's baseline.
    #[arg(global = true, long, value_name = "FILE")]
    pub startup: Vec<PathBuf>,

    /// Drop-in mode: started as `flowrepl [interpreter flags] SCRIPT [args...]`.
    #[arg(skip)]
    pub dropin: Option<crate::dropin::Python>,

    /// Longest request line accepted, in bytes; longer lines get error -32001.
    #[arg(global = true, long, env = "FLOWREPL_MAX_REQUEST_BYTES", default_value_t = 256 << 20)]
    pub max_request_bytes: usize,

    /// Output kept per stream and cell, in bytes; beyond it the middle is dropped.
    #[arg(global = true, long, env = "FLOWREPL_MAX_OUTPUT_BYTES", default_value_t = flowrepl_protocol::limits::DEFAULT_MAX_OUTPUT_BYTES,
          value_parser = clap::value_parser!(u64).range(4096..))]
    pub max_output_bytes: u64,

    /// Run cells in a keep-alive worker subprocess (also USE_SUBPROCESS_WORKER=1).
    #[arg(global = true, long)]
    pub worker: bool,

    /// Write no task log (no records, and the task context is not saved).
    #[arg(global = true, long, env = env::NO_LOG, action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub no_log: bool,

    /// After SIGINT (timeout or interrupt), how long a cell has to stop, in milliseconds.
    /// Then worker mode kills the worker's process group; in-process mode (which cannot kill
    /// the cell) answers the request with `CellNotStopped`.
    #[arg(global = true, long, env = "FLOWREPL_KILL_GRACE_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub kill_grace_ms: u64,

    /// Worker mode: address-space limit of the worker (RLIMIT_AS), in MiB. A cell that
    /// exceeds it gets MemoryLimitExceeded; the session survives.
    #[arg(global = true, long, env = "FLOWREPL_MEMORY_MB", value_parser = clap::value_parser!(u64).range(64..))]
    pub memory_mb: Option<u64>,

    /// Worker mode: CPU seconds a cell may use (RLIMIT_CPU, re-armed per cell). Past it the
    /// worker is ended (CpuLimitExceeded) and a fresh one started.
    #[arg(global = true, long, env = "FLOWREPL_CPU_SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub cpu_seconds: Option<u64>,

    /// Worker mode: processes the worker's user may have (RLIMIT_NPROC; counts all of that
    /// user's processes, and Linux does not apply it to root).
    #[arg(global = true, long, env = "FLOWREPL_MAX_PROCS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_procs: Option<u64>,

    /// Run cells in a confined worker (implies worker mode): no network, writes only in the
    /// workspace, no reach into the kernel or other processes (docs/sandbox.md). `strict`:
    /// refuse to start (exit 2) unless the host enforces every layer.
    #[arg(global = true, long, env = env::SANDBOX, value_name = "LEVEL", num_args = 0..=1,
          default_missing_value = "on", value_parser = parse_sandbox)]
    pub sandbox: Option<SandboxLevel>,

    /// With `--sandbox`, the network cells have: none (the default); `host` (the bare flag):
    /// the host's, nothing else loosens; `allow:RULE[,RULE...]`: only the hosts the rules
    /// name, through the kernel's egress proxy (a rule is `host`, `*.domain`, or either with
    /// `:port`; `@FILE` reads one rule per line). docs/sandbox.md.
    #[arg(global = true, long, env = "FLOWREPL_SANDBOX_NET", value_name = "NET",
          num_args = 0..=1, require_equals = true, default_missing_value = "host",
          value_parser = parse_sandbox_net)]
    pub sandbox_net: Option<flowrepl_egress::SandboxNet>,

    /// With `--sandbox`: the one folder cells may write, and their working directory
    /// (default: the current directory).
    #[arg(global = true, long, env = "FLOWREPL_WORKSPACE", value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// Worker mode: the `flowrepl-worker` executable (default: next to `flowrepl`).
    #[arg(global = true, long, env = "FLOWREPL_WORKER_BIN", value_name = "PATH")]
    pub worker_bin: Option<PathBuf>,

    /// When the namespace is checkpointed beside the task log: after each successful cell
    /// once idle (on-success), after every cell before the next one starts (every-cell),
    /// only on `checkpoint` (manual), or never (off).
    #[arg(
        global = true,
        long,
        env = env::CHECKPOINTS,
        default_value = "on-success",
        value_name = "POLICY"
    )]
    pub checkpoints: flowrepl_protocol::CheckpointPolicy,

    /// Variables whose pickle is larger than this many MB are not checkpointed (they are
    /// listed as unsaved).
    #[arg(global = true, long, env = env::CHECKPOINT_MAX_MB, default_value_t = flowrepl_protocol::limits::DEFAULT_CHECKPOINT_MAX_MB,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_max_mb: u64,

    /// Start from the task's automatic checkpoint, if it has one (also FLOWREPL_RESUME=1).
    #[arg(global = true, long, env = env::RESUME, action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub resume: bool,

    /// Restore checkpoints that a sandboxed session of the task wrote, in a kernel without
    /// the sandbox. Unpickling runs code: whatever a sandboxed cell put in its variables then
    /// runs with this kernel's rights, outside the sandbox. Without it, such checkpoints are
    /// listed but not restored (also FLOWREPL_TRUST_SANDBOXED_CHECKPOINTS=1).
    #[arg(global = true, long, env = "FLOWREPL_TRUST_SANDBOXED_CHECKPOINTS", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub trust_sandboxed_checkpoints: bool,

    /// Keep the task's log, checkpoints and lease in object storage, so that the task can
    /// resume on any machine: `s3://bucket/prefix` (configured by the standard AWS_*
    /// variables) or `file:///path` (one machine). Without it, everything stays on this disk
    /// (also FLOWREPL_STORE). See docs/store.md.
    #[arg(global = true, long, env = env::STORE, value_name = "URL")]
    pub store: Option<String>,

    /// With --store: how long the task's lease lasts without a renewal (renewed every third
    /// of it); a kernel that dies holds its task this long (also FLOWREPL_LEASE_S).
    #[arg(global = true, long, env = "FLOWREPL_LEASE_S", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub lease_s: u64,

    /// With --store: the workspace's files kept with each checkpoint, at most this many MB in
    /// all (files over it are skipped and named in `status`); 0 keeps none (also
    /// FLOWREPL_STORE_WORKSPACE_MB). The workspace is the sandbox's --workspace; unsandboxed,
    /// --workspace if given, else the current directory.
    #[arg(
        global = true,
        long,
        env = "FLOWREPL_STORE_WORKSPACE_MB",
        default_value_t = 1024
    )]
    pub store_workspace_mb: u64,

    /// With --store: answer a cell only once its log record is in the store, so that nothing
    /// answered is lost with this machine (each cell waits for an upload; also
    /// FLOWREPL_STORE_SYNC). See docs/store.md.
    #[arg(global = true, long, env = "FLOWREPL_STORE_SYNC",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub store_sync: bool,

    /// The largest file a client may upload or download (upload_file, download_file, serve's
    /// /files/ routes), in bytes (also FLOWREPL_MAX_FILE_BYTES). See docs/files.md.
    #[arg(global = true, long, env = "FLOWREPL_MAX_FILE_BYTES", default_value_t = 4 << 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_file_bytes: u64,

    /// The most a task's workspace may hold after a client's upload, in MB; an upload that
    /// would pass it is refused and nothing is written; 0: no cap (also
    /// FLOWREPL_MAX_WORKSPACE_MB). Files a cell writes are not held to it.
    #[arg(
        global = true,
        long,
        env = "FLOWREPL_MAX_WORKSPACE_MB",
        default_value_t = 10240
    )]
    pub max_workspace_mb: u64,

    /// Whether clients may install packages into a task's package layer (install_packages,
    /// JSON-RPC `install`): on (the default) or off (also FLOWREPL_PACKAGES). See
    /// docs/packages.md.
    #[arg(global = true, long, env = "FLOWREPL_PACKAGES", default_value = "on",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub packages: bool,

    /// The uv that installs packages (also FLOWREPL_UV); default: `uv` on PATH, else pip in
    /// the task's interpreter.
    #[arg(global = true, long, env = "FLOWREPL_UV")]
    pub uv: Option<PathBuf>,

    /// The package index installs use (also FLOWREPL_INDEX_URL); default: the installer's
    /// (PyPI). Callers cannot name another.
    #[arg(global = true, long, env = "FLOWREPL_INDEX_URL")]
    pub index_url: Option<String>,

    /// More package indexes, searched after --index-url (repeatable).
    #[arg(global = true, long)]
    pub extra_index_url: Vec<String>,

    /// A file of the package names (or patterns with `*`) clients may install, one per line;
    /// anything else, dependencies included, is refused (also FLOWREPL_PACKAGES_ALLOW).
    #[arg(global = true, long, env = "FLOWREPL_PACKAGES_ALLOW")]
    pub packages_allow: Option<PathBuf>,

    /// Let installs build packages from source (sdists); their build runs confined by the
    /// sandbox. Without it, wheels only: a build backend is arbitrary code.
    #[arg(global = true, long, env = "FLOWREPL_PACKAGES_BUILD", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub packages_build: bool,

    /// How long one install may take, in seconds; then its processes are killed and the
    /// layer stays as it was (also FLOWREPL_PACKAGES_TIMEOUT_S).
    #[arg(global = true, long, env = "FLOWREPL_PACKAGES_TIMEOUT_S", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub packages_timeout_s: u64,

    /// The root of the wheel caches tasks' installs share, DIR/sandboxed and DIR/unsandboxed
    /// (also FLOWREPL_PACKAGES_CACHE); default: ~/.cache/flowrepl-packages.
    #[arg(global = true, long, env = "FLOWREPL_PACKAGES_CACHE")]
    pub packages_cache: Option<PathBuf>,

    /// `serve`: the global flags and `mcp` settings given on its command line, as flags again,
    /// for the kernels it starts (which also inherit its environment).
    #[arg(skip)]
    pub forwarded: Vec<std::ffi::OsString>,
}

/// The tools of the MCP servers, for `--help`: functions of the kernel crate (which knows
/// them), called only when help is asked.
#[derive(Debug, Clone, Copy)]
pub struct ToolNames {
    /// `flowrepl mcp`'s.
    pub mcp: fn() -> Vec<String>,
    /// `flowrepl serve`'s.
    pub serve: fn() -> Vec<String>,
}

impl Cli {
    /// What `flowrepl log` takes from the global flags.
    pub fn log_globals(&self) -> crate::logcmd::Globals {
        crate::logcmd::Globals {
            log_dir: self.log_dir.clone(),
            python: self.python.clone(),
            worker: self.worker,
            store: self.store.clone(),
        }
    }

    /// Parses `args`; when they ask for help, the `mcp` and `serve` subcommands' lines list
    /// the tools that `tools` names (the servers' own lists, so they cannot fall behind).
    fn parse_with_help(args: &[std::ffi::OsString], tools: &ToolNames) -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let mut cmd = Cli::command();
        if args[1..]
            .iter()
            .any(|a| a == "-h" || a == "--help" || a == "help")
        {
            for (name, list) in [("mcp", tools.mcp), ("serve", tools.serve)] {
                cmd = cmd.mut_subcommand(name, |c| {
                    let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
                    let about = about.trim_end_matches('.').to_owned();
                    c.about(format!("{about} (tools: {})", list().join(", ")))
                });
            }
        }
        let matches = cmd.get_matches_from(args);
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        if let Some(serve) = matches.subcommand_matches("serve") {
            let root = Cli::command();
            let mcp = <McpArgs as clap::Args>::augment_args(clap::Command::new("mcp"));
            let globals = root.get_arguments().filter(|a| a.is_global_set());
            cli.forwarded = given(serve, globals.chain(mcp.get_arguments()));
        }
        cli
    }
}

/// The arguments of `args` given on the command line in `matches`, as `--long=value` (or
/// `--long` for a switch), so that a child parses them the same way.
fn given<'a>(
    matches: &clap::ArgMatches,
    args: impl Iterator<Item = &'a clap::Arg>,
) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    for arg in args {
        let id = arg.get_id().as_str();
        let (Some(long), Some(clap::parser::ValueSource::CommandLine)) =
            (arg.get_long(), matches.value_source(id))
        else {
            continue;
        };
        if !arg.get_action().takes_values() {
            out.push(format!("--{long}").into());
            continue;
        }
        for raw in matches.get_raw(id).into_iter().flatten() {
            let mut flag = std::ffi::OsString::from(format!("--{long}="));
            flag.push(raw);
            out.push(flag);
        }
    }
    out
}

/// Clients whose conventions flowrepl can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compat {
    /// The original system's `json_repl_session.py` clients.
    JsonRepl,
}

impl Cli {
    /// The command line of this process: flowrepl's own flags, or a Python interpreter's
    /// (drop-in mode, see [`crate::dropin`]). Exits 2 with a message when it is neither.
    /// `tools` names the MCP servers' tools for `--help` (asked only then).
    pub fn from_args(tools: &ToolNames) -> Cli {
        let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        for line in renamed_variables() {
            eprintln!("flowrepl: {line}");
        }
        if !crate::dropin::looks_like_python(&args[1..]) {
            for line in renamed_flags(&mut args[1..]) {
                eprintln!("flowrepl: {line}");
            }
            let mut cli = Cli::parse_with_help(&args, tools);
            cli.make_paths_absolute();
            return cli;
        }
        match crate::dropin::parse(&args[1..]) {
            Ok(py) => {
                // flowrepl's own settings still come from the environment.
                let mut cli = Cli::parse_from(&args[..1]);
                cli.dropin = Some(py);
                cli.make_paths_absolute();
                cli
            }
            Err(e) => {
                // Nothing runs yet: stderr is the real one and stdout stays clean.
                eprintln!("flowrepl: {e}");
                std::process::exit(2);
            }
        }
    }
}

impl Cli {
    /// The programs and files the kernel runs or loads, made absolute against the folder it
    /// was started in: a relative `--python .venv` was looked up later from wherever the
    /// kernel ran it (a task's workspace under `serve`, the layer's scratch folder for an
    /// install), folders a cell or a build can write.
    pub fn make_paths_absolute(&mut self) {
        // (A bare name that is no file here, `--uv uv`, stays a name for `PATH`.)
        let abs = |p: &mut PathBuf| {
            if p.is_relative() && (p.components().count() > 1 || p.exists()) {
                if let Ok(a) = std::path::absolute(&*p) {
                    *p = a;
                }
            }
        };
        self.python.iter_mut().for_each(abs);
        self.uv.iter_mut().for_each(abs);
        self.worker_bin.iter_mut().for_each(abs);
        self.startup.iter_mut().for_each(abs);
    }
}

/// Flags renamed (old, new): the old spelling keeps working, with a deprecation line.
pub const RENAMED_FLAGS: &[(&str, &str)] = &[
    ("snapshot", "checkpoints"),
    ("snapshot-max-mb", "checkpoint-max-mb"),
];

/// Environment variables renamed (old, new): the old one keeps working, with a deprecation
/// line.
pub const RENAMED_VARIABLES: &[(&str, &str)] = &[
    ("FLOWREPL_SNAPSHOT", env::CHECKPOINTS),
    ("FLOWREPL_SNAPSHOT_MAX_MB", env::CHECKPOINT_MAX_MB),
];

/// Rewrites the old spellings of [`RENAMED_FLAGS`] in `args` (`--old`, `--old=v`) to the new
/// ones; a deprecation line for each.
pub fn renamed_flags(args: &mut [std::ffi::OsString]) -> Vec<String> {
    let mut said = Vec::new();
    for arg in args.iter_mut() {
        let Some(text) = arg.to_str() else { continue };
        for (old, new) in RENAMED_FLAGS {
            let rest = match text.strip_prefix("--").and_then(|t| t.strip_prefix(old)) {
                Some(rest) if rest.is_empty() || rest.starts_with('=') => rest.to_owned(),
                _ => continue,
            };
            said.push(format!(
                "--{old} is deprecated and will be removed; use --{new}"
            ));
            *arg = format!("--{new}{rest}").into();
            break;
        }
    }
    said
}

/// Moves the old [`RENAMED_VARIABLES`] to their new names (the new one wins when both are
/// set) and removes the old, so that the kernel and every process it starts see only the new
/// names; a deprecation line for each. Called at start, before any thread.
pub fn renamed_variables() -> Vec<String> {
    let mut said = Vec::new();
    for (old, new) in RENAMED_VARIABLES {
        let Some(value) = std::env::var_os(old) else {
            continue;
        };
        if std::env::var_os(new).is_some() {
            said.push(format!("{old} is deprecated and ignored: {new} is set"));
        } else {
            said.push(format!(
                "{old} is deprecated and will be removed; use {new}"
            ));
            std::env::set_var(new, value);
        }
        std::env::remove_var(old);
    }
    said
}

/// Alternative fronts.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Serve the same kernel as an MCP server over stdio.
    Mcp(McpArgs),
    /// Read the task logs: list tasks, show or follow a task's cells, statistics, the task
    /// context, export as a script or notebook. Starts no Python.
    Log(crate::logcmd::LogArgs),
    /// Serve many kernels, one per task, as one MCP server over streamable HTTP, with a
    /// token and sandboxed by default.
    Serve(ServeArgs),
    /// The operator's commands on an object store (--store URL): list its tasks, show one,
    /// release a task whose holder is dead, collect unused blobs. Starts no Python.
    Store(crate::storecmd::StoreArgs),
}

/// Settings of `flowrepl serve` (the kernels it starts get the global flags given with it,
/// and its `mcp` settings).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address and port to listen on. A non-loopback address needs --allow-remote.
    #[arg(long, env = "FLOWREPL_LISTEN", default_value = "127.0.0.1:8765")]
    pub listen: std::net::SocketAddr,

    /// Listen on a non-loopback address (TLS then belongs to a reverse proxy in front).
    #[arg(long)]
    pub allow_remote: bool,

    /// A file holding the bearer token clients must send (default: FLOWREPL_TOKEN, else a
    /// token made at start and written 0600 to `<state-dir>/token`).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Where `serve` keeps its state (the token it made).
    #[arg(
        long,
        env = "FLOWREPL_STATE_DIR",
        default_value = ".flowrepl/serve",
        value_name = "DIR"
    )]
    pub state_dir: PathBuf,

    /// Each task's workspace is `<workspace-root>/<plan>/<task>` (made 0700 on first use).
    #[arg(
        long,
        env = "FLOWREPL_WORKSPACE_ROOT",
        default_value = ".flowrepl/workspaces",
        value_name = "DIR"
    )]
    pub workspace_root: PathBuf,

    /// Each task's own network rules: `<DIR>/<plan>/<task>.net` (safe names as in the log
    /// layout), one rule per line, read at each start of the task's kernel, replaces
    /// `--sandbox-net` for that task (an empty file: no network). A task without a file has
    /// the server's `--sandbox-net`. Keep DIR outside every workspace.
    #[arg(long, env = "FLOWREPL_TASK_NET", value_name = "DIR")]
    pub task_net: Option<PathBuf>,

    /// Kernels running at once; at the limit the least recently used idle one is stopped
    /// (checkpointed first), and with none idle a call on a new task gets an error.
    #[arg(long, env = "FLOWREPL_MAX_KERNELS", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_kernels: u32,

    /// A request's head must arrive whole within this, and a keep-alive connection waiting
    /// for its next request is closed after it (a response being sent is never cut).
    #[arg(long, env = "FLOWREPL_HEADER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub header_timeout: std::time::Duration,

    /// A request's body must arrive within this, else 408.
    #[arg(long, env = "FLOWREPL_BODY_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub body_timeout: std::time::Duration,

    /// Connections open at once (lowered to what the descriptor limit leaves after the
    /// kernels'); past it a new connection is answered 503 and closed.
    #[arg(long, env = "FLOWREPL_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// MCP sessions open at once (each costs about 60 KiB until it ends or expires); at the
    /// limit a new `initialize` is answered 503.
    #[arg(long, env = "FLOWREPL_MAX_SESSIONS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_sessions: u32,

    /// An MCP session ends this long after its last request (its client must `initialize`
    /// again; the tasks' kernels are not affected): seconds, or a number with s, m or h.
    #[arg(long, env = "FLOWREPL_SESSION_EXPIRY", default_value = "5m", value_parser = parse_positive_duration)]
    pub session_expiry: std::time::Duration,

    /// Stop a kernel idle this long (checkpointed first; the next call on its task resumes
    /// it): seconds, or a number with s, m or h; 0 never stops one.
    #[arg(long, env = "FLOWREPL_IDLE_STOP", default_value = "15m", value_parser = parse_duration)]
    pub idle_stop: std::time::Duration,

    /// Do not sandbox the kernels' workers (they are by default: `--sandbox`).
    #[arg(long)]
    pub no_sandbox: bool,

    /// A `Host` name (or `host:port`) clients may use besides loopback names and the listen
    /// address (a reverse proxy's public name). May be given more than once.
    #[arg(long, value_name = "HOST")]
    pub allowed_host: Vec<String>,

    /// A browser origin allowed to call besides loopback ones (`https://app.example.com:443`);
    /// a request with any other `Origin` gets 403. May be given more than once.
    #[arg(long, value_name = "ORIGIN")]
    pub allowed_origin: Vec<String>,

    /// The MCP server's settings, for every kernel.
    #[command(flatten)]
    pub mcp: McpArgs,
}

/// As [`parse_duration`], at least a second.
fn parse_positive_duration(s: &str) -> Result<std::time::Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: must be at least 1 s")),
        d => Ok(d),
    }
}

/// `15m`, `90s`, `2h`, `30` (seconds).
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&s[..i], s[i..].trim()),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected seconds, or a number with s, m or h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{s:?}: the unit must be s, m or h")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

/// Settings of `flowrepl mcp`.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// Characters of output per tool result; beyond it the text keeps the head and the tail,
    /// and says how to read the rest with `read_output`.
    #[arg(long, env = "FLOWREPL_MCP_MAX_CHARS", default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(200..=100_000_000))]
    pub max_chars: u64,

    /// Images (matplotlib figures, `_repr_png_` values) returned per cell; 0 turns figure
    /// collection off.
    #[arg(long, env = "FLOWREPL_MCP_MAX_IMAGES", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub max_images: u32,

    /// Pixels per image: figures are rendered at a lower dpi to fit; larger `_repr_png_`
    /// images are left out.
    #[arg(long, env = "FLOWREPL_MCP_MAX_IMAGE_PIXELS", default_value_t = flowrepl_protocol::limits::DEFAULT_MAX_IMAGE_PIXELS,
          value_parser = clap::value_parser!(u64).range(10_000..=100_000_000))]
    pub max_image_pixels: u64,

    /// Seconds `execute_code` waits for a cell before it answers `running: true` with the
    /// output so far (the cell goes on; `wait_cell` collects it), when the call gives no
    /// `wait_s`: under the 60 s request timeout many clients have.
    #[arg(long, env = "FLOWREPL_MCP_WAIT_S", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub wait_s: u64,

    /// MiB of cut output kept in memory for `read_output` (oldest cells are forgotten first;
    /// everything stays in the JSONL log). For `serve`, the whole server's: each kernel keeps
    /// its share (this divided by `--max-kernels`, at least 1).
    #[arg(long, env = "FLOWREPL_MCP_KEEP_OUTPUT_MB", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub keep_output_mb: u64,
}
