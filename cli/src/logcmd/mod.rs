//! `flowrepl log`: the task logs for people (tables, listings) and for programs (`--json`).
//!
//! | subcommand | what |
//! | --- | --- |
//! | `ls` | plans and tasks: cells, failures, sessions, first and last activity |
//! | `show` | a task's cells in order, with their events and context changes |
//! | `tail [-f]` | a task's (or a plan's) last cells; `-f` follows new records |
//! | `stats` | cells, success rate, elapsed percentiles, CPU, memory, errors, imports, events |
//! | `context` | the task's current context (its last context record) |
//! | `export --format py\|ipynb` | a task's cells as a script or an nbformat 4 notebook |
//! | `replay [--dry-run]` | runs a task's successful cells again in a fresh kernel (no checkpoint needed), reports cells whose output differs, checkpoints the result |
//!
//! `--log-dir` (`FLOWREPL_LOG_DIR`), `--plan` and `--task` (default `FLOW_PLAN_ID` /
//! `FLOW_TASK_ID`, else `local` / `adhoc`) as for the kernel. Logs are read streaming, a
//! line at a time. Lines that are not records (corrupt, torn, from a newer format version) are
//! skipped and named on stderr with their line numbers; the rest is still read. Exit code 0
//! when something was read, 1 when nothing was (no directory, no such plan or task, nothing
//! readable; `replay`: when a cell failed now), 2 for bad arguments, 3 with `--store` when the
//! store lacks log segments its heads count (every record that exists is shown, and each
//! missing segment is named on stderr). Nothing here starts Python
//! but `replay`, which starts a kernel.

mod export;
mod ls;
mod replay;
mod show;
mod stats;
mod stored;
mod table;
mod tail;

use flowrepl_task_logger::{for_each_line, parse_line, Record};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `flowrepl log` and its subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// What to read.
    #[command(subcommand)]
    pub command: LogCommand,
}

/// Which plan and task (`--plan`, `--task`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Scope {
    /// The plan id (default: FLOW_PLAN_ID, else `local`; `ls` and `stats`: every plan).
    #[arg(long)]
    pub plan: Option<String>,
    /// The task id (default: FLOW_TASK_ID, else `adhoc`; `ls`, `stats` and `tail`: every
    /// task of the plan).
    #[arg(long)]
    pub task: Option<String>,
    /// One JSON document instead of text for people (`tail`: one JSON record per line).
    #[arg(long)]
    pub json: bool,
}

