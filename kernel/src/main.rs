//! `flowrepl`: finds the Python the user means and starts the kernel built for its version
//! ([`flowrepl::launcher`]).

use std::process::ExitCode;

fn main() -> ExitCode {
    flowrepl::launcher::main(flowrepl::mcp::tools::tool_names)
}
