use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    flowrepl::run(flowrepl::cli::Cli::parse())
}
