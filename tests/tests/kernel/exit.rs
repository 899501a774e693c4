//! The session's end is a Python exit: `atexit` handlers run and files left open are flushed,
//! on `shutdown`, on EOF, and (worker mode) when `restart` replaces the worker. In both modes.

use flowrepl_tests::{Kernel, MODES};
use serde_json::json;
use std::path::Path;

/// Registers an exit handler that writes `<dir>/atexit` and leaves `<dir>/buffered` open with
/// unflushed data.
fn arm(k: &mut Kernel, dir: &Path) {
    let code = format!(
        "import atexit\nd = {dir:?}\natexit.register(lambda: open(d + '/atexit', 'w').write('handler ran'))\nf = open(d + '/buffered', 'w', buffering=1 << 20)\nf.write('buffered data')\n",
        dir = dir.display().to_string()
    );
    k.ok(&code);
    assert_eq!(
        std::fs::read_to_string(dir.join("buffered")).unwrap(),
        "",
        "still buffered"
    );
    assert!(!dir.join("atexit").exists());
}

fn assert_exited_like_python(dir: &Path, mode: &str) {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    assert_eq!(read("atexit"), "handler ran", "{mode}: atexit handler");
    assert_eq!(
        read("buffered"),
        "buffered data",
        "{mode}: open file flushed"
    );
}

/// A folder for the cells' files in the kernel's folder (the workspace when the worker suites
/// run sandboxed), removed with the kernel.
fn workspace_dir(k: &Kernel) -> std::path::PathBuf {
    let dir = k.dir.path().join("exit");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn shutdown_runs_exit_handlers_and_flushes_files() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        let dir = workspace_dir(&k);
        arm(&mut k, &dir);
        assert_eq!(
            k.call("shutdown", json!(null))["result"]["shutting_down"],
            true
        );
        assert!(k.wait().success());
        assert_exited_like_python(&dir, mode);
    }
}

#[test]
fn eof_runs_exit_handlers_and_flushes_files() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        let dir = workspace_dir(&k);
        arm(&mut k, &dir);
        assert!(k.close().success());
        assert_exited_like_python(&dir, mode);
    }
}

#[test]
fn worker_restart_runs_the_old_workers_exit_handlers() {
    let mut k = Kernel::options().worker().start();
    let dir = workspace_dir(&k);
    arm(&mut k, &dir);
    let r = k.call("restart", json!(null));
    assert_eq!(r["result"]["restarted"], true, "{r}");
    assert_exited_like_python(&dir, "worker");
    // The new worker is a fresh interpreter.
    let r = k.execute("f");
    assert_eq!(r["error"]["type"], "NameError", "{r}");
}

#[test]
fn a_hanging_exit_handler_is_killed_after_the_grace_period() {
    let mut k = Kernel::options()
        .worker()
        .env("FLOWREPL_KILL_GRACE_MS", "300")
        .start();
    k.ok("import atexit, time\natexit.register(lambda: time.sleep(3600))");
    let pid = k.ready["worker_pid"].as_u64().unwrap() as u32;
    let t0 = std::time::Instant::now();
    assert!(k.close().success());
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t0.elapsed()
    );
    assert!(
        !flowrepl_tests::alive(pid),
        "the worker {pid} outlived the kernel"
    );
}

/// SIGTERM (how clients restart a kernel) ends it only after every started cell's record is
/// in the log: a large record still queued for the writer thread, the small ones behind it,
/// and the cell that was running, which is interrupted. The kernel then dies by SIGTERM.
#[test]
fn sigterm_writes_every_record_before_the_kernel_ends() {
    use std::os::unix::process::ExitStatusExt;
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        let log = k.log_file();
        k.ok("print('x' * 500_000)");
        for i in 0..5 {
            k.ok(&format!("y = {i}"));
        }
        k.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"run\",\"method\":\"execute_code\",\"params\":{\"code\":\"import time\\ntime.sleep(60)\"}}\n");
        k.wait_busy();
        flowrepl_tests::kill(k.pid(), libc::SIGTERM);
        let r = k.recv();
        assert_eq!(r["result"]["interrupted"], true, "{mode}: {r}");
        let st = k.wait();
        assert_eq!(st.signal(), Some(libc::SIGTERM), "{mode}: {st:?}");
        let records = flowrepl_tests::read_log(&log);
        assert_eq!(records.len(), 7, "{mode}");
        assert_eq!(records[0].stdout.len(), 500_001, "{mode}");
        assert!(records[6].interrupted, "{mode}");
    }
}
