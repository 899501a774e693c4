//! The command line of flowrepl, without Python: everything the `flowrepl` launcher runs
//! before (or instead of) a kernel, built once for every Python version.
//!
//! # Layout
//! - [`args`]: flags and their environment variables ([`args::Cli`]), shared with the kernel.
//! - [`dropin`]: a Python interpreter's command line (`python [flags] SCRIPT`), as the
//!   original system's clients start it.
//! - [`launcher`]: `flowrepl` picks the interpreter and `exec`s the kernel built for its
//!   version.
//! - [`logcmd`]: `flowrepl log`: the task logs for people, and as JSON.
//!
//! Nothing here links pyo3: the kernel package's binaries pass in what the build knows about
//! Python ([`launcher::Build`]).
#![warn(missing_docs)]

pub mod args;
pub mod dropin;
pub mod launcher;
pub mod logcmd;
