//! The fault suite: each fault, then a normal call that must succeed, then the task log and
//! leftover processes. Faults that only worker mode survives run in worker mode; the stop
//! ladder's first step runs in both.
//!
//! Size: one scenario per fault kind, each a whole kernel session.

use flowrepl_tests::{
    alive, flowrepl_bin, kill, read_log, wait_for, zombie_children, Kernel, KernelOptions, Sleeper,
    MODES,
};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Worker mode with checkpoints off: these tests check what a death loses when nothing was
/// saved (what a restore brings back is checkpoints.rs's).
fn without_checkpoints() -> KernelOptions {
    Kernel::options()
        .worker()
        .env("FLOWREPL_CHECKPOINTS", "off")
}

fn worker_pid(k: &mut Kernel) -> u32 {
    k.call("status", Value::Null)["result"]["worker_pid"]
        .as_u64()
        .expect("worker_pid") as u32
}

/// After a fault: the next call works on a fresh worker, state is gone, the log says so,
/// the dead worker is reaped and gone.
fn check_recovered(k: &mut Kernel, old_worker: u32, error_type: &str) {
    let r = k.ok("'fresh'");
    assert_eq!(r["result"], "'fresh'");
    let new_worker = worker_pid(k);
    assert_ne!(new_worker, old_worker);
    assert_eq!(r["usage"]["pid"], new_worker);
    let lost = k.execute("x");
    assert_eq!(
        lost["error"]["type"], "NameError",
        "state should be gone: {lost:#}"
    );
    assert!(!alive(old_worker), "old worker {old_worker} still alive");
    assert!(
        zombie_children(k.pid()).is_empty(),
        "zombies: {:?}",
        zombie_children(k.pid())
    );
    k.sync();
    let log = read_log(&k.log_file());
    let rec = log
        .iter()
        .find(|r| r.error_type.as_deref() == Some(error_type))
        .unwrap_or_else(|| panic!("no {error_type} record in {log:#?}"));
    assert!(rec.state_lost);
    assert!(!rec.success);
    assert_eq!(rec.pid, Some(old_worker));
}

/// Runs `code` (which kills the worker) after setting `x`; checks the result.
fn crash(code: &str) -> (Kernel, Value, u32, Duration) {
    let mut k = without_checkpoints().start();
    k.ok("x = 1");
    let w = worker_pid(&mut k);
    let t = Instant::now();
    let r = k.execute(code);
    let took = t.elapsed();
    assert_eq!(r["success"], false);
    assert_eq!(r["state_lost"], true, "{r:#}");
    assert!(
        took < Duration::from_secs(1) + Duration::from_millis(200),
        "death reported after {took:?}"
    );
    (k, r, w, took)
}

#[test]
fn os_exit_reports_worker_died_with_the_code() {
    // Output reaches the kernel every monitor tick (50 ms); what a cell writes in the last
    // tick before an abrupt death is lost with the worker (documented), so wait one tick.
    let (mut k, r, w, _) =
        crash("print('before', flush=True)\nimport os, time\ntime.sleep(0.2)\nos._exit(3)");
    assert_eq!(r["error"]["type"], "WorkerDied");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exited with code 3"),
        "{r:#}"
    );
    assert_eq!(r["stdout"], "before\n", "output before the death is kept");
    assert!(r["warnings"][0].as_str().unwrap().contains("lost"));
    check_recovered(&mut k, w, "WorkerDied");
}

#[test]
fn segfault_reports_the_signal() {
    let (mut k, r, w, _) = crash("import ctypes\nctypes.string_at(0)");
    assert_eq!(r["error"]["type"], "WorkerDied");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("signal 11 (SIGSEGV)"), "{msg}");
    check_recovered(&mut k, w, "WorkerDied");
}

#[test]
fn sigkill_from_outside_during_a_cell() {
    let mut k = without_checkpoints().start();
    k.ok("x = 1");
    let w = worker_pid(&mut k);
    k.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"c\",\"method\":\"execute_code\",\"params\":{\"code\":\"import time\\ntime.sleep(30)\"}}\n");
    k.wait_busy();
    kill(w, libc::SIGKILL);
    let killed_at = Instant::now();
    let r = k.recv()["result"].clone();
    let reply_at = Instant::now();
    assert!(reply_at.duration_since(killed_at) < Duration::from_secs(1));
    assert_eq!(r["error"]["type"], "WorkerDied");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("signal 9 (SIGKILL)"));
    check_recovered(&mut k, w, "WorkerDied");
}

