//! `flowrepl serve`: many kernels, one per task, behind one MCP endpoint over streamable HTTP.
//!
//! # Layout
//! - [`auth`]: the bearer token (401), made at start when none is given.
//! - [`child`]: one task's kernel, a `flowrepl mcp` child process, relayed to.
//! - [`pool`]: the kernels: started on first use, stopped when idle or at the limit
//!   (checkpointed first), started again from the checkpoint.
//! - [`relay`]: calls parked while their client answers an approval, and the
//!   `requestState` that continues each (unguessable, bound to its task and tool).
//! - [`route`]: a task's own URL, `/mcp/<plan>/<task>`, for load balancers that route by path.
//! - [`sessions`]: the cap on MCP sessions, and their memory given back when they end.
//! - [`handler`]: the MCP server: the kernels' tools with `task`/`plan`, `list_kernels`,
//!   `stop_kernel`; the file tools and resources served here, from [`files`].
//! - [`files`]: a task's workspace files: `/files/<plan>/<task>/<path>` over plain HTTP
//!   (streamed), and the places the file tools use; they work while the kernel is stopped.
//!
//! rmcp's streamable HTTP service serves `/mcp` (its `Host` check and, configured here, its
//! `Origin` check: 403), behind the token middleware, on a multi-threaded tokio runtime.
//! Kernels are keyed by task, not by MCP session: a client that reconnects (or a protocol
//! revision without sessions) finds its task's kernel as it left it.
//!
//! # Shutdown
//! SIGTERM or SIGINT: no new call is taken; running cells get the kill grace to finish; every
//! kernel is checkpointed (when idle) and stopped, and writes every record; then the server
//! exits 0. The kernels also get SIGTERM if the server dies (their parent-death signal).

pub mod auth;
pub mod child;
pub mod files;
pub mod framing;
pub mod handler;
pub mod listen;
pub mod pool;
pub mod relay;
pub mod route;
pub mod sessions;

use flowrepl_cli::args::{Cli, SandboxLevel, ServeArgs};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Flags of the kernels that `serve` sets itself, per task.
const OWN_FLAGS: [&str; 5] = [
    "--sandbox",
    "--workspace",
    "--resume",
    "--worker",
    "--keep-output-mb",
];

