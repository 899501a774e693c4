//! The command line of flowrepl, without Python: what `flowrepl` decides before (or instead
//! of) a session, built once for every Python version.
//!
//! # Layout
//! - [`args`]: flags and their environment variables ([`args::Cli`]), shared with the kernel.
//! - [`env`](mod@env): the environment variables other code sets or reads, each named once.
//! - [`dropin`]: a Python interpreter's command line (`python [flags] SCRIPT`), as the
//!   original system's clients start it.
//! - [`choice`]: which Python versions this build serves, and the interpreter the user means.
//! - [`logcmd`]: `flowrepl log`: the task logs for people, and as JSON.
//! - [`storecmd`]: `flowrepl store`: the operator's commands on an object store.
//!
//! Nothing here links pyo3: the kernel package passes in what the build knows about Python
//! ([`choice::Build`]).
#![warn(missing_docs)]

pub mod args;
pub mod choice;
pub mod dropin;
pub mod env;
pub mod logcmd;
pub mod storecmd;