#[test]
fn worker_killed_while_idle_is_replaced_before_the_next_cell() {
    let mut k = without_checkpoints().start();
    k.ok("x = 1");
    let w = worker_pid(&mut k);
    kill(w, libc::SIGKILL);
    // Reaped by the kernel only when it notices, so "not alive" includes the zombie state;
    // its other threads (holding the pipe) may take a moment longer to exit.
    assert!(wait_for(Duration::from_secs(5), || !alive(w)));
    std::thread::sleep(Duration::from_millis(200));
    let r = k.ok("y = 2\n'ran'");
    assert_eq!(r["result"], "'ran'");
    assert_eq!(r["state_lost"], true);
    assert!(
        r["warnings"][0].as_str().unwrap().contains("while idle"),
        "{r:#}"
    );
    assert_ne!(r["usage"]["pid"], w);
    assert_eq!(k.execute("x")["error"]["type"], "NameError");
}

#[test]
fn timeout_interrupts_and_keeps_state_in_both_modes() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        k.ok("x = 1");
        let t = Instant::now();
        let r = k.execute_params(json!({"code": "import time\ntime.sleep(30)", "timeout_ms": 300}));
        assert!(t.elapsed() < Duration::from_secs(3), "{mode}");
        assert_eq!(r["timed_out"], true, "{mode}: {r:#}");
        assert_eq!(r["stopped_by"], "interrupt", "{mode}");
        assert_eq!(r["state_lost"], false, "{mode}");
        assert_eq!(k.ok("x")["result"], "1", "{mode}");
    }
}

/// A cell that ignores SIGINT and starts `sleep <sleep>` (see [`Sleeper`]).
fn ignores_sigint_and_starts_a_child(sleep: &Sleeper) -> String {
    format!(
        "import signal, subprocess, time\n\
signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
p = subprocess.Popen(['sleep', '{}'])\n\
time.sleep(300)",
        sleep.arg
    )
}

/// A `sleep` a cell starts, found by its command line (a pid printed in the cell would be
/// another namespace's in the sandbox).
fn starts_a_sleeper(sleep: &Sleeper) -> String {
    format!(
        "import subprocess\np = subprocess.Popen(['sleep', '{}'])",
        sleep.arg
    )
}

#[test]
fn timeout_kills_a_cell_that_ignores_sigint_and_its_children() {
    let mut k = without_checkpoints()
        .env("FLOWREPL_KILL_GRACE_MS", "500")
        .start();
    k.ok("x = 1");
    let w = worker_pid(&mut k);
    let t = Instant::now();
    let child = Sleeper::new();
    let r = k.execute_params(
        json!({"code": ignores_sigint_and_starts_a_child(&child), "timeout_ms": 500}),
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(r["timed_out"], true, "{r:#}");
    assert_eq!(r["stopped_by"], "kill");
    assert_eq!(r["state_lost"], true);
    assert_eq!(r["error"]["type"], "WorkerKilled");
    assert!(
        wait_for(Duration::from_secs(2), || child.gone()),
        "the cell's child survived"
    );
    check_recovered(&mut k, w, "WorkerKilled");
}

#[test]
fn interrupt_request_escalates_to_kill_after_the_grace_period() {
    let mut k = without_checkpoints()
        .env("FLOWREPL_KILL_GRACE_MS", "400")
        .start();
    let w = worker_pid(&mut k);
    let armed = k.dir.path().join("armed");
    let code = format!(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nopen({:?}, 'w').close()\ntime.sleep(60)",
        armed.display().to_string()
    );
    k.send_raw(
        format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": "cell", "method": "execute_code", "params": {"code": code}})
        )
        .as_bytes(),
    );
    // The cell ignores SIGINT from here on.
    assert!(wait_for(Duration::from_secs(30), || armed.exists()));
    let t = Instant::now();
    k.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"int\",\"method\":\"interrupt\"}\n");
    let ack = k.recv();
    assert_eq!(ack["id"], "int");
    assert_eq!(ack["result"]["interrupted"], true);
    let r = k.recv();
    assert_eq!(r["id"], "cell");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(2),
        "{took:?}"
    );
    let r = &r["result"];
    assert_eq!(r["interrupted"], true, "{r:#}");
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["stopped_by"], "kill");
    check_recovered(&mut k, w, "WorkerKilled");
}

