//! JSON-RPC framing, methods, bad input, pipelining.

use flowrepl_tests::Kernel;
use serde_json::{json, Value};
use std::time::Duration;

fn error_code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error reply: {v}"))
}

#[test]
fn ready_notification_carries_marker_and_status() {
    let k = Kernel::start();
    let r = &k.ready;
    assert_eq!(r["message"], "__READY__");
    for field in [
        "kernel_version",
        "python_version",
        "python_executable",
        "session_id",
        "log_file",
    ] {
        assert!(
            r[field].as_str().is_some_and(|s| !s.is_empty()),
            "{field} in {r}"
        );
    }
    assert_eq!(r["mode"], "in_process");
    assert_eq!(r["pid"], json!(k.pid()));
    assert_eq!(r["execution_count"], 0);
    assert_eq!(r["plan_id"], "local");
    assert_eq!(r["task_id"], "adhoc");
    assert!(r["python_version"].as_str().unwrap().starts_with("3.11"));
}

#[test]
fn execute_and_execute_code_are_the_same_method() {
    let mut k = Kernel::start();
    let a = k.call("execute", json!({"code": "1 + 1"}));
    let b = k.call("execute_code", json!({"code": "1 + 1"}));
    assert_eq!(a["result"]["result"], "2");
    assert_eq!(b["result"]["result"], "2");
    assert_eq!(a["result"]["execution_count"], 1);
    assert_eq!(b["result"]["execution_count"], 2);
}

#[test]
fn status_and_ping() {
    let mut k = Kernel::start();
    k.ok("x = 1");
    for m in ["status", "ping"] {
        let s = k.call(m, Value::Null)["result"].clone();
        assert_eq!(s["execution_count"], 1, "{m}: {s}");
        assert_eq!(s["mode"], "in_process");
        assert_eq!(s["pid"], json!(k.pid()));
        assert!(s.get("message").is_none());
        assert_eq!(s["session_id"], k.ready["session_id"]);
    }
}

#[test]
fn shutdown_replies_and_exits_zero() {
    let mut k = Kernel::start();
    k.ok("x = 1");
    let r = k.call("shutdown", Value::Null);
    assert_eq!(r["result"]["shutting_down"], true);
    assert!(k.wait().success());
    assert_eq!(flowrepl_tests::read_log(&k.log_file()).len(), 1);
}

#[test]
fn eof_on_stdin_exits_zero() {
    let mut k = Kernel::start();
    k.ok("x = 1");
    let log = k.log_file();
    assert!(k.close().success());
    assert_eq!(flowrepl_tests::read_log(&log).len(), 1);
}

#[test]
fn malformed_lines_get_errors_and_the_kernel_stays_up() {
    let mut k = Kernel::start();
    // (line, code, id of the reply: null unless the request's id could be read)
    let cases: &[(&[u8], i64, Value)] = &[
        (b"not json\n", -32700, Value::Null),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\n",
            -32700,
            Value::Null,
        ),
        (b"[1,2,3]\n", -32600, Value::Null),
        (b"\"execute\"\n", -32600, Value::Null),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1}\n", -32600, json!(1)),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":{\"a\":1},\"method\":\"status\"}\n",
            -32600,
            Value::Null,
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"st\xff\xfeatus\"}\n",
            -32700,
            Value::Null,
        ),
        (b"\xff\xfe\xfd\n", -32700, Value::Null),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":\"\xed\xa0\x80\",\"method\":\"status\"}\n",
            -32700,
            Value::Null,
        ),
    ];
    for (line, code, id) in cases {
        k.send_raw(line);
        let r = k.recv();
        assert_eq!(
            error_code(&r),
            *code,
            "{:?} -> {r}",
            String::from_utf8_lossy(line)
        );
        assert_eq!(&r["id"], id, "{r}");
    }
    k.send_raw(b"\n   \n"); // blank lines are skipped silently
    k.ok("y = 2");
}

