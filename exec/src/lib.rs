//! The half of flowrepl's executor that needs no Python, shared by the executor (the executor
//! crate, pyo3) and the kernel (which reads a worker's capture files itself).
//!
//! # Layout
//! - [`stdio`]: moves the real stdin/stdout/stderr out of user code's reach.
//! - [`capture`]: fds 1 and 2 captured into memfds: no pipe, no thread, no copy per cell.
//! - [`cell`]: finds a cell's final expression by scanning text, without an AST.
//! - [`monitor`]: the one helper thread: timeouts (SIGINT to the executing thread) and the
//!   output limit.
//! - [`python`]: the seam to the Python executor: a build's table and the executor's trait.
//! - [`sink`]: worker mode: output streamed in chunks while a cell runs.
//! - [`tail`]: the last line of a running cell's output, for progress reports.
//! - [`usage`]: CPU time and peak RSS per cell.
//! - [`worker_args`]: the `flowrepl-worker` command line, which the kernel writes and the
//!   worker reads.
//! - [`setup`]: the executor's interface in types: its config, a cell's outcome, its errors,
//!   the approver it asks through.
#![warn(missing_docs)]

pub mod capture;
pub mod cell;
pub mod monitor;
pub mod python;
pub mod setup;
pub mod sink;
pub mod stdio;
pub mod tail;
pub mod usage;
pub mod worker_args;
