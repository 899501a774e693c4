//! `flowrepl log tail [-f]`: the last cells of a task (or of every task of a plan), then,
//! with `-f`, every record as it is appended, polling every [`POLL`]. A file (or a plan
//! directory) that does not exist yet is waited for; a file that shrinks (replaced) is read
//! again from its start. `--json` prints the records as written, one per line.

use super::show::{cell_text, read_task, session_text, Cell, TaskLog};
use super::{one_task, plan_dir_of, say, task_file, task_files_in, LogCmdError, Read, Scope};
use flowrepl_task_logger::{parse_line, Record};
use std::collections::HashMap;
use std::io::{Read as _, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often `-f` looks for new records.
pub const POLL: Duration = Duration::from_millis(200);

/// What `tail` watches.
enum Target {
    Task(PathBuf),
    Plan(PathBuf),
}

impl Target {
    fn files(&self) -> Vec<PathBuf> {
        match self {
            Target::Task(f) => vec![f.clone()],
            Target::Plan(dir) => task_files_in(dir),
        }
    }
}

/// `tail`.
pub fn run(log_dir: &Path, scope: &Scope, follow: bool, n: usize) -> Result<Read, LogCmdError> {
    let target = match (&scope.plan, &scope.task) {
        (Some(plan), None) => match plan_dir_of(log_dir, plan) {
            Ok(d) => Target::Plan(d),
            Err(_) if follow => {
                Target::Plan(log_dir.join(flowrepl_task_logger::safe_component(plan)))
            }
            Err(e) => return Err(e),
        },
        _ => {
            let (plan, task) = one_task(scope);
            match task_file(log_dir, &plan, &task) {
                Ok(f) => Target::Task(f),
                Err(_) if follow => {
                    Target::Task(flowrepl_task_logger::task_log_path(log_dir, &plan, &task))
                }
                Err(e) => return Err(e),
            }
        }
    };
    let files = target.files();
    let several = matches!(target, Target::Plan(_));
    // The last n cells, by time, over every file.
    let mut cells: Vec<(String, Cell)> = Vec::new();
    let mut records = 0;
    let mut offsets: HashMap<PathBuf, u64> = HashMap::new();
    for f in &files {
        let log: TaskLog = read_task(f);
        records += log.records;
        offsets.insert(f.clone(), std::fs::metadata(f).map_or(0, |m| m.len()));
        let name = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        cells.extend(log.cells.into_iter().map(|c| (name.clone(), c)));
    }
    cells.sort_by(|a, b| a.1.record.timestamp.cmp(&b.1.record.timestamp));
    let skip = cells.len().saturating_sub(n);
    for (task, c) in cells.iter().skip(skip) {
        let text = if scope.json {
            super::show::cell_json(c).to_string()
        } else if several {
            format!("task {task}\n{}", cell_text(c))
        } else {
            cell_text(c)
        };
        if say(text).is_err() {
            return Ok(Read::from_count(records));
        }
    }
    if !follow {
        return Ok(Read::from_count(records));
    }
    let mut partial: HashMap<PathBuf, Vec<u8>> = HashMap::new();
    loop {
        for f in target.files() {
            let from = offsets.get(&f).copied().unwrap_or(0);
            let Ok(mut file) = std::fs::File::open(&f) else {
                continue;
            };
            let len = file.metadata().map_or(0, |m| m.len());
            let from = if len < from {
                partial.remove(&f);
                0 // replaced or truncated: start again
            } else {
                from
            };
            if len == from {
                continue;
            }
            let mut bytes = Vec::new();
            if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut bytes).is_err() {
                continue;
            }
            offsets.insert(f.clone(), from + bytes.len() as u64);
            let buf = partial.entry(f.clone()).or_default();
            buf.extend_from_slice(&bytes);
            let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            let complete: Vec<u8> = buf.drain(..=last_nl).collect();
            let task = f
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !print_new(&complete, scope.json, several.then_some(task.as_str())) {
                return Ok(Read::Something);
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Prints new complete lines; false when stdout is gone.
fn print_new(lines: &[u8], json: bool, task: Option<&str>) -> bool {
    for line in lines.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let text = if json {
            if serde_json::from_slice::<serde_json::Value>(line).is_err() {
                continue;
            }
            String::from_utf8_lossy(line).into_owned()
        } else {
            let prefix = task.map(|t| format!("task {t}\n")).unwrap_or_default();
            match parse_line(line) {
                Ok(Record::Execution(r)) => {
                    let c = Cell {
                        record: *r,
                        contexts: Vec::new(),
                    };
                    format!("{prefix}{}", cell_text(&c))
                }
                Ok(Record::Session(s)) => session_text(&s),
                Ok(Record::Context(c)) => format!("  context {}", c.context.get()),
                Ok(Record::File(f)) => format!(
                    "  file {} {} ({} bytes, {}{})",
                    f.op,
                    f.path,
                    f.bytes,
                    f.via,
                    f.error
                        .as_deref()
                        .map(|e| format!("; refused: {e}"))
                        .unwrap_or_default()
                ),
                Ok(Record::Install(i)) => format!(
                    "  install {} ({}, {}, {:.0} ms{})",
                    if i.added.is_empty() {
                        i.requested.join(" ")
                    } else {
                        i.added.join(" ")
                    },
                    i.trigger,
                    i.source,
                    i.elapsed_ms,
                    i.error
                        .as_deref()
                        .map(|e| format!("; failed: {}", e.lines().next().unwrap_or_default()))
                        .unwrap_or_default()
                ),
                Ok(Record::Egress(e)) => format!(
                    "  egress {} {}:{} ({}, {} bytes up, {} down, {:.0} ms{})",
                    if e.allowed { "allowed" } else { "refused" },
                    e.host,
                    e.port,
                    e.via,
                    e.bytes_up,
                    e.bytes_down,
                    e.duration_ms,
                    e.error
                        .as_deref()
                        .map(|x| format!("; {x}"))
                        .unwrap_or_default()
                ),
                Ok(Record::Event(_)) | Err(_) => continue,
            }
        };
        if say(text).is_err() {
            return false;
        }
    }
    true
}
