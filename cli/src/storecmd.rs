//! `flowrepl store`: the operator's commands on an object store (`--store URL`): the tasks,
//! their holders and sizes (`ls`); one task's head, log segments, states and blobs (`show`);
//! releasing a task whose holder is known dead (`release`); collecting the blobs and
//! manifests no state needs any more in tasks no one holds (`gc`). See docs/store.md.
//!
//! Exit codes: 0 done; 1 the store failed or has no such task; 2 bad arguments (no
//! `--store`); 75 `release` refused because the holder renewed its lease while the command
//! watched (it is alive: `--force` takes the task anyway).

use flowrepl_store::admin::{self, AdminError, Collected};
use flowrepl_store::gc;
use flowrepl_store::head::TaskKeys;
use flowrepl_store::Store;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

const EXAMPLES: &str = "\
Examples:
  flowrepl store ls --store s3://bucket/flowrepl
  flowrepl store ls --store file:///srv/flowrepl --plan nightly --json
  flowrepl store show --store s3://bucket/flowrepl --plan nightly --task t1
  flowrepl store release --store s3://bucket/flowrepl --plan nightly --task t1
      (waits out the holder's lease; refuses if it renews: it is alive)
  flowrepl store release --store s3://bucket/flowrepl --plan nightly --task t1 --drop-state
      (the next kernel starts without the stored checkpoints; the log stays)
  flowrepl store gc --store s3://bucket/flowrepl --dry-run
  flowrepl store gc --store s3://bucket/flowrepl --plan nightly --grace-s 60 --idle-s 3600

The store is configured as for the kernel: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP=true for a plain-HTTP endpoint.";

/// `flowrepl store` and its subcommands.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct StoreArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: StoreCommand,
}

/// The subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum StoreCommand {
    /// The tasks in the store: holder, epoch, whether released, when last renewed, the sizes
    /// of their log, states and blobs.
    #[command(after_help = EXAMPLES)]
    Ls {
        /// Only this plan's tasks.
        #[arg(long)]
        plan: Option<String>,
        /// One JSON document.
        #[arg(long)]
        json: bool,
    },
    /// One task: its head, its log segments (and which are missing), its state manifests,
    /// its current checkpoints and workspace files, its blobs and sizes.
    #[command(after_help = EXAMPLES)]
    Show {
        /// The plan.
        #[arg(long)]
        plan: String,
        /// The task.
        #[arg(long)]
        task: String,
        /// One JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Release a task whose holder is known dead, so that the next kernel takes it at once
    /// (its epoch bumped: the old holder, should it come back, is fenced). The holder is
    /// watched for its whole lease first; if it renews, it is alive and the task is not
    /// released (exit 75) unless --force.
    #[command(after_help = EXAMPLES)]
    Release {
        /// The plan.
        #[arg(long)]
        plan: String,
        /// The task.
        #[arg(long)]
        task: String,
        /// Take the task even from a live holder (it is fenced at its next write to the
        /// store and stops; calls it answers meanwhile are not in the store).
        #[arg(long)]
        force: bool,
        /// Also make the head name no state: the next kernel starts without the stored
        /// checkpoints and workspace files (the log stays; `flowrepl log replay --store`
        /// runs its cells again). For a state a kernel refuses to restore.
        #[arg(long)]
        drop_state: bool,
    },
    /// Collect the blobs and state manifests no state needs any more, in tasks no one holds
    /// (held tasks are collected by their holder). A replaced manifest, and blobs no kept
    /// manifest names, stay for the grace period. Log segments are never collected.
    #[command(after_help = EXAMPLES)]
    Gc {
        /// Only this plan's tasks.
        #[arg(long)]
        plan: Option<String>,
        /// Only this task (with --plan).
        #[arg(long, requires = "plan")]
        task: Option<String>,
        /// Say what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// The grace period in seconds (default: FLOWREPL_STORE_GC_GRACE_S, else 300).
        #[arg(long, value_name = "SECONDS")]
        grace_s: Option<f64>,
        /// Leave tasks released less than this many seconds ago (their kernel may be idle
        /// and alive, its lease parked: collecting takes the lease, which stops it).
        #[arg(long, value_name = "SECONDS", default_value_t = 900)]
        idle_s: u64,
        /// One JSON document.
        #[arg(long)]
        json: bool,
    },
}