#[test]
fn interrupt_request_in_worker_mode_keeps_state() {
    let mut k = Kernel::options().worker().start();
    k.ok("x = 5");
    k.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"c\",\"method\":\"execute_code\",\"params\":{\"code\":\"import time\\ntime.sleep(60)\"}}\n");
    k.wait_busy();
    k.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"i\",\"method\":\"interrupt\"}\n");
    assert_eq!(k.recv()["result"]["interrupted"], true);
    let r = k.recv()["result"].clone();
    assert_eq!(r["interrupted"], true, "{r:#}");
    assert_eq!(r["stopped_by"], "interrupt");
    assert_eq!(r["error"]["type"], "KeyboardInterrupt");
    assert_eq!(r["state_lost"], false);
    assert_eq!(k.ok("x")["result"], "5");
    // An interrupt with nothing running reaches nothing, and does not hit the next cell.
    assert_eq!(
        k.call("interrupt", Value::Null)["result"]["interrupted"],
        false
    );
    assert_eq!(k.ok("x + 1")["result"], "6");
}

#[test]
fn restart_drops_state_in_both_modes() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        k.ok("x = 1");
        let before = k.call("status", Value::Null)["result"]["worker_pid"].clone();
        let r = k.call("restart", Value::Null)["result"].clone();
        assert_eq!(r["restarted"], true, "{mode}: {r}");
        assert_eq!(r["state_lost"], true);
        assert_eq!(k.execute("x")["error"]["type"], "NameError", "{mode}");
        assert_eq!(k.ok("__name__")["result"], "'__main__'", "{mode}");
        if mode == "worker" {
            let after = worker_pid(&mut k);
            assert_ne!(json!(after), before);
            assert_eq!(r["pid"], after);
            assert!(wait_for(Duration::from_secs(2), || !alive(
                before.as_u64().unwrap() as u32
            )));
        }
    }
}

#[test]
fn kernel_sigkill_takes_the_worker_and_its_children_along() {
    let mut k = Kernel::options().worker().start();
    let w = worker_pid(&mut k);
    let child = Sleeper::new();
    k.ok(&starts_a_sleeper(&child));
    assert!(!child.gone());
    kill(k.pid(), libc::SIGKILL);
    assert!(
        wait_for(Duration::from_secs(3), || !alive(w)),
        "worker outlived the kernel"
    );
    assert!(
        wait_for(Duration::from_secs(3), || child.gone()),
        "the cell's child outlived the kernel"
    );
}

#[test]
fn kernel_eof_ends_worker_and_children_without_zombies() {
    let mut k = Kernel::options().worker().start();
    let w = worker_pid(&mut k);
    let child = Sleeper::new();
    k.ok(&starts_a_sleeper(&child));
    assert!(!child.gone());
    let st = k.close();
    assert!(st.success());
    assert!(wait_for(Duration::from_secs(3), || !alive(w)));
    assert!(wait_for(Duration::from_secs(3), || child.gone()));
}

