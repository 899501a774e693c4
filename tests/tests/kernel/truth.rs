//! Issue 21: a restore tells the whole truth, a full disk loses nothing it could keep, and
//! functions come back in any venv.
//!
//! - Names bound after the restored checkpoint are `lost_vars` with the cell that bound them
//!   (a crash in worker mode, `restart {restore}`, `--resume`).
//! - A checkpoint write that fails (a full filesystem) is said in the next cell's warnings,
//!   `status` and `checkpoints`; the previous checkpoint still restores.
//! - A torn task-log record stays a line of its own and later records read back whole; a
//!   read-only or deleted log dir is said in warnings and writing resumes.
//! - `every-cell`: a pipelined crash loses only the crashing cell.
//! - A fresh venv without cloudpickle or dill restores functions, lambdas, classes and
//!   instances, and a cell still cannot `import cloudpickle` there.
//!
//! The small filesystem is a 1 MiB tmpfs in a mount namespace of the kernel's own
//! (`unshare -m`, or `-Urm` when not root): the host's mounts are never touched, and the test
//! reads the kernel's files through `/proc/<pid>/root`.
//!
//! Size: the restore-truth and full-disk scenarios of one issue, each a whole kernel session.

use flowrepl_tests::{base_python, Kernel, KernelOptions, MODES};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn lost(r: &Value) -> Vec<String> {
    r["lost_vars"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// (1) Worker mode: a = 1 checkpointed, b = 2 not, then a crash: b is named lost.
#[test]
fn a_crash_names_what_was_bound_after_the_checkpoint() {
    let mut k = Kernel::options()
        .worker()
        .env("FLOWREPL_CHECKPOINTS", "manual")
        .start();
    k.ok("a = 1\nkeep = [1]");
    let c = k.call("checkpoint", Value::Null);
    assert_eq!(c["result"]["execution_count"], 1, "{c}");
    k.ok("b = 2\nkeep = [2]\ndel a");
    let r = k.execute("import os; os._exit(1)");
    assert_eq!(r["state_lost"], true, "{r:#}");
    let r = k.execute("sorted(n for n in globals() if not n.startswith('_'))");
    assert_eq!(r["restored"], true, "{r:#}");
    assert_eq!(r["checkpoint_execution_count"], 1);
    assert_eq!(r["state_lost"], true, "{r:#}");
    assert_eq!(r["result"], "['a', 'keep']");
    assert_eq!(lost(&r), ["a", "b", "keep"], "{r:#}");
    assert_eq!(
        r["lost_vars"]["b"],
        "bound in cell 2, after the checkpoint of cell 1"
    );
    assert!(r["lost_vars"]["keep"]
        .as_str()
        .unwrap()
        .starts_with("bound again in cell 2"));
    assert!(r["lost_vars"]["a"]
        .as_str()
        .unwrap()
        .starts_with("deleted in cell 2"));
    // The record says the same.
    k.sync();
    let recs = flowrepl_tests::read_log(&k.log_file());
    let rec = recs.iter().find(|r| r.restored.is_some()).unwrap();
    assert!(rec.state_lost);
    assert!(rec.restored.as_ref().unwrap().lost_vars.contains_key("b"));
    // A crash right after a restore does not name them again.
    k.execute("import os; os._exit(1)");
    let r = k.execute("1");
    assert_eq!(r["restored"], true, "{r:#}");
    assert_eq!(r["state_lost"], false, "{r:#}");
}

/// A kernel of task `task` logging into `logs`, with the checkpoint policy `policy`: started
/// again with the same options, it is the same task.
fn task_kernel(mode: &str, logs: &Path, policy: &str, task: &str) -> KernelOptions {
    Kernel::options()
        .mode(mode)
        .log_dir(logs)
        .env("FLOWREPL_CHECKPOINTS", policy)
        .env("FLOW_TASK_ID", task)
}

/// (1) `restart {restore}` and `--resume` in both modes: names bound after the checkpoint.
#[test]
fn restart_and_resume_name_what_was_bound_after_the_checkpoint() {
    for mode in MODES {
        let logs = tempfile::tempdir().unwrap();
        let opts = || task_kernel(mode, logs.path(), "manual", "truth");
        let mut k = opts().start();
        k.ok("a = 1");
        k.call("checkpoint", Value::Null);
        k.ok("b = 2");
        let r = k.call("restart", json!({"restore": true}))["result"].clone();
        assert_eq!(r["state_lost"], true, "{mode}: {r:#}");
        assert_eq!(lost(&r), ["b"], "{mode}: {r:#}");
        assert!(r["message"].as_str().unwrap().contains("lost: b"), "{r}");
        // The next kernel resumes from the same checkpoint: cells of this session after it
        // (the restart's own restore notwithstanding) are named with their session.
        k.ok("c = 3");
        assert!(k.close().success());
        let mut k = opts().arg("--resume").start();
        let r = k.execute("a");
        assert_eq!(r["restored"], true, "{mode}: {r:#}");
        assert_eq!(r["result"], "1");
        assert_eq!(r["state_lost"], true, "{mode}: {r:#}");
        let l = r["lost_vars"].as_object().unwrap();
        assert!(l.contains_key("b") && l.contains_key("c"), "{mode}: {r:#}");
        assert!(
            l["c"]
                .as_str()
                .unwrap()
                .starts_with("bound in cell 3, after the checkpoint of cell 1"),
            "{mode}: {r:#}"
        );
    }
}

/// (1) `restore {name}` of a named checkpoint, both modes: names changed after it are listed.
#[test]
fn restore_of_a_named_checkpoint_names_what_came_after_it() {
    for mode in MODES {
        let mut k = Kernel::options()
            .mode(mode)
            .env("FLOWREPL_CHECKPOINTS", "manual")
            .start();
        k.ok("a = 1\nkeep = [1]");
        let c = k.call("checkpoint", json!({"name": "before"}));
        assert_eq!(c["result"]["execution_count"], 1, "{mode}: {c}");
        k.ok("b = 2\nkeep = [2]");
        let r = k.call("restore", json!({"name": "before"}))["result"].clone();
        assert_eq!(lost(&r), ["b", "keep"], "{mode}: {r:#}");
        assert_eq!(
            r["lost_vars"]["b"], "bound in cell 2, after the checkpoint of cell 1",
            "{mode}"
        );
        assert_eq!(k.ok("(a, keep)")["result"], "(1, [1])", "{mode}");
    }
}

/// How the kernel is started on a 1 MiB tmpfs at `mnt` (its log dir), in a mount namespace
/// of its own.
fn on_small_fs(opts: KernelOptions, mnt: &Path) -> KernelOptions {
    on_tmpfs(opts, mnt, "size=1m,mode=0700")
}

/// How the kernel is started on a tmpfs mounted with `options` at `mnt` (its log dir), in a
/// mount namespace of its own, where its cells may remount it.
fn on_tmpfs(opts: KernelOptions, mnt: &Path, options: &str) -> KernelOptions {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let unshare = if root { "-m" } else { "-Urm" };
    opts.log_dir(&mnt.join("logs")).wrap(vec![
        "unshare".into(),
        unshare.into(),
        "sh".into(),
        "-c".into(),
        format!(r#"mount -t tmpfs -o {options} tmpfs "$0" && exec "$@""#),
        mnt.display().to_string(),
    ])
}

/// A file of the kernel's mount namespace, read from outside it.
fn inside(k: &Kernel, p: &Path) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root{}", k.pid(), p.display()))
}

/// Fills the small filesystem at `mnt` from inside the kernel, leaving about `free` bytes.
fn fill(k: &mut Kernel, mnt: &Path, free: u64) -> PathBuf {
    let fill = mnt.join("fill");
    k.ok(&format!(
        "import os as _os\n_st = _os.statvfs({m:?})\nopen({f:?}, 'wb').write(b'0' * (_st.f_bavail * _st.f_frsize - {free}))\ndel _os, _st",
        m = mnt,
        f = fill
    ));
    fill
}

/// (2) A full disk: a checkpoint write fails and says so where the client looks (the next
/// cell's warnings, `status`, `checkpoints`); the previous checkpoint still restores after a
/// crash (in-process: `restart {restore}`) and names what came after it.
#[test]
fn a_failed_checkpoint_is_said_and_the_previous_one_restores() {
    for mode in MODES {
        let mnt = tempfile::tempdir().unwrap();
        let mut k = on_small_fs(Kernel::options().mode(mode).arg("--no-log"), mnt.path()).start();
        k.ok("a = 1");
        let filler = fill(&mut k, mnt.path(), 60_000);
        k.wait_checkpoint(2);
        k.ok("b = 'x' * 200_000");
        let tried = flowrepl_tests::wait_for(std::time::Duration::from_secs(20), || {
            k.call("status", Value::Null)["result"]["checkpoint"]["failing"] == true
        });
        assert!(tried, "{mode}: no failed checkpoint write");
        let r = k.execute("c = 3");
        let warnings = r["warnings"].to_string();
        assert!(
            warnings.contains("the automatic checkpoint after cell 3 was not written"),
            "{mode}: {r:#}"
        );
        assert!(warnings.contains("No space left"), "{mode}: {warnings}");
        assert!(
            warnings.contains("the newest checkpoint holds the state after cell 2"),
            "{mode}: {warnings}"
        );
        for (what, h) in [
            (
                "status",
                k.call("status", Value::Null)["result"]["checkpoint"].clone(),
            ),
            (
                "checkpoints",
                k.call("checkpoints", Value::Null)["result"]["health"].clone(),
            ),
        ] {
            assert_eq!(h["failing"], true, "{mode} {what}: {h}");
            assert_eq!(h["auto_execution_count"], 2, "{mode} {what}: {h}");
            assert!(
                h["last_error"]["execution_count"].as_u64() >= Some(3),
                "{mode} {what}: {h}"
            );
        }
        let r = if mode == "worker" {
            k.execute("import os; os._exit(1)");
            k.execute("a")
        } else {
            k.call("restart", json!({"restore": true}))["result"].clone()
        };
        assert_eq!(r["checkpoint_execution_count"], 2, "{mode}: {r:#}");
        assert_eq!(lost(&r), ["b", "c"], "{mode}: {r:#}");
        // Space returns: the next write succeeds and says so.
        k.ok(&format!("import os; os.remove({filler:?})"));
        k.ok("d = 4");
        let healthy = flowrepl_tests::wait_for(std::time::Duration::from_secs(20), || {
            k.ok("e = 5");
            k.call("status", Value::Null)["result"]["checkpoint"]["failing"] == false
        });
        assert!(healthy, "{mode}: the checkpoint never succeeded again");
        assert!(k.close().success());
    }
}

/// Every warning of the results in `rs`, as one text.
fn warnings(rs: &[Value]) -> String {
    rs.iter()
        .flat_map(|r| r["warnings"].as_array().cloned().unwrap_or_default())
        .map(|w| w.as_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// (2, 4) The log dir and the checkpoint folder on a read-only filesystem: the kernel serves,
/// each record and checkpoint it could not write is named in a warning, and once the
/// filesystem is writable again (remounted from a cell) new records and checkpoints are
/// written whole.
#[test]
fn a_read_only_log_dir_is_said_and_writing_resumes() {
    for mode in MODES {
        let mnt = tempfile::tempdir().unwrap();
        let opts = Kernel::options().mode(mode).env("FLOW_TASK_ID", "ro");
        let mut k = on_tmpfs(opts, mnt.path(), "ro,size=1m,mode=0700").start();
        let mut rs = vec![k.ok("a = 1"), k.ok("b = 2")];
        // The automatic checkpoint after cell 2 is tried once the kernel is idle (one after
        // cell 1 may have failed before cell 2 and been said there).
        let tried = flowrepl_tests::wait_for(std::time::Duration::from_secs(20), || {
            let h = &k.call("status", Value::Null)["result"]["checkpoint"];
            h["failing"] == true && h["last_error"]["execution_count"] == 2
        });
        assert!(tried, "{mode}: no failed checkpoint write");
        rs.push(k.ok("c = 3"));
        k.sync();
        rs.push(k.ok(&format!(
            "import subprocess\nsubprocess.run(['mount', '-o', 'remount,rw', {:?}], check=True)",
            mnt.path()
        )));
        k.sync();
        rs.push(k.ok("d = 4"));
        k.sync();
        rs.push(k.ok("e = 5"));
        // Each of the first three cells says its own record is lost; the fourth's is written.
        for (i, r) in rs.iter().enumerate() {
            let w = r["warnings"].to_string();
            let says = w.contains("task log: cannot open task log")
                && w.contains("Read-only file system")
                && w.contains("this cell's record is not written");
            assert_eq!(says, i < 3, "{mode}: cell {}: {w}", i + 1);
        }
        let w = rs[2]["warnings"].to_string();
        assert!(
            w.contains("the automatic checkpoint after cell")
                && w.contains("Read-only file system")
                && w.contains("no checkpoint of this session was written yet"),
            "{mode}: {w}"
        );
        k.sync();
        let log = inside(&k, &k.log_file());
        let out = flowrepl_task_logger::reader::parse_records(&std::fs::read(&log).unwrap());
        assert!(out.skipped.is_empty(), "{mode}: {:?}", out.skipped);
        let counts: Vec<u64> = out.records.iter().map(|r| r.execution_count).collect();
        assert_eq!(counts, [4, 5, 6], "{mode}");
        let healthy = flowrepl_tests::wait_for(std::time::Duration::from_secs(20), || {
            k.call("status", Value::Null)["result"]["checkpoint"]["failing"] == false
        });
        assert!(healthy, "{mode}: the checkpoint never succeeded again");
        assert!(k.close().success());
    }
}

/// (4) The log dir deleted during a session (the task's checkpoints with it): the kernel
/// serves, says so, starts the log again, and the next checkpoint is written.
#[test]
fn a_log_dir_deleted_during_a_session_is_started_again() {
    for mode in MODES {
        let logs = tempfile::tempdir().unwrap();
        let mut k = Kernel::options()
            .mode(mode)
            .log_dir(&logs.path().join("logs"))
            .start();
        k.ok("a = 1");
        k.wait_checkpoint(1);
        std::fs::remove_dir_all(logs.path().join("logs")).unwrap();
        // The watch notices the deletion a moment later (under load, some records later),
        // and the next result says so: cells go on until one does.
        let notice = "task log: the file was deleted during the session; a new one was started at the record of execution";
        let mut rs = Vec::new();
        let mut n = 1;
        while !warnings(&rs).contains(notice) && n < 50 {
            n += 1;
            rs.push(k.ok(&format!("v{n} = {n}")));
            k.sync();
        }
        assert!(warnings(&rs).contains(notice), "{mode}: {}", warnings(&rs));
        k.wait_checkpoint(n);
        k.sync();
        let out = flowrepl_tests::read_log_all(&k.log_file());
        assert!(out.skipped.is_empty(), "{mode}: {:?}", out.skipped);
        // Every record after the deletion reads back (the one before it may be written again
        // as a record of the second before the deletion was noticed).
        let counts: Vec<u64> = out.records.iter().map(|r| r.execution_count).collect();
        let after: Vec<u64> = (2..=n).collect();
        assert!(
            counts == after || counts[1..] == after[..] && counts[0] == 1,
            "{mode}: {counts:?}"
        );
        assert!(k.close().success());
    }
}

/// `every-cell`: cells sent back to back, then one that kills the process: the checkpoint
/// holds every cell before it, so nothing but the crashing cell is lost (worker: the next
/// cell; in-process: the kernel itself dies and `--resume` brings the state back).
#[test]
fn every_cell_a_pipelined_crash_loses_only_the_crashing_cell() {
    for mode in MODES {
        let logs = tempfile::tempdir().unwrap();
        let opts = || task_kernel(mode, logs.path(), "every-cell", "pipelined");
        let mut k = opts().start();
        let cells = [
            "big = list(range(200_000))",
            "big.append(-1)\nn = len(big)",
            "def f():\n    return n + 1",
            "import os; os._exit(1)",
        ];
        let mut batch = Vec::new();
        for (i, code) in cells.iter().enumerate() {
            let req = json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "execute_code", "params": {"code": code}});
            batch.extend(serde_json::to_vec(&req).unwrap());
            batch.push(b'\n');
        }
        k.send_raw(&batch);
        for _ in 0..3 {
            let r = k.recv();
            assert_eq!(r["result"]["success"], true, "{mode}: {r:#}");
        }
        let check = "(len(big), big[-1], n, f())";
        let r = if mode == "worker" {
            let crash = k.recv();
            assert_eq!(crash["result"]["state_lost"], true, "{mode}: {crash:#}");
            k.execute(check)
        } else {
            assert!(!k.wait().success());
            let mut k = opts().arg("--resume").start();
            k.execute(check)
        };
        assert_eq!(r["restored"], true, "{mode}: {r:#}");
        assert_eq!(r["checkpoint_execution_count"], 3, "{mode}: {r:#}");
        assert_eq!(r["lost_vars"], json!({}), "{mode}: {r:#}");
        assert_eq!(r["result"], "(200001, -1, 200001, 200002)", "{mode}: {r:#}");
    }
}

/// (4) A full disk tears a task-log record: the torn bytes stay a line of their own (named
/// by the reader) and every record after space returns, the session's end included, reads
/// back whole.
#[test]
fn a_torn_record_stays_a_line_of_its_own() {
    for mode in MODES {
        let mnt = tempfile::tempdir().unwrap();
        let opts = Kernel::options()
            .mode(mode)
            .env("FLOWREPL_CHECKPOINTS", "off");
        let mut k = on_small_fs(opts, mnt.path()).start();
        let filler = fill(&mut k, mnt.path(), 60_000);
        k.ok("print('y' * 300_000)");
        k.sync();
        let r = k.execute(&format!("import os; os.remove({filler:?})"));
        assert!(
            r["warnings"].to_string().contains("record truncated"),
            "{mode}: {r:#}"
        );
        k.ok("d = 4");
        k.sync();
        let log = inside(&k, &k.log_file());
        let text = std::fs::read(&log).unwrap();
        let out = flowrepl_task_logger::reader::parse_records(&text);
        assert_eq!(out.skipped.len(), 1, "{mode}: {:?}", out.skipped);
        assert!(
            out.skipped[0].reason.starts_with("torn record"),
            "{:?}",
            out.skipped
        );
        let counts: Vec<u64> = out.records.iter().map(|r| r.execution_count).collect();
        assert_eq!(counts, [1, 3, 4], "{mode}");
        // `flowrepl log` names the torn line too.
        let out = std::process::Command::new(flowrepl_tests::flowrepl_bin())
            .args(["log", "show", "--plan"])
            .arg(k.ready["plan_id"].as_str().unwrap())
            .arg("--task")
            .arg(k.ready["task_id"].as_str().unwrap())
            .env("FLOWREPL_LOG_DIR", inside(&k, &k.log_dir))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("skipped: torn record"), "{mode}: {stderr}");
        assert!(k.close().success());
    }
}

/// The interpreters to test on: one of each CPython version found, or only the build's
/// when the kernel was built for that one alone (`FLOWREPL_PYTHONS=build`).
fn each_version() -> Vec<PathBuf> {
    if std::env::var("FLOWREPL_PYTHONS").as_deref() == Ok("build") {
        return vec![PathBuf::from(base_python())];
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for f in flowrepl_pythons::discover() {
        if !seen.contains(&f.version) {
            seen.push(f.version);
            out.push(f.program);
        }
    }
    out
}

/// (3) Functions, lambdas, classes and instances restore in a venv that has neither
/// cloudpickle nor dill, on every Python version, and the pickler stays out of the cell's
/// reach.
#[test]
fn functions_restore_without_cloudpickle_in_the_venv() {
    for base in each_version() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        let ok = std::process::Command::new(&base)
            .args(["-m", "venv", "--without-pip"])
            .arg(&venv)
            .status()
            .unwrap()
            .success();
        if !ok {
            eprintln!("{}: no venv module, skipped", base.display());
            continue;
        }
        let python = venv.join("bin/python").display().to_string();
        for mode in MODES {
            let what = format!("{} {mode}", base.display());
            let mut k = Kernel::options()
                .mode(mode)
                .arg("--python")
                .arg(&python)
                .start();
            let r = k.execute("import cloudpickle");
            assert_eq!(r["error"]["type"], "ModuleNotFoundError", "{what}: {r:#}");
            let r = k.execute("import dill");
            assert_eq!(r["error"]["type"], "ModuleNotFoundError", "{what}: {r:#}");
            k.ok(concat!(
                "def f(x):\n    return x + base\n",
                "g = lambda y: f(y) * 2\n",
                "class C:\n    def __init__(self, v):\n        self.v = v\n    def twice(self):\n        return self.v * 2\n",
                "c = C(21)\nbase = 1\n",
            ));
            let c = k.call("checkpoint", Value::Null)["result"].clone();
            assert!(
                c["unsaved"].as_object().unwrap().is_empty(),
                "{what}: {c:#}"
            );
            assert!(
                c["pickler"]
                    .as_str()
                    .unwrap()
                    .starts_with("cloudpickle 3.1.2 (flowrepl)"),
                "{what}: {c}"
            );
            let r = if mode == "worker" {
                k.execute("import os; os._exit(1)");
                k.execute("(f(1), g(1), c.twice(), isinstance(c, C))")
            } else {
                k.call("restart", json!({"restore": true}));
                k.execute("(f(1), g(1), c.twice(), isinstance(c, C))")
            };
            assert_eq!(r["result"], "(2, 4, 42, True)", "{what}: {r:#}");
            assert_eq!(r["added_imports"], json!([]), "{what}: {r:#}");
            // Still not importable, and nothing of it shows as the cell's import.
            let r = k.execute("import sys\n[m for m in sys.modules if 'cloudpickle' in m]");
            assert_eq!(r["result"], "[]", "{what}: {r:#}");
            let r = k.execute("import cloudpickle");
            assert_eq!(r["error"]["type"], "ModuleNotFoundError", "{what}: {r:#}");
        }
    }
}
