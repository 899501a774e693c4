//! A lean MCP client for `flowrepl serve` (`flowrepl-bench mcp-calls`): HTTP/1.1 over one
//! keep-alive connection per client, written by hand with the standard library, so that
//! what is measured is the server and not a client's own work; and the same calls as lines
//! to a stdio `flowrepl mcp`, to compare. Run by `bench/mcp/serve_bench.py`, which prints
//! the figures; this prints JSON.

use serde_json::{json, Value};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Debug, clap::Args)]
pub struct CallsArgs {
    /// `http://host:port/mcp` of a `flowrepl serve`.
    #[arg(long)]
    url: Option<String>,
    /// Its bearer token.
    #[arg(long, default_value = "")]
    token: String,
    /// Instead of a URL: this `flowrepl`, started as `flowrepl mcp --sandbox` on stdio.
    #[arg(long)]
    stdio: Option<String>,
    /// Clients at once, each with its own connection (stdio: 1).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Calls per client, after 20 not measured.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Tasks the clients share (client `i` calls task `bench-{i % tasks}`).
    #[arg(long, default_value_t = 1)]
    tasks: usize,
    /// Call `list_kernels` instead (the server alone, no kernel on the way).
    #[arg(long)]
    server_only: bool,
}

/// One MCP client.
trait Client {
    fn request(&mut self, method: &str, params: Value) -> io::Result<Value>;
    fn notify(&mut self, method: &str) -> io::Result<()>;
}

fn handshake(c: &mut dyn Client) -> io::Result<()> {
    c.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "flowrepl-bench", "version": "1"}}),
    )?;
    c.notify("notifications/initialized")
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// Over HTTP/1.1, one keep-alive connection.
struct Http {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    host: String,
    path: String,
    token: String,
    session: Option<String>,
    next_id: u64,
}

impl Http {
    fn connect(url: &str, token: &str) -> io::Result<Http> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("an http:// URL"))?;
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let stream = TcpStream::connect(host)?;
        stream.set_nodelay(true)?;
        let mut h = Http {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            host: host.into(),
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
            token: token.into(),
            session: None,
            next_id: 0,
        };
        handshake(&mut h)?;
        Ok(h)
    }

    /// POSTs `body` and returns the response body (JSON, or the event stream's data lines).
    fn post(&mut self, body: &[u8]) -> io::Result<String> {
        let mut req = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.path, self.host, self.token, body.len()
        );
        if let Some(s) = &self.session {
            req.push_str(&format!("mcp-session-id: {s}\r\n"));
        }
        req.push_str("\r\n");
        let mut out = req.into_bytes();
        out.extend_from_slice(body);
        self.writer.write_all(&out)?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("no status line: {line:?}")))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap_or((l, ""));
            match k.to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
                "mcp-session-id" => self.session = Some(v.trim().to_owned()),
                _ => {}
            }
        }
        let mut data = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let n = usize::from_str_radix(line.trim(), 16).map_err(|e| bad(e.to_string()))?;
                let mut chunk = vec![0; n + 2];
                self.reader.read_exact(&mut chunk)?;
                if n == 0 {
                    break;
                }
                data.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(n) = length {
            data.resize(n, 0);
            self.reader.read_exact(&mut data)?;
        }
        if !(200..300).contains(&status) {
            return Err(bad(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&data)
            )));
        }
        Ok(String::from_utf8_lossy(&data).into_owned())
    }
}

impl Client for Http {
    fn request(&mut self, method: &str, params: Value) -> io::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let text = self.post(body.to_string().as_bytes())?;
        // A JSON reply, or an event stream whose data lines carry it.
        let candidates = std::iter::once(text.as_str()).chain(
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim),
        );
        for c in candidates {
            if let Ok(v) = serde_json::from_str::<Value>(c) {
                if v["id"] == id {
                    return Ok(v);
                }
            }
        }
        Err(bad(format!("no reply to {id} in {text:?}")))
    }

    fn notify(&mut self, method: &str) -> io::Result<()> {
        let body = json!({"jsonrpc": "2.0", "method": method});
        self.post(body.to_string().as_bytes()).map(drop)
    }
}