#[test]
fn method_and_params_errors_keep_the_id() {
    let mut k = Kernel::start();
    let r = k.call("no_such_method", Value::Null);
    assert_eq!(error_code(&r), -32601);
    for params in [
        json!({}),
        json!({"code": 5}),
        json!(["x = 1"]),
        json!({"code": "x", "timeout_ms": 0}),
        json!({"code": "x", "timeout_ms": -1}),
        json!({"code": "x", "timeout_ms": "soon"}),
    ] {
        let r = k.call("execute_code", params.clone());
        assert_eq!(error_code(&r), -32602, "{params} -> {r}");
    }
    let r = k.call("status", json!({"verbose": true}));
    assert_eq!(error_code(&r), -32602);
    k.ok("x = 1");
}

#[test]
fn fifty_megabyte_lines() {
    let mut k = Kernel::start();
    // Garbage of 50 MB: an error, not a crash.
    let mut garbage = vec![b'x'; 50 << 20];
    garbage.push(b'\n');
    k.send_raw(&garbage);
    assert_eq!(error_code(&k.recv()), -32700);
    // A valid 50 MB request runs.
    let code = format!("s = '{}'\nlen(s)", "a".repeat(50 << 20));
    let r = k.execute(&code);
    assert_eq!(r["result"], json!((50 << 20).to_string()));
    k.ok("del s");
}

#[test]
fn lines_over_the_limit_are_discarded_with_an_error() {
    let mut k = Kernel::options()
        .env("FLOWREPL_MAX_REQUEST_BYTES", "1000")
        .start();
    let long = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"execute_code\",\"params\":{{\"code\":\"{}\"}}}}\n", "x".repeat(5000));
    k.send_raw(long.as_bytes());
    let r = k.recv();
    assert_eq!(error_code(&r), -32001, "{r}");
    // The id is recovered from the line's head (as over MCP)...
    assert_eq!(r["id"], 1, "{r}");
    // ... when it is there: written after a long field, it is not.
    let late = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"execute_code\",\"params\":{{\"code\":\"{}\"}},\"id\":2}}\n", "x".repeat(70_000));
    k.send_raw(late.as_bytes());
    let r = k.recv();
    assert_eq!(error_code(&r), -32001, "{r}");
    assert_eq!(r["id"], Value::Null, "{r}");
    k.ok("x = 1");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let mut k = Kernel::start();
    let mut batch = Vec::new();
    for i in 0..200 {
        let line = json!({"jsonrpc":"2.0","id": format!("r{i}"),"method":"execute_code","params":{"code": format!("v = {i}\nv * 2")}});
        batch.extend_from_slice(line.to_string().as_bytes());
        batch.push(b'\n');
    }
    // (A `status` here could be answered early, by design: it is answered at once while a
    // cell runs. Every other method is answered in order.)
    batch.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":\"last\",\"method\":\"execute\",\"params\":{\"code\":\"'end'\"}}\n");
    k.send_raw(&batch);
    for i in 0..200 {
        let r = k.recv();
        assert_eq!(r["id"], json!(format!("r{i}")));
        assert_eq!(r["result"]["result"], json!((i * 2).to_string()));
    }
    let last = k.recv();
    assert_eq!(last["id"], "last");
    assert_eq!(last["result"]["execution_count"], 201);
}

#[test]
fn notifications_run_but_get_no_reply() {
    let mut k = Kernel::start();
    k.send_raw(
        b"{\"jsonrpc\":\"2.0\",\"method\":\"execute_code\",\"params\":{\"code\":\"n = 7\"}}\n",
    );
    k.send_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"no_such_method\"}\n");
    assert!(k.recv_timeout(Duration::from_millis(300)).is_none());
    let r = k.ok("n");
    assert_eq!(r["result"], "7");
    assert_eq!(r["execution_count"], 2);
}

#[test]
fn jsonrpc_member_is_optional_but_checked() {
    let mut k = Kernel::start();
    k.send_raw(b"{\"id\":1,\"method\":\"execute\",\"params\":{\"code\":\"1\"}}\n");
    assert_eq!(k.recv()["result"]["result"], "1");
    k.send_raw(b"{\"jsonrpc\":\"1.0\",\"id\":2,\"method\":\"status\"}\n");
    let r = k.recv();
    assert_eq!(error_code(&r), -32600);
    assert_eq!(r["id"], 2);
}