/// Runs the server until SIGTERM or SIGINT. Exit codes: 0 after a signal, 1 when it cannot
/// listen, 2 for a configuration error.
pub fn run(cli: &Cli, args: &ServeArgs) -> ExitCode {
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => flowrepl_os::logging::init(std::fs::File::from(fd)),
        Err(e) => eprintln!("flowrepl serve: logging to stderr not set up: {e}"),
    }
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        eprintln!(
            "flowrepl serve: {} is not a loopback address; pass --allow-remote to listen on it (and put a reverse proxy with TLS in front)",
            args.listen
        );
        return ExitCode::from(2);
    }
    if let Some(why) = roots_apart(cli, args) {
        eprintln!("flowrepl serve: {why}");
        return ExitCode::from(2);
    }
    let (token, source) = match auth::token(args.token_file.as_deref(), &args.state_dir) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("flowrepl serve: {e}");
            return ExitCode::from(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("flowrepl serve: cannot find its own executable: {e}");
            return ExitCode::from(1);
        }
    };
    let sandbox = match (args.no_sandbox, cli.sandbox) {
        (true, _) | (false, Some(SandboxLevel::Off)) => "off",
        (false, Some(SandboxLevel::Strict)) => "strict",
        _ => "on",
    };
    if sandbox == "off"
        && (args.task_net.is_some()
            || matches!(cli.sandbox_net, Some(flowrepl_egress::SandboxNet::Allow(_))))
    {
        eprintln!("flowrepl serve: network rules (--sandbox-net=allow:..., --task-net) need the sandbox: without it cells have the host's whole network");
        return ExitCode::from(2);
    }
    if let Some(dir) = args.task_net.as_deref().map(absolute) {
        // Its files reach the kernels as `--sandbox-net=allow:@FILE`, where a space or a
        // comma would split the path.
        if dir
            .to_string_lossy()
            .contains(|c: char| c == ',' || c.is_whitespace())
        {
            eprintln!(
                "flowrepl serve: --task-net {}: the path cannot contain spaces or commas",
                dir.display()
            );
            return ExitCode::from(2);
        }
    }
    let forwarded = cli
        .forwarded
        .iter()
        .filter(|a| {
            let a = a.to_string_lossy();
            !OWN_FLAGS
                .iter()
                .any(|f| a == *f || a.starts_with(&format!("{f}=")))
        })
        .cloned()
        .collect();
    let spawn = child::Spawn {
        exe,
        args: forwarded,
        workspace_root: absolute(&args.workspace_root),
        sandbox,
        keep_output_mb: kernel_share(args.mcp.keep_output_mb, args.max_kernels),
        max_message_bytes: cli.max_request_bytes,
        lease_wait: match cli.store {
            Some(_) => Duration::from_secs(cli.lease_s),
            None => Duration::ZERO,
        },
        holder: format!("serve-{}", uuid::Uuid::new_v4()),
        store: cli.store.clone(),
        task_net: args.task_net.as_deref().map(absolute),
    };
    let places = Arc::new(files::Places {
        spawn: spawn.clone(),
        log_dir: absolute(&cli.log_dir),
        limits: flowrepl_files::Limits {
            max_file_bytes: cli.max_file_bytes,
            max_workspace_bytes: cli.max_workspace_mb.saturating_mul(1 << 20),
        },
        max_chars: args.mcp.max_chars as usize,
        store: cli.store.is_some(),
    });
    let grace = Duration::from_millis(cli.kill_grace_ms);
    let pool = pool::Pool::new(
        spawn,
        pool::Limits {
            max_kernels: args.max_kernels,
            idle_stop: args.idle_stop,
            grace,
        },
    );
    let (plan, task) = flowrepl_task_logger::path::plan_and_task_from_env();
    let tools = flowrepl_mcp::tools::listed(
        args.mcp.max_chars as usize,
        cli.timeout_ms
            .unwrap_or(flowrepl_protocol::call::DEFAULT_TIMEOUT_MS),
        Duration::from_secs(args.mcp.wait_s),
    );
    let files = files::Files {
        pool: Arc::clone(&pool),
        places,
    };
    let server = handler::Serve::new(files.clone(), tools, child::TaskKey { plan, task });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("flowrepl-serve")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flowrepl serve: cannot start its runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let config = http_config(args, cli.max_request_bytes);
    let limits = listen::Limits {
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        max_connections: args.max_connections as usize,
    };
    runtime.block_on(serve(
        server,
        files,
        config,
        args,
        Credentials {
            token: token.into(),
            source,
        },
        grace,
        limits,
    ))
}

/// A kernel's share of the server's `--keep-output-mb` (all kernels together keep at most
/// that much), at least 1 MiB.
fn kernel_share(server_mb: u64, max_kernels: u32) -> u64 {
    (server_mb / u64::from(max_kernels.max(1))).max(1)
}

/// Browser origins always allowed: pages served from this machine (they still need the
/// token); a page of any other origin is what a DNS-rebinding attack runs in.
const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

/// rmcp's settings: the `Host` names that may be used (loopback, the listen address and
/// `--allowed-host`), the browser origins (loopback and `--allowed-origin`; a request without
/// `Origin` passes), the request body cap (the kernels').
pub fn http_config(args: &ServeArgs, max_body: usize) -> StreamableHttpServerConfig {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "[::1]"]
        .map(String::from)
        .to_vec();
    hosts.push(args.listen.ip().to_string());
    hosts.push(args.listen.to_string());
    hosts.extend(args.allowed_host.iter().cloned());
    StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(
            LOOPBACK_ORIGINS
                .iter()
                .map(|o| o.to_string())
                .chain(args.allowed_origin.iter().cloned()),
        )
        .enforce_origin_validation()
        .with_max_request_body_bytes(max_body)
        // A plain JSON reply when the call sends nothing before it (most calls): cheaper
        // for clients than an event stream; rmcp streams when progress or a request comes.
        .with_json_response(true)
}

