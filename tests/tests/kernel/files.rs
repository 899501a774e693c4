//! Files in and out of a task's workspace: the stdio kernel's JSON-RPC methods, the MCP tools
//! and resources (the official Python SDK's client), `serve`'s streamed HTTP routes. Every
//! escape is tried and refused, and shown getting through where the protection is left out
//! (the same path opened by path, as a program without the confinement would).

use base64::Engine as _;
use flowrepl_tests::mcp::{mcp_venv, Scenario};
use flowrepl_tests::serve::{rss_kb, Server, TOKEN};
use flowrepl_tests::{read_log_all, wait_for, Kernel, MODES};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn kernel(mode: &str) -> Kernel {
    Kernel::options()
        .mode(mode)
        .arg("--python")
        .arg(mcp_venv().join("bin/python").display().to_string())
        .start()
}

/// The error message of a refused call (panics on a result).
fn refused(reply: &Value) -> String {
    assert!(reply.get("result").is_none(), "not refused: {reply}");
    reply["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn files_go_in_and_out_over_json_rpc_and_nothing_leads_outside() {
    for mode in MODES {
        let mut k = kernel(mode);
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.txt");
        std::fs::write(&secret, "the host's secret").unwrap();
        let ws = k.workspace();

        // In: a CSV, read by pandas in the next cell.
        let csv = "a,b\n1,2\n3,4\n";
        let up = k.call("upload_file", json!({"path": "data/in.csv", "text": csv}));
        assert_eq!(up["result"]["sha256"], hex(csv.as_bytes()), "{up}");
        assert_eq!(up["result"]["mime_type"], "text/csv");
        let r = k.ok("import pandas as pd\nprint(int(pd.read_csv('data/in.csv')['b'].sum()))");
        assert_eq!(r["stdout"], "6\n", "{mode}: {r}");

        // Out: a PNG and a parquet file a cell wrote, byte-equal.
        let r = k.ok(
            "import hashlib, json, duckdb, matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots(); ax.plot([1, 2]); fig.savefig('plot.png'); plt.close(fig)\nduckdb.sql(\"COPY (SELECT range AS n FROM range(100)) TO 'out.parquet' (FORMAT PARQUET)\")\nprint(json.dumps({n: hashlib.sha256(open(n, 'rb').read()).hexdigest() for n in ['plot.png', 'out.parquet']}))",
        );
        let want: Value = serde_json::from_str(r["stdout"].as_str().unwrap()).unwrap();
        for (name, mime) in [
            ("plot.png", "image/png"),
            ("out.parquet", "application/vnd.apache.parquet"),
        ] {
            let d = k.call("download_file", json!({"path": name}));
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(
                    d["result"]["base64"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{d}")),
                )
                .unwrap();
            assert_eq!(hex(&bytes), want[name], "{mode}: {name} differs");
            assert_eq!(d["result"]["sha256"], want[name]);
            assert_eq!(d["result"]["mime_type"], mime);
        }
        let listed = k.call("list_files", Value::Null);
        let names: Vec<&str> = listed["result"]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"plot.png") && names.contains(&"data"),
            "{listed}"
        );
        assert!(
            !names.contains(&"logs"),
            "the log folder is listed: {names:?}"
        );
        let del = k.call("delete_file", json!({"path": "out.parquet"}));
        assert_eq!(del["result"]["deleted"], true, "{del}");
        assert!(!ws.join("out.parquet").exists());

        // What a cell can plant: links to a host file and folder, a FIFO; and a hard link to
        // a host file (made here: a sandboxed cell cannot see the file to link it, an
        // unsandboxed one can).
        k.ok(&format!(
            "import os\nos.symlink({s:?}, 'leak')\nos.symlink({o:?}, 'linkdir')\nos.mkfifo('pipe')\nos.makedirs('sub', exist_ok=True)",
            s = secret.display().to_string(),
            o = outside.path().display().to_string(),
        ));
        std::fs::hard_link(&secret, ws.join("hard")).unwrap();
        // Without the confinement (the same paths opened by path): each gets through.
        assert_eq!(
            std::fs::read_to_string(ws.join("leak")).unwrap(),
            "the host's secret"
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("hard")).unwrap(),
            "the host's secret"
        );
        // With it: every one refused, and the kernel answers after each.
        for (method, params, says) in [
            ("download_file", json!({"path": "leak"}), "symbolic link"),
            ("download_file", json!({"path": "hard"}), "hard link"),
            (
                "download_file",
                json!({"path": "linkdir/secret.txt"}),
                "symbolic link",
            ),
            (
                "download_file",
                json!({"path": "../secret.txt"}),
                "not a path inside",
            ),
            (
                "download_file",
                json!({"path": secret.display().to_string()}),
                "not a path inside",
            ),
            (
                "download_file",
                json!({"path": "pipe"}),
                "not a regular file",
            ),
            (
                "download_file",
                json!({"path": "logs/plan-x.jsonl"}),
                "flowrepl's own",
            ),
            (
                "upload_file",
                json!({"path": "linkdir/planted", "text": "x"}),
                "symbolic link",
            ),
            (
                "upload_file",
                json!({"path": "sub/../../planted", "text": "x"}),
                "not a path inside",
            ),
            (
                "delete_file",
                json!({"path": "linkdir/secret.txt"}),
                "symbolic link",
            ),
            (
                "upload_file",
                json!({"path": "both", "text": "x", "base64": "eA=="}),
                "exactly one",
            ),
        ] {
            let started = Instant::now();
            let why = refused(&k.call(method, params.clone()));
            assert!(why.contains(says), "{mode} {method} {params}: {why}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{method} {params} took {:?}",
                started.elapsed()
            );
            assert_eq!(k.ok("1 + 1")["result"], "2");
        }
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "the host's secret"
        );
        assert!(!outside.path().join("planted").exists());
        // An upload over a planted link replaces the link itself, never what it points to.
        let up = k.call("upload_file", json!({"path": "leak", "text": "mine"}));
        assert_eq!(up["result"]["bytes"], 4, "{up}");
        assert!(!std::fs::symlink_metadata(ws.join("leak"))
            .unwrap()
            .is_symlink());
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "the host's secret"
        );
        // Without it, the planted write lands outside.
        std::fs::write(ws.join("linkdir/planted-by-path"), "x").unwrap();
        assert!(outside.path().join("planted-by-path").exists());

        // A cell swapping a file for a link to the secret in a loop: never read through.
        k.ok(&format!(
            "import os, threading, time\ndef swap():\n    end = time.time() + 3\n    while time.time() < end:\n        try:\n            os.symlink({s:?}, 'race.tmp'); os.replace('race.tmp', 'race')\n            with open('race.tmp', 'w') as f: f.write('plain')\n            os.replace('race.tmp', 'race')\n        except OSError:\n            pass\nwith open('race', 'w') as f: f.write('plain')\nthreading.Thread(target=swap, daemon=True).start()",
            s = secret.display().to_string()
        ));
        let (mut read, mut refused_n) = (0, 0);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            let d = k.call("download_file", json!({"path": "race"}));
            match d["result"]["text"].as_str() {
                Some(t) => {
                    assert_eq!(t, "plain", "{mode}: the swap got through");
                    read += 1;
                }
                None => refused_n += 1,
            }
        }
        assert!(
            read > 0 && refused_n > 0,
            "{mode}: the race did not race ({read} read, {refused_n} refused)"
        );

        // The log has a file record per transfer and refusal.
        let log = read_log_all(&k.log_file());
        let ops: Vec<(String, bool)> = log
            .files
            .iter()
            .map(|f| (f.op.to_string(), f.error.is_none()))
            .collect();
        assert!(
            ops.contains(&("upload".into(), true))
                && ops.contains(&("download".into(), true))
                && ops.contains(&("delete".into(), true)),
            "{ops:?}"
        );
        let first = &log.files[0];
        assert_eq!(
            (&*first.path, first.bytes, first.via.as_ref()),
            ("data/in.csv", csv.len() as u64, "jsonrpc")
        );
        assert_eq!(first.sha256.as_deref(), Some(hex(csv.as_bytes()).as_str()));
        assert!(log.files.iter().any(|f| f.path == "leak"
            && f.error
                .as_deref()
                .is_some_and(|e| e.contains("symbolic link"))));
        assert!(log.skipped.is_empty(), "{:?}", log.skipped);
        k.close();
    }
}