/// The exit code of a `release` refused because the holder is alive (EX_TEMPFAIL).
pub const EXIT_LIVE: u8 = 75;

/// `12.3 MB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn sizes_json(s: &gc::Sizes) -> Value {
    json!({
        "log": {"objects": s.log.0, "bytes": s.log.1},
        "state": {"objects": s.state.0, "bytes": s.state.1},
        "blobs": {"objects": s.blobs.0, "bytes": s.blobs.1},
        "other": {"objects": s.other.0, "bytes": s.other.1},
        "bytes": s.bytes(),
    })
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("JSON serializes")
    );
}

/// Runs `flowrepl store ...` against the store at `url`.
pub fn run(url: Option<&str>, args: &StoreArgs) -> ExitCode {
    let Some(url) = url else {
        eprintln!("flowrepl store: which store? Give --store URL (or set FLOWREPL_STORE)");
        return ExitCode::from(2);
    };
    let store = match Store::open(url) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowrepl store: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flowrepl store: cannot start a runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let done = runtime.block_on(async {
        match &args.command {
            StoreCommand::Ls { plan, json } => ls(&store, plan.as_deref(), *json).await,
            StoreCommand::Show { plan, task, json } => show(&store, plan, task, *json).await,
            StoreCommand::Release {
                plan,
                task,
                force,
                drop_state,
            } => release(&store, plan, task, *force, *drop_state).await,
            StoreCommand::Gc {
                plan,
                task,
                dry_run,
                grace_s,
                idle_s,
                json,
            } => {
                let grace = grace_s
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map_or_else(gc::grace, Duration::from_secs_f64);
                collect(
                    &store,
                    plan.as_deref(),
                    task.as_deref(),
                    grace,
                    Duration::from_secs(*idle_s),
                    *dry_run,
                    *json,
                )
                .await
            }
        }
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ AdminError::Live { .. }) => {
            eprintln!("flowrepl store: {e}");
            ExitCode::from(EXIT_LIVE)
        }
        Err(e) => {
            eprintln!("flowrepl store: {}", flowrepl_os::chain(&e));
            ExitCode::from(1)
        }
    }
}

fn holder_line(h: &flowrepl_store::head::Head) -> String {
    if h.released {
        format!("released (last: {})", h.holder)
    } else {
        format!("held by {}", h.holder)
    }
}

async fn ls(store: &Store, plan: Option<&str>, as_json: bool) -> Result<(), AdminError> {
    let tasks = admin::ls(store, plan, None).await?;
    if as_json {
        let list: Vec<Value> = tasks
            .iter()
            .map(|t| {
                let head = match &t.head {
                    Ok(h) => json!({
                        "plan_id": h.plan_id, "task_id": h.task_id, "epoch": h.epoch,
                        "holder": h.holder, "released": h.released,
                        "renewed_at": h.renewed_at, "lease_ms": h.lease_ms,
                        "log_bytes": h.log_bytes(), "state": h.state,
                    }),
                    Err(e) => json!({"error": e}),
                };
                json!({"folder": format!("{}/{}", t.folder.0, t.folder.1), "head": head, "sizes": sizes_json(&t.sizes)})
            })
            .collect();
        print_json(&json!({ "tasks": list }));
        return Ok(());
    }
    if tasks.is_empty() {
        println!("no tasks in {}", store.url());
        return Ok(());
    }
    for t in &tasks {
        let name = match &t.head {
            Ok(h) => format!("{}/{}", h.plan_id, h.task_id),
            Err(_) => format!("{}/{}", t.folder.0, t.folder.1),
        };
        let state = match &t.head {
            Ok(h) => format!(
                "epoch {}, {}, renewed {}",
                h.epoch,
                holder_line(h),
                h.renewed_at
            ),
            Err(e) => format!("head: {e}"),
        };
        println!("{name}  {state}");
        println!(
            "    log {} in {} segments, states {} in {}, blobs {} in {}, {} in all",
            human(t.sizes.log.1),
            t.sizes.log.0,
            human(t.sizes.state.1),
            t.sizes.state.0,
            human(t.sizes.blobs.1),
            t.sizes.blobs.0,
            human(t.sizes.bytes()),
        );
    }
    Ok(())
}

