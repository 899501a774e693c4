//! Drop-in for `python json_repl_session.py`: a client that behaves exactly as the original
//! system's TypeScript server does talks to `flowrepl` started the way it starts its REPL.

use flowrepl_tests::{flowrepl_bin, read_log, MODES};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The original client's reply timeout.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The REPL's folder as the original system ships it: the script (never run by flowrepl: it
/// would leave a marker) and the helper package the sessions import.
fn install_root(dir: &Path) -> PathBuf {
    let py = dir.join("python");
    std::fs::create_dir_all(py.join("flow_helpers")).unwrap();
    std::fs::write(
        py.join("json_repl_session.py"),
        "open(__file__ + '.ran', 'w').close()\n",
    )
    .unwrap();
    std::fs::write(
        py.join("flow_helpers/__init__.py"),
        "def shout(s):\n    return s.upper() + '!'\n",
    )
    .unwrap();
    py.join("json_repl_session.py")
}

/// What the original client gets back for a call.
#[derive(Debug)]
enum Outcome {
    /// `result` was present: shown as a success.
    Result(Value),
    /// `error` was present: `error.message`, and the data.
    Error(String, Value),
}

struct LegacyClient {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    n: u64,
}

impl LegacyClient {
    /// Spawns `$PYTHON_PATH -u -X utf8 <script>` with the client's environment and waits up to
    /// 10 s for `__READY__` anywhere on stdout, as the client does.
    fn start(script: &Path, mode: &str, extra_env: &[(&str, String)], logs: &Path) -> LegacyClient {
        let mut cmd = Command::new(flowrepl_bin());
        cmd.args(["-u", "-X", "utf8"])
            .arg(script)
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONUTF8", "1")
            .env("PYTHONUNBUFFERED", "1")
            .env("FLOWREPL_LOG_DIR", logs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if mode == "worker" {
            cmd.env("USE_SUBPROCESS_WORKER", "1");
        }
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = stderr.read_to_end(&mut sink);
        });
        // The client looks for the marker in raw chunks, then splits lines.
        let (tx, lines) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            let mut seen = String::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = stdout.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    return;
                }
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                if seen.contains("__READY__") {
                    let _ = ready_tx.send(());
                    break;
                }
            }
            // Then, as it does, each read of up to 64 KiB decoded on its own
            // (`data.toString()`): a character split across two reads becomes U+FFFD.
            let mut pending = seen
                .split_once("__READY__")
                .map_or(String::new(), |(_, rest)| rest.to_owned());
            let mut rest_of_ready = true;
            let mut chunk = vec![0u8; 64 << 10];
            loop {
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    if std::mem::take(&mut rest_of_ready) {
                        continue;
                    }
                    let line = line.trim_end_matches('\n');
                    if tx.send(line.to_owned()).is_err() {
                        return;
                    }
                }
                let n = stdout.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    return;
                }
                pending.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        });
        ready
            .recv_timeout(Duration::from_secs(10))
            .expect("no __READY__ within 10 s");
        LegacyClient {
            child,
            stdin,
            lines,
            n: 0,
        }
    }

    /// Sends `execute` with an id `req_<n>_<ms>` and waits for the reply with that id.
    fn execute(&mut self, code: &str) -> Outcome {
        self.n += 1;
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let id = format!("req_{}_{ms}", self.n);
        let req =
            json!({"jsonrpc": "2.0", "id": id, "method": "execute", "params": {"code": code}});
        self.stdin.write_all(format!("{req}\n").as_bytes()).unwrap();
        let until = Instant::now() + CLIENT_TIMEOUT;
        loop {
            let line = self
                .lines
                .recv_timeout(until.saturating_duration_since(Instant::now()))
                .expect("the client gave up on the reply");
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["id"] != json!(id) {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Outcome::Error(
                    e["message"].as_str().unwrap().to_owned(),
                    e["data"].clone(),
                );
            }
            return Outcome::Result(v["result"].clone());
        }
    }

    fn ok(&mut self, code: &str) -> Value {
        match self.execute(code) {
            Outcome::Result(r) => r,
            other => panic!("{code}: {other:?}"),
        }
    }

    fn err(&mut self, code: &str) -> (String, Value) {
        match self.execute(code) {
            Outcome::Error(m, d) => (m, d),
            other => panic!("{code} should fail: {other:?}"),
        }
    }

    /// The client's restart: SIGTERM, then wait.
    fn terminate(mut self) {
        flowrepl_tests::kill(self.child.id(), libc::SIGTERM);
        let st = self.child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}");
    }
}

