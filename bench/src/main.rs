//! flowrepl's benchmark: every figure next to its anchors, measured in one run on this
//! machine, with the ratio each issue sets as a target. Run it with `bench/run`.
//!
//! # Layout
//! - [`peer`]: processes spoken to in lines over pipes.
//! - [`stats`]: samples, medians, targets.
//! - [`echo`]: the raw pipe peer (`flowrepl-bench echo`).
//! - [`kernel`]: the JSON-RPC kernel in-process against the raw pipe and a plain Python REPL.
//! - [`worker`]: worker mode.
//! - [`flow`]: the cost of `flow.event` inside a cell.
//! - [`logging`]: the task log's and the checkpoints' cost per cell.
//! - [`versions`]: every Python version the build serves.
//! - [`ab`]: an interleaved A/B against another kernel build (`--baseline`).
//! - [`sandbox`]: a worker with and without `--sandbox` (`--sandbox`).
//! - [`store`]: a task kept in object storage against on local disk only (`--store`).
//! - [`http`]: a lean MCP client of `flowrepl serve` and of stdio `flowrepl mcp`
//!   (`mcp-calls`, for `bench/mcp/serve_bench.py`).

mod ab;
mod echo;
mod flow;
mod http;
mod kernel;
mod logging;
mod peer;
mod sandbox;
mod stats;
mod store;
mod versions;
mod worker;

use clap::Parser;
use std::path::PathBuf;

/// Benchmarks flowrepl against its anchors (raw pipe, plain Python REPL, bare python) and
/// prints the ratios.
#[derive(Debug, Parser)]
#[command(name = "flowrepl-bench", version)]
pub struct Args {
    /// The peer mode used as the raw-pipe anchor (started by the bench itself).
    #[command(subcommand)]
    command: Option<Sub>,
    /// The kernel to measure.
    #[arg(long, default_value = "target/release/flowrepl")]
    pub kernel: PathBuf,
    /// Where `plain_repl.py` and `diff_cycle.py` are.
    #[arg(long, default_value = "bench")]
    pub bench_dir: PathBuf,
    /// Fewer samples (a quick look, not figures to quote).
    #[arg(long)]
    pub quick: bool,
    /// Instead of the anchors: an interleaved A/B of `--kernel` against this older build.
    #[arg(long, value_name = "KERNEL")]
    pub baseline: Option<PathBuf>,
    /// Only the table of every Python version the build serves.
    #[arg(long)]
    pub versions: bool,
    /// Only the task log's cost per cell.
    #[arg(long)]
    pub logging: bool,
    /// Only the automatic checkpoints' cost per cell.
    #[arg(long)]
    pub checkpoints: bool,
    /// Only the sandbox's cost (a worker with and without `--sandbox`).
    #[arg(long)]
    pub sandbox: bool,
    /// Only `--store`'s cost per cell (a task kept in moto's S3 server against not).
    #[arg(long)]
    pub store: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Echo lines (the raw pipe anchor).
    #[command(hide = true)]
    Echo,
    /// `x = 1` calls from lean MCP clients (HTTP or stdio); prints JSON.
    McpCalls(http::CallsArgs),
}

impl Args {
    /// Round trips of `x = 1`, of the 1 MB print, and cold starts.
    pub fn counts(&self) -> (usize, usize, usize) {
        if self.quick {
            (1000, 20, 5)
        } else {
            (5000, 100, 15)
        }
    }
}

fn main() {
    let args = Args::parse();
    match &args.command {
        Some(Sub::Echo) => return echo::run(),
        Some(Sub::McpCalls(calls)) => {
            if let Err(e) = http::run(calls) {
                eprintln!("flowrepl-bench mcp-calls: {e}");
                std::process::exit(1);
            }
            return;
        }
        None => {}
    }
    let logs = std::env::temp_dir().join(format!("flowrepl-bench-{}", std::process::id()));
    match &args.baseline {
        Some(old) => ab::run(&args, old, &logs),
        None if args.versions => versions::run(&args, &logs),
        None if args.logging => logging::run(&args, &logs),
        None if args.checkpoints => logging::checkpoints(&args, &logs),
        None if args.sandbox => sandbox::run(&args, &logs),
        None if args.store => store::run(&args, &logs),
        None => {
            let python = peer::real_python();
            let anchors = kernel::run(&args, &python, &logs);
            worker::run(&args, &python, &logs, &anchors);
            flow::run(&args, &logs);
            logging::run(&args, &logs);
            logging::checkpoints(&args, &logs);
            versions::run(&args, &logs);
            sandbox::run(&args, &logs);
            store::run(&args, &logs);
        }
    }
    let _ = std::fs::remove_dir_all(&logs);
}
