//! `flowrepl-worker`: the keep-alive subprocess of flowrepl's worker mode. Started by the
//! kernel, spoken to in frames on stdin/stdout; see `flowrepl_executor::worker`. It loads the
//! Python library the kernel names (`--python-lib`), as the kernel does in-process, then,
//! with `--sandbox`, confines itself (`flowrepl_sandbox::apply`) before Python starts: the
//! library and libpython are mapped by then, and nothing of Python has run.
//!
//! `flowrepl-worker --confined-exec POLICY -- PROGRAM ARGS...` runs another program under the
//! same confinement instead (`flowrepl_sandbox::exec`): the package installer's builds.
//!
//! It uses nothing of the session or the fronts (only the engine's `linked.rs`, as a source
//! file), so that its link (thin LTO) takes in only the executor's interface and the sandbox.

#[path = "../../../session/src/engine/linked.rs"]
mod linked;

use clap::Parser;
use flowrepl_exec::worker_args::WorkerArgs;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if argv
        .first()
        .is_some_and(|a| a == flowrepl_sandbox::exec::CONFINED_EXEC)
    {
        // Another program, confined (the package installer's builds): see
        // flowrepl_sandbox::exec. Returns only when it could not be run.
        let (code, why) = flowrepl_sandbox::exec::run(&argv[1..]);
        eprintln!("flowrepl-worker: {why}");
        return ExitCode::from(code);
    }
    let mut args = WorkerArgs::parse();
    if let Err(e) = args.take_context() {
        eprintln!("flowrepl-worker: {e}; the session starts from an empty context");
    }
    let python = match &args.python_lib {
        Some(lib) => flowrepl_exec::python::library::load(lib),
        None => linked::linked(),
    };
    let python = match python {
        Ok(p) => p,
        Err(e) => {
            // Fd 2 is still the kernel's capture of this worker's stderr: it reports it.
            eprintln!("flowrepl-worker: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(policy) = &mut args.sandbox {
        // Where the embedded interpreter may find its standard library: beside the libpython
        // it just mapped (the kernel cannot know which one the dynamic linker picked).
        if let Some(prefix) = flowrepl_sandbox::files::libpython_prefix()
            .filter(|p| flowrepl_sandbox::files::too_wide(p).is_none())
        {
            policy.readable.push(prefix);
        }
        match flowrepl_sandbox::apply(policy) {
            Ok(confined) => {
                args.sandboxed = Some(confined.report);
                args.pid = Some(confined.pid);
            }
            Err(refused) => {
                eprintln!("flowrepl: {refused}");
                return ExitCode::from(flowrepl_sandbox::REFUSED_EXIT);
            }
        }
    }
    (python.run_worker)(args)
}
