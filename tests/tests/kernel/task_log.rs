//! The per-task JSONL log.

use flowrepl_tests::{read_log, Kernel};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[test]
fn one_record_per_call_with_every_field() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = Kernel::options()
        .log_dir(logs.path())
        .env("FLOW_PLAN_ID", "plan-7")
        .env("FLOW_TASK_ID", "task-42")
        .env("FLOW_TASK_NAME", "Analyse sales")
        .start();
    let path = logs.path().join("plan-7/task-42.jsonl");
    assert_eq!(k.ready["log_file"], path.to_str().unwrap());
    k.ok("import json\nx = 1\nprint('hi')\nx");
    let failed = k.execute("1/0");
    k.ok("del x");
    k.sync();
    let recs = read_log(&path);
    assert_eq!(recs.len(), 3);
    let r = &recs[0];
    assert_eq!(r.kind, "execution");
    assert_eq!(r.version, 1);
    assert_eq!((&*r.plan_id, &*r.task_id), ("plan-7", "task-42"));
    assert_eq!(r.task_name.as_deref(), Some("Analyse sales"));
    assert_eq!(r.session_id, k.ready["session_id"].as_str().unwrap());
    assert_eq!(r.execution_count, 1);
    assert_eq!(r.code, "import json\nx = 1\nprint('hi')\nx");
    assert_eq!(r.stdout, "hi\n");
    assert!(r.success);
    assert_eq!(r.result.as_deref(), Some("1"));
    assert_eq!(&*r.added_vars, ["json", "x"]);
    assert!(r.added_imports.contains(&"json".to_owned()));
    assert_eq!(r.mode, "in_process");
    assert!(r.timestamp.ends_with('Z'));
    assert!(r.elapsed_ms > 0.0);
    let e = &recs[1];
    assert!(!e.success);
    assert_eq!(e.error_type.as_deref(), Some("ZeroDivisionError"));
    assert_eq!(e.stderr, failed["stderr"].as_str().unwrap());
    assert_eq!(&*recs[2].removed_vars, ["x"]);
    // Raw lines carry exactly the documented fields (the first line is the session's start).
    let line = std::fs::read_to_string(&path).unwrap();
    let start: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(
        (&start["type"], &start["event"]),
        (&json!("session"), &json!("start"))
    );
    let first: Value = serde_json::from_str(line.lines().nth(1).unwrap()).unwrap();
    for f in [
        "type",
        "version",
        "plan_id",
        "task_id",
        "task_name",
        "session_id",
        "execution_count",
        "timestamp",
        "elapsed_ms",
        "code",
        "stdout",
        "stderr",
        "success",
        "error_type",
        "added_vars",
        "removed_vars",
        "added_imports",
        "mode",
    ] {
        assert!(first.get(f).is_some(), "missing {f}");
    }
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn defaults_to_local_adhoc_under_dot_flowrepl() {
    let mut k = Kernel::options()
        .env("FLOWREPL_LOG_DIR", ".flowrepl/logs")
        .start();
    k.ok("x = 1");
    k.sync();
    let path = k.dir.path().join(".flowrepl/logs/local/adhoc.jsonl");
    assert_eq!(read_log(&path).len(), 1);
}

#[test]
fn hostile_ids_stay_inside_the_log_dir_and_do_not_collide() {
    let logs = tempfile::tempdir().unwrap();
    let ids = [
        "../../escape",
        "/etc/passwd",
        "",
        "a\u{0}b",
        "작업",
        &"x".repeat(10_000),
        "..",
        "%2E%2E",
    ];
    let mut files = std::collections::HashSet::new();
    for id in ids {
        let mut k = Kernel::options()
            .log_dir(logs.path())
            .env("FLOW_PLAN_ID", id.replace('\0', ""))
            .env("FLOW_TASK_ID", id.replace('\0', ""))
            .start();
        k.ok("x = 1");
        k.sync();
        let f = k.log_file();
        assert!(f.starts_with(logs.path()), "{id:?} -> {f:?}");
        assert!(f
            .canonicalize()
            .unwrap()
            .starts_with(logs.path().canonicalize().unwrap()));
        let recs = read_log(&f);
        assert_eq!(recs.len(), 1, "{id:?}");
        assert_eq!(recs[0].task_id, id.replace('\0', ""));
        assert!(files.insert(f), "{id:?} collided");
    }
    // Nothing was written outside the log dir's tree.
    assert!(!logs.path().parent().unwrap().join("escape").exists());
}

