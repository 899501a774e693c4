//! Checkpoints: what a restore brings back (and says it lost), after a worker death, on
//! `restart {restore}`, `restore`, and `--resume` across kernels; atomic writes; isolation
//! between tasks; limits and bad input.

use flowrepl_tests::mcp::mcp_venv;
use flowrepl_tests::{exited, kill, read_log_all, wait_for, Kernel, KernelOptions, MODES};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// A kernel on the test venv (numpy, pandas, cloudpickle) for `task`, logging to `logs`.
fn rich(mode: &str, logs: &Path, task: &str) -> KernelOptions {
    Kernel::options()
        .mode(mode)
        .log_dir(logs)
        .arg("--python")
        .arg(mcp_venv().join("bin/python").display().to_string())
        .env("FLOW_PLAN_ID", "plan-snap")
        .env("FLOW_TASK_ID", task)
}

const SESSION: &str = r#"
import numpy as np
import pandas as pd
import threading
n = 42
nested = {"a": {"b": [1, 2, {"c": "é"}]}, "t": (1, 2)}
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
pt = Point(3, 4)
def double(v):
    return v * 2 + n - n
square = lambda v: v * v
arr = np.arange(12).reshape(3, 4)
df = pd.DataFrame({"k": ["a", "b"], "v": [1.5, 2.5]})
shared = [1]
alias = shared
inner = [9]
left = {"k": inner}
right = {"k": inner}
gen = (i for i in range(3))
fh = open(__file__ if "__file__" in globals() else "/etc/hostname")
lock = threading.Lock()
"#;

const CHECK: &str = r#"
assert n == 42 and nested["a"]["b"][2]["c"] == "é" and nested["t"] == (1, 2)
assert isinstance(pt, Point) and pt.norm2() == 25
assert double(4) == 8 and square(5) == 25
assert arr.shape == (3, 4) and int(arr.sum()) == 66
assert list(df["v"]) == [1.5, 2.5]
assert alias is shared and left["k"] is right["k"] is inner
assert np.__name__ == "numpy" and pd.__name__ == "pandas"
shared.append(2)
assert alias == [1, 2]
n = 43
assert double(1) == 2
'restored ok'
"#;

fn check_restored(r: &Value) {
    assert_eq!(r["success"], true, "{r:#}");
    assert_eq!(r["result"], "'restored ok'", "{r:#}");
    assert_eq!(r["restored"], true, "{r:#}");
    assert_eq!(r["state_lost"], true, "gen, fh and lock are gone: {r:#}");
    let lost = r["lost_vars"].as_object().expect("lost_vars");
    let mut names: Vec<&str> = lost.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["fh", "gen", "lock"], "{r:#}");
    assert!(lost["gen"].as_str().unwrap().contains("generator"));
    assert!(lost["fh"].as_str().unwrap().contains("open file"));
    assert!(lost["lock"].as_str().unwrap().contains("lock"));
    let restored: Vec<&str> = r["restored_vars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in [
        "n", "nested", "Point", "pt", "double", "square", "arr", "df", "np", "pd",
    ] {
        assert!(restored.contains(&name), "{name} not restored: {r:#}");
    }
    assert_eq!(r["checkpoint"], "auto");
}