/// The token and where it came from.
struct Credentials {
    token: Arc<str>,
    source: auth::TokenSource,
}

async fn serve(
    server: handler::Serve,
    files: files::Files,
    config: StreamableHttpServerConfig,
    args: &ServeArgs,
    Credentials { token, source }: Credentials,
    grace: Duration,
    limits: listen::Limits,
) -> ExitCode {
    let pool = Arc::clone(&files.pool);
    let stop = CancellationToken::new();
    let gate = Arc::new(auth::Gate::new(token));
    let guard = files::Guard::of(&config);
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(args.session_expiry);
    let sessions = Arc::new(sessions);
    let sessions_for_trim = Arc::clone(&sessions);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::clone(&sessions),
        config.with_cancellation_token(stop.child_token()),
    );
    let (max_sessions, expiry) = (args.max_sessions as usize, args.session_expiry);
    let per_task = axum::Router::new()
        .route_service(route::TASK_ROUTE, service.clone())
        .route_layer(axum::middleware::from_fn(route::bind));
    let file_routes = axum::Router::new()
        .route(
            files::FILES_ROUTE,
            axum::routing::put(files::serve)
                .get(files::serve)
                .delete(files::serve),
        )
        .with_state(files)
        .route_layer(axum::middleware::from_fn_with_state(guard, files::guard));
    let app = axum::Router::new()
        .route_service("/mcp", service)
        .merge(per_task)
        .layer(axum::middleware::from_fn(http_statuses))
        .layer(axum::middleware::from_fn(move |req, next| {
            sessions::at_most(Arc::clone(&sessions), max_sessions, expiry, req, next)
        }))
        // Files are not MCP: no session, and a DELETE is a file's.
        .merge(file_routes)
        .layer(axum::middleware::from_fn(move |req, next| {
            listen::body_within(limits.body_timeout, req, next)
        }))
        .layer(axum::middleware::from_fn(move |req, next| {
            auth::require_token(Arc::clone(&gate), req, next)
        }));
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("flowrepl serve: cannot listen on {}: {e}", args.listen);
            return ExitCode::from(1);
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    let token_line = match &source {
        auth::TokenSource::File(p) => format!("token from {}", p.display()),
        auth::TokenSource::Environment => format!("token from {}", auth::TOKEN_ENV),
        auth::TokenSource::Made(p) => format!("token written to {}", p.display()),
    };
    eprintln!("flowrepl serve: MCP at http://{addr}/mcp ({token_line})");
    if !addr.ip().is_loopback() {
        eprintln!("flowrepl serve: listening beyond loopback without TLS: put a reverse proxy with TLS in front");
    }
    tokio::spawn(Arc::clone(&pool).stop_idle_ones());
    tokio::spawn(sessions::give_back_memory(sessions_for_trim));
    let limits = limits.fit(pool.max_kernels());
    let http = tokio::spawn(listen::serve(
        listener,
        app,
        limits,
        stop.clone(),
        grace + Duration::from_secs(5),
    ));
    let sig = wait_for_signal().await;
    tracing::info!(
        signal = sig,
        "stopping: finishing running cells, checkpointing and stopping every kernel"
    );
    let stopped = pool.close().await;
    stop.cancel();
    // Open streams (a client's GET stream) need not end by themselves.
    let _ = tokio::time::timeout(grace + Duration::from_secs(5), http).await;
    tracing::info!(kernels = stopped, "flowrepl serve exiting");
    ExitCode::SUCCESS
}

