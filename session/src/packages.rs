//! The task's package layer in a session: made ready before the engine starts (rebuilt from
//! the task's last install where it is missing or differs, so that a restore finds what it
//! unpickles), then `install` calls between cells.

use crate::config::Config;
use flowrepl_packages::{Installed, Installer, Trigger, Who};
use flowrepl_protocol::packages::InstallReply;
use flowrepl_protocol::Mode;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Runs the installer's builds in the sandbox (`flowrepl-worker --confined-exec`), whatever
/// the task's own `--sandbox`: every layer or no build (strict), the host's network kept (the
/// index), nothing writable but the build's own folder (its working folder, its cache of the
/// task's own, its `/tmp`) and the generation being written; the log folder hidden, the
/// shared cache not there at all.
#[derive(Debug)]
struct WorkerConfine {
    worker_exe: PathBuf,
    readable: Vec<PathBuf>,
    log_dir: PathBuf,
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
    ) -> Result<Command, String> {
        if !self.worker_exe.is_file() {
            return Err(format!("{} not found", self.worker_exe.display()));
        }
        // Its /tmp: fresh for each build.
        let tmp = workdir.join("build-tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let policy = flowrepl_protocol::sandbox::SandboxPolicy {
            strict: true,
            network: flowrepl_protocol::sandbox::Network::Host,
            workspace: workdir.to_path_buf(),
            writable: writable.to_vec(),
            readable: self.readable.clone(),
            hidden: vec![self.log_dir.clone()],
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
        Ok(confined)
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
            }) as Box<dyn flowrepl_packages::install::Confine>
        });
    // No layer folder here: a fresh disk for the task (or its layer was deleted).
    let fresh = !flowrepl_task_logger::path::packages_root(&config.log_file).exists();
    let installer = match Installer::new(
        config.packages.clone(),
        config.python.clone(),
        &config.log_file,
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
        if have.as_ref().map(|h| &h.resolved) != Some(&wanted.resolved) {
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
    let mut message = if i.added.is_empty() {
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
