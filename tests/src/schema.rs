//! Every task log a test makes is checked against `docs/schema/v1` (strictly: no field the
//! schema does not describe) by one long-lived `tests/schema/validate.py --serve` per test
//! process, run with the MCP venv's Python (which has `jsonschema`).

use crate::mcp::mcp_venv;
use crate::workspace_root;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

struct Validator {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn validator() -> &'static Mutex<Validator> {
    static V: OnceLock<Mutex<Validator>> = OnceLock::new();
    V.get_or_init(|| {
        let mut child = Command::new(mcp_venv().join("bin/python"))
            .arg(workspace_root().join("tests/schema/validate.py"))
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start tests/schema/validate.py");
        Mutex::new(Validator {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            _child: child,
        })
    })
}

/// The `.jsonl` files under `dir`, at any depth.
pub fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                // Checkpoint folders (`<task>.checkpoints/`) hold journals, package layers
                // (`<task>.packages/`) packages: neither holds task logs.
                if p.extension()
                    .is_none_or(|x| x != "checkpoints" && x != "packages")
                {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "jsonl")
                && std::fs::metadata(&p).is_ok_and(|m| m.is_file())
            {
                // Regular files only: a test points a log at /dev/full.
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Checks every record of every log under `dir` against the schema; panics naming the first
/// record that does not match. Returns how many records were checked.
pub fn validate_logs(dir: &Path) -> usize {
    let mut total = 0;
    let mut v = validator().lock().unwrap_or_else(|p| p.into_inner());
    for file in log_files(dir) {
        writeln!(v.stdin, "{}", file.display()).expect("validator stdin");
        v.stdin.flush().unwrap();
        let mut answer = String::new();
        v.stdout.read_line(&mut answer).expect("validator answer");
        match answer.trim_end().strip_prefix("ok ") {
            Some(n) => total += n.parse::<usize>().unwrap_or(0),
            None => panic!("a task-log record does not match docs/schema/v1: {answer}"),
        }
    }
    total
}
