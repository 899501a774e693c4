use std::process::ExitCode;

fn main() -> ExitCode {
    flowrepl::run(flowrepl::cli::Cli::from_args())
}
