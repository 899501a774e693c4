//! `flowrepl-worker`: the keep-alive subprocess of flowrepl's worker mode. Started by the
//! kernel, spoken to in frames on stdin/stdout; see `flowrepl_worker::serve`. It loads the
//! Python library the kernel names (`--python-lib`), as the kernel does in-process.

use clap::Parser;
use flowrepl_cli::served::Executor;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = flowrepl_exec::worker_args::WorkerArgs::parse();
    let executor = match &args.python_lib {
        Some(lib) => Executor::Library(lib.clone()),
        None => Executor::Linked,
    };
    match flowrepl::python(&executor) {
        Ok(python) => (python.serve)(args),
        Err(e) => {
            // Fd 2 is still the kernel's capture of this worker's stderr: it reports it.
            eprintln!("flowrepl-worker: {e}");
            ExitCode::from(2)
        }
    }
}