#[test]
fn the_original_client_works_unchanged() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let script = install_root(dir.path());
        let logs = dir.path().join("logs");
        let startup = dir.path().join("preload.py");
        std::fs::write(&startup, "import os, sys, gc\nfrom pathlib import Path\nfrom datetime import datetime\ndef preloaded():\n    return 'here'\n").unwrap();
        let env = [
            ("PYTHONSTARTUP", startup.display().to_string()),
            ("FLOW_TASK_ID", "legacy".into()),
        ];
        let mut c = LegacyClient::start(&script, mode, &env, &logs);

        // A plain cell: a result, shown as a success.
        let r = c.ok("x = 20 + 1\nprint('hi')\nx * 2");
        assert_eq!(
            (
                r["success"].as_bool(),
                r["stdout"].as_str(),
                r["result"].as_str()
            ),
            (Some(true), Some("hi\n"), Some("42")),
            "{mode}"
        );
        // Names from PYTHONSTARTUP are the baseline: not added by the first cell, but there.
        assert_eq!(r["added_vars"], json!(["x"]), "{mode}");
        assert_eq!(
            c.ok("preloaded(), Path('a').name, type(datetime).__name__, gc.isenabled()")["result"],
            "('here', 'a', 'type', True)",
            "{mode}"
        );
        // The script's folder is first on sys.path, its helper package imports, and the
        // script itself never ran.
        assert_eq!(
            c.ok("import flow_helpers\nflow_helpers.shout('ok')")["result"],
            "'OK!'",
            "{mode}"
        );
        assert_eq!(
            c.ok("import sys\nsys.argv")["result"],
            format!("[{:?}]", script.display().to_string()).replace('"', "'"),
            "{mode}"
        );
        assert!(
            !script.with_extension("py.ran").exists(),
            "{mode}: the script ran"
        );

        // Failures are JSON-RPC errors with the exception text, the whole result as data.
        let (m, d) = c.err("def f():\n    raise ValueError('bad value')\nf()");
        assert_eq!(m, "bad value", "{mode}");
        assert_eq!(d["error"]["type"], "ValueError", "{mode}");
        assert!(
            d["stderr"].as_str().unwrap().contains("Traceback")
                && d["error"]["traceback"].as_str().unwrap().contains("in f"),
            "{mode}: {d}"
        );
        assert_eq!(d["success"], false);
        let (m, d) = c.err("print('before')\n1/0");
        assert_eq!(
            (m.as_str(), d["stdout"].as_str()),
            ("division by zero", Some("before\n")),
            "{mode}"
        );
        let (m, d) = c.err("def broken(:");
        assert_eq!(d["error"]["type"], "SyntaxError", "{mode}");
        assert!(
            m.contains("invalid syntax") || m.contains("was never closed") || !m.is_empty(),
            "{mode}: {m}"
        );
        let (m, d) = c.err("import sys\nsys.exit(3)");
        assert_eq!(
            (m.as_str(), d["error"]["type"].as_str()),
            ("3", Some("SystemExit")),
            "{mode}"
        );
        let (m, d) = c.err("raise KeyError()");
        assert_eq!(
            (m.as_str(), d["error"]["type"].as_str()),
            ("KeyError", Some("KeyError")),
            "{mode}: an empty message names the type"
        );
        // `execute_code` keeps the result shape for every cell.
        // UTF-8 both ways, and 200 kB of output whole.
        assert_eq!(
            c.ok("s = 'héllo → 世界 🐍'\nprint(s)\ns")["stdout"],
            "héllo → 世界 🐍\n",
            "{mode}"
        );
        let r = c.ok("print('x' * 200_000)");
        assert_eq!(r["stdout"].as_str().unwrap().len(), 200_001, "{mode}");
        // The session survived all of it.
        assert_eq!(c.ok("x")["result"], "21", "{mode}");
        c.terminate();

        // The client restarts the process: a fresh start works, and the log kept everything.
        let mut c = LegacyClient::start(&script, mode, &env, &logs);
        assert_eq!(c.ok("preloaded()")["result"], "'here'", "{mode}");
        c.terminate();
        let records = read_log(&logs.join("local/legacy.jsonl"));
        assert!(records.len() >= 13, "{mode}: {} records", records.len());
    }
}

