//! The `flowrepl` kernel: a persistent Python session behind JSON-RPC 2.0 on stdio, MCP on
//! stdio (`flowrepl mcp`), or many of them behind MCP over HTTP (`flowrepl serve`).
//!
//! This crate is the binaries and the start-up order; everything else is a library:
//! - `flowrepl-session`: the engine (where cells run) and the session every front uses.
//! - `flowrepl-jsonrpc`: the JSON-RPC front (request loop, busy-time watcher, reply writer).
//! - `flowrepl-mcp`: the MCP front (`flowrepl mcp`) and the tools `serve` relays.
//! - `flowrepl-serve`: many kernels, one per task, as one MCP server over HTTP.
//!
//! The flags, the choice of Python and `flowrepl log` are in `flowrepl-cli` (no Python);
//! [`BUILD`] is what they need to know about this build.
//!
//! # Start-up order
//! The real stdio is moved out of reach first (so nothing, not even a panic message, can write
//! to the protocol channel), then logging, configuration, Python, the log, and the `ready`
//! notification. See `docs/protocol.md` for the wire format.
#![warn(missing_docs)]

use flowrepl_cli::args::{Cli, Command};
use flowrepl_cli::choice::Build;
use flowrepl_cli::logcmd;
use flowrepl_jsonrpc as jsonrpc;
use flowrepl_session::{approvals, config, engine, session, stored, terminate};
use std::process::ExitCode;

/// What this build knows about Python, for choosing the executor and for the flags: the
/// interpreter it was built with, whether that version's executor is linked in, where the
/// Python libraries of the versions are (`kernel/build.rs`), the MCP tools.
pub const BUILD: Build = Build {
    python: env!("FLOWREPL_BUILD_PYTHON"),
    python_version: env!("FLOWREPL_BUILD_PYTHON_VERSION"),
    linked: cfg!(feature = "static-python"),
    versions_dir: option_env!("FLOWREPL_VERSIONS_DIR"),
    profile: option_env!("FLOWREPL_VERSIONS_PROFILE"),
    tools: flowrepl_cli::args::ToolNames {
        mcp: flowrepl_mcp::tools::tool_names,
        serve: flowrepl_serve::handler::tool_names,
    },
};

/// The exit code of a kernel whose task another kernel holds in the store (`--store`), and
/// keeps renewing: EX_TEMPFAIL, try again later.
pub const EXIT_HELD: u8 = flowrepl_session::stored::EXIT_HELD;

