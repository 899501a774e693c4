//! A task's state in object storage (`--store URL`): one holder per task enforced by the
//! store, the task log as segments, the checkpoints as blobs and manifests, and the way back
//! onto any machine's disk.
//!
//! - [`objects`]: the store (`s3://` or `file://`) and its four operations.
//! - [`head`]: the layout of a task's objects and its head, which names its holder and state.
//! - [`lease`]: taking, renewing, committing through and releasing the head.
//! - [`state`]: the checkpoint folder as a manifest of blobs (small segments carried inline).
//! - [`workspace`]: the workspace's files by hash, taken without following links and written
//!   back beneath the workspace.
//! - [`fetch`]: the log and checkpoints brought onto this disk before a kernel starts.
//! - [`local`]: what this disk last put in the store, so that its newer files are kept.
//! - [`mirror`]: the uploader thread, off the request path.
//! - [`gc`]: collection of the blobs and manifests no state needs any more.
//! - [`admin`]: the operator's commands (`flowrepl store ls|show|release|gc`).
//!
//! `docs/store.md` is the user's side: the layout, the lease, what a machine's death loses.
#![warn(missing_docs)]

pub mod admin;
pub mod fetch;
pub mod gc;
pub mod head;
pub mod lease;
pub mod local;
pub mod mirror;
pub mod objects;
pub mod state;
pub mod workspace;

pub use objects::{Store, StoreError};

/// A current-thread runtime for the crate's unit tests.
#[cfg(test)]
pub(crate) fn test_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