/// Each way a worker dies or is killed: the next cell runs in the namespace of the last
/// checkpoint and says what came back and what did not.
#[test]
fn every_worker_fault_restores_the_last_checkpoint() {
    // (fault, kernel flags, cell, its timeout in ms)
    let faults: [(&str, &[&str], &str, u64); 5] = [
        ("os._exit", &[], "import os; os._exit(3)", 20_000),
        ("segfault", &[], "import ctypes; ctypes.string_at(0)", 20_000),
        (
            "timeout kill",
            &["--kill-grace-ms", "200"],
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)",
            300,
        ),
        ("cpu limit", &["--cpu-seconds", "1"], "while True: pass", 20_000),
        (
            "memory limit crash",
            &["--memory-mb", "1024"],
            // A C library that does not check malloc under the limit: NULL, then a write.
            "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\np = libc.malloc(2 << 30)\nctypes.memset(p, 1, 16)",
            20_000,
        ),
    ];
    for (name, args, code, timeout_ms) in faults {
        let logs = tempfile::tempdir().unwrap();
        let mut opts = rich("worker", logs.path(), "faults");
        for a in args {
            opts = opts.arg(*a);
        }
        let mut k = opts.start();
        k.ok(SESSION);
        k.wait_checkpoint(1);
        let params = json!({"code": code, "timeout_ms": timeout_ms});
        let r = k.execute_params(params);
        assert_eq!(r["success"], false, "{name}: {r:#}");
        assert_eq!(r["state_lost"], true, "{name}: {r:#}");
        assert!(
            r["warnings"]
                .to_string()
                .contains("from the last checkpoint"),
            "{name}: {r:#}"
        );
        let r = k.execute(CHECK);
        check_restored(&r);
        assert_eq!(r["checkpoint_execution_count"], 1, "{name}");
        // Reported once: the next cell is an ordinary one.
        let r = k.ok("n");
        assert!(r.get("restored").is_none(), "{name}: {r:#}");
        assert_eq!(r["result"], "43");
    }
}

/// SIGKILL from outside while idle: the next cell notices, and runs restored.
#[test]
fn a_worker_killed_while_idle_is_replaced_from_the_checkpoint() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = rich("worker", logs.path(), "idle-kill").start();
    k.ok(SESSION);
    k.wait_checkpoint(1);
    let pid = k.call("status", Value::Null)["result"]["worker_pid"]
        .as_u64()
        .unwrap() as u32;
    kill(pid, 9);
    assert!(wait_for(Duration::from_secs(10), || exited(pid)));
    let r = k.execute(CHECK);
    check_restored(&r);
    // The log records the restore with the cell.
    k.sync();
    let log = read_log_all(&k.log_file());
    let rec = log
        .records
        .iter()
        .find(|r| r.code.contains("restored ok"))
        .expect("record of the restored cell");
    let restored = rec.restored.as_ref().expect("restored in the record");
    assert_eq!(restored.checkpoint, "auto");
    assert!(restored.lost_vars.contains_key("gen"));
}