/// Runs the kernel until `shutdown` or EOF. Exit codes: 0 after shutdown/EOF, 1 when Python
/// or the protocol channel fails, 2 for a configuration error (a store that cannot be used
/// among them), [`EXIT_HELD`] when another kernel holds the task.
pub fn run(cli: Cli) -> ExitCode {
    // Before any thread starts: a parent that ignores or blocks SIGINT must not take away
    // the interrupts and timeouts of in-process cells, nor SIGTERM's records.
    flowrepl_os::reset_inherited_signals();
    if let Some(Command::Log(args)) = &cli.command {
        return logcmd::run(&cli.log_globals(), args);
    }
    if let Some(Command::Store(args)) = &cli.command {
        return flowrepl_cli::storecmd::run(cli.store.as_deref(), args);
    }
    if let Some(Command::Serve(args)) = &cli.command {
        return flowrepl_serve::run(&cli, args);
    }
    // Before stdio is taken: an interpreter this build cannot serve is one plain line.
    let choice = match flowrepl_cli::choice::choose(&cli, &BUILD) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("flowrepl: {e}");
            return ExitCode::from(2);
        }
    };
    let stdio = match flowrepl_exec::stdio::take_protocol_stdio() {
        Ok(s) => s,
        Err(e) => {
            // Nothing is redirected yet, so stderr is still the real one.
            eprintln!("flowrepl: cannot set up stdio: {e}");
            return ExitCode::from(1);
        }
    };
    let diagnostics = match stdio.diagnostics.try_clone() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("flowrepl: cannot set up stdio: {e}");
            return ExitCode::from(1);
        }
    };
    flowrepl_os::logging::init(stdio.diagnostics);
    let mut config = match config::Config::resolve(&cli, choice) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    // With --store: the task taken and its state brought here before anything reads it.
    let attached = match stored::attach(&config) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("{}", flowrepl_os::chain(&e));
            return ExitCode::from(if e.is_held() { EXIT_HELD } else { 2 });
        }
    };
    if attached.is_some() {
        config.read_task_files();
    }
    for (k, v) in &config.python_env {
        // Drop-in interpreter flags, read by Python when it starts (here or in the worker).
        // Set before Python or the worker starts, while no other thread reads the environment.
        std::env::set_var(k, v);
    }
    if config.mcp.is_some() && std::env::var_os("MPLBACKEND").is_none() {
        // Figures are rendered to PNG, never shown in a window. Set before Python or the
        // worker starts, while this process has no other thread that reads the environment.
        std::env::set_var("MPLBACKEND", "Agg");
    }
    // Before the engine: a restore may unpickle objects of the layer's packages.
    let packages = flowrepl_session::packages::prepare(&config);
    let approvals = approvals::Approvals::new();
    if config.json_repl_client {
        approvals.set_unavailable(
            "drop-in mode: the original REPL's clients have no way to answer an approval",
        );
    }
    let engine = match engine::start(&config, diagnostics, std::sync::Arc::clone(&approvals)) {
        Ok(e) => e,
        Err(e) => {
            if let Some(a) = attached {
                a.release();
            }
            if let engine::StartError::Worker(engine::worker::WorkerError::SandboxRefused) = e {
                // The worker's one line on stderr says which layer is missing.
                return ExitCode::from(2);
            }
            tracing::error!(error = %flowrepl_os::chain(&e), "cannot start Python");
            return ExitCode::from(1);
        }
    };
    let store = match attached.map(|a| a.start(&config)).transpose() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the store's uploader");
            return ExitCode::from(1);
        }
    };
    let uploader = store.clone();
    let mut session = match session::Session::new(engine, &config, approvals, store, packages) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the record writer");
            // A failed start releases the task it took (after uploading what is there).
            if let Some(m) = uploader {
                m.finish();
            }
            return ExitCode::from(1);
        }
    };
    if let Err(e) = terminate::install(session.board(), config.kill_grace) {
        tracing::warn!(error = %e, "SIGTERM handling not installed: a kill may lose queued records");
    }
    if config.mcp.is_some() {
        return run_mcp(&mut session, &config, stdio.input, stdio.output);
    }
    tracing::info!(
        log_file = %config.log_file.display(),
        python = %config.python.display(),
        session_id = %config.identity.session_id,
        "flowrepl ready"
    );
    let front = std::sync::Arc::new(jsonrpc::front::Front::new(
        stdio.input,
        stdio.output,
        config.max_request_bytes,
        session.board(),
        config.kill_grace,
        std::sync::Arc::clone(session.approvals()),
        config.json_repl_client,
    ));
    if !config.json_repl_client {
        front.ask_client();
    }
    match jsonrpc::run(&mut session, &front, config.json_repl_client) {
        Ok(ended) => {
            let reason = match ended {
                jsonrpc::Ended::Shutdown => "shutdown",
                jsonrpc::Ended::Eof => "eof",
            };
            let records = session.finish(reason);
            tracing::info!(?ended, records, "flowrepl exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "protocol channel failed");
            session.finish("error");
            ExitCode::from(1)
        }
    }
}

/// `flowrepl mcp` after start-up.
fn run_mcp(
    session: &mut session::Session,
    config: &config::Config,
    input: std::fs::File,
    output: std::fs::File,
) -> ExitCode {
    tracing::info!(
        log_file = %config.log_file.display(),
        python = %config.python.display(),
        session_id = %config.identity.session_id,
        "flowrepl MCP server ready"
    );
    let served = flowrepl_mcp::run(session, config, input, output);
    let records = session.finish(if served.is_ok() { "eof" } else { "error" });
    match served {
        Ok(()) => {
            tracing::info!(records, "flowrepl exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "MCP server failed");
            ExitCode::from(1)
        }
    }
}
