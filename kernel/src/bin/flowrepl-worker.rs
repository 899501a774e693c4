//! `flowrepl-worker`: the keep-alive subprocess of flowrepl's worker mode. Started by the
//! kernel, spoken to in frames on stdin/stdout; see `flowrepl_worker::serve`. It loads the
//! Python library the kernel names (`--python-lib`), as the kernel does in-process.
//!
//! It uses nothing of the kernel crate, so that its link (thin LTO) takes in only the
//! executor's interface, not the kernel's fronts.

use clap::Parser;
use flowrepl_exec::python::library::LoadError;
use flowrepl_exec::python::PythonBuild;
use flowrepl_exec::worker_args::WorkerArgs;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = WorkerArgs::parse();
    let python = match &args.python_lib {
        Some(lib) => flowrepl_exec::python::library::load(lib),
        None => linked(),
    };
    match python {
        Ok(python) => (python.serve)(args),
        Err(e) => {
            // Fd 2 is still the kernel's capture of this worker's stderr: it reports it.
            eprintln!("flowrepl-worker: {e}");
            ExitCode::from(2)
        }
    }
}

/// The executor linked into this binary (`static-python`), if any.
fn linked() -> Result<&'static PythonBuild, LoadError> {
    #[cfg(feature = "static-python")]
    return Ok(&flowrepl_worker::PYTHON);
    #[cfg(not(feature = "static-python"))]
    Err(LoadError::NoneNamed)
}
