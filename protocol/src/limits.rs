//! Default limits, shared by the kernel's flags and the worker's (each unless set).

/// Output kept per stream and cell, in bytes (`FLOWREPL_MAX_OUTPUT_BYTES`).
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 256 << 20;
/// Pixels per collected image (`FLOWREPL_MCP_MAX_IMAGE_PIXELS`).
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 4_000_000;
/// Names whose pickle is larger are not checkpointed, in MB (`FLOWREPL_CHECKPOINT_MAX_MB`).
pub const DEFAULT_CHECKPOINT_MAX_MB: u64 = 1024;
/// The largest task context (`flow.context`), in bytes of JSON: `update` refuses a bigger
/// one (nothing saved), and a stored one that is bigger is not loaded (the kernel starts from
/// `{}` and says so).
pub const MAX_CONTEXT_BYTES: usize = 256 << 10;
