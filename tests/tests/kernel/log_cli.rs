//! The task log as a product: `flowrepl log` over logs the real kernel wrote (both modes,
//! with events and context), the documented queries through jq, pandas and DuckDB, nbformat
//! for the notebook export, bad input, and many kernels appending to one file.
//!
//! Size: one scenario per `flowrepl log` subcommand, and the documented jq/pandas/DuckDB queries.

use flowrepl_tests::mcp::mcp_venv;
use flowrepl_tests::{flowrepl_bin, Kernel, MODES};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `flowrepl log ARGS` on `log_dir`: (exit code, stdout, stderr).
fn log(log_dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(flowrepl_bin())
        .arg("log")
        .args(args)
        .env("FLOWREPL_LOG_DIR", log_dir)
        .env_remove("FLOW_PLAN_ID")
        .env_remove("FLOW_TASK_ID")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn log_json(log_dir: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let (code, out, err) = log(log_dir, &a);
    assert_eq!(code, 0, "flowrepl log {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

const HOSTILE: &str = "../ évil/task\nname";

/// Logs of plan `plan-log`: one task per mode (3 cells: one with output, an event and a
/// context change, one that fails, one with a value), and a task with a hostile name.
fn make_logs(dir: &Path) {
    for mode in MODES {
        let mut k = Kernel::options()
            .mode(mode)
            .log_dir(dir)
            .env("FLOW_PLAN_ID", "plan-log")
            .env("FLOW_TASK_ID", format!("t-{mode}"))
            .start();
        k.ok("import json\nprint('hello')\nflow.event('loaded', rows=3)\nwith flow.step('fit'):\n    pass\nflow.context.update({'stage': 'fit', 'n': 1})");
        k.execute("def f():\n    return 1 / 0\nf()");
        k.ok("x = 41\nx + 1");
        assert!(k.close().success());
    }
    let mut k = Kernel::options()
        .log_dir(dir)
        .env("FLOW_PLAN_ID", "plan-log")
        .env("FLOW_TASK_ID", HOSTILE)
        .start();
    k.ok("y = 1");
    assert!(k.close().success());
}

#[test]
fn every_subcommand_with_and_without_json() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_logs(dir);

    // ls
    let ls = log_json(dir, &["ls"]);
    let tasks = ls["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3, "{ls:#}");
    let t = tasks.iter().find(|t| t["task_id"] == "t-worker").unwrap();
    assert_eq!(
        (t["cells"].as_u64(), t["failures"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(t["sessions"], 1);
    assert!(
        tasks.iter().any(|t| t["task_id"] == HOSTILE),
        "ids come from the records"
    );
    let (code, text, _) = log(dir, &["ls"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("t-in_process") && text.contains("plan-log"),
        "{text}"
    );

    // show
    let show = log_json(dir, &["show", "--plan", "plan-log", "--task", "t-worker"]);
    let cells = show["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 3);
    assert_eq!(cells[0]["stdout_head"], "hello");
    assert_eq!(cells[0]["events"][0]["name"], "loaded");
    assert_eq!(
        cells[0]["context_changes"][0],
        json!({"stage": "fit", "n": 1})
    );
    assert_eq!(cells[1]["error_type"], "ZeroDivisionError");
    assert_eq!(cells[2]["result"], "42");
    assert_eq!(
        show["sessions"].as_array().unwrap().len(),
        2,
        "start and end"
    );
    let worker_show = |extra: &[&str]| {
        let mut args = vec!["show", "--plan", "plan-log", "--task", "t-worker"];
        args.extend_from_slice(extra);
        log_json(dir, &args)
    };
    let failed = worker_show(&["--failed"]);
    assert_eq!(failed["cells"].as_array().unwrap().len(), 1);
    let session = cells[0]["session_id"].as_str().unwrap();
    let by_session = worker_show(&["--session", &session[..8]]);
    assert_eq!(by_session["cells"].as_array().unwrap().len(), 3);
    let later = worker_show(&["--since", "2999-01-01"]);
    assert!(later["cells"].as_array().unwrap().is_empty());
    let (code, text, _) = log(
        dir,
        &["show", "--plan", "plan-log", "--task", "t-in_process"],
    );
    assert_eq!(code, 0);
    for want in [
        "[1] ok",
        "print('hello')",
        "event 1 loaded",
        "context {\"stage\":\"fit\",\"n\":1}",
        "ZeroDivisionError",
        "Out[3]: 42",
        "session",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    let hostile = log_json(dir, &["show", "--plan", "plan-log", "--task", HOSTILE]);
    assert_eq!(hostile["cells"][0]["code"], "y = 1");

    // stats
    let stats = log_json(dir, &["stats", "--plan", "plan-log"]);
    assert_eq!(stats["cells"], 7, "{stats:#}");
    assert_eq!(stats["failures"], 2);
    assert_eq!(stats["sessions"], 3);
    assert_eq!(
        stats["top_errors"][0],
        json!({"error_type": "ZeroDivisionError", "count": 2})
    );
    assert!(stats["imports"]
        .as_array()
        .unwrap()
        .contains(&json!({"module": "json", "count": 2})));
    let events = stats["events"].as_array().unwrap();
    assert!(
        events.contains(&json!({"name": "loaded", "count": 2})),
        "{events:?}"
    );
    assert!(
        stats["elapsed_ms"]["p95"].as_f64().unwrap()
            >= stats["elapsed_ms"]["p50"].as_f64().unwrap()
    );
    assert_eq!(stats["slowest"].as_array().unwrap().len(), 5);
    let (code, text, _) = log(dir, &["stats"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("success rate") && text.contains("ZeroDivisionError (2)"),
        "{text}"
    );

    // context
    let ctx = log_json(
        dir,
        &["context", "--plan", "plan-log", "--task", "t-in_process"],
    );
    assert_eq!(ctx["context"], json!({"stage": "fit", "n": 1}));
    assert_eq!(ctx["execution_count"], 1);
    let (code, text, _) = log(
        dir,
        &["context", "--plan", "plan-log", "--task", "t-in_process"],
    );
    assert_eq!(code, 0);
    assert!(text.contains("\"stage\": \"fit\""), "{text}");
    let (code, _, err) = log(dir, &["context", "--plan", "plan-log", "--task", HOSTILE]);
    assert_eq!(code, 1, "no context yet: nothing read");
    assert!(err.contains("no context"), "{err}");

    // tail (without -f)
    let (code, text, _) = log(
        dir,
        &[
            "tail", "--plan", "plan-log", "--task", "t-worker", "-n", "1",
        ],
    );
    assert_eq!(code, 0);
    assert!(
        text.contains("Out[3]: 42") && !text.contains("hello"),
        "{text}"
    );
    let (code, text, _) = log(dir, &["tail", "--plan", "plan-log", "-n", "2", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(text.lines().count(), 2, "{text}");
    for line in text.lines() {
        serde_json::from_str::<Value>(line).unwrap();
    }
}

#[test]
fn exports_run_as_a_script_and_validate_as_a_notebook() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_logs(dir);
    let py = mcp_venv().join("bin/python");
    for mode in MODES {
        let task = format!("t-{mode}");
        let script = tmp.path().join(format!("{mode}.py"));
        let nb = tmp.path().join(format!("{mode}.ipynb"));
        let s = script.display().to_string();
        let n = nb.display().to_string();
        let (code, _, err) = log(
            dir,
            &[
                "export", "--plan", "plan-log", "--task", &task, "--format", "py", "-o", &s,
            ],
        );
        assert_eq!(code, 0, "{err}");
        let text = std::fs::read_to_string(&script).unwrap();
        assert!(
            text.contains("# In[1]") && text.contains("# In[3]") && !text.contains("1 / 0"),
            "{text}"
        );
        let compiles = Command::new(&py)
            .args(["-m", "py_compile", &s])
            .status()
            .unwrap();
        assert!(compiles.success());
        let (code, _, err) = log(
            dir,
            &[
                "export", "--plan", "plan-log", "--task", &task, "--format", "ipynb", "-o", &n,
            ],
        );
        assert_eq!(code, 0, "{err}");
        let check = Command::new(&py)
            .args([
                "-c",
                "import sys, nbformat\n\
                 nb = nbformat.read(sys.argv[1], as_version=4)\n\
                 nbformat.validate(nb)\n\
                 kinds = [[o['output_type'] for o in c.outputs] for c in nb.cells]\n\
                 assert kinds == [['stream', 'execute_result'], ['error'], ['execute_result']], kinds\n\
                 assert [c.execution_count for c in nb.cells] == [1, 2, 3]\n\
                 assert nb.cells[1].outputs[0].ename == 'ZeroDivisionError'\n\
                 assert 'Traceback' in ''.join(nb.cells[1].outputs[0].traceback)\n\
                 assert nb.cells[2].outputs[0].data['text/plain'] == '42'\n\
                 print('ok')",
                &n,
            ])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        // --json without -o: the document inside one JSON object.
        let doc = log_json(
            dir,
            &[
                "export", "--plan", "plan-log", "--task", &task, "--format", "ipynb",
            ],
        );
        assert_eq!(doc["notebook"]["nbformat"], 4);
    }
}

/// Runs a shell command in `cwd`; its stdout.
fn sh(cwd: &Path, cmd: &str) -> String {
    let out = Command::new("bash")
        .args(["-c", cmd])
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `sql` with DuckDB's Python API in `cwd` (the CLI may not be installed); it must
/// return rows.
fn duckdb_rows(py: &Path, cwd: &Path, sql: &str) {
    let out = Command::new(py)
        .args([
            "-c",
            "import sys, duckdb\nrows = duckdb.sql(sys.argv[1]).fetchall()\nassert rows, 'no rows'",
            sql,
        ])
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{sql}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The fenced blocks of `lang` in a Markdown file.
fn blocks(file: &Path, lang: &str) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        match &mut cur {
            None if line.trim() == format!("```{lang}") => cur = Some(String::new()),
            Some(b) if line.trim() == "```" => {
                out.push(std::mem::take(b));
                cur = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn the_documented_queries_run_with_jq_pandas_and_duckdb() {
    assert!(
        Command::new("jq").arg("--version").output().is_ok(),
        "jq is not installed (.ci/run installs it)"
    );
    // Logs where the docs look: .flowrepl/logs under the working directory, task local/adhoc,
    // plus a second plan.
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let logs = cwd.join(".flowrepl/logs");
    make_logs(&logs);
    for mode in MODES {
        // Compat mode: an approval nobody can answer (two approval events, at once).
        let mut k = Kernel::options()
            .mode(mode)
            .log_dir(&logs)
            .arg("--compat")
            .arg("json-repl")
            .start();
        k.ok("import json\nflow.event('loaded', rows=1)\nflow.context.update({'k': 1})\nflow.request_approval('ok?')");
        k.execute("1/0");
        assert!(k.close().success());
    }
    let root = flowrepl_tests::workspace_root();
    let py = mcp_venv().join("bin/python");
    let mut ran = 0;
    for doc in [root.join("README.md"), root.join("docs/task-log.md")] {
        for block in blocks(&doc, "sh") {
            for line in block
                .lines()
                .filter(|l| l.starts_with("jq ") || l.starts_with("duckdb "))
            {
                if let Some(q) = line.strip_prefix("duckdb -c \"") {
                    // The DuckDB CLI may not be installed: the same query through its Python API.
                    duckdb_rows(&py, cwd, q.trim_end().trim_end_matches('"'));
                    ran += 1;
                    continue;
                }
                let out = sh(cwd, line);
                assert!(!out.trim().is_empty(), "{line} printed nothing");
                ran += 1;
            }
        }
        for block in blocks(&doc, "python") {
            let out = Command::new(&py)
                .args(["-c", &format!("{block}\nprint('ok')")])
                .current_dir(cwd)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {block}\n{}",
                doc.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            ran += 1;
        }
        for block in blocks(&doc, "sql") {
            let sql = block
                .lines()
                .filter(|l| !l.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            duckdb_rows(&py, cwd, &sql);
            ran += 1;
        }
    }
    assert!(ran >= 6, "only {ran} documented queries found");
    // pandas over every file of a plan: the same dtypes in every file; DuckDB over all logs.
    let check = Command::new(&py)
        .args([
            "-c",
            r#"
import glob, sys, duckdb, pandas as pd
files = sorted(glob.glob(sys.argv[1] + "/plan-log/*.jsonl"))
assert len(files) == 3, files
frames = [pd.read_json(f, lines=True) for f in files]
cols = ["type", "version", "plan_id", "task_id", "session_id", "execution_count", "success", "elapsed_ms"]
for f, df in zip(files, frames):
    for c in cols:
        assert c in df.columns, (f, c)
dtypes = [tuple(str(df[c].dtype) for c in ["type", "version", "plan_id", "session_id"]) for df in frames]
assert len(set(dtypes)) == 1, dtypes
cells = pd.concat(frames)
cells = cells[cells.type == "execution"]
assert len(cells) == 7, len(cells)
assert str(cells.elapsed_ms.dtype) == "float64", cells.elapsed_ms.dtype
n = duckdb.sql(f"select count(*) from read_json_auto('{sys.argv[1]}/*/*.jsonl', format='newline_delimited', union_by_name=true) where type = 'execution'").fetchall()[0][0]
assert n == 11, n
print("ok")
"#,
            &logs.display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn bad_input_is_named_and_the_rest_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // No log directory at all.
    let (code, out, err) = log(&dir.join("missing"), &["ls"]);
    assert_eq!(code, 1);
    assert!(out.is_empty() && err.contains("does not exist"), "{err}");
    make_logs(dir);
    // Unknown plan and task: the message lists what exists.
    let (code, _, err) = log(dir, &["show", "--plan", "nope", "--task", "x"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no plan \"nope\"") && err.contains("plan-log"),
        "{err}"
    );
    let (code, _, err) = log(dir, &["show", "--plan", "plan-log", "--task", "nope"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no task \"nope\"") && err.contains("t-worker"),
        "{err}"
    );
    // A corrupt line, a record of a newer version, a torn last line: named with their line
    // numbers; every other record is still read.
    let file = flowrepl_task_logger::task_log_path(dir, "plan-log", "t-worker");
    let mut text = std::fs::read_to_string(&file).unwrap();
    let lines_before = text.lines().count();
    text.push_str("{not json\n");
    text.push_str("{\"type\":\"execution\",\"version\":99,\"plan_id\":\"p\",\"task_id\":\"t\",\"session_id\":\"s\"}\n");
    text.push_str("{\"type\":\"execution\",\"vers");
    std::fs::write(&file, text).unwrap();
    let (code, out, err) = log(
        dir,
        &["show", "--plan", "plan-log", "--task", "t-worker", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["cells"].as_array().unwrap().len(), 3);
    for n in 1..=3 {
        assert!(
            err.contains(&format!("line {} skipped", lines_before + n)),
            "line {}: {err}",
            lines_before + n
        );
    }
    assert!(
        err.contains("newer than 1") && err.contains("incomplete last line"),
        "{err}"
    );
    let stats = log_json(dir, &["stats", "--plan", "plan-log", "--task", "t-worker"]);
    assert_eq!(stats["skipped_lines"], 3);
    assert_eq!(stats["cells"], 3);
    // A file that cannot be read (a dangling link) is named; the other tasks are listed.
    std::os::unix::fs::symlink(dir.join("gone"), dir.join("plan-log/broken.jsonl")).unwrap();
    let (code, out, err) = log(dir, &["ls", "--plan", "plan-log", "--json"]);
    assert_eq!(code, 0);
    assert!(err.contains("broken.jsonl: cannot read"), "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["tasks"].as_array().unwrap().len(), 4);
    // Only garbage: nothing read, exit 1.
    let junk = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(junk.path().join("p")).unwrap();
    std::fs::write(junk.path().join("p/t.jsonl"), "garbage\n").unwrap();
    let (code, _, err) = log(junk.path(), &["stats"]);
    assert_eq!(code, 1, "{err}");
}

#[test]
fn tail_follows_a_file_created_later() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let mut child = Command::new(flowrepl_bin())
        .args([
            "log",
            "tail",
            "-f",
            "--plan",
            "plan-tail",
            "--task",
            "t",
            "--json",
        ])
        .env("FLOWREPL_LOG_DIR", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut k = Kernel::options()
        .log_dir(&dir)
        .env("FLOW_PLAN_ID", "plan-tail")
        .env("FLOW_TASK_ID", "t")
        .start();
    k.ok("print('followed')");
    k.sync();
    let mut seen: Vec<Value> = Vec::new();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !seen.iter().any(|r| r["type"] == "execution") {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("tail -f printed the new records");
        seen.push(serde_json::from_str(&line).unwrap());
    }
    assert_eq!(seen[0]["type"], "session", "{seen:?}");
    let cell = seen.iter().find(|r| r["type"] == "execution").unwrap();
    assert_eq!(cell["stdout"], "followed\n");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn four_kernels_append_two_thousand_intact_records_to_one_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().to_path_buf();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut k = Kernel::options()
                    .log_dir(&dir)
                    .env("FLOW_PLAN_ID", "plan-c")
                    .env("FLOW_TASK_ID", "shared")
                    .start();
                // 500 cells, pipelined; every 100th prints 1 MB.
                let mut batch = Vec::new();
                for n in 0..500 {
                    let code = if n % 100 == 7 {
                        format!("print('{i}' * 1_000_000)")
                    } else {
                        format!("k{n} = {n}")
                    };
                    let req = json!({"jsonrpc": "2.0", "id": n + 1, "method": "execute_code", "params": {"code": code}});
                    batch.extend_from_slice(serde_json::to_string(&req).unwrap().as_bytes());
                    batch.push(b'\n');
                }
                k.send_raw(&batch);
                for _ in 0..500 {
                    let r = k.recv();
                    assert_eq!(r["result"]["success"], true, "{r}");
                }
                assert!(k.close().success());
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let file = flowrepl_task_logger::task_log_path(&dir, "plan-c", "shared");
    let out = flowrepl_task_logger::read_records(&file).unwrap();
    assert!(
        out.skipped.is_empty(),
        "{:?}",
        &out.skipped[..out.skipped.len().min(3)]
    );
    assert_eq!(out.records.len(), 2000);
    assert_eq!(out.sessions.len(), 8, "a start and an end per kernel");
    let big: Vec<_> = out
        .records
        .iter()
        .filter(|r| r.stdout.len() > 1_000_000)
        .collect();
    assert_eq!(big.len(), 20);
    for r in big {
        let c = r.stdout.chars().next().unwrap();
        assert!(
            r.stdout.trim_end().chars().all(|x| x == c),
            "a 1 MB record is intact"
        );
    }
    let stats = log_json(&dir, &["stats", "--plan", "plan-c"]);
    assert_eq!(stats["cells"], 2000);
}

/// `log replay` rebuilds a task's state without a checkpoint: it lists (`--dry-run`) then
/// re-runs the successful cells in a fresh kernel, names the cells whose output differs,
/// writes no records, and leaves a checkpoint that `--resume` starts from.
#[test]
fn replay_rebuilds_the_state_from_the_log() {
    for mode in MODES {
        let logs = tempfile::tempdir().unwrap();
        let opts = || {
            Kernel::options()
                .mode(mode)
                .log_dir(logs.path())
                .env("FLOW_PLAN_ID", "plan-replay")
                .env("FLOW_TASK_ID", "t")
                .env("FLOWREPL_CHECKPOINTS", "off")
        };
        let mut k = opts().start();
        k.ok("import random\nx = 40\nprint('same')");
        k.ok("x += 2\nx");
        k.execute("1/0");
        k.ok("print(random.random())");
        assert!(k.close().success());
        let records_before = flowrepl_tests::read_log(&flowrepl_task_logger::task_log_path(
            logs.path(),
            "plan-replay",
            "t",
        ))
        .len();
        let scope = ["--plan", "plan-replay", "--task", "t"];
        let mut dry = vec!["replay", "--dry-run"];
        dry.extend(scope);
        let (code, out, _) = log(logs.path(), &dry);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("3 successful cells") && out.contains("side effects"),
            "{out}"
        );
        assert!(
            !logs.path().join("plan-replay/t.checkpoints").exists(),
            "dry run ran nothing"
        );
        let mut run = vec!["replay"];
        run.extend(scope);
        if mode == "worker" {
            run.push("--worker");
        }
        let doc = log_json(logs.path(), &run);
        assert_eq!(doc["replayed"], 3, "{mode}: {doc:#}");
        assert_eq!(doc["failed"], 0);
        assert_eq!(doc["differ"], 1, "the random number differs: {doc:#}");
        let cells = doc["cells"].as_array().unwrap();
        assert_eq!(cells[2]["differs"], json!(["stdout"]));
        assert_eq!(cells[1]["differs"], json!([]));
        assert_eq!(doc["checkpoint"]["checkpoint"], "auto", "{doc:#}");
        let records_after = flowrepl_tests::read_log(&flowrepl_task_logger::task_log_path(
            logs.path(),
            "plan-replay",
            "t",
        ))
        .len();
        assert_eq!(
            records_before, records_after,
            "replayed cells are not logged"
        );
        let mut k = opts()
            .env("FLOWREPL_CHECKPOINTS", "on-success")
            .arg("--resume")
            .start();
        let r = k.ok("(x, random.__name__)");
        assert_eq!(r["result"], "(42, 'random')", "{mode}: {r:#}");
        assert_eq!(r["restored"], true);
    }
}

/// On a terminal the tables fit its width (a pseudo-terminal of 50 columns made by
/// `script`), and colours are used; elsewhere they are not cut.
#[test]
fn tables_fit_the_terminal() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = Kernel::options().log_dir(logs.path()).start();
    k.ok("x = 1");
    assert!(k.close().success());
    let cmd = format!(
        "stty rows 20 cols 50; {} log ls --log-dir {}",
        flowrepl_bin().display(),
        logs.path().display()
    );
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\x1b["), "no colours on a terminal: {text}");
    let plain = {
        // Without the colour escapes.
        let mut s = String::new();
        let mut esc = false;
        for c in text.chars() {
            match (esc, c) {
                (false, '\x1b') => esc = true,
                (true, 'm') => esc = false,
                (true, _) => {}
                (false, c) => s.push(c),
            }
        }
        s
    };
    let widest = plain
        .lines()
        .map(|l| l.trim_end_matches('\r').chars().count())
        .max();
    assert!(widest.is_some_and(|w| w <= 50), "{plain}");
    let (_, wide, _) = log(logs.path(), &["ls"]);
    assert!(
        wide.lines().map(|l| l.chars().count()).max() > Some(50),
        "{wide}"
    );
}
