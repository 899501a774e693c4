//! `flowrepl-kernel`: the kernel for the one Python version this binary embeds. People start
//! `flowrepl`, which picks the kernel built for the interpreter they want
//! (`flowrepl_cli::launcher`).

use std::process::ExitCode;

fn main() -> ExitCode {
    flowrepl::run(flowrepl_cli::args::Cli::from_args(
        flowrepl::BUILD.mcp_tools,
    ))
}
