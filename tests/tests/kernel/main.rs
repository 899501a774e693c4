//! Integration tests: the real `flowrepl` binary over pipes, against real CPython.
//! Each module covers one part of the core kernel issue.

mod approvals;
mod checkpoints;
mod docs;
mod dropin;
mod egress;
mod exit;
mod faults;
mod files;
mod flow;
mod interrupt;
mod isolation;
mod limits;
mod log_cli;
mod mcp;
mod packages;
mod protocol;
mod python_env;
mod results;
mod sandbox;
mod sandbox_paths;
mod serve;
mod store;
mod support_code;
mod task_log;
mod timeouts;
mod truth;
mod versions;
mod worker;
