//! What this disk last put in the store for a task: `<log_dir>/<plan>/<task>.store`, written
//! by the uploader after each commit that changed the task's state or log. A kernel that
//! takes the task on the same disk again (after a crash of its own, or `serve` restarting a
//! kernel that died) finds that the store's newest state is the one this disk wrote, so its
//! local files are at least as new: it keeps them (and uploads what the store is missing)
//! instead of replacing them with the store's older copies. On another disk, or when another
//! holder wrote since, the store's copy wins.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The marker of the task whose log is `log_file`.
pub fn marker_path(log_file: &Path) -> PathBuf {
    log_file.with_extension("store")
}

/// The marker's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The holder's epoch when it was written.
    pub epoch: u64,
    /// The head's `state` after the commit.
    pub state: Option<String>,
    /// The head's log bytes after the commit.
    pub log_bytes: u64,
}

impl Marker {
    /// The marker beside `log_file`, if there is a readable one.
    pub fn read(log_file: &Path) -> Option<Marker> {
        let bytes = std::fs::read(marker_path(log_file)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes it beside `log_file` (a temporary file renamed over the old one); best effort:
    /// without it, the next kernel on this disk fetches the store's copy.
    pub fn write(&self, log_file: &Path) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = marker_path(log_file);
        let tmp = path.with_extension(format!("store.{}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&serde_json::to_vec(self).expect("serializes")))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(error = %e, "the store marker was not written");
        }
    }
}
