//! `flow` in the session: events, steps and `MCP::` lines, in the result and the task log.

use flowrepl_tests::{Kernel, MODES};
use serde_json::{json, Value};

fn names(r: &Value) -> Vec<(u64, String, Value)> {
    r["events"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["name"].as_str().unwrap().to_owned(),
                e["step"].clone(),
            )
        })
        .collect()
}

#[test]
fn events_steps_and_lines_in_order_in_the_result_and_the_log() {
    for mode in MODES {
        let mut k = Kernel::options()
            .mode(mode)
            .env("FLOW_PLAN_ID", "plan-f")
            .env("FLOW_TASK_ID", "task-f")
            .start();
        let r = k.ok(
            "flow.event('loaded', rows=3, names=['a', 'b'], ok=True, ratio=0.5, none=None)\n\
             print('MCP::progress {\"pct\": 50}')\n\
             with flow.step('outer', total=2) as s:\n\
             \x20   s.log('halfway')\n\
             \x20   with flow.step('inner'):\n\
             \x20       flow.event('deep', n=1)\n\
             print('done')",
        );
        let want: Vec<(u64, String, Value)> = [
            ("loaded", Value::Null),
            ("progress", Value::Null),
            ("step_start", Value::Null),
            ("step_log", json!("outer")),
            ("step_start", json!("outer")),
            ("deep", json!("inner")),
            ("step_end", json!("outer")),
            ("step_end", Value::Null),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (n, s))| (i as u64 + 1, n.to_owned(), s))
        .collect();
        assert_eq!(names(&r), want, "{mode}");
        let ev = &r["events"];
        assert_eq!(
            ev[0]["data"],
            json!({"rows": 3, "names": ["a", "b"], "ok": true, "ratio": 0.5, "none": null}),
            "{mode}"
        );
        assert_eq!(ev[1]["data"], json!({"pct": 50}), "{mode}");
        assert_eq!(
            ev[2]["data"],
            json!({"name": "outer", "total": 2}),
            "{mode}"
        );
        assert_eq!(
            ev[3]["data"],
            json!({"name": "outer", "message": "halfway"}),
            "{mode}"
        );
        assert_eq!(ev[7]["data"]["success"], true, "{mode}");
        assert!(
            ev[7]["data"]["duration_ms"].as_f64().unwrap() >= 0.0,
            "{mode}"
        );
        assert!(
            ev[0]["timestamp"].as_str().unwrap().ends_with('Z'),
            "{mode}"
        );
        assert_eq!(
            r["stdout"], "MCP::progress {\"pct\": 50}\ndone\n",
            "{mode}: lines stay in stdout"
        );
        // The log: the execution record carries them, and each is a record of its own.
        k.sync();
        let log = flowrepl_tests::read_log_all(&k.log_file());
        assert_eq!(log.records[0].events.len(), 8, "{mode}");
        assert_eq!(log.events.len(), 8, "{mode}");
        for (i, e) in log.events.iter().enumerate() {
            assert_eq!(
                (
                    &*e.head.task.plan_id,
                    &*e.head.task.task_id,
                    e.head.execution_count
                ),
                ("plan-f", "task-f", 1),
                "{mode}"
            );
            assert_eq!(e.head.task.session_id, log.records[0].session_id, "{mode}");
            assert_eq!(e.event.seq, i as u64 + 1, "{mode}");
        }
        // A cell without events has none, and pays for none.
        let r = k.ok("x = 1");
        assert!(r.get("events").is_none(), "{mode}: {r}");
    }
}

#[test]
fn a_step_that_raises_says_so_and_the_exception_goes_on() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        let r = k.execute("with flow.step('load'):\n    raise ValueError('no file')");
        assert_eq!(r["error"]["type"], "ValueError", "{mode}");
        let ev = &r["events"];
        assert_eq!(ev[1]["name"], "step_end", "{mode}");
        assert_eq!(ev[1]["data"]["success"], false, "{mode}");
        assert_eq!(ev[1]["data"]["error"], "ValueError", "{mode}");
    }
}

