//! `flowrepl-worker`: the keep-alive subprocess of flowrepl's worker mode. Started by the
//! kernel, spoken to in frames on stdin/stdout; see `flowrepl_worker::serve`.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    (flowrepl::PYTHON.serve)(flowrepl_exec::worker_args::WorkerArgs::parse())
}
