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

/// The test's servers: two plain HTTP ones, an HTTPS one (its certificate at `cert`), and
/// `keep`, a lax keep-alive one that records every request it reads (`seen`).
struct Servers {
    child: Child,
    http: u16,
    other: u16,
    tls: u16,
    keep: u16,
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
            keep: port("keep"),
            cert,
            child,
            _dir: dir,
        }
    }
}

impl Servers {
    /// The requests `keep` has read: (method, target, host, body).
    fn seen(&self) -> Vec<Value> {
        let path = PathBuf::from(format!("{}.seen", self.cert.display()));
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
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
        got.contains("api.example.test resolves to 127.0.0.1, an internal address (loopback): only a rule naming api.example.test itself allows that (the rule *.example.test does not)"),
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
/// record budget's worth of records, the rest counted. Allowed requests in the middle of the
/// flood, past the budget (data in their query), have their own records all the same; when
/// the kernel ends, a last `summary` record counts what the budget left out since, and
/// everything adds up.
#[test]
fn a_flood_of_connections_is_capped_and_recorded_within_the_budget() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let mut k = kernel(ws.path(), &s, &format!("allow:localhost:{}", s.keep), &[]);
    let proxy = "import os, socket, time, urllib.parse, urllib.request\np = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])\naddr = (p.hostname, p.port)\n";
    let held = eval(
        &mut k,
        &format!("{proxy}held = [socket.create_connection(addr, timeout=10) for _ in range(256)]\ntime.sleep(0.5)\nextra = socket.create_connection(addr, timeout=10)\nline = extra.recv(200).split(b'\\r\\n')[0].decode()\nextra.close()\nline"),
    );
    assert!(
        held.starts_with("HTTP/1.1 503 flowrepl egress: more than 256 connections"),
        "{held}"
    );
    k.ok("for h in held:\n    h.close()\nheld = None");
    // A flood of refusals from a thread; while it runs, past the budget, allowed requests
    // carrying data out (each its own connection); then more of the flood.
    let flood = format!(
        "{proxy}import threading\nstop = threading.Event()\ncount = [0]\ndef flood():\n    while not stop.is_set():\n        c = socket.create_connection(addr, timeout=10)\n        c.sendall(b'CONNECT localhost:{} HTTP/1.1\\r\\n\\r\\n')\n        c.recv(1000)\n        c.close()\n        count[0] += 1\nt = time.perf_counter()\nth = threading.Thread(target=flood)\nth.start()\nwhile count[0] < 1500:\n    time.sleep(0.005)\ngot = [urllib.request.urlopen(f'http://localhost:{}/EXFIL?data={{i}}', timeout=10).read().decode() for i in range(5)]\nn = count[0]\nwhile count[0] < n + 300:\n    time.sleep(0.005)\nstop.set()\nth.join()\nf'{{count[0]}} {{round(time.perf_counter() - t, 3)}} {{got}}'",
        s.other, s.keep
    );
    let said = eval(&mut k, &flood);
    let mut said = said.splitn(3, ' ');
    let refused: u64 = said.next().unwrap().parse().unwrap();
    let took: f64 = said.next().unwrap().parse().unwrap();
    assert_eq!(
        said.next().unwrap(),
        "['seen 1', 'seen 1', 'seen 1', 'seen 1', 'seen 1']"
    );
    assert_eq!(eval(&mut k, "1 + 1"), "2");
    // The kernel ends: its proxy writes the count of what has no record yet.
    k.close();
    let records = read_log_all(&k.log_file()).egress;
    let exfil: Vec<_> = records
        .iter()
        .filter(|r| r.allowed && r.port == s.keep)
        .collect();
    assert_eq!(exfil.len(), 5, "each allowed request's record");
    assert!(exfil.iter().all(|r| r.bytes_up > 0 && r.bytes_down > 0));
    let seen = s.seen();
    assert_eq!(seen.len(), 5);
    assert!(seen
        .iter()
        .all(|r| r["target"].as_str().unwrap().starts_with("/EXFIL?data=")));
    let summary = records.last().unwrap();
    assert_eq!((&*summary.via, summary.allowed), ("summary", false));
    assert!(summary.unrecorded > 0, "{summary:?}");
    let connections = records.iter().filter(|r| r.via != "summary").count() as u64;
    let counted: u64 = records.iter().map(|r| r.unrecorded).sum();
    assert_eq!(
        connections + counted,
        256 + 1 + refused + 5,
        "{connections} records, {counted} counted"
    );
    // The burst, what refilled while the flood ran, and the allowed ones.
    let budget = 1000.0 + 100.0 * (took + 2.0) + 5.0;
    assert!(
        (connections as f64) <= budget && counted > 0,
        "{connections} records in {took} s"
    );
    assert_eq!(
        records.iter().filter(|r| r.via == "summary").count(),
        1,
        "one summary"
    );
    assert!(flowrepl_tests::schema::validate_logs(k.dir.path()) > connections as usize);
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

/// The Python of a cell that speaks to the proxy over a raw socket: `attempt(parts,
/// tunnel=None)` sends each part, reading what comes back after it (until 0.5 s of quiet),
/// first through `CONNECT tunnel` when given; gives all it read.
const RAW: &str = r#"import os, socket, time, urllib.parse
p = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
def drain(s, quiet=0.5):
    got = b''
    s.settimeout(quiet)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
    except socket.timeout:
        pass
    return got
def attempt(parts, tunnel=None):
    s = socket.create_connection((p.hostname, p.port), timeout=10)
    if tunnel:
        s.sendall(f'CONNECT {tunnel} HTTP/1.1\r\nHost: {tunnel}\r\n\r\n'.encode())
        assert drain(s).startswith(b'HTTP/1.1 200')
    got = b''
    for part in parts:
        s.sendall(part.encode())
        got += drain(s)
    s.close()
    return got.decode('latin-1')
"#;

/// One plain HTTP request per connection, framed exactly: a second request in the same write
/// (after a head, a Content-Length body or a chunked body), a body turned into a request by
/// `Connection: content-length`, and a request sent after the first answer never reach the
/// host, a lax server that keeps connections open whatever `Connection` says; the records
/// say what was dropped, a refused request's record names its host, and `bytes_up` counts
/// the head. The control: the same bytes as the proxy forwarded them before it framed
/// requests (its rewritten head, then the rest as it came), sent through a CONNECT tunnel
/// to the same server, get every second request through.
#[test]
fn a_plain_http_connection_carries_one_request_framed_exactly() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let kp = s.keep;
    let mut k = kernel(ws.path(), &s, &format!("allow:localhost:{kp}"), &[]);
    let host = format!("localhost:{kp}");
    let smuggled = |n: u32| format!("GET /s{n} HTTP/1.1\r\nHost: evil.example\r\n\r\n");
    // (the attempt's parts through the proxy, the same as forwarded before framing)
    let attacks: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            vec![format!("GET http://{host}/a1 HTTP/1.1\r\nHost: {host}\r\n\r\n{}", smuggled(1))],
            vec![format!("GET /a1 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n{}", smuggled(1))],
        ),
        (
            vec![format!(
                "POST http://{host}/a2 HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: content-length\r\n\r\n{}",
                smuggled(2).len(),
                smuggled(2)
            )],
            // Content-Length dropped as hop-by-hop: the body is the next request.
            vec![format!("POST /a2 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n{}", smuggled(2))],
        ),
        (
            vec![
                format!("GET http://{host}/a3 HTTP/1.1\r\nHost: {host}\r\n\r\n"),
                smuggled(3),
            ],
            vec![
                format!("GET /a3 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
                smuggled(3),
            ],
        ),
        (
            vec![format!(
                "POST http://{host}/a4 HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n{}",
                smuggled(4)
            )],
            vec![format!(
                "POST /a4 HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n{}",
                smuggled(4)
            )],
        ),
        (
            vec![format!(
                "POST http://{host}/a5 HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n\r\nhello{}",
                smuggled(5)
            )],
            vec![format!(
                "POST /a5 HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello{}",
                smuggled(5)
            )],
        ),
    ];
    let run = |k: &mut Kernel, parts: &[String], tunnel: Option<&str>| {
        let parts: Vec<String> = parts.iter().map(|p| format!("{p:?}")).collect();
        let tunnel = tunnel.map(|t| format!("{t:?}")).unwrap_or("None".into());
        eval(
            k,
            &format!("{RAW}attempt([{}], tunnel={tunnel})", parts.join(", ")),
        )
    };
    let answers: Vec<String> = attacks.iter().map(|(a, _)| run(&mut k, a, None)).collect();
    for (i, a) in answers.iter().enumerate() {
        if i == 1 {
            assert!(
                a.starts_with(
                    "HTTP/1.1 400 flowrepl egress: a Connection header naming content-length"
                ),
                "{a}"
            );
        } else {
            assert!(
                a.starts_with("HTTP/1.1 200") && a.ends_with("seen 1"),
                "attack {}: {a}",
                i + 1
            );
        }
    }
    let seen = s.seen();
    let targets: Vec<&str> = seen.iter().map(|r| r["target"].as_str().unwrap()).collect();
    assert_eq!(targets, ["/a1", "/a3", "/a4", "/a5"], "{seen:#?}");
    assert_eq!(seen[2]["body"], "hello");
    assert_eq!(seen[3]["body"], "hello");
    let records = egress_records(&k, 5);
    let r = &records[0];
    assert!(r.allowed && r.error.is_none(), "{r:?}");
    let head = format!("GET /a1 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    assert_eq!(
        r.bytes_up,
        head.len() as u64,
        "the forwarded head is counted"
    );
    assert_eq!(r.bytes_dropped, smuggled(1).len() as u64);
    let r = &records[1];
    assert!(
        !r.allowed
            && r.error
                .as_deref()
                .unwrap()
                .contains("Connection header naming content-length")
    );
    assert_eq!(
        (&*r.via, &*r.host, r.port),
        ("http", "localhost", kp),
        "what it named"
    );
    assert_eq!(records[2].bytes_dropped, smuggled(3).len() as u64);
    assert_eq!(records[3].bytes_dropped, smuggled(4).len() as u64);
    assert_eq!(records[4].bytes_dropped, smuggled(5).len() as u64);
    assert!(records[3].allowed && records[4].allowed);
    // The control: unframed, every second request reaches the server.
    for (_, before) in &attacks {
        run(&mut k, before, Some(&host));
    }
    let seen = s.seen();
    let targets: Vec<&str> = seen[4..]
        .iter()
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        ["/a1", "/s1", "/a2", "/s2", "/a3", "/s3", "/a4", "/s4", "/a5", "/s5"],
        "{seen:#?}"
    );
    assert!(seen[4..]
        .iter()
        .filter(|r| r["target"].as_str().unwrap().starts_with("/s"))
        .all(|r| r["host"] == "evil.example"));
    // A head with bare LF line ends is refused at once (it was left waiting for a CRLF CRLF
    // until the head's time limit), and nothing reaches the host.
    let lf = run(
        &mut k,
        &[format!("GET http://{host}/lf HTTP/1.1\nHost: {host}\n\n")],
        None,
    );
    assert!(
        lf.starts_with("HTTP/1.1 400 flowrepl egress: a request head with bare LF line ends"),
        "{lf}"
    );
    assert!(s.seen().iter().all(|r| r["target"] != "/lf"));
    k.close();
    assert!(flowrepl_tests::schema::validate_logs(k.dir.path()) >= 10);
}