#[test]
fn limits_refuse_a_file_whole_and_write_nothing() {
    let mut k = Kernel::options()
        .arg("--max-file-bytes")
        .arg("1000")
        .arg("--max-workspace-mb")
        .arg("1")
        .start();
    let ws = k.workspace();
    let why = refused(&k.call(
        "upload_file",
        json!({"path": "big.txt", "text": "x".repeat(1001)}),
    ));
    assert!(why.contains("--max-file-bytes"), "{why}");
    assert!(!ws.join("big.txt").exists());
    k.ok("open('filler', 'wb').write(b'x' * (1 << 20))");
    let why = refused(&k.call(
        "upload_file",
        json!({"path": "small.txt", "text": "x".repeat(500)}),
    ));
    assert!(why.contains("--max-workspace-mb"), "{why}");
    assert!(!ws.join("small.txt").exists());
    let why = refused(&k.call("download_file", json!({"path": "filler"})));
    assert!(why.contains("--max-file-bytes"), "{why}");
    k.close();
    // One JSON-RPC answer carries at most 3/4 of the longest request line (base64 fits it).
    let mut k = Kernel::options()
        .env("FLOWREPL_MAX_REQUEST_BYTES", "4000")
        .start();
    k.ok("open('three.txt', 'w').write('x' * 3001)");
    let why = refused(&k.call("download_file", json!({"path": "three.txt"})));
    assert!(why.contains("one answer carries"), "{why}");
    k.ok("open('three.txt', 'w').write('x' * 3000)");
    let d = k.call("download_file", json!({"path": "three.txt"}));
    assert_eq!(d["result"]["bytes"], 3000, "{d}");
    // Nothing half-written is left, and the temporary names are never listed.
    let names: Vec<String> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".flowrepl-")), "{names:?}");
    k.close();
}