/// `restart {restore: true}` and `restore {name}`, in both modes.
#[test]
fn restart_with_restore_and_named_checkpoints() {
    for mode in MODES {
        let logs = tempfile::tempdir().unwrap();
        let mut k = rich(mode, logs.path(), "named").start();
        k.ok(SESSION);
        let c = k.call("checkpoint", json!({"name": "first"}))["result"].clone();
        assert_eq!(c["checkpoint"], "first", "{mode}: {c:#}");
        assert_eq!(c["full"], true);
        assert!(c["unsaved"]["gen"].is_string(), "{c:#}");
        k.ok("n = 1000\ndel square");
        let r = k.call("restart", json!({"restore": true}))["result"].clone();
        assert_eq!(r["restored"], true, "{mode}: {r:#}");
        assert_eq!(r["checkpoint_execution_count"], 2, "{mode}: {r:#}");
        assert!(r["message"].as_str().unwrap().contains("restored"), "{r}");
        let r = k.ok("(n, 'square' in globals())");
        assert_eq!(r["result"], "(1000, False)", "{mode}: the last state");
        let r = k.call("restore", json!({"name": "first"}))["result"].clone();
        assert_eq!(r["checkpoint"], "first", "{mode}: {r:#}");
        let r = k.execute(CHECK);
        assert_eq!(r["result"], "'restored ok'", "{mode}: {r:#}");
        let list = k.call("checkpoints", Value::Null)["result"].clone();
        let names: Vec<&str> = list["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["auto", "first"], "{mode}: {list:#}");
        assert_eq!(list["policy"], "on-success");
        // Bad names and missing checkpoints are the caller's errors; the session stays.
        for name in ["../etc", "", "missing"] {
            let e = k.call("restore", json!({"name": name}));
            assert_eq!(e["error"]["code"], -32602, "{mode}: {e}");
        }
        let e = k.call("restart", json!({"bogus": 1}));
        assert_eq!(e["error"]["code"], -32602, "{e}");
        assert_eq!(k.ok("n")["result"], "43", "{mode}: still the same session");
    }
}

/// A kernel started with `--resume` (or FLOWREPL_RESUME=1) for the same task starts from the
/// last checkpoint; the session's last state is written at exit.
#[test]
fn resume_across_kernel_restarts() {
    for mode in MODES {
        for how in ["flag", "env"] {
            let logs = tempfile::tempdir().unwrap();
            let mut k = rich(mode, logs.path(), "resume").start();
            k.ok(SESSION);
            // The next cell's checkpoint is written at EOF at the latest.
            k.ok("later = 'kept'");
            assert!(k.close().success());
            let opts = rich(mode, logs.path(), "resume");
            let opts = match how {
                "flag" => opts.arg("--resume"),
                _ => opts.env("FLOWREPL_RESUME", "1"),
            };
            let mut k = opts.start();
            let r = k.execute(&format!("{CHECK}\nlater"));
            assert_eq!(r["result"], "'kept'", "{mode} {how}: {r:#}");
            assert_eq!(r["restored"], true);
            assert_eq!(r["checkpoint_execution_count"], 2);
            // Without --resume, a kernel starts empty.
            assert!(k.close().success());
            let mut k = rich(mode, logs.path(), "resume").start();
            let r = k.execute("n");
            assert_eq!(r["error"]["type"], "NameError", "{mode}: {r:#}");
        }
    }
}

/// In-process, a crash of the kernel itself is survived by `--resume`.
#[test]
fn an_in_process_kernel_killed_resumes_from_its_checkpoint() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = rich("in_process", logs.path(), "crash").start();
    k.ok(SESSION);
    k.wait_checkpoint(1);
    kill(k.pid(), 9);
    k.wait();
    let mut k = rich("in_process", logs.path(), "crash")
        .arg("--resume")
        .start();
    check_restored(&k.execute(CHECK));
}

/// Two tasks never see each other's checkpoints.
#[test]
fn tasks_do_not_share_checkpoints() {
    let logs = tempfile::tempdir().unwrap();
    let mut a = rich("worker", logs.path(), "task-a").start();
    a.ok("secret = 'a'");
    assert!(a.close().success());
    let mut b = rich("worker", logs.path(), "task-b")
        .arg("--resume")
        .start();
    let r = b.execute("secret");
    assert_eq!(r["error"]["type"], "NameError", "{r:#}");
    assert!(r.get("restored").is_none());
    let list = b.call("checkpoints", Value::Null)["result"].clone();
    assert_eq!(list["checkpoints"], json!([]), "{list:#}");
    let e = b.call("restore", Value::Null);
    assert_eq!(e["error"]["code"], -32602, "{e}");
    let root = logs.path().join("plan-snap").join("task-a.checkpoints");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&root).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700);
}

/// A SIGKILL while a checkpoint is being written leaves the previous one whole.
#[test]
fn a_kill_during_a_checkpoint_leaves_the_previous_one() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = rich("worker", logs.path(), "torn").start();
    k.ok("a = 1");
    k.wait_checkpoint(1);
    let dir = logs.path().join("plan-snap/torn.checkpoints/auto");
    let journal = std::fs::read_to_string(dir.join("journal.jsonl")).unwrap();
    let pid = k.call("status", Value::Null)["result"]["worker_pid"]
        .as_u64()
        .unwrap() as u32;
    // 400 MB to pickle and write: the kill lands while it is written.
    k.ok("big = bytes(400 << 20)");
    let torn = wait_for(Duration::from_secs(20), || {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name() == "s-000002.bin")
    });
    assert!(torn, "the second checkpoint never started");
    kill(pid, 9);
    // Every thread gone (the one writing may finish its `write` first), not only the main one.
    assert!(wait_for(Duration::from_secs(10), || exited(pid)));
    let after = std::fs::read_to_string(dir.join("journal.jsonl")).unwrap();
    // The kernel notices the death before the next cell, which runs restored.
    let r = k.execute("(a, 'big' in globals())");
    assert_eq!(r["restored"], true, "{r:#}");
    if after == journal {
        assert_eq!(r["result"], "(1, False)", "{r:#}");
        assert_eq!(r["checkpoint_execution_count"], 1);
    } else {
        // The write finished before the kill arrived: then it is whole.
        assert_eq!(r["result"], "(1, True)", "{r:#}");
    }
}

