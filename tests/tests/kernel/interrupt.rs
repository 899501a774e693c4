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
