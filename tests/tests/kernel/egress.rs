//! `--sandbox-net=allow:RULES`: a sandboxed task reaches the hosts its rules name, through the
//! kernel's egress proxy, and nothing else. Every server here is one the test starts on
//! 127.0.0.1 (`tests/egress/server.py`), reached by name (`localhost`) or by address; each
//! refusal is shown passing once the missing rule is added, and each way around the proxy is
//! shown working once only the layers that stop it are left out.

use flowrepl_tests::mcp::mcp_venv;
use flowrepl_tests::{read_log_all, wait_for, Kernel};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The test's servers: two plain HTTP ones and an HTTPS one (its certificate at `cert`).
struct Servers {
    child: Child,
    http: u16,
    other: u16,
    tls: u16,
    cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl Servers {
    fn start() -> Servers {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let mut child = Command::new(mcp_venv().join("bin/python"))
            .arg(flowrepl_tests::workspace_root().join("tests/egress/server.py"))
            .arg(&cert)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ports: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let port = |k: &str| ports[k].as_u64().unwrap() as u16;
        Servers {
            http: port("http"),
            other: port("other"),
            tls: port("tls"),
            cert,
            child,
            _dir: dir,
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sandboxed kernel on the test venv (requests, urllib) with `net` as `--sandbox-net`,
/// `skip` layers left out; the servers' certificate copied into its workspace as `cert.pem`.
fn kernel(ws: &Path, servers: &Servers, net: &str, skip: &[&str]) -> Kernel {
    std::fs::copy(&servers.cert, ws.join("cert.pem")).unwrap();
    Kernel::options()
        .arg("--sandbox")
        .arg("--workspace")
        .arg(ws.display().to_string())
        .arg("--python")
        .arg(mcp_venv().join("bin/python").display().to_string())
        .arg(format!("--sandbox-net={net}"))
        .env("FLOWREPL_SANDBOX_SKIP", skip.join(","))
        .start()
}

/// The result of `code` (an expression last; the cell must not fail): a string's text
/// (without the quotes of its repr), else the repr.
fn eval(k: &mut Kernel, code: &str) -> String {
    let repr = k.ok(code)["result"].as_str().unwrap_or_default().to_owned();
    for q in ['\'', '"'] {
        if let Some(text) = repr.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return text.to_owned();
        }
    }
    repr
}

/// A cell that fetches `url` with `client` (`requests` or `urllib`) and gives the body, or
/// `failed: <the error>`.
fn fetch(client: &str, url: &str) -> String {
    let get = match client {
        "requests" => format!(
            "requests.get({url:?}, verify='cert.pem', timeout=10)\n    r.raise_for_status()\n    r = r.text"
        ),
        _ => format!(
            "urllib.request.urlopen({url:?}, timeout=10, context=ssl.create_default_context(cafile='cert.pem')).read().decode()"
        ),
    };
    format!(
        "import requests, urllib.request, urllib.error, ssl\ntry:\n    r = {get}\nexcept Exception as e:\n    r = f'failed: {{e}}'\nr"
    )
}

/// The task's egress records once there are `n` (each is written as the proxy sees its
/// connection end, a moment after the cell that opened it may have returned).
fn egress_records(k: &Kernel, n: usize) -> Vec<flowrepl_task_logger::EgressRecord<'static>> {
    let log = k.log_file();
    wait_for(Duration::from_secs(10), || {
        read_log_all(&log).egress.len() >= n
    });
    read_log_all(&log).egress
}

/// An allowed name works from requests and from urllib, over plain HTTP and through a CONNECT
/// tunnel (HTTPS, verified against the server's certificate); the rules are in the ready
/// notification, `status` and the session record; every connection is a valid `egress`
/// record.
#[test]
fn allowed_names_work_from_requests_and_urllib_over_http_and_connect() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let rules = format!("localhost:{},localhost:{}", s.http, s.tls);
    let mut k = kernel(ws.path(), &s, &format!("allow:{rules}"), &[]);
    let want: Vec<String> = rules.split(',').map(String::from).collect();
    assert_eq!(k.ready["sandbox"]["network"], "allow");
    assert_eq!(k.ready["sandbox"]["rules"], serde_json::json!(want));
    for client in ["requests", "urllib"] {
        let body = eval(
            &mut k,
            &fetch(client, &format!("http://localhost:{}/hello", s.http)),
        );
        assert!(body.starts_with("hello from http"), "{client}: {body}");
        let body = eval(
            &mut k,
            &fetch(client, &format!("https://localhost:{}/hello", s.tls)),
        );
        assert!(body.starts_with("hello from tls"), "{client}: {body}");
    }
    let status = k.call("status", serde_json::json!({}));
    assert_eq!(
        status["result"]["sandbox"]["rules"],
        serde_json::json!(want)
    );
    let records = egress_records(&k, 4);
    assert_eq!(records.len(), 4, "{records:#?}");
    for (r, (via, port)) in records.iter().zip([
        ("http", s.http),
        ("connect", s.tls),
        ("http", s.http),
        ("connect", s.tls),
    ]) {
        assert!(r.allowed, "{r:?}");
        assert_eq!((&*r.via, &*r.host, r.port), (via, "localhost", port));
        assert_eq!(r.rule.as_deref(), Some(&*format!("localhost:{port}")));
        assert_eq!(r.address.as_deref(), Some("127.0.0.1"));
        assert!(r.bytes_down > 0 && r.error.is_none(), "{r:?}");
        if via == "connect" {
            assert!(r.bytes_up > 0, "the tunnel's bytes: {r:?}");
        }
    }
    k.close();
    let all = read_log_all(&k.log_file());
    let session = &all.sessions[0];
    assert_eq!(
        serde_json::to_value(session).unwrap()["sandbox"]["rules"],
        serde_json::json!(want)
    );
    assert!(flowrepl_tests::schema::validate_logs(k.dir.path()) >= 8);
}

/// A port no rule names, an address where the rule names a host, and a CONNECT to a name not
/// listed are refused, each with an error that names the rule to add; with those rules
/// added, the same attempts pass.
#[test]
fn names_no_rule_allows_are_refused_naming_the_rule_and_pass_once_it_is_added() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let attempts = [
        (
            "urllib",
            format!("http://localhost:{}/hello", s.other),
            format!("localhost:{}", s.other),
            "hello from other",
        ),
        (
            "requests",
            format!("http://127.0.0.1:{}/hello", s.http),
            format!("127.0.0.1:{}", s.http),
            "hello from http",
        ),
        (
            "requests",
            format!("https://localhost:{}/hello", s.tls),
            format!("localhost:{}", s.tls),
            "hello from tls",
        ),
    ];
    let mut k = kernel(ws.path(), &s, &format!("allow:localhost:{}", s.http), &[]);
    for (client, url, rule, _) in &attempts {
        let got = eval(&mut k, &fetch(client, url));
        assert!(got.starts_with("failed: "), "{url}: {got}");
        assert!(
            got.contains(&format!("no rule allows {rule}; add the rule {rule}")),
            "{url}: {got}"
        );
    }
    let records = egress_records(&k, 3);
    assert_eq!(records.len(), 3);
    assert!(records
        .iter()
        .all(|r| !r.allowed && r.bytes_down == 0 && r.address.is_none()));
    assert_eq!(records[2].via, "connect");
    // The rules added: the same attempts pass.
    let all: Vec<String> = std::iter::once(format!("localhost:{}", s.http))
        .chain(attempts.iter().map(|a| a.2.clone()))
        .collect();
    let mut k = kernel(ws.path(), &s, &format!("allow:{}", all.join(",")), &[]);
    for (client, url, _, want) in &attempts {
        let got = eval(&mut k, &fetch(client, url));
        assert!(got.starts_with(want), "{url}: {got}");
    }
}

