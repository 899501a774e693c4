//! The `flowrepl` kernel: a persistent Python session behind JSON-RPC 2.0 on stdio.
//!
//! # Layout
//! - [`cli`]: flags and their environment variables.
//! - [`config`]: flags + environment → [`config::Config`] (identity, log path, limits, python).
//! - [`line_reader`]: bounded request lines.
//! - [`server`]: the request loop and reply writer.
//! - [`front`]: stdin and stdout shared with the busy-time watcher (`status`, `interrupt`).
//! - [`records`]: the task-log record writer thread.
//! - [`session`]: engine (in-process executor or worker) + task log + counters; turns a
//!   cell's outcome into a result and a record.
//! - [`worker_client`]: worker mode: frames, output, the stop ladder, crash recovery.
//! - [`worker_proc`]: spawning, guarding, killing and reaping the worker process.
//!
//! # Start-up order
//! The real stdio is moved out of reach first (so nothing, not even a panic message, can write
//! to the protocol channel), then logging, configuration, Python, the log, and the `ready`
//! notification. See `docs/protocol.md` for the wire format.
#![warn(missing_docs)]

pub mod cli;
pub mod config;
pub mod front;
pub mod line_reader;
pub mod mcp;
pub mod records;
pub mod server;
pub mod session;
pub mod worker_client;
pub mod worker_proc;

use std::process::ExitCode;

/// Runs the kernel until `shutdown` or EOF. Exit codes: 0 after shutdown/EOF, 1 when Python
/// or the protocol channel fails, 2 for a configuration error.
pub fn run(cli: cli::Cli) -> ExitCode {
    let stdio = match flowrepl_worker::stdio::take_protocol_stdio() {
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
    flowrepl_worker::logging::init(stdio.diagnostics);
    let config = match config::Config::resolve(&cli) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    if config.mcp.is_some() && std::env::var_os("MPLBACKEND").is_none() {
        // Figures are rendered to PNG, never shown in a window. Set before Python or the
        // worker starts, while this process has no other thread that reads the environment.
        std::env::set_var("MPLBACKEND", "Agg");
    }
    let engine = match start_engine(&config, diagnostics) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "cannot start Python");
            return ExitCode::from(1);
        }
    };
    let mut session = match session::Session::new(engine, &config) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the record writer");
            return ExitCode::from(1);
        }
    };
    if config.mcp.is_some() {
        return run_mcp(&mut session, &config, stdio.input, stdio.output);
    }
    tracing::info!(
        log_file = %config.log_file.display(),
        python = %config.python.display(),
        session_id = %config.identity.session_id,
        "flowrepl ready"
    );
    let front = std::sync::Arc::new(front::Front::new(
        stdio.input,
        stdio.output,
        config.max_request_bytes,
        session.status_template(),
        session.control(),
        session.flusher(),
        config.kill_grace,
    ));
    match server::serve(&mut session, &front) {
        Ok(ended) => {
            let records = session.finish();
            tracing::info!(?ended, records, "flowrepl exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "protocol channel failed");
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
    match mcp::serve(session, config, input, output) {
        Ok(()) => {
            let records = session.finish();
            tracing::info!(records, "flowrepl exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "MCP server failed");
            ExitCode::from(1)
        }
    }
}

/// Starts embedded Python, or the worker (waiting until it is ready).
fn start_engine(
    config: &config::Config,
    diagnostics: std::fs::File,
) -> Result<session::Engine, Box<dyn std::error::Error>> {
    match &config.worker {
        None => {
            // Fds 1 and 2 become the cells' capture files.
            let executor = flowrepl_worker::Executor::start(&flowrepl_worker::ExecutorConfig {
                python: config.python.clone(),
                max_output_bytes: config.max_output_bytes,
                sink: None,
                images: config.image_limits(),
            })?;
            Ok(session::Engine::InProcess(executor))
        }
        Some(w) => {
            // No Python here: fds 1 and 2 go nowhere, so a stray write cannot reach stdout.
            let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
            for fd in [1, 2] {
                flowrepl_worker::stdio::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd)?;
            }
            let client = worker_client::WorkerClient::start(
                worker_proc::SpawnConfig {
                    exe: w.exe.clone(),
                    python: config.python.clone(),
                    max_output_bytes: config.max_output_bytes,
                    limits: w.limits,
                    images: config.image_limits(),
                },
                diagnostics,
                config.kill_grace,
            )?;
            Ok(session::Engine::Worker(client))
        }
    }
}
