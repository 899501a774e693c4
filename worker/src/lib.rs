//! The Python executor of flowrepl, and the `flowrepl-worker` binary around it.
//!
//! # Layout
//! - [`support`]: the executor's Python support code, compiled once and cached.
//! - [`stdio`]: moves the real stdin/stdout/stderr out of user code's reach.
//! - [`capture`]: fds 1 and 2 captured into memfds: no pipe, no thread, no copy per cell.
//! - [`interpreter`]: starts embedded CPython with the right stdlib and venv.
//! - [`cell`]: finds a cell's final expression by scanning text, without an AST.
//! - [`key_diff`]: diffs namespace and `sys.modules` keys with one ordered walk (what a cell
//!   added and removed; "snapshot" names only checkpoints).
//! - [`checkpoint`]: checkpoints of the namespace (when, and the bridge to `snapshot.py`).
//! - [`monitor`]: the one helper thread: timeouts (SIGINT to the executing thread) and the
//!   output limit.
//! - [`sink`]: worker mode: output streamed in chunks while a cell runs.
//! - [`usage`]: CPU time and peak RSS per cell.
//! - `sys`: the OS and sync helpers of `flowrepl-os` (signal masks, poll, locks), shared with
//!   the kernel.
//! - [`approval`]: `flow.request_approval`: asking a person while the cell waits.
//! - [`events`]: `flow`: events cells report, timestamped and placed in their output.
//! - [`executor`]: [`Executor`], which ties these together for one cell at a time.
//! - [`serve`]: the `flowrepl-worker` process: frames in, cells run, frames out (`args.rs`:
//!   its command line; `channel.rs`: the pipe to the kernel, and approvals over it).
//!
//! # Threads
//! The thread that calls [`Executor::start`] becomes Python's main thread and must run every
//! cell (signal handlers run there). Two other threads are started here: the monitor
//! (`flowrepl-monitor`: timeouts, the output limit) and, when checkpoints are on, the
//! checkpoint writer (`flowrepl-checkpoint`: automatic checkpoints between cells, under the
//! GIL).
#![warn(missing_docs)]

pub mod approval;
pub mod capture;
pub mod cell;
pub mod checkpoint;
pub mod events;
pub mod executor;
pub mod flow;
pub mod interpreter;
pub mod key_diff;
pub mod monitor;
pub mod serve;
pub mod sink;
pub mod stdio;
pub mod support;
pub mod tail;
pub mod usage;

pub use checkpoint::{CheckpointError, SnapshotConfig};
pub use executor::{CellOutcome, Executor, ExecutorConfig, ExecutorError, SessionSetup};
pub use interpreter::InitError;
pub use monitor::Interrupter;
pub use support::CallError;
pub use tail::OutputTail;

/// The OS helpers, under the name the worker's modules use.
pub(crate) use flowrepl_os as sys;
