//! `--store`: what keeping a task in object storage costs a cell (issue 33): `x = 1` with
//! `--store` against without, interleaved, in both modes, against a real S3-compatible server
//! on loopback (moto's, `target/mcp-venv/bin/moto_server`, started here). The handover and
//! upload-delay figures are `bench/store_bench.py`'s.

use crate::logging::interleaved;
use crate::peer::kernel_cmd;
use crate::stats::target;
use crate::Args;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A moto S3 server with the bucket `bench`, stopped when dropped.
struct Moto(Child, u16);

impl Moto {
    fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("target/mcp-venv/bin/moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("target/mcp-venv/bin/moto_server (tests/mcp/make-venv makes it)");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "PUT /bench HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 200"), "bucket not made: {out}");
        Moto(child, port)
    }

    fn kernel(&self, kernel: &Path, logs: &Path, worker: bool, task: &str) -> Command {
        let mut c = kernel_cmd(kernel, logs, worker);
        c.args(["--store", "s3://bench/x"])
            .env("FLOW_TASK_ID", task)
            .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.1))
            .env("AWS_ACCESS_KEY_ID", "bench")
            .env("AWS_SECRET_ACCESS_KEY", "bench")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ALLOW_HTTP", "true");
        c
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Measures and prints `x = 1` with the store against without.
pub fn run(args: &Args, logs: &Path) {
    let moto = Moto::start();
    println!("\n--store's cost per cell (x = 1 round trip, µs, interleaved; the store: moto's S3 server on loopback)");
    println!(
        "{:<12} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "", "store p50", "local p50", "store p99", "local p99", "ratio"
    );
    for (mode, worker) in [("in-process", false), ("worker", true)] {
        let stored = moto.kernel(&args.kernel, logs, worker, &format!("bench-store-{mode}"));
        let mut local = kernel_cmd(&args.kernel, logs, worker);
        local.env("FLOW_TASK_ID", format!("bench-local-{mode}"));
        let (s, l, _, _) = interleaved(args, stored, local);
        println!(
            "{mode:<12} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>7.2}x",
            s.p50,
            l.p50,
            s.p99,
            l.p99,
            s.p50 / l.p50
        );
        target(
            &format!("x = 1 with --store / without, p50, {mode}"),
            s.p50 / l.p50,
            1.05,
            false,
        );
    }
}