/// Bad settings stop the kernel at its start with a clear error (exit 2): an unparsable rule,
/// and rules without the sandbox (cells would have the host's whole network).
#[test]
fn bad_network_settings_exit_2_with_a_clear_error() {
    let bin = flowrepl_tests::flowrepl_bin();
    for (args, why) in [
        (
            vec!["--sandbox", "--sandbox-net=allow:https://example.com"],
            "not a URL",
        ),
        (vec!["--sandbox", "--sandbox-net=allow:"], "names no rule"),
        (
            vec!["--sandbox", "--sandbox-net=everything"],
            "not a network setting",
        ),
        (vec!["--sandbox-net=allow:localhost:80"], "needs --sandbox"),
    ] {
        let out = Command::new(bin)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
    // The same refusals from `flowrepl serve`, before it listens.
    let dir = tempfile::tempdir().unwrap();
    for (args, why) in [
        (
            vec!["--no-sandbox", "--sandbox-net=allow:localhost:80"],
            "need the sandbox",
        ),
        (
            vec!["--task-net", "/tmp/a b"],
            "cannot contain spaces or commas",
        ),
    ] {
        let out = Command::new(bin)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(&args)
            .current_dir(dir.path())
            .env("FLOWREPL_TOKEN", "a-token-of-at-least-16-chars")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

/// DNS rebinding: a name under an allowed `*.domain` that resolves to a loopback address is
/// refused; a rule naming the host itself allows it. The kernel runs in a mount namespace of
/// its own where `/etc/hosts` says `api.example.test` is 127.0.0.1.
#[test]
fn a_name_that_resolves_to_an_internal_address_needs_a_rule_naming_it() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let hosts = ws.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.1 api.example.test\n").unwrap();
    let start = |rules: &str| {
        std::fs::copy(&s.cert, ws.path().join("cert.pem")).unwrap();
        Kernel::options()
            .wrap(vec![
                "unshare".into(),
                "--user".into(),
                "--map-root-user".into(),
                "--mount".into(),
                "sh".into(),
                "-c".into(),
                format!("mount --bind {} /etc/hosts && exec \"$@\"", hosts.display()),
                "sh".into(),
            ])
            .arg("--sandbox")
            .arg("--workspace")
            .arg(ws.path().display().to_string())
            .arg("--python")
            .arg(mcp_venv().join("bin/python").display().to_string())
            .arg(format!("--sandbox-net=allow:{rules}"))
            .start()
    };
    let url = format!("http://api.example.test:{}/hello", s.http);
    let mut k = start("*.example.test");
    let got = eval(&mut k, &fetch("requests", &url));
    assert!(
        got.contains("api.example.test resolves to 127.0.0.1, a loopback address: only a rule naming api.example.test itself allows that (the rule *.example.test does not)"),
        "{got}"
    );
    let r = &egress_records(&k, 1)[0];
    assert_eq!(
        (r.allowed, r.rule.as_deref()),
        (false, Some("*.example.test"))
    );
    let mut k = start(&format!("*.example.test,api.example.test:{}", s.http));
    let got = eval(&mut k, &fetch("requests", &url));
    assert!(
        got.starts_with("hello from http (Host: api.example.test"),
        "{got}"
    );
}

/// No way around the proxy: a raw socket to an allowed host's port, a cell that unsets the
/// proxy variables or points them at the server itself, all fail; the raw socket gets through
/// once the network namespace and Landlock's network rules are both left out (each alone
/// still stops it).
#[test]
fn a_cell_gains_nothing_by_going_around_the_proxy() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let rules = format!("allow:localhost:{}", s.http);
    let raw = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {}), timeout=5)\n    r = 'connected'\nexcept OSError as e:\n    r = f'refused {{e.errno}}'\nr",
        s.http
    );
    let url = format!("http://localhost:{}/hello", s.http);
    let mut k = kernel(ws.path(), &s, &rules, &[]);
    assert!(eval(&mut k, &raw).starts_with("refused"));
    for (how, code) in [
        ("unset", "import os\nfor v in [v for v in os.environ if v.lower().endswith('_proxy')]:\n    del os.environ[v]\n"),
        ("no proxies", "import os\nos.environ['NO_PROXY'] = '*'\n"),
        ("the server as proxy", &*format!("import os\nfor v in ['HTTP_PROXY', 'http_proxy', 'ALL_PROXY', 'all_proxy']:\n    os.environ[v] = 'http://127.0.0.1:{}'\n", s.http)),
    ] {
        let mut k = kernel(ws.path(), &s, &rules, &[]);
        k.ok(code);
        for client in ["requests", "urllib"] {
            let got = eval(&mut k, &fetch(client, &url));
            assert!(got.starts_with("failed: "), "{how}, {client}: {got}");
        }
    }
    // Layer by layer: each of the two stops the raw socket alone.
    for (skip, expect) in [
        (vec!["network_namespace"], "refused 13"), // EACCES: Landlock
        (vec!["landlock_network"], "refused 111"), // ECONNREFUSED: nothing there in the namespace
        (vec!["network_namespace", "landlock_network"], "connected"),
    ] {
        let mut k = kernel(ws.path(), &s, &rules, &skip);
        assert_eq!(eval(&mut k, &raw), expect, "skip {skip:?}");
    }
}

