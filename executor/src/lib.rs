//! The Python executor of flowrepl (embedded CPython), run in the kernel's process or in a
//! `flowrepl-worker` subprocess, and that process's loop.
//!
//! Names: the **executor** is this crate, wherever it runs; a **worker** is only the
//! subprocess (the `flowrepl-worker` binary, its loop in [`worker`], and the kernel's engine
//! that drives it).
//!
//! # Layout
//! What needs no Python (capture files, the monitor, sinks, cell splitting, usage, stdio) is
//! in `flowrepl-exec`; here:
//! - [`support`]: the executor's Python support code, compiled once and cached.
//! - [`interpreter`]: starts embedded CPython with the right stdlib and venv.
//! - [`key_diff`]: diffs namespace and `sys.modules` keys with one ordered walk (what a cell
//!   added and removed, against its snapshot of the last cell).
//! - [`checkpoint`]: checkpoints of the namespace (when, and the bridge to the Python package
//!   in its folder).
//! - [`approval`]: `flow.request_approval`: asking a person while the cell waits.
//! - [`events`]: `flow`: events cells report, timestamped and placed in their output.
//! - [`python`]: [`PYTHON`], this build as the kernel reaches it (the only way it does).
//! - [`executor`]: [`Executor`], which ties these together for one cell at a time.
//! - [`worker`]: the `flowrepl-worker` process: frames in, cells run, frames out (its command
//!   line is `flowrepl_exec::worker_args`; `channel.rs`: the pipe to the kernel, and approvals
//!   over it).
//!
//! # Threads
//! The thread that calls [`Executor::start`] becomes Python's main thread and must run every
//! cell (signal handlers run there). Two other threads are started here: the monitor
//! (`flowrepl-monitor`: timeouts, the output limit) and, when checkpoints are on, the
//! checkpoint writer (`flowrepl-checkpoint`: automatic checkpoints between cells, under the
//! GIL).
#![warn(missing_docs)]

pub mod approval;
pub mod checkpoint;
pub mod events;
pub mod executor;
pub mod flow;
pub mod interpreter;
pub mod key_diff;
pub mod python;
pub mod support;
pub mod worker;

pub use executor::Executor;
pub use python::PYTHON;
