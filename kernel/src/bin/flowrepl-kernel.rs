//! `flowrepl-kernel`: the kernel for the one Python version this binary embeds. People start
//! `flowrepl`, which picks the kernel built for the interpreter they want
//! ([`flowrepl::launcher`]).

use std::process::ExitCode;

fn main() -> ExitCode {
    flowrepl::run(flowrepl::cli::Cli::from_args(
        flowrepl::mcp::tools::tool_names,
    ))
}