/// A TLS tunnel whose ClientHello names another server than the CONNECT host is cut before a
/// byte reaches the host, and recorded so; the same tunnel naming the host passes.
#[test]
fn a_tunnels_tls_server_name_must_be_the_host_it_was_allowed_for() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let mut k = kernel(ws.path(), &s, &format!("allow:localhost:{}", s.tls), &[]);
    let tunnel = |sni: &str| {
        format!(
            "import os, socket, ssl, urllib.parse\np = urllib.parse.urlsplit(os.environ['HTTPS_PROXY'])\ns = socket.create_connection((p.hostname, p.port), timeout=10)\ns.sendall(b'CONNECT localhost:{} HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n')\nhead = s.recv(4096)\nctx = ssl.create_default_context(cafile='cert.pem')\nctx.check_hostname = False\ntry:\n    t = ctx.wrap_socket(s, server_hostname={sni:?})\n    t.sendall(b'GET /hello HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n')\n    r = b''.join(iter(lambda: t.recv(4096), b'')).decode()\nexcept (OSError, ssl.SSLError) as e:\n    r = f'failed: {{e!r}}'\n(head.split(b'\\r\\n')[0].decode(), r)",
            s.tls
        )
    };
    let got = eval(&mut k, &tunnel("evil.example"));
    assert!(
        got.contains("200 Connection established") && got.contains("failed"),
        "{got}"
    );
    let got = eval(&mut k, &tunnel("localhost"));
    assert!(got.contains("hello from tls"), "{got}");
    let records = egress_records(&k, 2);
    assert!(!records[0].allowed);
    assert_eq!(
        records[0].error.as_deref(),
        Some("the TLS server name \"evil.example\" is not the host the tunnel was allowed for (localhost)")
    );
    assert!(records[1].allowed && records[1].bytes_down > 0);
}

