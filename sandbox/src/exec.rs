//! A program other than the worker run confined (`flowrepl-worker --confined-exec POLICY --
//! PROGRAM ARGS...`): the same layers as a worker's, applied by the worker binary while it is
//! single-threaded, then `exec`. The package installer's builds run so (`--packages-build`):
//! a build backend is arbitrary code.

use flowrepl_protocol::sandbox::SandboxPolicy;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;

/// The worker binary's first argument that asks for this.
pub const CONFINED_EXEC: &str = "--confined-exec";

/// The arguments of the worker binary that run `program args...` confined by `policy`.
pub fn args(policy: &SandboxPolicy, program: &std::path::Path, args: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        CONFINED_EXEC.into(),
        serde_json::to_string(policy)
            .expect("a policy serializes")
            .into(),
        "--".into(),
        program.into(),
    ];
    out.extend(args.iter().cloned());
    out
}

/// Runs what [`args`] says (the arguments after [`CONFINED_EXEC`]): returns only when it
/// could not, with the exit code to end with and why.
pub fn run(args: &[OsString]) -> (u8, String) {
    let usage = (
        2,
        format!("usage: flowrepl-worker {CONFINED_EXEC} POLICY -- PROGRAM [ARGS...]"),
    );
    let [policy, dash, program, rest @ ..] = args else {
        return usage;
    };
    if dash != "--" {
        return usage;
    }
    let policy: SandboxPolicy = match policy.to_str().map(serde_json::from_str) {
        Some(Ok(p)) => p,
        _ => return (2, "the sandbox policy is not JSON".into()),
    };
    if let Err(refused) = crate::apply(&policy) {
        return (crate::REFUSED_EXIT, format!("flowrepl: {refused}"));
    }
    let err = std::process::Command::new(program).args(rest).exec();
    (
        127,
        format!("cannot run {}: {err}", program.to_string_lossy()),
    )
}
