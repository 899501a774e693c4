//! Diagnostics: tracing to the process's original stderr, never to stdout.

use std::fs::File;
use std::sync::Arc;
use tracing_subscriber::EnvFilter;

/// The environment variable of the diagnostics filter (`tracing_subscriber`'s syntax).
pub const LOG_ENV: &str = "FLOWREPL_LOG";

/// Sends tracing events and panic messages to `diagnostics` (the private copy of the original
/// stderr). Fd 2 itself is the cells' stderr capture, so nothing here may write to it.
/// The filter comes from [`LOG_ENV`] (default `info`, with the MCP library's per-message
/// logs at `error`: it reports every error response as a warning).
pub fn init(diagnostics: File) {
    let filter =
        EnvFilter::try_from_env(LOG_ENV).unwrap_or_else(|_| EnvFilter::new("info,rmcp=error"));
    let _ = tracing_subscriber::fmt()
        .with_writer(Arc::new(diagnostics))
        .with_ansi(false)
        .with_env_filter(filter)
        .try_init();
    // The default hook writes to fd 2, which belongs to the cells.
    std::panic::set_hook(Box::new(|info| {
        tracing::error!(%info, "panic");
    }));
}