/// A download without end through the proxy is stopped by `interrupt`; the kernel goes on,
/// and the connection's record has what came through.
#[test]
fn a_long_download_through_the_proxy_is_stopped_by_interrupt() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let mut k = kernel(ws.path(), &s, &format!("allow:localhost:{}", s.http), &[]);
    let code = format!(
        "import requests\nn = 0\nfor chunk in requests.get('http://localhost:{}/slow', stream=True, timeout=10).iter_content(65536):\n    n += len(chunk)",
        s.http
    );
    let req = serde_json::json!({"jsonrpc": "2.0", "id": "slow", "method": "execute_code", "params": {"code": code}});
    k.send_raw(format!("{req}\n").as_bytes());
    k.wait_busy();
    std::thread::sleep(Duration::from_millis(1500));
    k.interrupt_running();
    let reply = k.recv();
    assert_eq!(reply["id"], "slow");
    assert_eq!(
        reply["result"]["error"]["type"], "KeyboardInterrupt",
        "{reply}"
    );
    assert!(eval(&mut k, "n").parse::<u64>().unwrap() > 0);
    let r = &egress_records(&k, 1)[0];
    assert!(
        r.allowed && r.bytes_down > 0 && r.duration_ms >= 1000.0,
        "{r:?}"
    );
}