fn blocked_log_dir(tmp: &Path) -> std::path::PathBuf {
    // A regular file where a directory should be: every open fails, even for root.
    let file = tmp.join("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    file.join("logs")
}

#[test]
fn an_unwritable_log_never_fails_the_cell_and_logging_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let log_dir = blocked_log_dir(tmp.path());
    // Checkpoints off: the blocked folder also fails the automatic checkpoint after the first
    // cell, which the next cell would report (or not, by timing); the task log is the subject.
    let mut k = Kernel::options()
        .log_dir(&log_dir)
        .env("FLOWREPL_CHECKPOINTS", "off")
        .start();
    let err = k.stderr_with("task log unavailable");
    assert!(err.contains("task log unavailable"), "{err}");
    let r = k.ok("x = 1\nx");
    assert_eq!(r["result"], "1");
    let w = r["warnings"].as_array().unwrap();
    assert_eq!(w.len(), 1);
    assert!(
        w[0].as_str()
            .unwrap()
            .starts_with("task log: cannot open task log"),
        "{w:?}"
    );
    // Fix the cause: the next record is written.
    std::fs::remove_file(tmp.path().join("not-a-dir")).unwrap();
    let r = k.ok("y = 2");
    assert_eq!(r["warnings"], serde_json::json!([]));
    k.sync();
    let recs = read_log(&log_dir.join("local/adhoc.jsonl"));
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].execution_count, 2);
}

#[test]
fn a_full_disk_is_a_warning() {
    let logs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(logs.path().join("local")).unwrap();
    std::os::unix::fs::symlink("/dev/full", logs.path().join("local/adhoc.jsonl")).unwrap();
    let mut k = Kernel::options().log_dir(logs.path()).start();
    // Records are written after the reply (on the writer thread), so a failed write is
    // reported with a later result, and on stderr at once. `sync` waits for the writer.
    let r = k.ok("x = 1");
    assert_eq!(r["warnings"], serde_json::json!([]));
    k.sync();
    let r = k.ok("y = 2");
    let w = r["warnings"][0].as_str().unwrap();
    assert!(
        w.contains("record of execution 1 was not written")
            && w.contains("cannot write to task log"),
        "{w}"
    );
    assert!(k
        .stderr_with("task log record not written")
        .contains("task log record not written"));
}

#[test]
fn concurrent_kernels_on_one_task_file_never_interleave() {
    let logs = tempfile::tempdir().unwrap();
    let code = "print('x' * 200_000)\nfor i in range(20):\n    print(i)";
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let dir = logs.path().to_path_buf();
            std::thread::spawn(move || {
                let mut k = Kernel::options().log_dir(&dir).start();
                let mut batch = Vec::new();
                for i in 0..60 {
                    batch.extend_from_slice(
                        serde_json::json!({"jsonrpc":"2.0","id":i,"method":"execute_code","params":{"code":code}}).to_string().as_bytes(),
                    );
                    batch.push(b'\n');
                }
                k.send_raw(&batch);
                for _ in 0..60 {
                    assert_eq!(k.recv()["result"]["success"], true);
                }
                k.sync();
                k.ready["session_id"].as_str().unwrap().to_owned()
            })
        })
        .collect();
    let sessions: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let recs = read_log(&logs.path().join("local/adhoc.jsonl"));
    assert_eq!(recs.len(), 180);
    for s in &sessions {
        let mine: Vec<u64> = recs
            .iter()
            .filter(|r| &*r.session_id == s)
            .map(|r| r.execution_count)
            .collect();
        assert_eq!(mine, (1..=60).collect::<Vec<_>>());
    }
    assert!(recs.iter().all(|r| r.stdout.len()
        == 200_001 + (0..20).map(|i: i32| i.to_string().len() + 1).sum::<usize>()));
}