#[test]
fn a_timeout_is_an_error_the_client_still_receives() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let script = install_root(dir.path());
        let env = [("FLOWREPL_TIMEOUT_MS", "300".to_owned())];
        let mut c = LegacyClient::start(&script, mode, &env, &dir.path().join("logs"));
        let (m, d) = c.err("import time\ntime.sleep(30)");
        assert!(m.contains("timed out after 300 ms"), "{mode}: {m}");
        assert_eq!(d["timed_out"], true, "{mode}");
        assert_eq!(c.ok("'after'")["result"], "'after'", "{mode}");
        c.terminate();
    }
}

/// Without FLOWREPL_TIMEOUT_MS, drop-in mode answers a cell before the client's 300 s run out.
#[test]
fn the_default_timeout_stays_under_the_clients() {
    let dir = tempfile::tempdir().unwrap();
    let script = install_root(dir.path());
    let mut c = LegacyClient::start(&script, "in_process", &[], &dir.path().join("logs"));
    c.stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"s\",\"method\":\"status\"}\n")
        .unwrap();
    let status: Value = loop {
        let v: Value =
            serde_json::from_str(&c.lines.recv_timeout(Duration::from_secs(30)).unwrap()).unwrap();
        if v["id"] == "s" {
            break v;
        }
    };
    let t = status["result"]["default_timeout_ms"].as_u64().unwrap();
    assert!(
        t + 2_000 < 300_000,
        "{t}: timeout plus the kill grace must stay under 300 s"
    );
    c.terminate();
}

#[test]
fn interpreter_flags_are_honoured_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let script = install_root(dir.path());
    // -W and -B reach the interpreter; script arguments become sys.argv[1:].
    let mut opts = flowrepl_tests::Kernel::options();
    for a in ["-B", "-W", "error::UserWarning", "-X", "utf8"] {
        opts = opts.arg(a);
    }
    let mut k = opts
        .arg(script.display().to_string())
        .arg("--flag")
        .arg("value")
        .start();
    let r = k.ok("import sys\n(sys.dont_write_bytecode, sys.flags.utf8_mode, sys.warnoptions[-1], sys.argv[1:])");
    assert_eq!(
        r["result"],
        "(True, 1, 'error::UserWarning', ['--flag', 'value'])"
    );
    let r = k.execute("import warnings\nwarnings.warn('now an error')");
    assert_eq!(r["error"]["type"], "UserWarning", "{r}");
    drop(k);
    // Anything else unknown is still exit code 2, with nothing on stdout.
    for args in [&["-Z", "s.py"][..], &["-c", "print(1)"], &["-u"], &["-X"]] {
        let out = Command::new(flowrepl_bin())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// The original client decodes each 64 KiB pipe read on its own, so a character split
/// across two reads became U+FFFD (`print('한글' * 60000)` reached it as 120,006 characters
/// with 10 replacement characters). Drop-in replies are ASCII (`\u` escapes): it gets every
/// character. The same reply without the escaping (plain JSON-RPC mode) is not ASCII, and
/// decoded in 64 KiB pieces it is broken.
#[test]
fn the_original_client_gets_every_non_ascii_character() {
    let text = "한글".repeat(60_000);
    let code = "print('한글' * 60000, end='')";
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let script = install_root(dir.path());
        let mut c = LegacyClient::start(&script, mode, &[], &dir.path().join("logs"));
        let r = c.ok(code);
        let stdout = r["stdout"].as_str().unwrap();
        assert!(!stdout.contains('\u{fffd}'), "{mode}");
        assert_eq!(stdout, text, "{mode}");
        c.terminate();
    }
    // Without the escaping, what that client would do to the line.
    let mut k = flowrepl_tests::Kernel::start();
    let line = k.call("execute", json!({ "code": code })).to_string();
    assert!(!line.is_ascii());
    let broken = (0..3).any(|shift| {
        let bytes = line.as_bytes();
        let mut decoded = String::from_utf8_lossy(&bytes[..(64 << 10) - shift]).into_owned();
        for piece in bytes[(64 << 10) - shift..].chunks(64 << 10) {
            decoded.push_str(&String::from_utf8_lossy(piece));
        }
        decoded.contains('\u{fffd}')
    });
    assert!(
        broken,
        "a 64 KiB boundary splits a character at one of three offsets"
    );
}

