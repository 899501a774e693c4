//! `flowrepl`: finds the Python the user means and starts the kernel built for its version
//! (`flowrepl_cli::launcher`).

use std::process::ExitCode;

fn main() -> ExitCode {
    flowrepl_cli::launcher::main(&flowrepl::BUILD)
}