/// A name under an allowed `*.domain` that resolves to an address of the host's own
/// interfaces (a public-looking one, as a VM's `eth0` may have) or to a special-purpose range
/// (documentation 192.0.2.0/24) is refused; a rule naming each host reaches it (the
/// control). The kernel runs in network and mount namespaces of its own: `lo` also has
/// 1.2.3.4 and 192.0.2.10, a server listens on every address, `/etc/hosts` names them.
#[test]
fn a_wildcard_never_reaches_the_hosts_own_addresses_or_special_ranges() {
    let ws = tempfile::tempdir().unwrap();
    let hosts = ws.path().join("hosts");
    std::fs::write(
        &hosts,
        "127.0.0.1 localhost\n1.2.3.4 own.example.test\n192.0.2.10 doc.example.test\n",
    )
    .unwrap();
    let site = ws.path().join("site");
    std::fs::create_dir(&site).unwrap();
    std::fs::write(site.join("hello"), "hello from here").unwrap();
    // The server ends when the kernel does (its parent: the kernel, exec'd by the shell).
    let server = format!(
        "import functools, http.server, os, threading, time\nh = functools.partial(http.server.SimpleHTTPRequestHandler, directory={:?})\nh.log_message = lambda *a: None\ns = http.server.ThreadingHTTPServer(('0.0.0.0', 8080), h)\nthreading.Thread(target=s.serve_forever, daemon=True).start()\nopen({:?}, 'w').close()\nparent = os.getppid()\nwhile os.getppid() == parent:\n    time.sleep(0.2)",
        site.display().to_string(),
        ws.path().join("up").display().to_string(),
    );
    let py = mcp_venv().join("bin/python").display().to_string();
    let start = |rules: &str| {
        let _ = std::fs::remove_file(ws.path().join("up"));
        let k = Kernel::options()
            .wrap(vec![
                "unshare".into(),
                "--user".into(),
                "--map-root-user".into(),
                "--net".into(),
                "--mount".into(),
                "sh".into(),
                "-c".into(),
                format!(
                    "ip link set lo up && ip addr add 1.2.3.4/32 dev lo && ip addr add 192.0.2.10/32 dev lo && mount --bind {} /etc/hosts && {{ {py} -c \"$SERVER\" & }} && exec \"$@\"",
                    hosts.display()
                ),
                "sh".into(),
            ])
            .env("SERVER", server.clone())
            .arg("--sandbox")
            .arg("--workspace")
            .arg(ws.path().display().to_string())
            .arg("--python")
            .arg(py.clone())
            .arg(format!("--sandbox-net=allow:{rules}"))
            .start();
        assert!(wait_for(Duration::from_secs(10), || ws
            .path()
            .join("up")
            .exists()));
        k
    };
    let get = |name: &str| {
        format!("import urllib.request\ntry:\n    r = urllib.request.urlopen('http://{name}.example.test:8080/hello', timeout=10).read().decode()\nexcept Exception as e:\n    r = f'failed: {{e}}'\nr")
    };
    let mut k = start("*.example.test");
    let got = eval(&mut k, &get("own"));
    assert!(
        got.contains("own.example.test resolves to 1.2.3.4, an internal address (this host's own (an address of one of its interfaces)): only a rule naming own.example.test itself allows that"),
        "{got}"
    );
    let got = eval(&mut k, &get("doc"));
    assert!(
        got.contains(
            "doc.example.test resolves to 192.0.2.10, an internal address (documentation)"
        ),
        "{got}"
    );
    let records = egress_records(&k, 2);
    assert!(records.iter().all(|r| !r.allowed && r.address.is_none()));
    // The control: rules naming the hosts reach the same addresses.
    let mut k = start("*.example.test,own.example.test:8080,doc.example.test");
    assert_eq!(eval(&mut k, &get("own")), "hello from here");
    assert_eq!(eval(&mut k, &get("doc")), "hello from here");
    let records = egress_records(&k, 2);
    assert_eq!(records[0].address.as_deref(), Some("1.2.3.4"));
    assert_eq!(records[1].address.as_deref(), Some("192.0.2.10"));
}

