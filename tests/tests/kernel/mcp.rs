//! `flowrepl mcp` driven by the official Python MCP SDK (scenarios in `tests/mcp/client.py`),
//! plus raw-protocol checks of stdout and shutdown.

use flowrepl_tests::mcp::Scenario;
use flowrepl_tests::{flowrepl_bin, read_log, wait_for, MODES};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn tools_are_listed_with_schemas_for_a_model() {
    let (facts, _, _logs) = Scenario::default().run("tools");
    let tools = facts["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 14);
    // The description states the server's own settings.
    let said = facts["execute_code"].as_str().unwrap();
    assert!(
        said.contains("Output over 20000 characters") && said.contains("(default 300000)"),
        "{said}"
    );
    let (facts, _, _logs) = Scenario::default()
        .env("FLOWREPL_MCP_MAX_CHARS", "5000")
        .env("FLOWREPL_TIMEOUT_MS", "60000")
        .run("tools");
    let said = facts["execute_code"].as_str().unwrap();
    assert!(
        said.contains("Output over 5000 characters") && said.contains("(default 60000)"),
        "{said}"
    );
    flowrepl_tests::assert_help_lists_tools("mcp", tools);
}

/// `wait_s`: a cell still running is answered with its id and output so far, and
/// `wait_cell` collects its result once; a queued cell says so. One record per cell.
#[test]
fn a_long_cell_answers_running_and_wait_cell_collects_it() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("long_cell");
        assert!(
            facts["answered_s"].as_f64().unwrap() < 2.5,
            "{mode}: {facts}"
        );
        let records = read_log(&log);
        // The cell dropped by `interrupt {cell}` never ran: no record.
        assert_eq!(records.len(), 6, "{mode}");
        assert_eq!(records[0].result.as_deref(), Some("'done'"), "{mode}");
        assert!(records[4].interrupted, "{mode}: {:?}", records[4]);
    }
}

/// The MCP tasks extension (2026-07-28, the SDK's own `Client`): a cell outliving `wait_s`
/// becomes a task that ends with its result; `tasks/cancel` interrupts its cell, whose record
/// says so.
#[test]
fn a_long_cell_becomes_a_task_for_clients_with_the_tasks_extension() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("tasks");
        assert_eq!(facts["tasks"], 3, "{mode}: {facts}");
        let records = read_log(&log);
        assert_eq!(records.len(), 7, "{mode}");
        assert_eq!(records[1].result.as_deref(), Some("'done'"), "{mode}");
        assert!(records[2].interrupted, "{mode}: {:?}", records[2]);
    }
}

#[test]
fn checkpoint_tools_and_restores_through_mcp() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("checkpoints");
        assert!(facts["restore_ms"].as_f64().unwrap() >= 0.0, "{facts}");
        if mode == "worker" {
            let records = read_log(&log);
            assert!(
                records.iter().any(|r| r.restored.is_some()),
                "the restored cell's record says so"
            );
        }
    }
}

#[test]
fn state_persists_across_calls_and_every_call_is_logged() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("persistence");
        assert_eq!(facts["mode"], mode);
        let records = read_log(&log);
        assert_eq!(records.len(), 5, "{mode}: one record per execute_code call");
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.execution_count, i as u64 + 1);
            assert_eq!((&*r.plan_id, &*r.task_id), ("plan-mcp", "task-persistence"));
            assert_eq!(r.mode, mode);
        }
        assert_eq!(records[1].result.as_deref(), Some("84"));
    }
}

#[test]
fn failing_cells_are_error_results_and_bad_arguments_are_protocol_errors() {
    let (_, log, _logs) = Scenario::default().run("errors");
    let records = read_log(&log);
    assert_eq!(
        records.len(),
        4,
        "rejected calls run nothing and log nothing"
    );
    assert_eq!(records[0].error_type.as_deref(), Some("ZeroDivisionError"));
}

#[test]
fn output_over_the_budget_is_cut_and_paged_back_with_read_output() {
    let (facts, log, _logs) = Scenario::default()
        .env("FLOWREPL_MCP_MAX_CHARS", "5000")
        .run("budget");
    assert!(facts["pages"].as_u64().unwrap() > 10, "{facts}");
    let records = read_log(&log);
    assert_eq!(
        records[0].stdout.chars().count() as u64,
        facts["total_chars"].as_u64().unwrap(),
        "the log keeps the whole output"
    );
}