/// A cell cannot exhaust the kernel through its proxy: past 256 connections open at once the
/// next is answered 503 at once; 1,500 refused connections in a loop leave at most the
/// record budget's worth of records, the rest counted in the next one; the kernel answers
/// throughout.
#[test]
fn a_flood_of_connections_is_capped_and_recorded_within_the_budget() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let mut k = kernel(ws.path(), &s, &format!("allow:localhost:{}", s.http), &[]);
    let proxy = "import os, socket, time, urllib.parse\np = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])\naddr = (p.hostname, p.port)\n";
    let held = eval(
        &mut k,
        &format!("{proxy}held = [socket.create_connection(addr, timeout=10) for _ in range(256)]\ntime.sleep(0.5)\nextra = socket.create_connection(addr, timeout=10)\nline = extra.recv(200).split(b'\\r\\n')[0].decode()\nextra.close()\nline"),
    );
    assert!(
        held.starts_with("HTTP/1.1 503 flowrepl egress: more than 256 connections"),
        "{held}"
    );
    k.ok("for h in held:\n    h.close()\nheld = None");
    let flood = format!(
        "{proxy}t = time.perf_counter()\nfor _ in range(1500):\n    c = socket.create_connection(addr, timeout=10)\n    c.sendall(b'CONNECT localhost:{} HTTP/1.1\\r\\n\\r\\n')\n    c.recv(1000)\n    c.close()\nround(time.perf_counter() - t, 3)",
        s.other
    );
    let took: f64 = eval(&mut k, &flood).parse().unwrap();
    assert_eq!(eval(&mut k, "1 + 1"), "2");
    // One more after a pause: it carries the count of those not recorded.
    std::thread::sleep(Duration::from_millis(300));
    k.ok(&format!("{proxy}c = socket.create_connection(addr, timeout=10)\nc.sendall(b'CONNECT localhost:{} HTTP/1.1\\r\\n\\r\\n')\nc.recv(1000)\nc.close()", s.other));
    let mut records = Vec::new();
    let complete = wait_for(Duration::from_secs(10), || {
        records = read_log_all(&k.log_file()).egress;
        let counted: u64 = records.iter().map(|r| r.unrecorded).sum();
        records.len() as u64 + counted == 256 + 1 + 1500 + 1
    });
    let counted: u64 = records.iter().map(|r| r.unrecorded).sum();
    assert!(complete, "{} records, {counted} counted", records.len());
    // The burst, and what refilled while the flood ran.
    let budget = 1000.0 + 100.0 * (took + 1.5);
    assert!(
        (records.len() as f64) <= budget && counted > 0,
        "{} records in {took} s",
        records.len()
    );
}

/// `flowrepl serve`: the server's `--sandbox-net=allow:` applies to every task, and
/// `--task-net DIR` gives a task its own rules (`<DIR>/<plan>/<task>.net`), read at its
/// kernel's start; a task without a file keeps the server's.
#[test]
fn serve_gives_each_task_the_servers_rules_or_its_own() {
    let s = Servers::start();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    std::fs::create_dir_all(net.join("p1")).unwrap();
    std::fs::write(
        net.join("p1/t1.net"),
        format!("# t1's API\nlocalhost:{}\n", s.other),
    )
    .unwrap();
    let server = flowrepl_tests::serve::Server::start(&[
        &format!("--sandbox-net=allow:localhost:{}", s.http),
        "--task-net",
        &net.display().to_string(),
    ]);
    let code = format!(
        "import urllib.request\nfor p in ({}, {}):\n    try:\n        print(p, urllib.request.urlopen(f'http://localhost:{{p}}/hello', timeout=10).read().decode())\n    except Exception as e:\n        print(p, 'failed', e)",
        s.http, s.other
    );
    let said = server.run(
        "net",
        &[
            "--plan",
            "p1",
            "--task",
            "t1",
            "--other-task",
            "t2",
            "--code",
            &code,
        ],
    );
    let (t1, t2) = (
        said["task"].as_str().unwrap(),
        said["other"].as_str().unwrap(),
    );
    // t1: its own rules only.
    assert!(
        t1.contains(&format!("{} failed HTTP Error 403", s.http)),
        "{t1}"
    );
    assert!(
        t1.contains(&format!("{} hello from other", s.other)),
        "{t1}"
    );
    // t2: the server's.
    assert!(t2.contains(&format!("{} hello from http", s.http)), "{t2}");
    assert!(
        t2.contains(&format!("{} failed HTTP Error 403", s.other)),
        "{t2}"
    );
    let log = flowrepl_task_logger::task_log_path(&server.logs(), "p1", "t1");
    assert!(wait_for(Duration::from_secs(10), || read_log_all(&log)
        .egress
        .len()
        == 2));
}