async fn show(store: &Store, plan: &str, task: &str, as_json: bool) -> Result<(), AdminError> {
    let d = admin::show(store, plan, task).await?;
    let missing: Vec<&admin::SegmentInfo> =
        d.segments.iter().filter(|s| s.bytes.is_none()).collect();
    if as_json {
        let current = match &d.current {
            None => Value::Null,
            Some(Ok(m)) => json!({
                "sandboxed": m.sandboxed,
                "checkpoints": m.checkpoints.iter().map(|(n, c)| (n.clone(), json!({
                    "segments": c.segments.len(),
                    "bytes": c.segments.values().map(|s| s.bytes).sum::<u64>(),
                    "inline": c.segments.values().filter(|s| s.inline.is_some()).count(),
                }))).collect::<serde_json::Map<String, Value>>(),
                "workspace": m.workspace,
            }),
            Some(Err(e)) => json!({ "error": e }),
        };
        print_json(&json!({
            "head": d.head,
            "segments": d.segments.iter().map(|s| json!({
                "key": s.key, "epoch": s.epoch, "seq": s.seq, "bytes": s.bytes,
            })).collect::<Vec<_>>(),
            "missing_segments": missing.iter().map(|s| s.key.clone()).collect::<Vec<_>>(),
            "uncounted_log": d.uncounted_log.iter().map(|l| json!({"key": l.key, "bytes": l.bytes})).collect::<Vec<_>>(),
            "recovered": d.recovered.iter().map(|l| json!({"key": l.key, "bytes": l.bytes})).collect::<Vec<_>>(),
            "states": d.states.iter().map(|s| json!({
                "key": s.key, "bytes": s.bytes, "modified": s.modified, "current": s.current,
            })).collect::<Vec<_>>(),
            "current": current,
            "blobs": {"objects": d.blobs.0, "bytes": d.blobs.1},
            "live_blobs": {"objects": d.live_blobs.0, "bytes": d.live_blobs.1},
            "missing_blobs": d.missing_blobs,
            "sizes": sizes_json(&d.sizes),
        }));
        return Ok(());
    }
    let h = &d.head;
    println!("task {}/{} in {}", h.plan_id, h.task_id, store.url());
    println!("  epoch {}, {}", h.epoch, holder_line(h));
    println!(
        "  last renewed {} (its clock), lease {} ms",
        h.renewed_at, h.lease_ms
    );
    let counted: u64 = h.log.iter().map(|r| r.segments).sum();
    println!(
        "  log: {} segments counted by {} holder(s), {} ({} in the store)",
        counted,
        h.log.len(),
        human(h.log_bytes()),
        human(d.sizes.log.1)
    );
    for s in &missing {
        println!(
            "    MISSING {} (epoch {}, #{}): counted, never written",
            s.key, s.epoch, s.seq
        );
    }
    for l in &d.uncounted_log {
        println!(
            "    not counted by the head: {} ({})",
            l.key,
            human(l.bytes)
        );
    }
    for l in &d.recovered {
        println!(
            "    recovered records (not in the log's order): {} ({})",
            l.key,
            human(l.bytes)
        );
    }
    println!("  states ({}):", d.states.len());
    for s in &d.states {
        println!(
            "    {}{}  {}  written {}",
            s.key,
            if s.current { " (current)" } else { "" },
            human(s.bytes),
            s.modified
        );
    }
    match &d.current {
        None => println!("  current state: none"),
        Some(Err(e)) => println!("  current state: REFUSED: {e}"),
        Some(Ok(m)) => {
            println!("  current state:");
            for (name, cp) in &m.checkpoints {
                println!(
                    "    checkpoint {name}: {} segment file(s), {} ({} inline in the manifest)",
                    cp.segments.len(),
                    human(cp.segments.values().map(|s| s.bytes).sum()),
                    cp.segments.values().filter(|s| s.inline.is_some()).count()
                );
            }
            if let Some(w) = &m.workspace {
                println!(
                    "    workspace: {} file(s), {}; {} not kept",
                    w.files.len(),
                    human(w.files.values().map(|f| f.bytes).sum()),
                    w.skipped.len()
                );
                for (path, why) in &w.skipped {
                    println!("      {path}: {why}");
                }
            }
        }
    }
    println!(
        "  blobs: {} ({} objects); the current state names {} ({} objects)",
        human(d.blobs.1),
        d.blobs.0,
        human(d.live_blobs.1),
        d.live_blobs.0
    );
    for b in &d.missing_blobs {
        println!("    MISSING blob {b}, named by the current state");
    }
    println!("  in all: {}", human(d.sizes.bytes()));
    Ok(())
}