#[test]
fn a_long_cell_reports_progress_with_its_last_output_line() {
    for mode in MODES {
        let (facts, _, _logs) = Scenario::mode(mode).run("progress");
        assert!(
            facts["notifications"].as_u64().unwrap() >= 2,
            "{mode}: {facts}"
        );
    }
}

#[test]
fn cancelling_a_call_interrupts_its_cell_and_the_session_goes_on() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("cancel");
        assert!(facts["next_call_s"].as_f64().unwrap() < 10.0, "{facts}");
        let records = read_log(&log);
        let codes: Vec<&str> = records.iter().map(|r| &*r.code).collect();
        assert!(
            !codes.contains(&"never = 1"),
            "{mode}: a cancelled queued call never runs"
        );
        assert_eq!(records.len(), 5, "{mode}: {codes:?}");
        let sleep = &records[1];
        assert!(sleep.code.contains("sleep(60)"));
        assert!(
            sleep.interrupted,
            "{mode}: the cancelled cell was interrupted"
        );
        assert_eq!(sleep.stopped_by.as_deref(), Some("interrupt"));
        assert!(sleep.elapsed_ms < 10_000.0, "{mode}: {}", sleep.elapsed_ms);
    }
}

#[test]
fn the_interrupt_tool_stops_the_running_cell() {
    for mode in MODES {
        Scenario::mode(mode).run("interrupt");
    }
}

#[test]
fn in_process_a_call_behind_a_cell_that_ignores_sigint_is_told_so() {
    let (facts, log, _logs) = Scenario::default()
        .env("FLOWREPL_KILL_GRACE_MS", "500")
        .run("stuck");
    assert!(facts["second_answered_after_s"].as_f64().unwrap() < 4.0);
    let codes: Vec<String> = read_log(&log).iter().map(|r| r.code.to_string()).collect();
    assert_eq!(codes.len(), 2, "the withdrawn call never ran: {codes:?}");
}

#[test]
fn variables_are_listed_and_restart_drops_them() {
    for mode in MODES {
        let (facts, _, _logs) = Scenario::mode(mode).run("variables");
        assert!(facts["restart_pid"].as_u64().unwrap() > 0);
    }
}

#[test]
fn matplotlib_figures_come_back_as_png_images() {
    for mode in MODES {
        let (_, log, _logs) = Scenario::mode(mode)
            .env("FLOWREPL_MCP_MAX_IMAGES", "3")
            .run("figures");
        let records = read_log(&log);
        let plot = &records[1];
        assert_eq!(plot.images.len(), 1, "{mode}: {:?}", plot.images);
        assert_eq!(plot.images[0].source, "figure 1");
        assert_eq!((plot.images[0].width, plot.images[0].height), (640, 480));
        assert!(records[0].images.is_empty());
    }
}

/// A raw MCP session over pipes: every line on stdout must be a JSON-RPC message.
struct Raw {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    _logs: tempfile::TempDir,
}

impl Raw {
    fn start(worker: bool) -> Raw {
        let logs = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(flowrepl_bin());
        cmd.arg("mcp")
            .env("FLOWREPL_LOG_DIR", logs.path())
            .env("FLOWREPL_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if worker {
            cmd.arg("--worker");
        }
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut raw = Raw {
            child,
            lines,
            _logs: logs,
        };
        raw.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "0"}}}),
        );
        let init = raw.reply(0);
        assert_eq!(init["result"]["serverInfo"]["name"], "flowrepl", "{init}");
        raw.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        raw
    }

    fn send(&mut self, v: Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for the response to `id`; every line before it must be a JSON-RPC message too.
    fn reply(&mut self, id: u64) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .expect("a reply within 60 s");
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line:?}"));
            assert_eq!(v["jsonrpc"], "2.0", "not JSON-RPC: {line}");
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    fn call(&mut self, id: u64, code: &str) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": {"code": code}}}));
        self.reply(id)
    }
}

