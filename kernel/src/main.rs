//! `flowrepl`: the kernel. It picks the Python the user means, loads the executor built for
//! that version (`flowrepl_cli::choice`) and serves the session.

use std::process::ExitCode;

fn main() -> ExitCode {
    flowrepl::run(flowrepl_cli::args::Cli::from_args(&flowrepl::BUILD.tools))
}