async fn release(
    store: &Store,
    plan: &str,
    task: &str,
    force: bool,
    drop_state: bool,
) -> Result<(), AdminError> {
    let keys = TaskKeys::new(plan, task);
    if let Some((h, _)) = admin::read_head(store, &keys).await? {
        if !h.released && !force {
            eprintln!(
                "flowrepl store: watching the lease of {} (epoch {}, {} ms) for a renewal…",
                h.holder, h.epoch, h.lease_ms
            );
        }
    }
    let r = admin::release(store, plan, task, force, drop_state).await?;
    let b = &r.before;
    match &r.after {
        None => println!(
            "task {plan}/{task} was released already (epoch {}, by {})",
            b.epoch, b.holder
        ),
        Some(a) => {
            if b.released {
                println!(
                    "task {plan}/{task}: released (epoch {} → {})",
                    b.epoch, a.epoch
                );
            } else {
                println!(
                    "task {plan}/{task}: released (epoch {} → {}); {} had not released it and did not renew within {:.1} s{}",
                    b.epoch,
                    a.epoch,
                    b.holder,
                    r.watched.as_secs_f64(),
                    if force { " (--force: not waited for)" } else { "" },
                );
                println!(
                    "  its last commit to the store was at {} (its clock): calls it answered after that may be lost",
                    b.renewed_at
                );
            }
            if drop_state {
                println!(
                    "  the head names no state now (it named {}): the next kernel starts without the stored checkpoints; the log stays",
                    b.state.as_deref().unwrap_or("none")
                );
            }
        }
    }
    Ok(())
}

async fn collect(
    store: &Store,
    plan: Option<&str>,
    task: Option<&str>,
    grace: Duration,
    idle: Duration,
    dry_run: bool,
    as_json: bool,
) -> Result<(), AdminError> {
    let tasks = admin::ls(store, plan, task).await?;
    let mut out = Vec::new();
    let (mut removed, mut bytes) = (0u64, 0u64);
    for t in &tasks {
        let keys = TaskKeys::of_folder(&t.folder.0, &t.folder.1);
        let name = format!("{}/{}", t.folder.0, t.folder.1);
        match admin::gc(store, &keys, grace, idle, dry_run).await? {
            Collected::Done(p) => {
                removed += p.removed_blobs.len() as u64 + p.removed_manifests.len() as u64;
                bytes += p.removed_bytes();
                if as_json {
                    out.push(json!({
                        "task": name, "collected": true,
                        "removed_manifests": p.removed_manifests,
                        "removed_blobs": p.removed_blobs.len(),
                        "removed_bytes": p.removed_bytes(),
                        "kept_manifests": p.kept_manifests,
                        "kept_blobs": p.kept_blobs.0, "kept_bytes": p.kept_blobs.1,
                    }));
                } else {
                    println!(
                        "{name}: {} {} manifest(s) and {} blob(s), {}; kept {} manifest(s) and {} blob(s), {}",
                        if dry_run { "would remove" } else { "removed" },
                        p.removed_manifests.len(),
                        p.removed_blobs.len(),
                        human(p.removed_bytes()),
                        p.kept_manifests.len(),
                        p.kept_blobs.0,
                        human(p.kept_blobs.1),
                    );
                }
            }
            Collected::Skipped(why) => {
                if as_json {
                    out.push(json!({"task": name, "collected": false, "why": why}));
                } else {
                    println!("{name}: not collected: {why}");
                }
            }
        }
    }
    if as_json {
        print_json(&json!({
            "dry_run": dry_run, "grace_s": grace.as_secs_f64(),
            "tasks": out, "removed_objects": removed, "removed_bytes": bytes,
        }));
    } else {
        println!(
            "{} {removed} object(s), {} (grace {:.0} s)",
            if dry_run { "would remove" } else { "removed" },
            human(bytes),
            grace.as_secs_f64()
        );
    }
    Ok(())
}