#[test]
fn nothing_but_mcp_messages_reach_stdout() {
    for worker in [false, true] {
        let mut raw = Raw::start(worker);
        let noisy = r#"
import os, sys, ctypes, subprocess
print("print")
os.write(1, b"raw fd 1\n")
os.write(2, b"raw fd 2\n")
ctypes.CDLL(None).printf(b"C printf\n")
subprocess.run(["echo", "child process"])
sys.__stdout__.write("dunder stdout\n")
'done'
"#;
        let r = raw.call(1, noisy);
        let text = r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        for piece in [
            "print",
            "raw fd 1",
            "C printf",
            "child process",
            "dunder stdout",
        ] {
            assert!(
                text.contains(piece),
                "worker {worker}: {piece:?} missing from {text:?}"
            );
        }
        assert!(text.contains("[stderr]\nraw fd 2"), "{text}");
        // A background writer after the call: its output must not reach the channel either.
        raw.call(2, "import threading, time, os\nthreading.Thread(target=lambda: [os.write(1, b'late\\n') or time.sleep(0.01) for _ in range(20)]).start()");
        std::thread::sleep(Duration::from_millis(400));
        let r = raw.call(3, "1 + 1");
        assert!(r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Out[3]: 2"));
        drop(raw.child.stdin.take());
        let started = Instant::now();
        assert!(
            wait_for(Duration::from_secs(10), || matches!(
                raw.child.try_wait(),
                Ok(Some(_))
            )),
            "the server exits when stdin closes"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(raw.child.wait().unwrap().success());
    }
}

#[test]
fn closing_stdin_during_a_cell_stops_it_and_exits() {
    for worker in [false, true] {
        let mut raw = Raw::start(worker);
        raw.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": {"code": "import time\ntime.sleep(60)"}}}));
        std::thread::sleep(Duration::from_millis(500));
        drop(raw.child.stdin.take());
        assert!(
            wait_for(Duration::from_secs(15), || matches!(
                raw.child.try_wait(),
                Ok(Some(_))
            )),
            "worker {worker}: the server exits soon after stdin closes, mid-cell"
        );
        let log_dir = raw._logs.path().to_path_buf();
        let log = flowrepl_task_logger::task_log_path(&log_dir, "local", "adhoc");
        let records = read_log(&log);
        assert_eq!(records.len(), 1, "the interrupted cell is still logged");
        assert!(records[0].interrupted);
    }
}

#[test]
fn a_fifty_megabyte_call_runs_and_a_call_over_the_limit_is_refused() {
    let (facts, log, _logs) = Scenario::default().run("large_requests");
    assert_eq!(facts["ran"], true);
    assert_eq!(read_log(&log)[0].result.as_deref(), Some("52428800"));
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode)
            .env("FLOWREPL_MAX_REQUEST_BYTES", (1 << 20).to_string())
            .run("large_requests");
        assert_eq!(facts["ran"], false, "{mode}");
        assert_eq!(
            read_log(&log).len(),
            1,
            "{mode}: the refused call ran nothing"
        );
    }
}

#[test]
fn a_line_over_the_limit_gets_its_id_back_and_memory_stays_bounded() {
    let mut child = Command::new(flowrepl_bin())
        .arg("mcp")
        .env("FLOWREPL_MAX_REQUEST_BYTES", (4 << 20).to_string())
        .env("FLOWREPL_LOG_DIR", tempfile::tempdir().unwrap().path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let send = |stdin: &mut std::process::ChildStdin, v: Value| {
        stdin.write_all(format!("{v}\n").as_bytes()).unwrap();
    };
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}),
    );
    out.read_line(&mut line).unwrap();
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    // 200 MB in one line, written in pieces: the kernel must not hold it.
    stdin
        .write_all(br#"{"jsonrpc":"2.0","id":"big-1","method":"tools/call","params":{"name":"execute_code","arguments":{"code":"x = '"#)
        .unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..200 {
        stdin.write_all(&chunk).unwrap();
    }
    stdin.write_all(b"'\"}}}\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let reply: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["id"], "big-1", "{reply}");
    assert_eq!(reply["error"]["code"], -32001, "{reply}");
    let rss_kb = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmHWM:").map(|v| {
                v.trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap()
            })
        })
        .unwrap();
    assert!(
        rss_kb < 120 << 10,
        "peak RSS {rss_kb} kB while a 200 MB line went by"
    );
    // The server goes on.
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"code": "6 * 7"}}}),
    );
    line.clear();
    out.read_line(&mut line).unwrap();
    let reply: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["id"], 2, "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["result"], "42",
        "{reply}"
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

#[test]
fn events_are_shown_in_the_text_and_structured() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("events");
        assert_eq!(facts["events"], 5, "{mode}");
        assert_eq!(read_log(&log)[0].events.len(), 5, "{mode}");
    }
}

#[test]
fn approvals_are_elicitation_requests_when_the_client_can_answer() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("approvals");
        assert_eq!(facts["asked"], 6, "{mode}");
        let approvals = read_log(&log)
            .iter()
            .flat_map(|r| r.events.iter())
            .filter(|e| e.name == "approval")
            .count();
        assert_eq!(approvals, 12, "{mode}");
        Scenario::mode(mode).run("approvals_without_elicitation");
    }
}
