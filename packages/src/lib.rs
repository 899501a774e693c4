//! A task's package layer: what `install_packages` (JSON-RPC `install`) does.
//!
//! - [`policy`]: the operator's settings and the checks of a caller's requirements (names
//!   with specifiers only; the allow list).
//! - [`layer`]: the layer's folder, its generations and the `current` link cells import from.
//! - [`install`]: resolving (the shared cache first, the index only when it cannot answer;
//!   the venv's versions preferred) and installing into a new generation, switched in whole;
//!   rebuilding a layer from the task's last state.
//!
//! Installing runs no package's code: wheels only (uv `--no-build`, pip `--only-binary
//! :all:`) unless the operator allows builds; a wheel's `.pth` files and entry points run
//! only in the task's own Python, which reads the layer. See `docs/packages.md`.

#![warn(missing_docs)]

pub mod install;
pub mod layer;
pub mod policy;
mod run;

pub use install::{InstallError, Installed, Installer, Tool, Trust};
pub use layer::{Layer, LayerState};
pub use policy::{AllowList, Policy, PolicyError, Requirement};

use chrono::{SecondsFormat, Utc};
use flowrepl_task_logger::{InstallRecord, TaskHead, TaskLog, RECORD_TYPE_INSTALL};
use std::borrow::Cow;
use std::path::Path;
use std::time::Duration;

/// Whose record it is.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    /// The plan.
    pub plan_id: &'a str,
    /// The task.
    pub task_id: &'a str,
    /// Its name.
    pub task_name: Option<&'a str>,
    /// The session.
    pub session_id: &'a str,
}

/// Why an install happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A client asked.
    Call,
    /// The kernel rebuilt the layer as it started.
    Rebuild,
}

impl Installer {
    /// Appends the `install` record of `result` to `log_file`.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        log_file: &Path,
        who: Who<'_>,
        trigger: Trigger,
        requested: &[String],
        result: &Result<Installed, InstallError>,
        restart_needed: &[String],
        elapsed: Duration,
    ) {
        let layer = match result {
            Ok(i) => i.state.clone(),
            Err(_) => self.layer().state().unwrap_or_default(),
        };
        let record = InstallRecord {
            head: TaskHead::new(
                RECORD_TYPE_INSTALL,
                who.plan_id,
                who.task_id,
                who.task_name,
                who.session_id,
            ),
            timestamp: Utc::now()
                .to_rfc3339_opts(SecondsFormat::Millis, true)
                .into(),
            trigger: Cow::Borrowed(match trigger {
                Trigger::Call => "call",
                Trigger::Rebuild => "rebuild",
            }),
            requested: requested.to_vec(),
            resolved: layer.resolved,
            added: result.as_ref().map(|i| i.added.clone()).unwrap_or_default(),
            requirements: layer.requirements,
            index: self.policy().index_url.as_deref().map(Cow::Borrowed),
            installer: Cow::Borrowed(self.tool().name()),
            source: Cow::Borrowed(match result {
                Ok(i) if i.from_cache => "cache",
                Ok(_) => "index",
                Err(_) => "none",
            }),
            restart_needed: restart_needed.to_vec(),
            elapsed_ms: elapsed.as_secs_f64() * 1e3,
            error: result.as_ref().err().map(|e| Cow::Owned(e.to_string())),
        };
        if let Err(e) = TaskLog::new(log_file.to_path_buf()).append(&record) {
            tracing::warn!(error = %flowrepl_os::chain(&e), "an install record was not written");
        }
    }
}