/// rmcp's statuses where HTTP says otherwise: a session ended by `DELETE` is 204 No Content
/// (rmcp's 202 Accepted made the official Python SDK log "Session termination failed: 202"
/// at every disconnect), and a JSON body that does not parse is 400 Bad Request (rmcp
/// answers 415 Unsupported Media Type to it, as to a body that is not JSON at all).
async fn http_statuses(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let delete = request.method() == axum::http::Method::DELETE;
    let json = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    let mut response = next.run(request).await;
    if delete && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    if json && response.status() == axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE {
        *response.status_mut() = axum::http::StatusCode::BAD_REQUEST;
    }
    response
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot handle SIGTERM/SIGINT: the server runs until killed");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// The folders and files the server keeps for itself, by flag: none may lie inside
/// `--workspace-root` (a task whose workspace it is would read and replace it: with
/// `--log-dir W/lg`, task (lg, p1)'s workspace *is* the log folder of plan p1), nor may the
/// workspace root lie inside one of them. Compared after resolving symbolic links (of the
/// part that exists), component by component. `None`: they are apart.
pub fn roots_apart(cli: &Cli, args: &ServeArgs) -> Option<String> {
    let mut kept: Vec<(&str, std::path::PathBuf)> = vec![
        ("--log-dir", cli.log_dir.clone()),
        ("--state-dir", args.state_dir.clone()),
    ];
    kept.extend(args.token_file.clone().map(|p| ("--token-file", p)));
    kept.extend(args.task_net.clone().map(|p| ("--task-net", p)));
    kept.extend(cli.packages_cache.clone().map(|p| ("--packages-cache", p)));
    kept.extend(cli.packages_allow.clone().map(|p| ("--packages-allow", p)));
    if let Some(dir) = cli.store.as_deref().and_then(|s| s.strip_prefix("file://")) {
        kept.push(("--store", dir.into()));
    }
    // What the server and its kernels run or load, outside the sandbox: a task whose
    // workspace holds it (`--python W/venv`: task (venv, bin)'s workspace is `W/venv/bin`)
    // could replace it, and the next install or start would run the cell's program as the
    // server's user.
    for (flag, url) in std::iter::once(&cli.index_url)
        .flatten()
        .map(|u| ("--index-url", u))
        .chain(cli.extra_index_url.iter().map(|u| ("--extra-index-url", u)))
    {
        if let Some(dir) = url.strip_prefix("file://") {
            kept.push((flag, dir.into()));
        }
    }
    // (These only one way: a workspace root in the home or the temporary folder is usual.)
    overlap(&args.workspace_root, &kept)
        .or_else(|| inside(&args.workspace_root, &ran_or_loaded(cli)))
}

/// The first of `ran` that lies inside `workspace_root`, as a line naming both.
fn inside(workspace_root: &std::path::Path, ran: &[(&str, std::path::PathBuf)]) -> Option<String> {
    let ws = resolved(workspace_root);
    ran.iter().find(|(_, p)| resolved(p).starts_with(&ws)).map(|(what, p)| {
        format!(
            "{what} {} lies inside --workspace-root {}: a task whose workspace is there could replace what the server runs outside the sandbox; put the workspace root elsewhere",
            p.display(),
            workspace_root.display()
        )
    })
}

/// The programs and files a kernel of this server runs or loads, by the flag (or variable)
/// that names them: the interpreter (its venv, as the kernel resolves it), uv, the worker,
/// the startup files, the server's own folder, the home, the package and support-code caches
/// and the temporary folder (the workers' private folders).
fn ran_or_loaded(cli: &Cli) -> Vec<(&'static str, std::path::PathBuf)> {
    let mut out = Vec::new();
    let request = flowrepl_pythons::Request::from_env(cli.python.clone(), None);
    if let Ok(found) = flowrepl_pythons::resolve(&request) {
        let program = found.program;
        let venv = program
            .parent()
            .and_then(std::path::Path::parent)
            .filter(|v| v.join("pyvenv.cfg").is_file());
        let what = if cli.python.is_some() {
            "--python"
        } else {
            "the Python it serves"
        };
        match venv {
            Some(v) => out.push((what, v.to_path_buf())),
            None => out.extend(program.parent().map(|d| (what, d.to_path_buf()))),
        }
    }
    out.extend(cli.uv.clone().map(|p| ("--uv", p)));
    out.extend(cli.worker_bin.clone().map(|p| ("--worker-bin", p)));
    out.extend(cli.startup.iter().map(|p| ("--startup", p.clone())));
    out.extend(
        std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(std::path::Path::to_path_buf))
            .map(|d| ("flowrepl's own folder", d)),
    );
    out.extend(std::env::var_os("HOME").map(|h| ("$HOME", h.into())));
    // The caches kernels share and run from ($XDG_CACHE_HOME may lie elsewhere than $HOME):
    // one task's cell rewriting a cached package file would reach every task that installs it.
    if cli.packages_cache.is_none() {
        out.extend(
            flowrepl_packages::policy::default_cache_root()
                .map(|p| ("the package cache ($XDG_CACHE_HOME)", p)),
        );
    }
    out.extend(flowrepl_exec::setup::support_cache_dir().map(|p| ("the support-code cache", p)));
    out.push(("the temporary folder ($TMPDIR)", std::env::temp_dir()));
    out
}

