//! `interrupt` and `status` while a cell runs (answered at once); everything else stays in
//! order behind the running cell.

use flowrepl_tests::{read_log, Kernel};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn send(k: &mut Kernel, id: &str, method: &str, params: Value) {
    let mut req = json!({"jsonrpc": "2.0", "id": id, "method": method});
    if !params.is_null() {
        req["params"] = params;
    }
    k.send_raw(format!("{req}\n").as_bytes());
}

fn interrupts_and_keeps_state(code: &str) {
    let mut k = Kernel::start();
    k.ok("kept = 41");
    send(&mut k, "run", "execute_code", json!({"code": code}));
    k.interrupt_running();
    let t = Instant::now();
    let r = k.recv();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(r["id"], "run");
    let r = &r["result"];
    assert_eq!(r["success"], false);
    assert_eq!(r["interrupted"], true);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["stopped_by"], "interrupt");
    assert_eq!(r["error"]["type"], "KeyboardInterrupt");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("interrupted on request"));
    assert_eq!(k.ok("kept + 1")["result"], "42");
    k.sync();
    let recs = read_log(&k.log_file());
    let rec = recs
        .iter()
        .find(|r| r.interrupted)
        .expect("interrupted record");
    assert_eq!(rec.stopped_by.as_deref(), Some("interrupt"));
}

#[test]
fn interrupt_stops_a_sleeping_cell() {
    interrupts_and_keeps_state("import time; time.sleep(60)");
}

#[test]
fn interrupt_stops_a_busy_loop() {
    interrupts_and_keeps_state("n = 0\nwhile True:\n    n += 1");
}

#[test]
fn status_answers_while_busy() {
    let mut k = Kernel::start();
    send(
        &mut k,
        "run",
        "execute_code",
        json!({"code": "import time; time.sleep(1); 'slept'"}),
    );
    k.wait_busy();
    let t = Instant::now();
    send(&mut k, "s", "status", Value::Null);
    let s = k.recv();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "status took {:?}",
        t.elapsed()
    );
    assert_eq!(s["id"], "s");
    assert_eq!(s["result"]["busy"], true);
    assert_eq!(s["result"]["execution_count"], 1);
    let r = k.recv();
    assert_eq!(r["id"], "run");
    assert_eq!(r["result"]["result"], "'slept'");
    let s = k.call("status", Value::Null);
    assert_eq!(s["result"]["busy"], false);
}

#[test]
fn interrupt_while_idle_says_so() {
    let mut k = Kernel::start();
    let r = k.call("interrupt", Value::Null);
    assert_eq!(r["result"]["interrupted"], false);
    assert_eq!(k.ok("1 + 1")["result"], "2", "no stray KeyboardInterrupt");
}

#[test]
fn requests_behind_a_running_cell_keep_their_order() {
    let mut k = Kernel::start();
    send(
        &mut k,
        "a",
        "execute_code",
        json!({"code": "import time; time.sleep(0.5); 'a'"}),
    );
    send(&mut k, "b", "execute_code", json!({"code": "'b'"}));
    k.send_raw(b"garbage\n");
    send(&mut k, "s", "status", Value::Null);
    send(&mut k, "c", "execute_code", json!({"code": "'c'"}));
    // status overtakes; everything else in order.
    assert_eq!(k.recv()["id"], "s");
    assert_eq!(k.recv()["result"]["result"], "'a'");
    assert_eq!(k.recv()["result"]["result"], "'b'");
    assert_eq!(k.recv()["error"]["code"], -32700);
    assert_eq!(k.recv()["result"]["result"], "'c'");
}

#[test]
fn eof_while_busy_finishes_the_cell_then_exits() {
    let mut k = Kernel::start();
    send(
        &mut k,
        "run",
        "execute_code",
        json!({"code": "import time; time.sleep(0.5); 'done'"}),
    );
    k.wait_busy();
    let log = k.log_file();
    // Close stdin while the cell runs: the reply still comes, then a clean exit.
    k.close_stdin();
    let r = k.recv();
    assert_eq!(r["result"]["result"], "'done'");
    assert!(k.wait().success());
    assert_eq!(read_log(&log).len(), 1);
}

/// Issue 21 (5): a parent that ignores SIGINT, or blocks it, must not take interrupts and
/// timeouts away: both modes stop the cell with SIGINT (`stopped_by: "interrupt"`, state
/// kept), and a cell's own child process starts with SIGINT at its default, unblocked.
#[test]
fn interrupts_work_whatever_the_parent_did_to_sigint() {
    use flowrepl_tests::{ParentSignals, MODES};
    for parent in [ParentSignals::IgnoreSigint, ParentSignals::BlockSigint] {
        for mode in MODES {
            let what = format!("{parent:?} {mode}");
            let mut k = Kernel::options()
                .mode(mode)
                .env("FLOWREPL_KILL_GRACE_MS", "20000")
                .parent_signals(parent)
                .start();
            k.ok("kept = 41");
            // A timeout.
            let r = k.execute_params(json!({"code": "while True:\n    pass", "timeout_ms": 300}));
            assert_eq!(r["timed_out"], true, "{what}: {r}");
            assert_eq!(r["stopped_by"], "interrupt", "{what}: {r}");
            assert_eq!(r["error"]["type"], "KeyboardInterrupt", "{what}: {r}");
            // An interrupt.
            send(
                &mut k,
                "run",
                "execute_code",
                json!({"code": "import time; time.sleep(60)"}),
            );
            k.interrupt_running();
            let r = k.recv();
            assert_eq!(r["id"], "run", "{what}");
            assert_eq!(r["result"]["stopped_by"], "interrupt", "{what}: {r}");
            // The session goes on, with its state.
            assert_eq!(k.ok("kept + 1")["result"], "42", "{what}");
            // What a cell's child inherits: SIGINT not ignored, not blocked.
            let r = k.ok(concat!(
                "import subprocess, sys\n",
                "out = subprocess.run([sys.executable, '-c', ",
                "'import signal; print(signal.getsignal(signal.SIGINT).__name__); ",
                "print([l for l in open(\"/proc/self/status\") if l.startswith(\"SigBlk\")][0].split()[1])'],",
                " capture_output=True, text=True).stdout.split()\n",
                "out",
            ));
            let out: Vec<String> =
                serde_json::from_str(&r["result"].as_str().unwrap().replace('\'', "\"")).unwrap();
            assert_eq!(out[0], "default_int_handler", "{what}: {out:?}");
            let blocked = u64::from_str_radix(&out[1], 16).unwrap();
            assert_eq!(
                blocked & (1 << (libc::SIGINT - 1)),
                0,
                "{what}: SigBlk {blocked:x}"
            );
        }
    }
}