/// A real TLS client (CPython's OpenSSL through memory BIOs) whose ClientHello the cell splits
/// over three records: the server name, in the last one, is read; naming the host the tunnel
/// was allowed for it passes (the handshake and a request complete), naming another it is
/// cut before a byte reaches the host.
#[test]
fn a_client_hello_split_over_records_is_read_whole() {
    let s = Servers::start();
    let ws = tempfile::tempdir().unwrap();
    let mut k = kernel(ws.path(), &s, &format!("allow:localhost:{}", s.tls), &[]);
    let split = |sni: &str| {
        format!(
            r#"import os, socket, ssl, urllib.parse
p = urllib.parse.urlsplit(os.environ['HTTPS_PROXY'])
s = socket.create_connection((p.hostname, p.port), timeout=10)
s.sendall(b'CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost\r\n\r\n')
assert s.recv(4096).startswith(b'HTTP/1.1 200')
ctx = ssl.create_default_context(cafile='cert.pem')
ctx.check_hostname = False
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
t = ctx.wrap_bio(inc, out, server_hostname={sni:?})
try:
    t.do_handshake()
except ssl.SSLWantReadError:
    pass
hello = out.read()
assert hello[0] == 0x16 and len(hello) == 5 + int.from_bytes(hello[3:5], 'big')
m = hello[5:]
name = m.find({sni:?}.encode())
parts = [m[:40], m[40:name - 2], m[name - 2:]]
s.sendall(b''.join(hello[:3] + len(x).to_bytes(2, 'big') + x for x in parts))
def pump():
    d = s.recv(65536)
    if not d:
        raise ConnectionError('closed')
    inc.write(d)
try:
    while True:
        try:
            t.do_handshake()
            break
        except ssl.SSLWantReadError:
            s.sendall(out.read())
            pump()
    s.sendall(out.read())
    t.write(b'GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n')
    s.sendall(out.read())
    body = b''
    while True:
        try:
            body += t.read(65536)
        except ssl.SSLWantReadError:
            try:
                pump()
            except ConnectionError:
                break
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            break
    r = body.decode()
except (OSError, ssl.SSLError) as e:
    r = f'failed: {{e!r}}'
r"#,
            port = s.tls
        )
    };
    let got = eval(&mut k, &split("localhost"));
    assert!(got.contains("hello from tls"), "{got}");
    let got = eval(&mut k, &split("evil.example"));
    assert!(got.starts_with("failed"), "{got}");
    let records = egress_records(&k, 2);
    assert!(
        records[0].allowed && records[0].error.is_none(),
        "{:?}",
        records[0]
    );
    assert!(!records[1].allowed);
    assert_eq!(
        records[1].error.as_deref(),
        Some("the TLS server name \"evil.example\" is not the host the tunnel was allowed for (localhost)")
    );
}
