//! The environment variables that code other than the flags sets or reads (the replayer,
//! tests), each written once; the flags name them too.

/// `--python`.
pub const PYTHON: &str = "FLOWREPL_PYTHON";
/// `--no-log`.
pub const NO_LOG: &str = "FLOWREPL_NO_LOG";
/// `--resume`.
pub const RESUME: &str = "FLOWREPL_RESUME";
/// `--checkpoints`.
pub const CHECKPOINTS: &str = "FLOWREPL_CHECKPOINTS";
/// `--checkpoint-max-mb`.
pub const CHECKPOINT_MAX_MB: &str = "FLOWREPL_CHECKPOINT_MAX_MB";
/// `--sandbox`.
pub const SANDBOX: &str = "FLOWREPL_SANDBOX";
/// Sandbox layers to leave out, comma-separated (diagnostics and tests; a skipped layer
/// is reported as not enforced).
pub const SANDBOX_SKIP: &str = "FLOWREPL_SANDBOX_SKIP";
/// `--store`.
pub const STORE: &str = "FLOWREPL_STORE";
