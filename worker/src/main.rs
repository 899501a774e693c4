//! `flowrepl-worker`: the keep-alive subprocess of flowrepl's worker mode. Started by the
//! kernel, spoken to in frames on stdin/stdout; see [`flowrepl_worker::serve`].

use std::process::ExitCode;

fn main() -> ExitCode {
    match flowrepl_worker::serve::WorkerArgs::parse(std::env::args_os().skip(1)) {
        Ok(args) => flowrepl_worker::serve::run(args),
        Err(e) => {
            eprintln!("flowrepl-worker: {e} (this program is started by `flowrepl --worker`)");
            ExitCode::from(2)
        }
    }
}