#[test]
fn the_log_path_is_absolute_so_chdir_in_a_cell_does_not_move_it() {
    let mut k = Kernel::options()
        .env("FLOWREPL_LOG_DIR", "rel/logs")
        .start();
    let path = k.dir.path().join("rel/logs/local/adhoc.jsonl");
    assert_eq!(k.ready["log_file"], path.to_str().unwrap());
    // A relative log dir is resolved once, at start: a cell moving the working directory
    // does not move the log (which is reopened by path after any failure).
    k.ok("import os, tempfile; os.chdir(tempfile.mkdtemp())");
    k.ok("x = 1");
    k.sync();
    assert_eq!(read_log(&path).len(), 2);
}

#[test]
fn large_and_small_records_stay_in_order() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = Kernel::options().log_dir(logs.path()).start();
    let mut batch = Vec::new();
    for i in 0..40 {
        // Every third cell's record is large enough for the writer thread.
        let code = if i % 3 == 0 {
            "print('z' * 300_000)"
        } else {
            "n = 1"
        };
        batch.extend_from_slice(
            serde_json::json!({"jsonrpc":"2.0","id":i,"method":"execute_code","params":{"code":code}})
                .to_string()
                .as_bytes(),
        );
        batch.push(b'\n');
    }
    k.send_raw(&batch);
    for _ in 0..40 {
        assert_eq!(k.recv()["result"]["success"], true);
    }
    k.sync();
    let recs = read_log(&logs.path().join("local/adhoc.jsonl"));
    let counts: Vec<u64> = recs.iter().map(|r| r.execution_count).collect();
    assert_eq!(counts, (1..=40).collect::<Vec<_>>());
    assert!(recs.iter().step_by(3).all(|r| r.stdout.len() == 300_001));
}

/// A kernel leaves a start and an end record even when it runs no cell, and the end says why
/// it ended: EOF, `shutdown`, or SIGTERM.
#[test]
fn session_records_bracket_every_kernel_run() {
    use flowrepl_tests::MODES;
    let sessions =
        |dir: &Path| flowrepl_tests::read_log_all(&dir.join("local/adhoc.jsonl")).sessions;
    for mode in MODES {
        // No cell, stdin closed.
        let logs = tempfile::tempdir().unwrap();
        let mut k = Kernel::options().mode(mode).log_dir(logs.path()).start();
        assert!(k.close().success());
        let s = sessions(logs.path());
        assert_eq!(s.len(), 2, "{mode}: {s:?}");
        assert_eq!((&*s[0].event, &*s[1].event), ("start", "end"), "{mode}");
        assert_eq!(s[1].reason.as_deref(), Some("eof"), "{mode}");
        assert_eq!((s[1].cells, s[1].failures), (Some(0), Some(0)), "{mode}");
        assert_eq!(s[0].mode, mode, "{mode}");
        assert_eq!(s[0].front, "jsonrpc");
        assert_eq!(s[0].limits.kill_grace_ms, 2000);
        assert_eq!(s[0].head.session_id, s[1].head.session_id);
        // shutdown after a failing cell.
        let logs = tempfile::tempdir().unwrap();
        let mut k = Kernel::options().mode(mode).log_dir(logs.path()).start();
        k.execute("1/0");
        k.call("shutdown", Value::Null);
        assert!(k.wait().success());
        let s = sessions(logs.path());
        assert_eq!(s[1].reason.as_deref(), Some("shutdown"), "{mode}");
        assert_eq!((s[1].cells, s[1].failures), (Some(1), Some(1)), "{mode}");
        // SIGTERM.
        let logs = tempfile::tempdir().unwrap();
        let k = Kernel::options().mode(mode).log_dir(logs.path()).start();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(k.pid() as i32, libc::SIGTERM) };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while sessions(logs.path()).len() < 2 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let s = sessions(logs.path());
        assert_eq!(
            s.last().unwrap().reason.as_deref(),
            Some("signal"),
            "{mode}: {s:?}"
        );
    }
}