#[test]
fn non_json_data_is_a_type_error_naming_the_key_and_a_bad_line_a_warning() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        let r = k.execute("flow.event('ok', n=1)\nflow.event('bad', good=1, handle=open)");
        assert_eq!(r["error"]["type"], "TypeError", "{mode}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("\"handle\"") && msg.contains("not JSON-serialisable"),
            "{mode}: {msg}"
        );
        assert_eq!(names(&r).len(), 1, "{mode}: the bad event was not reported");
        for bad in ["float('nan')", "{1, 2}", "[object()]", "b'x'"] {
            let r = k.execute(&format!("flow.event('bad', v={bad})"));
            assert_eq!(r["error"]["type"], "TypeError", "{mode}: {bad}");
        }
        let r = k.execute("l = []\nl.append(l)\nflow.event('cycle', v=l)");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("nested too deeply"),
            "{mode}"
        );
        let r = k.ok("print('MCP::odd {not json')");
        assert_eq!(
            r["events"][0]["data"],
            json!({"raw": "{not json"}),
            "{mode}"
        );
        assert!(
            r["warnings"][0].as_str().unwrap().contains("MCP::odd"),
            "{mode}: {r}"
        );
    }
}

#[test]
fn flow_is_not_a_session_variable_and_survives_being_rebound() {
    for mode in MODES {
        let mut k = Kernel::options()
            .mode(mode)
            .env("FLOW_TASK_ID", "t9")
            .start();
        let r = k.ok("a = 1");
        assert_eq!(
            (r["added_vars"].clone(), r["variable_count"].clone()),
            (json!(["a"]), json!(1)),
            "{mode}"
        );
        let r = k.call("list_variables", Value::Null);
        assert_eq!(r["result"]["count"], 1, "{mode}: {r}");
        let r = k.ok("(flow.task_id, flow.execution_count, flow.session_id == flow.session_id)");
        assert_eq!(r["result"], "('t9', 2, True)", "{mode}");
        // A cell may use the name for itself; the kernel's flow stays reachable.
        let r = k.ok("flow = 'mine'\nimport flowrepl\nflowrepl.flow.event('still', ok=True)\nflow");
        assert_eq!(r["result"], "'mine'", "{mode}");
        assert_eq!(r["events"][0]["name"], "still", "{mode}");
        assert_eq!(r["added_vars"], json!(["flow", "flowrepl"]), "{mode}");
        assert_eq!(r["added_imports"], json!([]), "{mode}");
    }
}

#[test]
fn an_event_before_a_worker_crash_is_not_lost() {
    let mut k = Kernel::options().worker().start();
    let r = k.execute("flow.event('before_crash', n=1)\nimport os\nos._exit(3)");
    assert_eq!(r["error"]["type"], "WorkerDied");
    assert_eq!(
        names(&r),
        [(1, "before_crash".to_owned(), Value::Null)],
        "{r}"
    );
    k.sync();
    let log = flowrepl_tests::read_log_all(&k.log_file());
    assert_eq!(log.events.len(), 1);
    assert_eq!(log.events[0].event.name, "before_crash");
}