/// Names over FLOWREPL_CHECKPOINT_MAX_MB are listed, not saved; `off` turns checkpoints off.
#[test]
fn limits_and_off() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = rich("in_process", logs.path(), "limits")
        .env("FLOWREPL_CHECKPOINT_MAX_MB", "1")
        .start();
    k.ok("small = 1\nlarge = bytes(3 << 20)");
    let c = k.call("checkpoint", Value::Null)["result"].clone();
    assert!(
        c["unsaved"]["large"]
            .as_str()
            .unwrap()
            .contains("FLOWREPL_CHECKPOINT_MAX_MB"),
        "{c:#}"
    );
    assert_eq!(c["saved"], json!(["small"]));
    drop(k);
    let mut k = rich("worker", logs.path(), "off")
        .env("FLOWREPL_CHECKPOINTS", "off")
        .start();
    k.ok("x = 1");
    let e = k.call("checkpoint", Value::Null);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("off"),
        "{e}"
    );
    let list = k.call("checkpoints", Value::Null)["result"].clone();
    assert_eq!(list["policy"], "off");
    assert!(!logs.path().join("plan-snap/off.checkpoints").exists());
}

/// A checkpoint folder that is not the kernel's own (group or other permissions) is never
/// loaded.
#[test]
fn a_folder_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let logs = tempfile::tempdir().unwrap();
    let mut k = rich("in_process", logs.path(), "perm").start();
    k.ok("x = 1");
    k.wait_checkpoint(1);
    let root = logs.path().join("plan-snap/perm.checkpoints");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = k.call("restore", Value::Null);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a private directory"),
        "{e}"
    );
    assert_eq!(k.ok("x")["result"], "1");
}

/// A cell's `import json` is reported even though the checkpoint code imported json first.
#[test]
fn imports_the_checkpoint_code_made_are_still_reported() {
    for mode in MODES {
        let logs = tempfile::tempdir().unwrap();
        let mut k = rich(mode, logs.path(), "imports").start();
        k.ok("x = 1");
        k.wait_checkpoint(1);
        let r = k.ok("import json, pickle");
        let added = r["added_imports"].to_string();
        assert!(
            added.contains("\"json\"") && added.contains("\"pickle\""),
            "{mode}: {r:#}"
        );
        let r = k.ok("import json");
        assert_eq!(r["added_imports"], json!([]), "{mode}: once");
    }
}

/// The automatic checkpoint saves what changed: rebound names, names a cell mutates, names a
/// session function it calls mutates; shared references stay shared across writes; many
/// writes are compacted.
#[test]
fn incremental_checkpoints_follow_mutations_and_compact() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = rich("worker", logs.path(), "incremental").start();
    k.ok("data = []\ndef add(v):\n    data.append(v)\nd = {}\na = [1]");
    k.wait_checkpoint(1);
    k.ok("add(2)");
    k.ok("d['k'] = 1");
    k.ok("b = a");
    for i in 0..80 {
        k.ok(&format!("n = {i}"));
        k.wait_checkpoint(5 + i);
    }
    let list = k.wait_checkpoint(84);
    let auto = &list["checkpoints"][0];
    assert_eq!(auto["last_write_names"], 1, "one name saved: {auto:#}");
    assert_eq!(auto["last_write_full"], false);
    assert!(auto["last_write_ms"].as_f64().is_some());
    let dir = logs.path().join("plan-snap/incremental.checkpoints/auto");
    let segments = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("s-"))
        .count();
    assert!(
        segments <= 65,
        "{segments} segments: compaction did not run"
    );
    let pid = k.call("status", Value::Null)["result"]["worker_pid"]
        .as_u64()
        .unwrap() as u32;
    kill(pid, 9);
    assert!(wait_for(Duration::from_secs(10), || exited(pid)));
    let r = k.execute("(data, d, b is a, n)");
    assert_eq!(r["result"], "([2], {'k': 1}, True, 79)", "{r:#}");
    assert_eq!(r["restored"], true);
    assert_eq!(r["state_lost"], false, "nothing was lost: {r:#}");
}

