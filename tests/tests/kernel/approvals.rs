//! `flow.request_approval` over JSON-RPC: the `approval_requested` notification, the
//! `approve` method answered while the cell runs, and every way a wait can end.

use flowrepl_tests::{Kernel, MODES};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Sends a request without waiting for its reply.
fn send(k: &mut Kernel, id: u64, method: &str, params: Value) {
    let mut line = serde_json::to_vec(
        &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
    )
    .unwrap();
    line.push(b'\n');
    k.send_raw(&line);
}

/// Starts a cell (request `id`) without waiting for its reply.
fn start_cell(k: &mut Kernel, id: u64, code: &str) {
    send(k, id, "execute_code", json!({ "code": code }));
}

/// The next message, which must be the `approval_requested` notification; its params.
fn requested(k: &mut Kernel) -> Value {
    let n = k.recv();
    assert_eq!(n["method"], "approval_requested", "{n}");
    assert!(n.get("id").is_none(), "a notification has no id: {n}");
    n["params"].clone()
}

fn statuses(r: &Value) -> Vec<String> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "approval")
        .map(|e| e["data"]["status"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn approved_and_declined_answers_arrive_while_the_cell_waits_past_its_timeout() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        // The cell's timeout is 1 s; the person answers after 1.5 s.
        send(
            &mut k,
            100,
            "execute_code",
            json!({"code": "before = 1\nok = flow.request_approval('Deploy to prod?', env='prod', n=2)\n(ok, flow.last_approval)", "timeout_ms": 1000}),
        );
        let req = requested(&mut k);
        assert_eq!(req["message"], "Deploy to prod?", "{mode}");
        assert_eq!(req["data"], json!({"env": "prod", "n": 2}), "{mode}");
        let id = req["approval_id"].as_str().unwrap().to_owned();
        std::thread::sleep(Duration::from_millis(1500));
        let ack = k.call(
            "approve",
            json!({"approval_id": id, "approved": true, "comment": "go ahead"}),
        );
        assert_eq!(ack["result"], json!({"accepted": true}), "{mode}");
        let r = k.recv();
        assert_eq!(r["id"], 100, "{mode}: {r}");
        let r = &r["result"];
        assert_eq!(r["success"], true, "{mode}: {r:#}");
        assert_eq!(r["timed_out"], false, "{mode}");
        assert_eq!(
            r["result"], "(True, {'outcome': 'approved', 'comment': 'go ahead', 'reason': None})",
            "{mode}"
        );
        assert_eq!(statuses(r), ["requested", "approved"], "{mode}");
        let ended = &r["events"][1]["data"];
        assert_eq!(ended["approval_id"], id.as_str(), "{mode}");
        assert_eq!(ended["comment"], "go ahead", "{mode}");
        assert!(ended["waited_ms"].as_f64().unwrap() >= 1400.0, "{mode}");
        // An answer for a request nobody waits for any more is not accepted.
        let late = k.call("approve", json!({"approval_id": id, "approved": false}));
        assert_eq!(late["result"], json!({"accepted": false}), "{mode}");

        start_cell(
            &mut k,
            101,
            "with flow.step('ship'):\n    no = flow.request_approval('Really?')\nno",
        );
        let id = requested(&mut k)["approval_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let ack = k.call("approve", json!({"approval_id": id, "approved": false}));
        assert_eq!(ack["result"]["accepted"], true, "{mode}");
        let r = k.recv()["result"].clone();
        assert_eq!(r["result"], "False", "{mode}: {r:#}");
        assert_eq!(statuses(&r), ["requested", "declined"], "{mode}");
        assert_eq!(
            r["events"][1]["step"], "ship",
            "{mode}: events name their step"
        );
        // Each request and answer is in the log as an event record.
        k.sync();
        let log = flowrepl_tests::read_log_all(&k.log_file());
        let logged: Vec<(u64, String)> = log
            .events
            .iter()
            .filter(|e| e.event.name == "approval")
            .map(|e| {
                let d: Value = serde_json::from_str(e.event.data.get()).unwrap();
                (
                    e.head.execution_count,
                    d["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            logged,
            [
                (1, "requested".to_owned()),
                (1, "approved".into()),
                (2, "requested".into()),
                (2, "declined".into())
            ],
            "{mode}"
        );
    }
}

#[test]
fn a_wait_ends_by_timeout_s_or_interrupt_and_the_session_goes_on() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        start_cell(&mut k, 100, "kept = 7\ntry:\n    flow.request_approval('ok?', timeout_s=0.3)\nexcept flow.ApprovalCancelled as e:\n    print('cancelled:', e)\nimport flowrepl\nflowrepl.ApprovalCancelled is flow.ApprovalCancelled");
        requested(&mut k);
        let r = k.recv()["result"].clone();
        assert_eq!(r["success"], true, "{mode}: {r:#}");
        assert_eq!(r["stdout"], "cancelled: no answer within 0.3 s\n", "{mode}");
        assert_eq!(r["result"], "True", "{mode}");
        assert_eq!(statuses(&r), ["requested", "timed_out"], "{mode}");

        // Interrupted while waiting: KeyboardInterrupt, state kept, the request withdrawn.
        start_cell(&mut k, 101, "flow.request_approval('wait for me')");
        let id = requested(&mut k)["approval_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let t0 = Instant::now();
        let ack = k.call("interrupt", Value::Null);
        assert_eq!(ack["result"]["interrupted"], true, "{mode}");
        let r = k.recv()["result"].clone();
        assert!(t0.elapsed() < Duration::from_secs(2), "{mode}");
        assert_eq!(r["error"]["type"], "KeyboardInterrupt", "{mode}: {r:#}");
        assert_eq!(r["interrupted"], true, "{mode}");
        assert_eq!(statuses(&r), ["requested", "interrupted"], "{mode}");
        let late = k.call("approve", json!({"approval_id": id, "approved": true}));
        assert_eq!(late["result"]["accepted"], false, "{mode}");
        assert_eq!(k.ok("kept")["result"], "7", "{mode}");

        // Bad calls: a clear error in the cell, nothing asked.
        for (code, kind) in [
            ("flow.request_approval('')", "TypeError"),
            ("flow.request_approval('x', timeout_s=0)", "ValueError"),
            ("flow.request_approval('x', timeout_s=True)", "ValueError"),
            ("flow.request_approval('x', f=open)", "TypeError"),
        ] {
            let r = k.execute(code);
            assert_eq!(r["error"]["type"], kind, "{mode}: {code}");
        }
        // Only the cell's own thread may ask.
        let r = k.ok(
            "import threading\nerr = []\n\
             def ask():\n    try:\n        flow.request_approval('from a thread')\n    except RuntimeError as e:\n        err.append(str(e))\n\
             t = threading.Thread(target=ask); t.start(); t.join()\nerr[0]",
        );
        assert!(
            r["result"].as_str().unwrap().contains("cell's own thread"),
            "{mode}: {r}"
        );
    }
}

#[test]
fn closing_stdin_cancels_the_wait_and_the_cell_is_logged() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        start_cell(&mut k, 100, "try:\n    flow.request_approval('anyone?')\nexcept flow.ApprovalCancelled as e:\n    print('cancelled:', e)");
        requested(&mut k);
        k.close_stdin();
        let r = k.recv()["result"].clone();
        assert_eq!(
            r["stdout"], "cancelled: the client closed stdin: nobody can answer\n",
            "{mode}: {r:#}"
        );
        assert!(k.wait().success(), "{mode}");
        let log = flowrepl_tests::read_log_all(&k.log_file());
        assert_eq!(log.records.len(), 1, "{mode}");
        assert!(log.records[0].success, "{mode}");
    }
}

#[test]
fn compat_mode_has_nobody_to_ask_and_returns_none_at_once() {
    for mode in MODES {
        let mut k = Kernel::options()
            .mode(mode)
            .arg("--compat")
            .arg("json-repl")
            .start();
        let r = k.ok("flow.request_approval('anyone?') is None");
        assert_eq!(r["result"], "True", "{mode}");
        assert_eq!(statuses(&r), ["requested", "unavailable"], "{mode}");
        assert!(
            r["events"][1]["data"]["reason"]
                .as_str()
                .unwrap()
                .contains("drop-in mode"),
            "{mode}: {r}"
        );
        // No notification was written: the next message is the next reply.
        assert_eq!(k.call("status", Value::Null)["result"]["busy"], false);
    }
}
