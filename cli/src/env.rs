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
/// Who holds a task in the store (`--store`), when not the kernel run itself: `serve` gives
/// its kernels its own instance's id, so that a kernel of the same server that comes after
/// one that died takes the task at once instead of waiting out the dead one's lease (the
/// server never runs two kernels of one task at once).
pub const STORE_HOLDER: &str = "FLOWREPL_STORE_HOLDER";