#[test]
fn memory_limit_gives_a_typed_error_and_the_session_survives() {
    let mut k = Kernel::options()
        .worker()
        .env("FLOWREPL_MEMORY_MB", "1024")
        .start();
    k.ok("x = 1");
    let r = k.execute("b = bytearray(3 * 1024 ** 3)");
    assert_eq!(r["error"]["type"], "MemoryLimitExceeded", "{r:#}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("1024 MB") && msg.contains("peak RSS"), "{msg}");
    assert_eq!(r["state_lost"], false);
    assert_eq!(k.ok("x")["result"], "1");
    k.sync();
    let log = read_log(&k.log_file());
    assert_eq!(log[1].error_type.as_deref(), Some("MemoryLimitExceeded"));
}

#[test]
fn cpu_limit_ends_the_worker_with_a_typed_error() {
    let mut k = without_checkpoints()
        .env("FLOWREPL_CPU_SECONDS", "1")
        .start();
    k.ok("x = 1");
    let w = worker_pid(&mut k);
    let t = Instant::now();
    let r = k.execute("while True: pass");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(r["error"]["type"], "CpuLimitExceeded", "{r:#}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("1 s per cell"));
    let used = r["usage"]["cpu_ms"].as_f64().unwrap();
    assert!(used >= 900.0, "cpu_ms {used}");
    check_recovered(&mut k, w, "CpuLimitExceeded");
    // Each cell gets its own budget: two cells of 0.6 s each are fine.
    let spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass";
    k.ok(spin);
    k.ok(spin);
}

#[test]
fn process_limit_is_applied_to_the_worker_only() {
    let mut k = Kernel::options()
        .worker()
        .env("FLOWREPL_MAX_PROCS", "4000")
        .start();
    // Soft and hard: a cell cannot raise it back (a soft limit alone it could, up to the
    // hard one). Root may raise a hard limit: the attempt runs as nobody.
    let r = k.ok("import resource\nresource.getrlimit(resource.RLIMIT_NPROC)");
    assert_eq!(r["result"], "(4000, 4000)");
    if k.ok("import os\nos.getuid()")["result"] == "0"
        && std::env::var_os("FLOWREPL_TEST_SANDBOX").is_none()
    {
        let r = k.ok("import os, resource, traceback, linecache\nos.setuid(65534)\ntry:\n    resource.setrlimit(resource.RLIMIT_NPROC, (8000, 8000))\n    r = 'raised'\nexcept (ValueError, OSError) as e:\n    r = 'refused'\n(r, resource.getrlimit(resource.RLIMIT_NPROC))");
        assert_eq!(r["result"], "('refused', (4000, 4000))");
    }
    let mut k = Kernel::options().worker().start();
    let r = k.ok("import resource\nresource.getrlimit(resource.RLIMIT_NPROC)[0] == 4000");
    assert_eq!(r["result"], "False");
}

#[test]
fn in_process_cell_that_ignores_sigint_is_answered_after_the_grace_period() {
    let mut k = Kernel::options()
        .env("FLOWREPL_KILL_GRACE_MS", "500")
        .start();
    k.ok("x = 1");
    let code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(2.5)\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n'done'";
    let t = Instant::now();
    k.send_raw(
        format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": "stuck", "method": "execute_code",
                   "params": {"code": code, "timeout_ms": 200}})
        )
        .as_bytes(),
    );
    let r = k.recv();
    let took = t.elapsed();
    assert_eq!(r["id"], "stuck");
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_millis(2000),
        "{took:?}"
    );
    assert_eq!(r["result"]["error"]["type"], "CellNotStopped", "{r:#}");
    // The kernel still answers status while the cell runs on.
    let st = k.call("status", Value::Null);
    assert_eq!(st["result"]["busy"], true);
    // Queued behind the cell: answered once it ends, and the session is intact.
    assert_eq!(k.ok("x + 1")["result"], "2");
    assert!(t.elapsed() >= Duration::from_millis(2500));
    k.sync();
    let log = read_log(&k.log_file());
    assert_eq!(log.len(), 3);
    assert_eq!(
        log[1].result.as_deref(),
        Some("'done'"),
        "the real result is logged"
    );
    assert!(log[1].warnings.iter().any(|w| w.contains("CellNotStopped")));
}

/// `interrupt` sent the moment each cell starts, 25 times in a row, in both modes. Found two
/// bugs: the watcher could block reading stdin while holding the reader lock (when the
/// request thread had read the line it polled for), leaving `status` and `interrupt`
/// unanswered until the cell ended; and in worker mode an interrupt that reaches the worker
/// before its cell begins is discarded there as stale, so the ladder re-sends SIGINT (the
/// window is tens of microseconds: the ladder's unit tests cover the re-send). Each cell must
/// stop with KeyboardInterrupt at once and keep the session.
#[test]
fn an_interrupt_as_the_cell_starts_is_answered_and_not_lost() {
    for mode in flowrepl_tests::MODES {
        let mut k = Kernel::options()
            .mode(mode)
            .env("FLOWREPL_KILL_GRACE_MS", "5000")
            .start();
        k.ok("kept = 1");
        for i in 0..25 {
            k.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"c\",\"method\":\"execute_code\",\"params\":{\"code\":\"import time\\ntime.sleep(60)\"}}\n");
            let t = Instant::now();
            k.interrupt_running();
            let r = k.recv()["result"].clone();
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "{mode} round {i}: {:?}",
                t.elapsed()
            );
            assert_eq!(r["stopped_by"], "interrupt", "{mode} round {i}: {r:#}");
            assert_eq!(r["error"]["type"], "KeyboardInterrupt", "{mode} round {i}");
            assert_eq!(r["state_lost"], false, "{mode} round {i}");
        }
        assert_eq!(k.ok("kept")["result"], "1", "{mode}");
    }
}

