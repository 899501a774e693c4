//! The task's package layer in a session: made ready before the engine starts (rebuilt from
//! the task's last install where it is missing or differs, so that a restore finds what it
//! unpickles), then `install` calls between cells.

use crate::config::Config;
use flowrepl_packages::{Installed, Installer, Trigger, Trust, Who};
use flowrepl_protocol::packages::InstallReply;
use flowrepl_protocol::Mode;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Runs the installer's builds in the sandbox (`flowrepl-worker --confined-exec`), whatever
/// the task's own `--sandbox`: every layer or no build (strict); for a network, a namespace
/// with only `lo` whose one way out is an egress proxy of the kernel's allowing the index's
/// hosts alone (as `--sandbox-net=allow:` gives cells; uv fetches a build's sdist and build
/// requirements in the same run as it builds, so the build cannot go without the index);
/// nothing writable but the build's own folder (its working folder, its cache of the task's
/// own, its `/tmp`) and the generation being written; the log folder hidden, the shared
/// cache not there at all.
#[derive(Debug)]
struct WorkerConfine {
    worker_exe: PathBuf,
    readable: Vec<PathBuf>,
    log_dir: PathBuf,
    network: BuildNetwork,
}

/// A build's network.
#[derive(Debug)]
enum BuildNetwork {
    /// Only the index's hosts, through an egress proxy recording as this says.
    Index(flowrepl_egress::proxy::ProxyConfig),
    /// The host's (`FLOWREPL_PACKAGES_BUILD_NET=host`: how builds ran before the proxy; for
    /// diagnosis, and the tests' control).
    Host,
}

/// Leaves a build the host's network when `host` (for diagnosis: the control of the tests
/// that show a build reaches only the index).
pub const BUILD_NET: &str = "FLOWREPL_PACKAGES_BUILD_NET";

/// The egress proxy of one build, and the kernel's copy of the socket the build hands its
/// listener through; dropped when the build has ended.
struct BuildProxy {
    _proxy: flowrepl_egress::Proxy,
    _theirs: std::os::fd::OwnedFd,
}

/// What a build may read: what a sandboxed worker of the task may, and the installer.
fn readable(config: &Config) -> Vec<PathBuf> {
    let mut out = crate::engine::worker::sandbox::readable(&config.python, None, &config.setup);
    if let Some(dir) = config
        .packages
        .uv
        .as_deref()
        .and_then(|uv| std::fs::canonicalize(uv).ok())
        .and_then(|uv| uv.parent().map(Path::to_path_buf))
        .filter(|d| flowrepl_sandbox::files::too_wide(d).is_none())
    {
        out.push(dir);
    }
    out
}

impl flowrepl_packages::install::Confine for WorkerConfine {
    fn confine(
        &self,
        cmd: &Command,
        workdir: &Path,
        writable: &[PathBuf],
        hosts: &[String],
    ) -> Result<flowrepl_packages::install::Confined, String> {
        if !self.worker_exe.is_file() {
            return Err(format!("{} not found", self.worker_exe.display()));
        }
        // Its /tmp: fresh for each build.
        let tmp = workdir.join("build-tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let network = match &self.network {
            BuildNetwork::Index(_) => flowrepl_protocol::sandbox::Network::Proxy,
            BuildNetwork::Host => flowrepl_protocol::sandbox::Network::Host,
        };
        let policy = flowrepl_protocol::sandbox::SandboxPolicy {
            strict: true,
            network,
            workspace: workdir.to_path_buf(),
            writable: writable.to_vec(),
            readable: self.readable.clone(),
            hidden: vec![self.log_dir.clone()],
            protected: Vec::new(),
            tmp,
            skip: Vec::new(),
        };
        let args: Vec<std::ffi::OsString> = cmd.get_args().map(Into::into).collect();
        let mut confined = Command::new(&self.worker_exe);
        confined
            .args(flowrepl_sandbox::exec::args(
                &policy,
                Path::new(cmd.get_program()),
                &args,
            ))
            .current_dir(workdir)
            .env_clear()
            .envs(flowrepl_sandbox::environment::kept());
        let BuildNetwork::Index(proxy) = &self.network else {
            return Ok(confined.into());
        };
        let mut rules = flowrepl_egress::Rules::default();
        for h in hosts {
            rules.add(
                flowrepl_egress::Rule::parse(h).map_err(|e| format!("the index's host: {e}"))?,
            );
        }
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("the build's proxy channel: {e}"))?;
        let theirs = std::os::fd::OwnedFd::from(theirs);
        give_proxy_fd(&mut confined, &theirs);
        let proxy = flowrepl_egress::Proxy::start(
            ours,
            flowrepl_egress::proxy::ProxyConfig {
                rules: std::sync::Arc::new(rules),
                ..proxy.clone()
            },
        )
        .map_err(|e| format!("the build's egress proxy: {e}"))?;
        Ok(flowrepl_packages::install::Confined {
            command: confined,
            keep: Some(Box::new(BuildProxy {
                _proxy: proxy,
                _theirs: theirs,
            })),
        })
    }
}