#[test]
fn the_task_context_merges_replaces_and_outlives_the_kernel() {
    for mode in MODES {
        let logs = tempfile::tempdir().unwrap();
        let task = |t: &str| {
            Kernel::options()
                .mode(mode)
                .log_dir(logs.path())
                .env("FLOW_PLAN_ID", "p")
                .env("FLOW_TASK_ID", t)
                .start()
        };
        let mut k = task("a");
        assert_eq!(k.ok("dict(flow.context)")["result"], "{}", "{mode}");
        let r = k.ok("flow.context.update({'stage': 'load', 'files': ['x.csv']})");
        assert_eq!(
            r["result"], "{'stage': 'load', 'files': ['x.csv']}",
            "{mode}"
        );
        let r = k.ok("flow.context.update({'stage': 'train', 'n': 2})\n(flow.context['stage'], flow.context.get('files'), 'n' in flow.context, sorted(flow.context.keys()))");
        assert_eq!(
            r["result"], "('train', ['x.csv'], True, ['files', 'n', 'stage'])",
            "{mode}"
        );
        let r = k.execute("flow.context.update({'bad': {1, 2}})");
        assert_eq!(r["error"]["type"], "TypeError", "{mode}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("\"bad\""),
            "{mode}: {r}"
        );
        assert_eq!(
            k.ok("flow.context['stage']")["result"],
            "'train'",
            "{mode}: unchanged"
        );
        k.sync();
        let log = flowrepl_tests::read_log_all(&k.log_file());
        assert_eq!(
            log.contexts.len(),
            2,
            "{mode}: one record per change, none for the refused one"
        );
        assert_eq!(
            log.contexts[1].context.get(),
            r#"{"stage":"train","files":["x.csv"],"n":2}"#,
            "{mode}"
        );
        assert_eq!(log.contexts[1].head.execution_count, 3, "{mode}");
        drop(k);
        // A later kernel for the same task starts from the last context; another task does not.
        let mut k = task("a");
        assert_eq!(k.ok("flow.context['n']")["result"], "2", "{mode}");
        let r = k.ok("flow.context.update({'only': True}, merge=False)");
        assert_eq!(r["result"], "{'only': True}", "{mode}");
        k.sync(); // the record follows the reply
        drop(k);
        let mut k = task("a");
        assert_eq!(
            k.ok("dict(flow.context)")["result"],
            "{'only': True}",
            "{mode}"
        );
        let mut other = task("b");
        assert_eq!(
            other.ok("dict(flow.context)")["result"],
            "{}",
            "{mode}: tasks are isolated"
        );
    }
}

#[test]
fn a_context_change_before_a_worker_crash_is_saved_and_kept() {
    let mut k = Kernel::options().worker().start();
    let r = k.execute("flow.context.update({'step': 7})\nimport os\nos._exit(1)");
    assert_eq!(r["error"]["type"], "WorkerDied");
    // The fresh worker starts from it, and so would a later kernel.
    assert_eq!(k.ok("flow.context['step']")["result"], "7");
    k.sync();
    assert_eq!(
        flowrepl_tests::read_log_all(&k.log_file()).contexts.len(),
        1
    );
}

/// A context of 200 KB (more than Linux lets one command-line string hold: it once stopped
/// every later worker of the task from starting, E2BIG) reaches a fresh worker and a later
/// kernel; one over the limit is a ValueError at `update` with nothing saved; a stored
/// context over the limit (written by hand) does not stop a kernel: it starts from `{}` and
/// says why on stderr. Sandboxed, as serve runs workers.
#[test]
fn a_large_context_starts_every_later_worker_and_a_too_large_one_is_refused() {
    let logs = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let task = || {
        Kernel::options()
            .worker()
            .arg("--sandbox")
            .arg("--workspace")
            .arg(ws.path().display().to_string())
            .log_dir(logs.path())
            .env("FLOW_PLAN_ID", "p")
            .env("FLOW_TASK_ID", "big")
            .start()
    };
    let mut k = task();
    k.ok("_ = flow.context.update({'blob': 'x' * 200_000})");
    let r = k.execute("flow.context.update({'blob': 'x' * 300_000})");
    assert_eq!(r["error"]["type"], "ValueError", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 262144"),
        "{r}"
    );
    assert_eq!(
        k.ok("len(flow.context['blob'])")["result"],
        "200000",
        "unchanged"
    );
    let r = k.execute("import os\nos._exit(1)");
    assert_eq!(r["error"]["type"], "WorkerDied");
    assert_eq!(
        k.ok("len(flow.context['blob'])")["result"],
        "200000",
        "a fresh worker"
    );
    k.sync();
    let path = flowrepl_task_logger::context_path(&k.log_file());
    drop(k);
    let mut k = task();
    assert_eq!(
        k.ok("len(flow.context['blob'])")["result"],
        "200000",
        "a later kernel"
    );
    drop(k);
    std::fs::write(&path, format!("{{\"blob\":\"{}\"}}", "y".repeat(300_000))).unwrap();
    let mut k = task();
    assert_eq!(k.ok("dict(flow.context)")["result"], "{}");
    assert!(k.stderr_with("larger than").contains("context"));
}
