//! The worker's sandbox on the wire: what the kernel asks for ([`SandboxPolicy`], on the
//! worker's command line) and what the worker could enforce ([`SandboxReport`], in its Ready
//! frame, then in `status`, `ready` and the session record). The layers themselves are
//! applied by `flowrepl-sandbox`; docs/sandbox.md has the threat model.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What the kernel asks the worker's sandbox to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPolicy {
    /// Refuse to start unless every layer is in force (`--sandbox=strict`).
    pub strict: bool,
    /// What network cells have.
    #[serde(default)]
    pub network: Network,
    /// The one place cells may write, besides the private `/tmp` and [`Self::writable`].
    pub workspace: PathBuf,
    /// Also writable: the task's checkpoint folder.
    pub writable: Vec<PathBuf>,
    /// Readable (and executable) beyond the system: the interpreter's prefixes, the venv,
    /// the Python library, `PYTHONPATH` entries.
    pub readable: Vec<PathBuf>,
    /// Hidden: the log folder (the task log and every other task's). In the mount namespace
    /// an empty folder covers it, and the checkpoint folder inside is bound back; without the
    /// mount namespace, Landlock hides it unless it is inside the workspace.
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// What the kernel, outside the sandbox, runs or reads by path at a later start: the
    /// venv and the interpreter's prefixes (it probes them; the installer runs them), the
    /// Python library, the support-code cache, the package layer, the kernel's own
    /// executables. Where one lies inside a writable folder (a `./.venv` in the workspace),
    /// the mount namespace binds it read-only there, and every folder between the writable
    /// one and it (as for [`Self::hidden`]) is made a mount point, which a cell can neither
    /// rename nor remove; without the mount namespace the sandbox refuses to start.
    #[serde(default)]
    pub protected: Vec<PathBuf>,
    /// A private temporary directory the kernel made: the worker's `/tmp` when the mount
    /// namespace is refused (`TMPDIR` points to it either way).
    pub tmp: PathBuf,
    /// Layers left out on purpose (`FLOWREPL_SANDBOX_SKIP`, for diagnostics and for the
    /// tests that show each layer is what stops an attempt). A skipped layer is reported as
    /// not enforced, so it is never claimed.
    #[serde(default)]
    pub skip: Vec<String>,
}

/// The network a sandboxed worker has (`--sandbox-net`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// A network namespace of its own with only `lo`, down: no network at all.
    #[default]
    None,
    /// The host's network (`--sandbox-net`, `--sandbox-net=host`); nothing else loosens.
    Host,
    /// Only the kernel's egress proxy (`--sandbox-net=allow:RULES`): the worker's network
    /// namespace has `lo` up, where the worker listens on [`PROXY_ADDRESS`] for the kernel
    /// and hands the listening socket to it (fd [`PROXY_FD`]); cells get `HTTP(S)_PROXY`
    /// pointing there, and may connect to nothing else.
    Proxy,
}

impl Network {
    /// What [`SandboxReport::network`] says for it.
    pub fn name(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Host => "host",
            Network::Proxy => "allow",
        }
    }
}

/// Where the proxy listens inside the worker's network namespace (the port is the
/// system's choice: `HTTP_PROXY` says which).
pub const PROXY_ADDRESS: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// The worker's descriptor, with [`Network::Proxy`], of the Unix socket it hands the proxy's
/// listening socket to the kernel through (then closes).
pub const PROXY_FD: i32 = 6;

/// What one layer of the sandbox is doing in this worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLayer {
    /// Its name (`flowrepl_sandbox::LAYERS`).
    pub layer: String,
    /// In force: the host accepted it and it applies to every cell from the first.
    pub enforced: bool,
    /// The policy asks for it (`--sandbox-net` asks for no network layer, a skipped layer is
    /// not asked for): `--sandbox=strict` refuses to start when one asked for is missing.
    pub wanted: bool,
    /// What it holds (when enforced) or why it is not.
    pub detail: String,
}

/// What the worker's sandbox enforces, layer by layer, as the host accepted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxReport {
    /// `strict` or `best-effort`.
    pub level: String,
    /// `none` (a network namespace of its own: only `lo`, down), `host` (`--sandbox-net`) or
    /// `allow` (only the kernel's egress proxy, by [`Self::rules`]).
    pub network: String,
    /// With `allow`: the rules in force, as written canonically (the kernel fills them in;
    /// the worker does not know them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// Every layer, enforced or not.
    pub layers: Vec<SandboxLayer>,
}

impl SandboxReport {
    /// The layers asked for and not in force.
    pub fn missing(&self) -> impl Iterator<Item = &SandboxLayer> {
        self.layers.iter().filter(|l| l.wanted && !l.enforced)
    }
}
