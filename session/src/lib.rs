//! The kernel's engine and session, a library under every front: where cells run (in-process
//! or a worker subprocess), the session that dispatches calls to them, and the task log they
//! write.
//!
//! # Layout
//! - [`approvals`]: the cells' requests for approval, routed to the front's way of asking.
//! - [`config`]: flags + environment → [`config::Config`] (identity, log path, limits, python).
//! - [`engine`]: where cells run, behind one interface: in-process or a worker subprocess
//!   (its lifecycle, the stop ladder, crash recovery).
//! - [`events`]: a cell's events (`flow`, `MCP::` lines) in order.
//! - [`session`]: engine + task log + counters, and the one dispatcher every front uses.
//! - [`records`]: the task-log record writer thread.
//! - [`ledger`]: what each cell changed, so that restores name what they could not bring back.
//! - [`stored`]: `--store`: the task taken from the object store before the kernel starts,
//!   uploaded while it runs, let go when it stops.
//! - [`terminate`]: SIGTERM/SIGHUP write every record before the kernel ends.
//!
//! Dependencies point one way: fronts (`flowrepl-jsonrpc`, `flowrepl-mcp`, and
//! `flowrepl-serve` over MCP) → session → engine. Nothing here knows about a front's wire.
//! The kernel links no Python: the engine loads the executor of the session's Python version
//! from that version's library ([`engine::python`]).
#![warn(missing_docs)]

pub mod approvals;
pub mod config;
pub mod engine;
pub mod events;
pub mod ledger;
pub mod packages;
pub mod records;
pub mod session;
pub mod stored;
pub mod terminate;