/// `--compat json-repl` gives the same error replies without drop-in mode; `execute_code`
/// keeps the result shape in every mode.
#[test]
fn compat_mode_and_execute_code() {
    let mut k = flowrepl_tests::Kernel::options()
        .arg("--compat")
        .arg("json-repl")
        .start();
    let r = k.call("execute", json!({"code": "1/0"}));
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(r["error"]["message"], "division by zero");
    assert_eq!(r["error"]["data"]["error"]["type"], "ZeroDivisionError");
    let r = k.call("execute_code", json!({"code": "1/0"}));
    assert_eq!(r["result"]["success"], false, "{r}");
    assert_eq!(r["result"]["error"]["type"], "ZeroDivisionError");
    // Without compat, `execute` is `execute_code`.
    let mut k = flowrepl_tests::Kernel::start();
    let r = k.call("execute", json!({"code": "1/0"}));
    assert_eq!(r["result"]["success"], false, "{r}");
}

/// `--startup FILE` runs before `ready`; its names are the baseline, listed by
/// `list_variables`, back after `restart`; an error in a startup file is reported and the
/// session starts all the same.
#[test]
fn startup_files_are_the_sessions_baseline() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.py");
        let bad = dir.path().join("bad.py");
        std::fs::write(&good, "import json\nanswer = 42\n").unwrap();
        std::fs::write(&bad, "raise RuntimeError('broken startup')\n").unwrap();
        let mut k = flowrepl_tests::Kernel::options()
            .mode(mode)
            .arg("--startup")
            .arg(good.display().to_string())
            .arg("--startup")
            .arg(bad.display().to_string())
            .start();
        assert!(
            k.stderr_with("broken startup")
                .contains("RuntimeError: broken startup"),
            "{mode}"
        );
        let r = k.ok("y = answer + 1");
        assert_eq!(r["added_vars"], json!(["y"]), "{mode}");
        assert_eq!(
            r["added_imports"],
            json!([]),
            "{mode}: json was imported by the startup file"
        );
        let names: Vec<Value> = k.call("list_variables", Value::Null)["result"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].clone())
            .collect();
        assert_eq!(
            names,
            [json!("answer"), json!("json"), json!("y")],
            "{mode}"
        );
        k.call("restart", Value::Null);
        let r = k.ok("answer");
        assert_eq!(
            r["result"], "42",
            "{mode}: the baseline is back after restart"
        );
        assert_eq!(k.execute("y")["error"]["type"], "NameError", "{mode}");
    }
    let out = Command::new(flowrepl_bin())
        .args(["--startup", "/no/such/file.py"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("startup file /no/such/file.py not found")
    );
}

/// `-h` and `-V` alone are flowrepl's own, as in any command-line tool (they were taken for
/// Python's and refused, exit 2); with a script, the line is Python's.
#[test]
fn dash_h_and_dash_v_are_flowrepls_own_without_a_script() {
    let run = |args: &[&str]| {
        std::process::Command::new(flowrepl_tests::flowrepl_bin())
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let v = run(&["-V"]);
    assert_eq!(v.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("flowrepl "));
    let short = run(&["-h"]);
    let long = run(&["--help"]);
    assert_eq!(short.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&short.stdout).contains("Usage: flowrepl"));
    assert!(short.stdout.len() < long.stdout.len());
    let python = run(&["-V", "repl.py"]);
    assert_eq!(python.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&python.stderr).contains("-V"));
}