/// The flags and variables named "snapshot" before keep working, each with a deprecation
/// line, and the new names say none; the new name wins when both are set.
#[test]
fn the_old_names_still_work_and_say_they_are_deprecated() {
    /// A task, the variable and flag it is started with, the deprecation line expected.
    type Case<'a> = (
        &'a str,
        Option<(&'a str, &'a str)>,
        Option<&'a str>,
        Option<&'a str>,
    );
    let logs = tempfile::tempdir().unwrap();
    let cases: [Case; 5] = [
        ("new-env", Some(("FLOWREPL_CHECKPOINTS", "off")), None, None),
        ("new-flag", None, Some("--checkpoints=off"), None),
        (
            "old-env",
            Some(("FLOWREPL_SNAPSHOT", "off")),
            None,
            Some("FLOWREPL_SNAPSHOT is deprecated and will be removed; use FLOWREPL_CHECKPOINTS"),
        ),
        (
            "old-flag",
            None,
            Some("--snapshot=off"),
            Some("--snapshot is deprecated and will be removed; use --checkpoints"),
        ),
        (
            "old-max",
            Some(("FLOWREPL_SNAPSHOT_MAX_MB", "1")),
            Some("--checkpoints=off"),
            Some("FLOWREPL_SNAPSHOT_MAX_MB is deprecated and will be removed; use FLOWREPL_CHECKPOINT_MAX_MB"),
        ),
    ];
    let kernel = |task: &str| {
        Kernel::options()
            .mode("in_process")
            .log_dir(logs.path())
            .env("FLOW_PLAN_ID", "plan-names")
            .env("FLOW_TASK_ID", task)
    };
    for (task, var, flag, said) in cases {
        let mut opts = kernel(task);
        if let Some((k, v)) = var {
            opts = opts.env(k, v);
        }
        if let Some(f) = flag {
            opts = opts.arg(f);
        }
        let mut k = opts.start();
        k.ok("x = 1");
        let list = k.call("checkpoints", Value::Null)["result"].clone();
        assert_eq!(list["policy"], "off", "{task}: {list}");
        assert!(!logs
            .path()
            .join(format!("plan-names/{task}.checkpoints"))
            .exists());
        match said {
            Some(line) => assert!(k.stderr_with(line).contains(line), "{task}"),
            None => assert!(!k.stderr().contains("deprecated"), "{task}: {}", k.stderr()),
        }
    }
    // Both set: the new one wins, and the old one is said to be ignored.
    let mut k = kernel("both")
        .env("FLOWREPL_SNAPSHOT", "manual")
        .env("FLOWREPL_CHECKPOINTS", "off")
        .start();
    let list = k.call("checkpoints", Value::Null)["result"].clone();
    assert_eq!(list["policy"], "off", "{list}");
    k.stderr_with("FLOWREPL_SNAPSHOT is deprecated and ignored: FLOWREPL_CHECKPOINTS is set");
}

/// A task whose checkpoints are in a folder of the older name (`<task>.snapshot`, before the
/// rename) resumes from them: the kernel takes the folder over under the new name. A
/// symlink of the older name is not followed (it would let a cell's files pass for the
/// kernel's checkpoints).
#[test]
fn a_checkpoint_folder_of_the_older_name_is_taken_over() {
    let logs = tempfile::tempdir().unwrap();
    let mut k = rich("in_process", logs.path(), "legacy").start();
    k.ok("kept = [1, 2, 3]");
    assert!(k.close().success());
    let new = logs.path().join("plan-snap/legacy.checkpoints");
    let old = logs.path().join("plan-snap/legacy.snapshot");
    std::fs::rename(&new, &old).unwrap();
    let mut k = rich("in_process", logs.path(), "legacy")
        .arg("--resume")
        .start();
    let r = k.execute("kept");
    assert_eq!(r["result"], "[1, 2, 3]", "{r:#}");
    assert_eq!(r["restored"], true);
    assert!(new.is_dir() && !old.exists());
    assert!(k.close().success());
    // A symlink of the older name, and no folder of the new one: not taken over.
    std::fs::rename(&new, logs.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(logs.path().join("elsewhere"), &old).unwrap();
    let mut k = rich("in_process", logs.path(), "legacy")
        .arg("--resume")
        .start();
    let r = k.execute("kept");
    assert_eq!(r["error"]["type"], "NameError", "{r:#}");
    assert!(old.is_symlink());
}