/// The subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum LogCommand {
    /// Plans and tasks, with cells, failures, sessions, first and last activity.
    Ls(#[command(flatten)] Scope),
    /// A task's cells in order: code, outcome, time, output head; events and context
    /// changes in place.
    Show {
        /// Which task.
        #[command(flatten)]
        scope: Scope,
        /// Only cells that failed.
        #[arg(long)]
        failed: bool,
        /// Only cells that started at or after this time (ISO 8601, e.g. 2026-11-23 or
        /// 2026-11-23T10:00).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only cells of this session (a prefix of its id).
        #[arg(long, value_name = "ID")]
        session: Option<String>,
    },
    /// A task's last cells; with -f, then every record as it arrives (a plan's tasks when no
    /// --task is given), also from files created later.
    Tail {
        /// Which task or plan.
        #[command(flatten)]
        scope: Scope,
        /// Keep following.
        #[arg(short, long)]
        follow: bool,
        /// How many cells to show first.
        #[arg(short = 'n', long, default_value_t = 10)]
        lines: usize,
    },
    /// Statistics of a plan, a task, or every log: cells, success rate, elapsed p50/p95/max,
    /// CPU and peak RSS, top error types, slowest cells, modules imported, event counts.
    Stats(#[command(flatten)] Scope),
    /// The task's current context (its last context record).
    Context(#[command(flatten)] Scope),
    /// A task's cells as a Python script (successful cells) or a notebook (every cell, with
    /// its outputs).
    Export {
        /// Which task.
        #[command(flatten)]
        scope: Scope,
        /// `py` or `ipynb`.
        #[arg(long, value_enum)]
        format: export::Format,
        /// Write here instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Rebuild a task's state without a checkpoint: run its successful cells again, in order,
    /// in a fresh kernel (with --python / --worker as given, else the task's last
    /// interpreter), report cells whose output now differs, and save the result as the
    /// task's checkpoint. Re-running repeats the cells' side effects.
    Replay {
        /// Which task.
        #[command(flatten)]
        scope: Scope,
        /// List the cells that would run; run nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only cells of this session (a prefix of its id).
        #[arg(long, value_name = "ID")]
        session: Option<String>,
    },
}

impl LogCommand {
    /// Which tasks it reads.
    fn scope(&self) -> &Scope {
        match self {
            LogCommand::Ls(scope) | LogCommand::Stats(scope) | LogCommand::Context(scope) => scope,
            LogCommand::Show { scope, .. }
            | LogCommand::Tail { scope, .. }
            | LogCommand::Export { scope, .. }
            | LogCommand::Replay { scope, .. } => scope,
        }
    }

    /// Whether it keeps reading (`tail -f`).
    fn follows(&self) -> bool {
        matches!(self, LogCommand::Tail { follow: true, .. })
    }
}

/// What `flowrepl log` takes from flowrepl's global flags.
#[derive(Debug, Clone)]
pub struct Globals {
    /// `--log-dir`.
    pub log_dir: std::path::PathBuf,
    /// `--python`, for `replay`.
    pub python: Option<std::path::PathBuf>,
    /// `--worker`, for `replay`.
    pub worker: bool,
    /// `--store`: read the logs from the object store instead of `log_dir`.
    pub store: Option<String>,
}

/// Runs `flowrepl log ...` on the logs under `--log-dir` (with `--store`, on those in the
/// store).
pub fn run(globals: &Globals, args: &LogArgs) -> ExitCode {
    let stored = match &globals.store {
        Some(url) => match stored::fetch(url, args.command.scope(), args.command.follows()) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("flowrepl log: {e}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let gaps = stored.as_ref().map_or(0, |s| s.missing.len());
    for m in stored.iter().flat_map(|s| &s.missing) {
        eprintln!("flowrepl log: {m}");
    }
    let log_dir = stored
        .as_ref()
        .map_or(globals.log_dir.as_path(), |s| s.log_dir());
    let out = match &args.command {
        LogCommand::Ls(scope) => ls::run(log_dir, scope),
        LogCommand::Show {
            scope,
            failed,
            since,
            session,
        } => show::run(
            log_dir,
            scope,
            &show::Filter {
                failed: *failed,
                since: since.clone(),
                session: session.clone(),
            },
        ),
        LogCommand::Tail {
            scope,
            follow,
            lines,
        } => tail::run(log_dir, scope, *follow, *lines),
        LogCommand::Stats(scope) => stats::run(log_dir, scope),
        LogCommand::Context(scope) => context(log_dir, scope),
        LogCommand::Export {
            scope,
            format,
            output,
        } => export::run(log_dir, scope, *format, output.as_deref()),
        LogCommand::Replay {
            scope,
            dry_run,
            session,
        } => replay::run(
            log_dir,
            scope,
            &replay::Options {
                dry_run: *dry_run,
                session: session.as_deref(),
                python: globals.python.clone(),
                worker: globals.worker,
                store: globals.store.clone(),
            },
        ),
    };
    match out {
        // Every record that exists was shown; the missing segments were named on stderr.
        Ok(_) if gaps > 0 => {
            eprintln!(
                "flowrepl log: {gaps} log segment(s) counted in the store are missing (named above); exit code {}",
                stored::EXIT_GAPS
            );
            ExitCode::from(stored::EXIT_GAPS)
        }
        Ok(Read::Something) => ExitCode::SUCCESS,
        Ok(Read::Nothing) => ExitCode::from(1),
        // The reader went away (`| head`): not an error.
        Err(LogCmdError::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("flowrepl log: {e}");
            ExitCode::from(1)
        }
    }
}

/// Whether a subcommand read anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// At least one record.
    Something,
    /// No record.
    Nothing,
}

impl Read {
    fn from_count(n: usize) -> Read {
        if n > 0 {
            Read::Something
        } else {
            Read::Nothing
        }
    }
}

/// Why a subcommand could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum LogCmdError {
    /// No log directory.
    #[error("no task logs: {0} does not exist (set --log-dir or FLOWREPL_LOG_DIR)")]
    NoDir(PathBuf),
    /// No such plan.
    #[error("no plan {plan:?} in {dir} (plans: {known})")]
    NoPlan {
        /// The plan asked for.
        plan: String,
        /// The log dir.
        dir: PathBuf,
        /// The plans there.
        known: String,
    },
    /// No such task.
    #[error("no task {task:?} in plan {plan:?} ({file} does not exist; tasks: {known})")]
    NoTask {
        /// The plan.
        plan: String,
        /// The task asked for.
        task: String,
        /// The file looked for.
        file: PathBuf,
        /// The tasks of the plan.
        known: String,
    },
    /// Reading or writing failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LogCmdError {
    let what = what.into();
    move |source| LogCmdError::Io { what, source }
}

/// The plan and task a subcommand about one task reads.
fn one_task(scope: &Scope) -> (String, String) {
    let (plan, task) = flowrepl_task_logger::path::plan_and_task_from_env();
    (
        scope.plan.clone().unwrap_or(plan),
        scope.task.clone().unwrap_or(task),
    )
}

/// The log file of one task; an error naming what exists when it does not.
fn task_file(log_dir: &Path, plan: &str, task: &str) -> Result<PathBuf, LogCmdError> {
    let file = flowrepl_task_logger::task_log_path(log_dir, plan, task);
    if file.is_file() {
        return Ok(file);
    }
    let plan_dir = file.parent().expect("a task file has a plan directory");
    if !plan_dir.is_dir() {
        plan_dir_of(log_dir, plan)?;
    }
    Err(LogCmdError::NoTask {
        plan: plan.to_owned(),
        task: task.to_owned(),
        known: names(&task_files_in(plan_dir)),
        file,
    })
}

/// The directory of one plan, or an error listing the plans.
fn plan_dir_of(log_dir: &Path, plan: &str) -> Result<PathBuf, LogCmdError> {
    if !log_dir.is_dir() {
        return Err(LogCmdError::NoDir(log_dir.to_path_buf()));
    }
    let dir = log_dir.join(flowrepl_task_logger::safe_component(plan));
    if dir.is_dir() {
        return Ok(dir);
    }
    Err(LogCmdError::NoPlan {
        plan: plan.to_owned(),
        dir: log_dir.to_path_buf(),
        known: names(&plan_dirs(log_dir)),
    })
}

fn names(paths: &[PathBuf]) -> String {
    let n: Vec<String> = paths
        .iter()
        .filter_map(|p| p.file_stem()?.to_str().map(str::to_owned))
        .collect();
    if n.is_empty() {
        "none".into()
    } else {
        n.join(", ")
    }
}

fn plan_dirs(log_dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(log_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

fn task_files_in(plan_dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(plan_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    out.sort();
    out
}

/// The task files a plan-or-all subcommand reads (`ls`, `stats`): one task, one plan's, or
/// every plan's.
fn scoped_files(log_dir: &Path, scope: &Scope) -> Result<Vec<PathBuf>, LogCmdError> {
    if !log_dir.is_dir() {
        return Err(LogCmdError::NoDir(log_dir.to_path_buf()));
    }
    match (&scope.plan, &scope.task) {
        (Some(plan), Some(task)) => Ok(vec![task_file(log_dir, plan, task)?]),
        (Some(plan), None) => Ok(task_files_in(&plan_dir_of(log_dir, plan)?)),
        (None, Some(task)) => {
            let (plan, _) = flowrepl_task_logger::path::plan_and_task_from_env();
            Ok(vec![task_file(log_dir, &plan, task)?])
        }
        (None, None) => Ok(plan_dirs(log_dir)
            .iter()
            .flat_map(|d| task_files_in(d))
            .collect()),
    }
}

/// Lines of a file that were skipped, reported on stderr (at most [`MAX_REPORTED`] each).
#[derive(Debug, Default)]
struct Skips {
    count: usize,
}

const MAX_REPORTED: usize = 20;

impl Skips {
    fn skip(&mut self, file: &Path, line: usize, why: &str) {
        self.count += 1;
        if self.count <= MAX_REPORTED {
            eprintln!(
                "flowrepl log: {}: line {line} skipped: {why}",
                file.display()
            );
        }
    }

    fn finish(&self, file: &Path) {
        if self.count > MAX_REPORTED {
            eprintln!(
                "flowrepl log: {}: {} more lines skipped",
                file.display(),
                self.count - MAX_REPORTED
            );
        }
    }
}

/// Calls `f` for every non-blank complete line of `file`, with its number and a [`Skips`]
/// to report a line the caller cannot use; reports an unreadable file, a torn last line and
/// a read error itself. Returns the number of lines skipped.
fn each_line(file: &Path, mut f: impl FnMut(usize, &[u8], &mut Skips)) -> usize {
    let reader = match std::fs::File::open(file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flowrepl log: {}: cannot read: {e}", file.display());
            return 0;
        }
    };
    let mut skips = Skips::default();
    let torn = for_each_line(reader, |no, line| {
        if !line.iter().all(u8::is_ascii_whitespace) {
            f(no, line, &mut skips);
        }
    });
    match torn {
        Ok(Some(no)) => skips.skip(file, no, "incomplete last line"),
        Ok(None) => {}
        Err(e) => eprintln!("flowrepl log: {}: reading stopped: {e}", file.display()),
    }
    skips.finish(file);
    skips.count
}

/// Calls `f` for every record of `file`, in order, reporting what it skips. An unreadable
/// file is reported and counts as empty. Returns the number of lines skipped.
fn each_record(file: &Path, mut f: impl FnMut(Record)) -> usize {
    each_line(file, |no, line, skips| match parse_line(line) {
        Ok(r) => f(r),
        Err(why) => skips.skip(file, no, &why),
    })
}

/// Writes a line of the command's output. `flowrepl log` runs without a session (before
/// stdio is taken or any Python is loaded), so stdout is its own here and
/// never the protocol channel; all of its output goes through this one place, and a closed stdout (`| head`) ends the command quietly.
fn say(text: impl std::fmt::Display) -> Result<(), LogCmdError> {
    use std::io::Write;
    writeln!(std::io::stdout().lock(), "{text}").map_err(io_err("writing to stdout"))
}

/// Prints a JSON document on stdout.
fn print_json(value: &serde_json::Value) -> Result<(), LogCmdError> {
    say(serde_json::to_string_pretty(value).expect("JSON values serialize"))
}

/// `context`: the task's last context record.
fn context(log_dir: &Path, scope: &Scope) -> Result<Read, LogCmdError> {
    let (plan, task) = one_task(scope);
    let file = task_file(log_dir, &plan, &task)?;
    let mut last = None;
    each_record(&file, |r| {
        if let Record::Context(c) = r {
            last = Some(c);
        }
    });
    let Some(c) = last else {
        if scope.json {
            print_json(&serde_json::json!({"plan_id": plan, "task_id": task, "context": null}))?;
        } else {
            eprintln!("flowrepl log: plan {plan:?} task {task:?} has no context yet");
        }
        return Ok(Read::Nothing);
    };
    let context: serde_json::Value =
        serde_json::from_str(c.context.get()).unwrap_or(serde_json::Value::Null);
    if scope.json {
        print_json(&serde_json::json!({
            "plan_id": plan,
            "task_id": task,
            "session_id": c.head.task.session_id,
            "execution_count": c.head.execution_count,
            "timestamp": c.timestamp,
            "context": context,
        }))?;
    } else {
        say(format!(
            "# plan {plan}, task {task}: set by cell {} of session {} at {}",
            c.head.execution_count,
            short_id(&c.head.task.session_id),
            c.timestamp
        ))?;
        print_json(&context)?;
    }
    Ok(Read::Something)
}

/// The first 8 characters of a session id.
fn short_id(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}
