//! Installing packages into a task's package layer: the `install` method's params and reply
//! (`install_packages` over MCP). See `docs/packages.md`.

use serde::{Deserialize, Serialize};

/// The most requirements one call may name.
pub const MAX_REQUIREMENTS: usize = 100;

/// Params of `install` / `install_packages`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct InstallParams {
    /// Requirements as pip writes them: a name with optional extras, version specifiers and
    /// an environment marker (`"pandas>=2"`, `"polars==1.15"`, `"httpx[http2]"`). No URLs,
    /// paths or options: the index is the operator's.
    pub packages: Vec<String>,
}

/// What `install` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InstallReply {
    /// The layer now, `name==version` sorted by name: what cells import from it (on top of
    /// the task's venv).
    pub installed: Vec<String>,
    /// What this call added to the layer or changed in it.
    pub added: Vec<String>,
    /// Imported modules the install replaced: they stay as imported until a restart
    /// (`restart_session` in worker mode; in-process, only a new kernel).
    pub restart_needed: Vec<String>,
    /// `uv`, or `pip` where no uv was found.
    pub installer: String,
    /// `cache`: resolved and installed from the shared cache alone (no index asked);
    /// `index`: the index was asked.
    pub source: String,
    /// The installer's output.
    pub output: String,
    /// How long it took, ms.
    pub elapsed_ms: f64,
    /// What happened, for people.
    pub message: String,
}