/// Puts `theirs` at the child's fd [`flowrepl_protocol::sandbox::PROXY_FD`] (without
/// close-on-exec), where `flowrepl-worker` hands its proxy's listening socket over.
fn give_proxy_fd(cmd: &mut Command, theirs: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = theirs.as_raw_fd();
    let target = flowrepl_protocol::sandbox::PROXY_FD;
    // SAFETY: between fork and exec, only dup2 and fcntl (async-signal-safe); `fd` stays open
    // in the parent until the command has ended (it is kept with the proxy).
    unsafe {
        cmd.pre_exec(move || {
            let ok = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0) >= 0
            } else {
                libc::dup2(fd, target) >= 0
            };
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// The task's installer: `None` with `--packages off`; an error when it cannot be used (a
/// `--uv` that does not exist, a layer folder that cannot be made), said to each caller.
pub type Packages = Option<Result<Installer, String>>;

/// Whose records they are.
pub fn who(id: &crate::config::Identity) -> Who<'_> {
    Who {
        plan_id: &id.plan_id,
        task_id: &id.task_id,
        task_name: id.task_name.as_deref(),
        session_id: &id.session_id,
    }
}

/// Opens the task's layer and, where the task installed packages before (its state file, or
/// its log's last install) and the layer does not hold them (a fresh machine, a deleted
/// folder), rebuilds it. Before the engine starts.
pub fn prepare(config: &Config) -> Packages {
    if !config.packages.enabled {
        return None;
    }
    let confine: Option<Box<dyn flowrepl_packages::install::Confine>> =
        config.packages.build.then(|| {
            Box::new(WorkerConfine {
                worker_exe: config.worker_exe.clone(),
                readable: readable(config),
                log_dir: flowrepl_task_logger::path::log_dir_of(&config.log_file)
                    .map(Path::to_path_buf)
                    .unwrap_or_default(),
                network: if std::env::var(BUILD_NET).is_ok_and(|v| v.trim() == "host") {
                    tracing::warn!("{BUILD_NET}=host: builds keep the host's network");
                    BuildNetwork::Host
                } else {
                    BuildNetwork::Index(config.egress_proxy(Default::default()))
                },
            }) as Box<dyn flowrepl_packages::install::Confine>
        });
    // No layer folder here: a fresh disk for the task (or its layer was deleted).
    let fresh = !flowrepl_task_logger::path::packages_root(&config.log_file).exists();
    // One shared cache per trust level (flowrepl_packages::Trust); a sandbox with layers
    // left out (FLOWREPL_SANDBOX_SKIP, for diagnosis) may leave the layer writable to cells.
    let trust = if config
        .worker
        .as_ref()
        .and_then(|w| w.sandbox.as_ref())
        .is_some_and(|sb| sb.skip.is_empty())
    {
        Trust::Sandboxed
    } else {
        Trust::Unsandboxed
    };
    let installer = match Installer::new(
        config.packages.clone(),
        config.python.clone(),
        &config.log_file,
        trust,
        confine,
    ) {
        Ok(i) => i,
        Err(e) => {
            let why = format!("packages cannot be installed on this kernel: {e}");
            tracing::warn!("{why}");
            return Some(Err(why));
        }
    };
    let wanted = match installer.task_state(&config.log_file, fresh) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "the task's package state could not be read; its layer is left as it is");
            None
        }
    };
    if let Some(wanted) = wanted {
        let have = installer.layer().state();
        // Missing, different, or linked from the other trust level's cache.
        if have
            .as_ref()
            .is_none_or(|h| h.resolved != wanted.resolved || installer.foreign(h))
        {
            let started = Instant::now();
            let result = installer.rebuild(&wanted);
            match &result {
                Ok(i) => tracing::info!(
                    packages = i.state.resolved.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "the task's package layer was rebuilt from its last install"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "the task's package layer could not be rebuilt")
                }
            }
            if config.logging {
                installer.record(
                    &config.log_file,
                    who(&config.identity),
                    Trigger::Rebuild,
                    &wanted.requirements,
                    &result,
                    &[],
                    started.elapsed(),
                );
            }
        }
    }
    Some(Ok(installer))
}

/// The reply to a successful install.
pub fn reply(
    installer: &Installer,
    i: Installed,
    restart_needed: Vec<String>,
    mode: Mode,
    elapsed_ms: f64,
) -> InstallReply {
    let source = if i.from_cache { "cache" } else { "index" };
    let mut message = if !i.excluded.is_empty() && i.added.is_empty() {
        format!(
            "nothing installed: the environment markers excluded {} on this Python; the layer has {} ({elapsed_ms:.0} ms)",
            i.excluded.join(", "),
            if i.state.resolved.is_empty() {
                "nothing".to_owned()
            } else {
                i.state.resolved.join(", ")
            }
        )
    } else if i.added.is_empty() {
        format!(
            "nothing new to install: the layer already has {} ({elapsed_ms:.0} ms)",
            i.state.resolved.join(", ")
        )
    } else {
        format!(
            "installed {} with {} ({}, {elapsed_ms:.0} ms); the next cell imports them",
            i.added.join(", "),
            installer.tool().name(),
            if i.from_cache {
                "from the shared cache, no index asked"
            } else {
                "from the index"
            }
        )
    };
    if !i.excluded.is_empty() && !i.added.is_empty() {
        message.push_str(&format!(
            "; the environment markers excluded {} on this Python",
            i.excluded.join(", ")
        ));
    }
    if installer.tool() == &flowrepl_packages::Tool::Pip {
        message.push_str("; uv was not found, pip installed them");
    }
    if !restart_needed.is_empty() {
        message.push_str(&format!(
            ". Already imported, so still the version loaded before: {} ({})",
            restart_needed.join(", "),
            match mode {
                Mode::Worker => "restart_session loads the new one",
                Mode::InProcess => {
                    "in-process, restart_session keeps loaded modules: only a new kernel loads the new one"
                }
            }
        ));
    }
    InstallReply {
        installed: i.state.resolved,
        added: i.added,
        restart_needed,
        installer: installer.tool().name().to_owned(),
        source: source.to_owned(),
        output: i.output,
        elapsed_ms,
        message,
    }
}