/// The first of `kept` that lies inside `workspace_root` or holds it, as a line naming both.
fn overlap(
    workspace_root: &std::path::Path,
    kept: &[(&str, std::path::PathBuf)],
) -> Option<String> {
    let ws = resolved(workspace_root);
    for (flag, path) in kept {
        let p = resolved(path);
        let (inner, outer): ((&str, &std::path::Path), (&str, &std::path::Path)) =
            if p.starts_with(&ws) {
                ((flag, path), ("--workspace-root", workspace_root))
            } else if ws.starts_with(&p) {
                (("--workspace-root", workspace_root), (flag, path))
            } else {
                continue;
            };
        return Some(format!(
            "{} {} lies inside {} {}{}: a task whose workspace is there could read and replace what the server keeps; put the workspace root and the server's own folders apart",
            inner.0,
            inner.1.display(),
            outer.0,
            outer.1.display(),
            if p == ws { " (the same folder)" } else { "" },
        ));
    }
    None
}

/// `p` absolute, its longest existing part with symbolic links resolved, the rest (which
/// does not exist yet) added as it is.
fn resolved(p: &std::path::Path) -> std::path::PathBuf {
    let abs = absolute(p);
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    let base = loop {
        if let Ok(real) = std::fs::canonicalize(&existing) {
            break real;
        }
        match (
            existing.file_name().map(|n| n.to_owned()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break existing,
        }
    };
    let mut out = base;
    out.extend(rest.into_iter().rev());
    out
}

fn absolute(p: &std::path::Path) -> std::path::PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn kept(flag: &'static str, p: &Path) -> Vec<(&'static str, PathBuf)> {
        vec![(flag, p.to_path_buf())]
    }

    /// The guard with and without: each layout it refuses gives a task's workspace path that
    /// is the kept folder (so without the guard the task reaches it); apart, neither holds
    /// the other.
    #[test]
    fn kept_folders_inside_the_workspace_root_or_around_it_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let w = t.path().join("W");
        std::fs::create_dir(&w).unwrap();
        let lg = w.join("lg");
        let why = overlap(&w, &kept("--log-dir", &lg)).unwrap();
        assert!(
            why.contains("--log-dir") && why.contains("--workspace-root"),
            "{why}"
        );
        // Without the guard: task (plan lg, task p1)'s workspace is the log folder of plan p1.
        let spawn_ws = w.join("lg").join("p1");
        assert_eq!(spawn_ws, lg.join("p1"));
        // The reverse, a kept folder holding the workspace root, and the same folder.
        assert!(overlap(&w, &kept("--state-dir", t.path())).is_some());
        assert!(overlap(&w, &kept("--state-dir", &w))
            .unwrap()
            .contains("same folder"));
        // Through a symbolic link to the root, and with a part that does not exist yet.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&w, &link).unwrap();
        assert!(overlap(&link, &kept("--log-dir", &w.join("x/y"))).is_some());
        assert!(overlap(&w, &kept("--log-dir", &link.join("lg"))).is_some());
        // Apart: siblings, and a name that merely starts the same.
        assert!(overlap(&w, &kept("--log-dir", &t.path().join("logs"))).is_none());
        assert!(overlap(&w, &kept("--log-dir", &t.path().join("W2"))).is_none());
    }
}