/// Lines on stdio to a `flowrepl mcp` child.
struct Pipe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Pipe {
    fn start(flowrepl: &str) -> io::Result<Pipe> {
        let ws = std::env::temp_dir().join(format!("flowrepl-bench-{}", std::process::id()));
        std::fs::create_dir_all(&ws)?;
        let mut child = Command::new(flowrepl)
            .args(["mcp", "--sandbox", "--workspace"])
            .arg(&ws)
            .arg("--log-dir")
            .arg(ws.join("logs"))
            .env("FLOWREPL_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut s = Pipe {
            stdin: child.stdin.take().expect("piped"),
            stdout: BufReader::new(child.stdout.take().expect("piped")),
            child,
            next_id: 0,
        };
        handshake(&mut s)?;
        Ok(s)
    }

    fn send(&mut self, v: &Value) -> io::Result<()> {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        self.stdin.write_all(&line)
    }
}

impl Client for Pipe {
    fn request(&mut self, method: &str, params: Value) -> io::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                return Err(bad("the kernel closed stdout"));
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
            if v["id"] == id {
                return Ok(v);
            }
        }
    }

    fn notify(&mut self, method: &str) -> io::Result<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method}))
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `execute_code` of `x = 1`, on `task` (a server's; a stdio kernel takes none), or
/// `list_kernels`.
fn call_x(c: &mut dyn Client, task: Option<&str>, server_only: bool) -> io::Result<()> {
    let mut arguments = json!({"code": "x = 1"});
    if let Some(t) = task {
        arguments["task"] = json!(t);
    }
    let params = if server_only {
        json!({"name": "list_kernels", "arguments": {}})
    } else {
        json!({"name": "execute_code", "arguments": arguments})
    };
    let r = c.request("tools/call", params)?;
    if r["result"]["isError"] == true || r.get("error").is_some() {
        return Err(bad(format!("the call failed: {r}")));
    }
    Ok(())
}

/// Runs the calls and prints `{calls, wall_s, per_s, p50_us, p99_us}`.
pub fn run(args: &CallsArgs) -> io::Result<()> {
    let clients: Vec<Box<dyn Client + Send>> = match (&args.url, &args.stdio) {
        (Some(url), _) => (0..args.clients)
            .map(|_| Http::connect(url, &args.token).map(|h| Box::new(h) as Box<dyn Client + Send>))
            .collect::<io::Result<_>>()?,
        (None, Some(bin)) => vec![Box::new(Pipe::start(bin)?)],
        (None, None) => return Err(bad("--url or --stdio")),
    };
    let stdio = args.url.is_none();
    let n = clients.len();
    let barrier = Arc::new(Barrier::new(n));
    let all = Arc::new(Mutex::new(Vec::with_capacity(n * args.calls)));
    let mut threads = Vec::new();
    let server_only = args.server_only;
    for (i, mut c) in clients.into_iter().enumerate() {
        let (barrier, all, calls, tasks) = (
            Arc::clone(&barrier),
            Arc::clone(&all),
            args.calls,
            args.tasks.max(1),
        );
        threads.push(std::thread::spawn(move || -> io::Result<Duration> {
            let task = (!stdio).then(|| format!("bench-{}", i % tasks));
            let call =
                |c: &mut Box<dyn Client + Send>| call_x(c.as_mut(), task.as_deref(), server_only);
            for _ in 0..20 {
                call(&mut c)?;
            }
            barrier.wait();
            let started = Instant::now();
            let mut mine = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                call(&mut c)?;
                mine.push(t.elapsed());
            }
            all.lock().unwrap_or_else(|p| p.into_inner()).extend(mine);
            Ok(started.elapsed())
        }));
    }
    let mut wall = Duration::ZERO;
    for t in threads {
        wall = wall.max(t.join().map_err(|_| bad("a client panicked"))??);
    }
    let mut lat = std::mem::take(&mut *all.lock().unwrap_or_else(|p| p.into_inner()));
    lat.sort();
    let q = |f: f64| lat[((lat.len() as f64 * f) as usize).min(lat.len() - 1)].as_secs_f64() * 1e6;
    println!(
        "{}",
        json!({"calls": lat.len(), "wall_s": wall.as_secs_f64(),
               "per_s": lat.len() as f64 / wall.as_secs_f64(),
               "p50_us": q(0.5), "p99_us": q(0.99)})
    );
    Ok(())
}