/// `fork` past FLOWREPL_MAX_PROCS is `ProcessLimitExceeded`, and the session lives on. Linux
/// does not apply RLIMIT_NPROC to root, so a cell running as root first drops to uid 65534
/// (for all its threads); the limit then counts that user's processes, the worker included.
/// (That user cannot read a stdlib under /root: what the cells and the traceback need is
/// imported first.)
#[test]
fn a_fork_over_the_process_limit_is_process_limit_exceeded() {
    let mut k = Kernel::options()
        .worker()
        .env("FLOWREPL_MAX_PROCS", "1")
        .start();
    // Linux does not apply RLIMIT_NPROC to root: drop to nobody. A sandboxed worker cannot
    // (its user namespace maps only its own uid), so as root the limit does not bind there,
    // as docs/sandbox.md says.
    if std::env::var_os("FLOWREPL_TEST_SANDBOX").is_some()
        && k.ok("import os\nos.getuid()")["result"] == "0"
    {
        eprintln!("skipped: a sandboxed worker of root cannot drop to another uid");
        return;
    }
    k.ok("import os, traceback, linecache\nif os.getuid() == 0:\n    os.setuid(65534)\nkept = 7");
    let r = k.execute("pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)");
    assert_eq!(r["error"]["type"], "ProcessLimitExceeded", "{r:#}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("limit is 1 processes (FLOWREPL_MAX_PROCS)"),
        "{msg}"
    );
    assert_eq!(r["state_lost"], false);
    assert_eq!(k.ok("kept")["result"], "7");
}

/// No worker can be started (its executable is gone): the cell did not run and says so as
/// `WorkerUnavailable`; once the executable is back, the next cell runs on a fresh worker.
#[test]
fn a_cell_without_a_worker_is_worker_unavailable_until_one_can_start() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("flowrepl-worker");
    let built = flowrepl_bin().with_file_name("flowrepl-worker");
    std::fs::copy(&built, &exe).unwrap();
    let mut k = Kernel::options()
        .worker()
        .env("FLOWREPL_WORKER_BIN", exe.display().to_string())
        .start();
    k.ok("x = 1");
    std::fs::remove_file(&exe).unwrap();
    let r = k.execute("import os; os._exit(1)");
    assert_eq!(r["error"]["type"], "WorkerDied");
    let warnings = r["warnings"].to_string();
    assert!(
        warnings.contains("a new worker could not be started"),
        "{warnings}"
    );
    let r = k.execute("'ran'");
    assert_eq!(r["error"]["type"], "WorkerUnavailable", "{r:#}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("the cell did not run"),
        "{r:#}"
    );
    assert_eq!(r["state_lost"], true);
    assert_eq!(r["result"], Value::Null);
    std::fs::copy(&built, &exe).unwrap();
    assert_eq!(k.ok("'ran'")["result"], "'ran'");
}

/// Output written right before the worker dies arrives whole: what was not yet streamed is
/// read from the capture files the kernel handed the worker (an `os._exit` right after a
/// print, a segfault, a large output partly streamed, and one over the output limit).
#[test]
fn output_to_the_last_byte_when_the_worker_dies() {
    let mut k = Kernel::options().worker().start();
    let r = k.execute(
        "import os, sys\nprint('before exit', flush=True)\nsys.stderr.write('err line\\n')\nos.write(1, b'raw\\n')\nos._exit(3)",
    );
    assert_eq!(r["error"]["type"], "WorkerDied", "{r}");
    assert_eq!(r["stdout"], "before exit\nraw\n");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .starts_with("err line\nWorkerDied"),
        "{r}"
    );
    let r = k.execute("import ctypes\nprint('then a segfault', flush=True)\nctypes.string_at(0)");
    assert_eq!(r["stdout"], "then a segfault\n", "{r}");
    // 3 MB: some of it streamed while the cell ran, the rest read after the death.
    let r = k.execute(
        "import os, time\nfor i in range(30):\n    os.write(1, (str(i % 10) * 99_999 + '\\n').encode())\n    time.sleep(0.004)\nos._exit(1)",
    );
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(out.len(), 3_000_000, "{}", &out[..100]);
    for (i, line) in out.lines().enumerate() {
        assert_eq!(line, (i % 10).to_string().repeat(99_999), "line {i}");
    }
    // Over the output limit: the head, the marker and the tail, as for a cell that ends.
    let mut k = Kernel::options()
        .worker()
        .env("FLOWREPL_MAX_OUTPUT_BYTES", "65536")
        .start();
    let r = k.execute("import os\nos.write(1, b'H' * 100_000 + b'T' * 100_000)\nos._exit(1)");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with(&"H".repeat(32768)), "{}", &out[..50]);
    assert!(
        out.ends_with(&"T".repeat(16384)),
        "{}",
        &out[out.len() - 50..]
    );
    assert!(
        out.contains("bytes of output dropped here"),
        "{}",
        &out[32760..32900]
    );
    assert!(out.len() < 60_000, "{}", out.len());
}