#[test]
fn files_over_mcp_tools_and_resources() {
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode).run("files");
        let refused = facts["refused"].as_object().unwrap();
        assert!(refused["../outside.txt"]
            .as_str()
            .unwrap()
            .contains("not a path inside"));
        assert!(refused[".flowrepl/x"]
            .as_str()
            .unwrap()
            .contains("flowrepl's own"));
        let files = read_log_all(&log).files;
        let via: Vec<&str> = files.iter().map(|f| f.via.as_ref()).collect();
        assert!(via.contains(&"mcp") && via.contains(&"resource"), "{via:?}");
        let read = files.iter().find(|f| f.via == "resource").unwrap();
        assert_eq!(read.sha256.as_deref(), facts["sha"]["big.bin"].as_str());
        assert_eq!(read.bytes, 3 << 20);
    }
}

/// Writes a request's body.
type BodyWriter<'a> = dyn FnMut(&mut dyn Write) -> std::io::Result<()> + 'a;

/// A request on a raw connection, its body written from `body` (streamed); the reply's status,
/// head and its body streamed into `sink`.
fn http(
    server: &Server,
    method: &str,
    path: &str,
    extra: &str,
    body: Option<(u64, &mut BodyWriter<'_>)>,
    sink: &mut dyn FnMut(&[u8]),
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(server.host()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let len = body.as_ref().map_or(0, |b| b.0);
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {len}\r\nConnection: close\r\n{extra}\r\n",
        server.host()
    )
    .unwrap();
    // A server that refuses mid-body answers and closes: the write fails, its answer says why.
    let written = body.map_or(Ok(()), |(_, write)| write(&mut s));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut buf = vec![0u8; 1 << 20];
    let mut start = Vec::new();
    loop {
        let n = s.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        if start.len() < 4096 {
            start.extend_from_slice(&buf[..n.min(4096)]);
        }
        sink(&buf[..n]);
    }
    if let Err(e) = written {
        panic!(
            "writing the body failed ({e}); the server answered {status}: {head}{}",
            String::from_utf8_lossy(&start)
        );
    }
    (status, head)
}

fn text_reply(server: &Server, method: &str, path: &str, extra: &str, body: &str) -> (u16, String) {
    let mut out = Vec::new();
    let bytes = body.as_bytes().to_vec();
    let mut write = |w: &mut dyn Write| w.write_all(&bytes);
    let (status, _) = http(
        server,
        method,
        path,
        extra,
        (!bytes.is_empty() || method == "PUT")
            .then_some((bytes.len() as u64, &mut write as &mut BodyWriter<'_>)),
        &mut |b| out.extend_from_slice(b),
    );
    (status, String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn serve_moves_files_over_http_streamed_while_the_kernel_is_stopped() {
    let server = Server::start(&["--no-sandbox"]);
    let ws = server.dir.path().join("workspaces/p1/t1");
    // No kernel runs for the task: the files are the workspace's.
    let (status, body) = text_reply(&server, "PUT", "/files/p1/t1/data/in.csv", "", "a,b\n1,2\n");
    assert_eq!(status, 200, "{body}");
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info["sha256"], hex(b"a,b\n1,2\n"));
    assert_eq!(
        std::fs::read_to_string(ws.join("data/in.csv")).unwrap(),
        "a,b\n1,2\n"
    );
    assert!(
        flowrepl_tests::serve::processes_naming(server.dir.path())
            .iter()
            .all(|(_, c)| !c.contains(" mcp ")),
        "a kernel was started"
    );
    let (status, body) = text_reply(&server, "GET", "/files/p1/t1/data/in.csv", "", "");
    assert_eq!((status, body.as_str()), (200, "a,b\n1,2\n"));

    // The token, Host and Origin rules of /mcp.
    let mut s = std::net::TcpStream::connect(server.host()).unwrap();
    write!(
        s,
        "GET /files/p1/t1/data/in.csv HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        server.host()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    let (status, _) = text_reply(
        &server,
        "GET",
        "/files/p1/t1/data/in.csv",
        "Origin: https://evil.example\r\n",
        "",
    );
    assert_eq!(status, 403);
    let mut s = std::net::TcpStream::connect(server.host()).unwrap();
    write!(s, "GET /files/p1/t1/data/in.csv HTTP/1.1\r\nHost: rebound.example\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");

    // Escapes: what a cell could plant, and paths that climb; each refused, the server fine.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "the host's secret").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), ws.join("leak")).unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.join("linkdir")).unwrap();
    std::fs::hard_link(outside.path().join("secret"), ws.join("hard")).unwrap();
    nix::unistd::mkfifo(&ws.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    for (method, path, want) in [
        ("GET", "/files/p1/t1/leak", 403),
        ("GET", "/files/p1/t1/hard", 403),
        ("GET", "/files/p1/t1/linkdir/secret", 403),
        ("GET", "/files/p1/t1/pipe", 409),
        ("GET", "/files/p1/t1/data/%2e%2e/%2e%2e/t2/x", 400),
        ("PUT", "/files/p1/t1/linkdir/planted", 403),
        ("GET", "/files/p1/t1/nothing", 404),
        ("DELETE", "/files/p1/t1/linkdir/secret", 403),
    ] {
        let started = Instant::now();
        let (status, body) = text_reply(
            &server,
            method,
            path,
            "",
            if method == "PUT" { "x" } else { "" },
        );
        assert_eq!(status, want, "{method} {path}: {body}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    assert!(!outside.path().join("planted").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "the host's secret"
    );
    let (status, _) = text_reply(&server, "DELETE", "/files/p1/t1/data/in.csv", "", "");
    assert_eq!(status, 204);
    assert!(!ws.join("data/in.csv").exists());

    // 1 GB up and down, streamed: the server's memory grows by far less than the file.
    const GB: u64 = 1 << 30;
    let pid = server.pid();
    let before = rss_kb(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (peak, stop) = (std::sync::Arc::clone(&peak), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_kb(pid), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let chunk: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let mut sent = Sha256::new();
    let mut write = |w: &mut dyn Write| {
        for _ in 0..GB / chunk.len() as u64 {
            w.write_all(&chunk)?;
            sent.update(&chunk);
        }
        Ok(())
    };
    let started = Instant::now();
    let mut reply = Vec::new();
    let (status, _) = http(
        &server,
        "PUT",
        "/files/p1/t1/big.bin",
        "",
        Some((GB, &mut write)),
        &mut |b| reply.extend_from_slice(b),
    );
    let put_s = started.elapsed().as_secs_f64();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let sent = format!("{:x}", sent.finalize());
    let info: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(info["sha256"], sent);
    let mut got = Sha256::new();
    let mut n = 0u64;
    let started = Instant::now();
    let (status, head) = http(&server, "GET", "/files/p1/t1/big.bin", "", None, &mut |b| {
        got.update(b);
        n += b.len() as u64;
    });
    let get_s = started.elapsed().as_secs_f64();
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-length: {GB}")),
        "{head}"
    );
    assert_eq!((n, format!("{:x}", got.finalize())), (GB, sent));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    let grew_mb = (peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(before))
        / 1024;
    eprintln!(
        "1 GiB PUT {put_s:.1} s, GET {get_s:.1} s; the server's RSS grew {grew_mb} MB at most"
    );
    assert!(
        grew_mb < 64,
        "the server's memory grew by {grew_mb} MB for a 1 GB transfer"
    );

    // The MCP file tools on the same task, its kernel still stopped; the records as the
    // server's.
    let facts = server.run("files", &["--task", "t1", "--plan", "p1"]);
    assert!(
        facts["listed"].as_array().is_some_and(|l| !l.is_empty()),
        "{facts}"
    );
    let log = flowrepl_task_logger::task_log_path(&server.logs(), "p1", "t1");
    assert!(wait_for(Duration::from_secs(5), || read_log_all(&log)
        .files
        .len()
        >= 3));
    let files = read_log_all(&log).files;
    let big = files
        .iter()
        .find(|f| f.path == "big.bin" && f.op == "download")
        .unwrap();
    assert_eq!((big.bytes, big.via.as_ref()), (GB, "http"));
    assert!(
        files
            .iter()
            .all(|f| f.head.session_id.starts_with("serve-")),
        "{files:?}"
    );
    std::fs::remove_file(ws.join("big.bin")).unwrap();

    // A cut stream's link is read through the server from the task's kernel.
    let facts = server.run("output_link", &["--task", "t1", "--plan", "p1"]);
    assert!(
        facts["stopped"].as_str().unwrap().contains("task log"),
        "{facts}"
    );
}

/// The MCP Inspector's CLI (npm, run with Node 22 through npx as the conformance suite is),
/// one call per run against `flowrepl mcp` on stdio: a file uploaded, listed, read back
/// through the resource template.
#[test]
fn the_inspector_cli_moves_files() {
    let work = tempfile::tempdir().unwrap();
    let logs = work.path().join("logs");
    // A tool result with isError makes the CLI exit 1; the refusal is then read from its output.
    let run = |args: &[&str], refused: bool| -> Value {
        let out = std::process::Command::new("timeout")
            .args(["-k", "10", "180", "npx", "-y", "-p", "node@22", "-p"])
            .arg("@modelcontextprotocol/inspector@2.12.0")
            .args(["--", "mcp-inspector", "--cli"])
            .arg(flowrepl_tests::flowrepl_bin())
            .arg("mcp")
            .args(args)
            .current_dir(work.path())
            .env("FLOWREPL_LOG_DIR", &logs)
            .env("FLOWREPL_LOG", "warn")
            .env_remove("FLOW_PLAN_ID")
            .env_remove("FLOW_TASK_ID")
            .output()
            .expect("npx (Node.js) runs the MCP Inspector");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() != refused,
            "inspector {args:?}: {stderr}\n{stdout}"
        );
        if refused {
            return Value::String(format!("{stdout}{stderr}"));
        }
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    };
    let inspector = |args: &[&str]| run(args, false);
    let up = inspector(&[
        "--method",
        "tools/call",
        "--tool-name",
        "upload_file",
        "--tool-arg",
        "path=in/hello.txt",
        "--tool-arg",
        "text=hello from the inspector",
    ]);
    assert_eq!(up["isError"], false, "{up}");
    assert_eq!(
        std::fs::read_to_string(work.path().join("in/hello.txt")).unwrap(),
        "hello from the inspector"
    );
    let listed = inspector(&[
        "--method",
        "tools/call",
        "--tool-name",
        "list_files",
        "--tool-arg",
        "path=in",
    ]);
    assert_eq!(
        listed["structuredContent"]["entries"][0]["name"], "hello.txt",
        "{listed}"
    );
    let templates = inspector(&["--method", "resources/templates/list"]);
    assert_eq!(
        templates["resourceTemplates"][0]["uriTemplate"], "flowrepl://files/{plan}/{task}/{path}",
        "{templates}"
    );
    let read = inspector(&[
        "--method",
        "resources/read",
        "--uri",
        "flowrepl://files/local/adhoc/in/hello.txt",
    ]);
    assert_eq!(
        read["contents"][0]["text"], "hello from the inspector",
        "{read}"
    );
    let refused = run(
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "download_file",
            "--tool-arg",
            "path=../../etc/passwd",
        ],
        true,
    );
    assert!(
        refused
            .to_string()
            .contains("not a path inside the workspace"),
        "{refused}"
    );
}

/// Sends `request` as it is on a new connection and reads the reply to its end: status,
/// head, body.
fn raw(server: &Server, request: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(server.host()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(all.len(), |e| e + 4);
    let head = String::from_utf8_lossy(&all[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head, all[end..].to_vec())
}

/// A request's head with the token, the server's Host and `Connection: close`.
fn head_of(server: &Server, method: &str, path: &str, extra: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n{extra}\r\n",
        server.host()
    )
}

/// A one-byte `PUT` of `path` (which makes the task's workspace); its status.
fn put_one_byte(server: &Server, path: &str) -> u16 {
    let head = head_of(server, "PUT", path, "Content-Length: 1\r\n");
    raw(server, format!("{head}x").as_bytes()).0
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The attack pass on serve's file routes, each attempt refused, beside its control:
/// - a probe of a task that does not exist (GET, HEAD, DELETE) is 404 and leaves no folder and
///   no log (before: every probe made both), while the same probe on a task that exists leaves
///   its refusal record (the recording is there; only a task that is not gets none);
/// - a name over 255 bytes, a path over 4095: 400 with the path cut (before: 500 echoing it);
/// - a request with both `Transfer-Encoding` and `Content-Length`: 400 and closed (before:
///   taken as chunked); the same body chunked alone is written;
/// - HEAD answers the GET's head without a body (before: 405); single byte ranges are 206 with
///   Content-Range, past the end 416, several ranges the whole file; GETs say Accept-Ranges.
#[test]
fn serve_file_routes_refuse_probes_long_names_and_double_framing_and_answer_head_and_ranges() {
    let server = Server::start(&["--no-sandbox"]);
    let ws = server.dir.path().join("workspaces/p1/t1");
    let body: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let mut put = head_of(
        &server,
        "PUT",
        "/files/p1/t1/data.bin",
        "Content-Length: 1000\r\n",
    )
    .into_bytes();
    put.extend_from_slice(&body);
    assert_eq!(raw(&server, &put).0, 200);

    // Probes of tasks that do not exist: 404, nothing made.
    for (method, path) in [
        ("GET", "/files/ghost/t/x"),
        ("HEAD", "/files/ghost/t/x"),
        ("DELETE", "/files/ghost/t2/x"),
        ("GET", "/files/p1/nobody/x"),
    ] {
        let (status, head, said) = raw(&server, head_of(&server, method, path, "").as_bytes());
        assert_eq!(status, 404, "{method} {path}: {head}");
        if method != "HEAD" {
            assert!(
                String::from_utf8_lossy(&said).contains("does not exist"),
                "{said:?}"
            );
        }
    }
    for gone in ["workspaces/ghost", "logs/ghost", "workspaces/p1/nobody"] {
        assert!(!server.dir.path().join(gone).exists(), "{gone} was made");
    }
    assert!(!flowrepl_task_logger::task_log_path(&server.logs(), "p1", "nobody").exists());
    // The control: on the task that exists the same probe is recorded.
    let (status, _, _) = raw(
        &server,
        head_of(&server, "GET", "/files/p1/t1/x", "").as_bytes(),
    );
    assert_eq!(status, 404);
    let log = flowrepl_task_logger::task_log_path(&server.logs(), "p1", "t1");
    assert!(wait_for(Duration::from_secs(5), || read_log_all(&log)
        .files
        .iter()
        .any(|f| f.path == "x" && f.error.is_some())));

    // Names past the file system's limits: 400, the path cut.
    let long_name = format!("/files/p1/t1/{}", "n".repeat(300));
    let long_path = format!("/files/p1/t1/{}", vec!["d".repeat(250); 20].join("/"));
    for path in [&long_name, &long_path] {
        for method in ["GET", "PUT"] {
            let extra = if method == "PUT" {
                "Content-Length: 1\r\n"
            } else {
                ""
            };
            let mut req = head_of(&server, method, path, extra).into_bytes();
            if method == "PUT" {
                req.push(b'x');
            }
            let (status, head, said) = raw(&server, &req);
            assert_eq!(status, 400, "{method} {}: {head}", path.len());
            assert!(said.len() < 1000, "{} bytes said", said.len());
            assert!(
                String::from_utf8_lossy(&said).contains("255 bytes"),
                "{said:?}"
            );
        }
    }

    // Both framings: refused. Chunked alone: written.
    let smuggle = format!(
        "{}0\r\n\r\n",
        head_of(
            &server,
            "PUT",
            "/files/p1/t1/smuggled.txt",
            "Content-Length: 40\r\nTransfer-Encoding: chunked\r\n"
        )
    );
    let (status, head, _) = raw(&server, smuggle.as_bytes());
    assert_eq!(status, 400, "{head}");
    assert!(!ws.join("smuggled.txt").exists());
    let chunked = format!(
        "{}5\r\nhello\r\n0\r\n\r\n",
        head_of(
            &server,
            "PUT",
            "/files/p1/t1/chunked.txt",
            "Transfer-Encoding: chunked\r\n"
        )
    );
    let (status, head, _) = raw(&server, chunked.as_bytes());
    assert_eq!(status, 200, "{head}");
    assert_eq!(std::fs::read(ws.join("chunked.txt")).unwrap(), b"hello");

    // HEAD: the GET's head, no body.
    let (status, head, said) = raw(
        &server,
        head_of(&server, "HEAD", "/files/p1/t1/data.bin", "").as_bytes(),
    );
    assert_eq!(status, 200, "{head}");
    assert_eq!(header(&head, "content-length"), Some("1000"), "{head}");
    assert_eq!(header(&head, "accept-ranges"), Some("bytes"), "{head}");
    assert!(said.is_empty());
    // Other methods: 405, and their Allow lists HEAD, which is answered.
    let (status, head, _) = raw(
        &server,
        head_of(&server, "OPTIONS", "/files/p1/t1/data.bin", "").as_bytes(),
    );
    assert_eq!(status, 405, "{head}");
    assert!(
        header(&head, "allow").is_some_and(|a| a.contains("HEAD")),
        "{head}"
    );
    // Ranges.
    for (range, status_want, bytes, content_range) in [
        ("bytes=0-9", 206, &body[..10], Some("bytes 0-9/1000")),
        ("bytes=990-", 206, &body[990..], Some("bytes 990-999/1000")),
        ("bytes=-5", 206, &body[995..], Some("bytes 995-999/1000")),
        (
            "bytes=500-5000",
            206,
            &body[500..],
            Some("bytes 500-999/1000"),
        ),
        ("bytes=0-1,5-6", 200, &body[..], None),
        ("bytes=1000-", 416, &[][..], Some("bytes */1000")),
        ("bytes=-0", 416, &[][..], Some("bytes */1000")),
    ] {
        let extra = format!("Range: {range}\r\n");
        let (status, head, said) = raw(
            &server,
            head_of(&server, "GET", "/files/p1/t1/data.bin", &extra).as_bytes(),
        );
        assert_eq!(status, status_want, "{range}: {head}");
        assert_eq!(
            header(&head, "content-range"),
            content_range,
            "{range}: {head}"
        );
        if status != 416 {
            assert_eq!(said, bytes, "{range}");
            assert_eq!(header(&head, "accept-ranges"), Some("bytes"), "{range}");
        }
    }
    let files = read_log_all(&log).files;
    let part = files
        .iter()
        .find(|f| f.op == "download" && f.bytes == 10 && f.error.is_none())
        .expect("the range's record");
    assert_eq!(part.sha256.as_deref(), Some(hex(&body[..10]).as_str()));
}

/// `--max-workspace-mb` counts the disk a workspace takes: a sparse 8 TB file (no blocks)
/// does not fill it (before: every upload was refused), and uploads are still refused past
/// the cap, counted from the kept figure.
#[test]
fn a_sparse_file_does_not_fill_the_workspace_cap() {
    let server = Server::start(&["--no-sandbox", "--max-workspace-mb", "1"]);
    assert_eq!(put_one_byte(&server, "/files/p1/t1/first.txt"), 200);
    let ws = server.dir.path().join("workspaces/p1/t1");
    let sparse = std::fs::File::create(ws.join("sparse")).unwrap();
    sparse.set_len(8 << 40).unwrap();
    drop(sparse);
    let meta = std::fs::metadata(ws.join("sparse")).unwrap();
    assert_eq!(meta.len(), 8 << 40, "the file's apparent size");
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) < 64);
    let put = |name: &str, n: usize| {
        let mut req = head_of(
            &server,
            "PUT",
            &format!("/files/p1/t1/{name}"),
            &format!("Content-Length: {n}\r\n"),
        )
        .into_bytes();
        req.extend(std::iter::repeat_n(b'y', n));
        raw(&server, &req)
    };
    // Past the figure kept since the first upload: looked at again on the miss.
    let (status, head, said) = put("small.txt", 1000);
    assert_eq!(status, 200, "{head}{}", String::from_utf8_lossy(&said));
    let (status, _, _) = put("a.bin", 600_000);
    assert_eq!(status, 200);
    let (status, head, said) = put("b.bin", 600_000);
    assert_eq!(status, 507, "{head}");
    assert!(String::from_utf8_lossy(&said).contains("--max-workspace-mb"));
    assert!(!ws.join("b.bin").exists());
    // A delete makes room at once.
    let (status, _, _) = raw(
        &server,
        head_of(&server, "DELETE", "/files/p1/t1/a.bin", "").as_bytes(),
    );
    assert_eq!(status, 204);
    assert_eq!(put("b.bin", 600_000).0, 200);
}

/// A file a cell keeps rewriting, read over HTTP: an answer is either whole and of one
/// version, or cut short (the connection closed before `Content-Length`), and its record says
/// the file changed while it was read, with the real counts (before: "cut short after 0 of 0
/// bytes (the client went away)").
#[test]
fn a_file_rewritten_while_it_is_read_is_cut_and_recorded_as_changed() {
    let server = Server::start(&["--no-sandbox"]);
    assert_eq!(put_one_byte(&server, "/files/p1/t1/live.bin"), 200);
    let file = server.dir.path().join("workspaces/p1/t1/live.bin");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (file, stop) = (file.clone(), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut k = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                k = k.wrapping_add(1);
                let len = (2 << 20) + (usize::from(k) << 14);
                // As `open(name, 'wb').write(...)` does: truncated, then written.
                let _ = std::fs::write(&file, vec![b'a' + k % 26; len]);
            }
        })
    };
    let (mut whole, mut cut, mut midway) = (0, 0, 0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) || midway == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "never cut");
        let (status, head, said) = raw(
            &server,
            head_of(&server, "GET", "/files/p1/t1/live.bin", "").as_bytes(),
        );
        if status == 409 {
            // Changed before a byte was sent: refused with a word.
            assert!(String::from_utf8_lossy(&said).contains("changed while it was read"));
            cut += 1;
            continue;
        }
        assert_eq!(status, 200, "{head}");
        let promised: usize = header(&head, "content-length").unwrap().parse().unwrap();
        if said.len() == promised {
            assert!(
                said.iter().all(|b| *b == said[0]),
                "a whole answer mixed versions"
            );
            whole += 1;
        } else {
            assert!(said.len() < promised);
            cut += 1;
            midway += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    eprintln!("{whole} whole answers, {cut} cut ({midway} of them after the head: 200, short)");
    let log = flowrepl_task_logger::task_log_path(&server.logs(), "p1", "t1");
    assert!(wait_for(Duration::from_secs(5), || {
        read_log_all(&log)
            .files
            .iter()
            .filter(|f| f.op == "download" && f.error.is_some())
            .count()
            >= cut
    }));
    for f in read_log_all(&log)
        .files
        .iter()
        .filter(|f| f.op == "download")
    {
        if let Some(e) = &f.error {
            assert!(e.contains("changed while it was read"), "{e}");
            assert!(!e.contains("the client went away"), "{e}");
        }
    }
}

/// `list_files` lists what a cell made that an older listing left out: a name that is not
/// UTF-8 (readable in `name`, exact in `name_base64`), and a file whose name merely looks like
/// an upload's temporary one; an upload's real temporary file, on disk while the upload runs,
/// is not listed.
#[test]
fn list_files_shows_non_utf8_names_and_a_cells_temporary_looking_file_but_not_an_uploads() {
    use std::os::unix::ffi::OsStrExt;
    let server = Server::start(&["--no-sandbox"]);
    assert_eq!(put_one_byte(&server, "/files/p1/t1/first.txt"), 200);
    let ws = server.dir.path().join("workspaces/p1/t1");
    let raw_name: &[u8] = b"caf\xe9.txt";
    std::fs::write(ws.join(std::ffi::OsStr::from_bytes(raw_name)), "x").unwrap();
    std::fs::write(ws.join(".report.csv.flowrepl-1-2"), "mine").unwrap();
    // An upload under way: its head and part of its body sent.
    let mut slow = std::net::TcpStream::connect(server.host()).unwrap();
    slow.write_all(
        format!(
            "{}part",
            head_of(
                &server,
                "PUT",
                "/files/p1/t1/slow.bin",
                "Content-Length: 100\r\n"
            )
        )
        .as_bytes(),
    )
    .unwrap();
    assert!(wait_for(Duration::from_secs(5), || std::fs::read_dir(&ws)
        .unwrap()
        .any(|e| {
            let n = e.unwrap().file_name();
            let n = n.to_string_lossy();
            n.starts_with(".slow.bin.flowrepl-")
        })));
    let mut http = flowrepl_tests::serve::RawHttp::connect(&server.url);
    let post = http.open_session(&server);
    let (status, _, reply) = http.exchange(
        &post,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_files","arguments":{"task":"t1","plan":"p1"}}}"#,
    );
    assert_eq!(status, 200, "{reply}");
    let json = reply
        .lines()
        .find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{')))
        .unwrap_or(&reply);
    let reply: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {reply:?}"));
    let entries = reply["result"]["structuredContent"]["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .clone();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&".report.csv.flowrepl-1-2"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with(".slow.bin")),
        "{names:?}"
    );
    let odd = entries
        .iter()
        .find(|e| e["name"] == "caf\\xe9.txt")
        .unwrap_or_else(|| panic!("{names:?}"));
    assert_eq!(
        odd["name_base64"],
        base64::engine::general_purpose::STANDARD.encode(raw_name)
    );
    assert!(
        entries
            .iter()
            .filter(|e| e["name_base64"].is_string())
            .count()
            == 1
    );
    // The upload ends and is listed under its name.
    slow.write_all(&[b'z'; 96]).unwrap();
    let mut reply = String::new();
    let _ = slow.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(std::fs::read(ws.join("slow.bin")).unwrap().len(), 100);
}
