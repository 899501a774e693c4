//! Helpers for the integration tests: build the real `flowrepl` binary once, start it over
//! pipes, and talk JSON-RPC to it. Every line the kernel writes to stdout is checked to be a
//! JSON-RPC message as it arrives, so every test also checks that stdout stays clean.
//!
//! Size: the one harness every integration test drives kernels with.

pub mod index;
pub mod mcp;
pub mod nginx;
pub mod pty;
pub mod s3;
pub mod schema;
pub mod serve;

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long any single reply may take before a test fails.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Path of the `flowrepl` binary that this build made: `cargo test --workspace` builds it,
/// `flowrepl-worker` and the build Python's library into the same target directory as this
/// test (the `kernel` and `worker` packages have integration tests of their own, so cargo
/// builds their binaries first; the library is a workspace member).
pub fn flowrepl_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap(); // target/<profile>/deps/..
        sync_python_lib(profile_dir);
        for name in ["flowrepl", "flowrepl-worker", "libflowrepl_pylib.so"] {
            assert!(
                profile_dir.join(name).is_file(),
                "{name} is not in {}: run the tests with `cargo test --workspace`, which builds it",
                profile_dir.display()
            );
        }
        profile_dir.join("flowrepl")
    })
}

/// `cargo test` builds the Python library as a dependency of its integration test, into
/// `deps/`, and copies to `target/<profile>/` only what was asked for by name (the binaries);
/// `cargo build` puts it there. The kernel looks next to its executable, so the library of
/// this build is put there when `deps/` has a newer one (through a rename: tests run at once).
fn sync_python_lib(profile_dir: &Path) {
    let built = profile_dir.join("deps/libflowrepl_pylib.so");
    let used = profile_dir.join("libflowrepl_pylib.so");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let Some(b) = mtime(&built) {
        if mtime(&used).is_none_or(|u| u < b) {
            let tmp = profile_dir.join(format!("libflowrepl_pylib.so.{}", std::process::id()));
            std::fs::copy(&built, &tmp).unwrap();
            std::fs::rename(&tmp, &used).unwrap();
        }
    }
}

/// The build Python's library (`libflowrepl_pylib.so`), next to [`flowrepl_bin`].
pub fn python_lib() -> PathBuf {
    flowrepl_bin().with_file_name("libflowrepl_pylib.so")
}

/// The real interpreter the kernel was built against (for making venvs in tests).
pub fn base_python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Options for starting a kernel.
#[derive(Default, Clone)]
pub struct KernelOptions {
    env: HashMap<String, String>,
    args: Vec<String>,
    log_dir: Option<PathBuf>,
    parent: ParentSignals,
    wrap: Vec<String>,
    terminal: Option<std::ffi::CString>,
}

/// What the kernel inherits of SIGINT from its parent, as `exec` passes it on.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentSignals {
    /// SIGINT at its default, unblocked (an interactive shell).
    #[default]
    Default,
    /// SIGINT ignored (a background job of a non-interactive shell, `nohup`).
    IgnoreSigint,
    /// SIGINT blocked in the signal mask.
    BlockSigint,
}

impl KernelOptions {
    /// Sets an environment variable for the kernel.
    pub fn env(mut self, k: &str, v: impl Into<String>) -> Self {
        self.env.insert(k.into(), v.into());
        self
    }
    /// Adds a command-line argument.
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }
    /// Runs cells in a worker subprocess (`USE_SUBPROCESS_WORKER=1`); sandboxed, with the
    /// kernel's folder as the workspace, when the tests run with `FLOWREPL_TEST_SANDBOX=1`
    /// (`.ci/run` runs the worker suites again so: everything must keep working inside).
    pub fn worker(self) -> Self {
        let o = self.env("USE_SUBPROCESS_WORKER", "1");
        if std::env::var_os("FLOWREPL_TEST_SANDBOX").is_some() {
            o.env("FLOWREPL_SANDBOX", "1")
        } else {
            o
        }
    }
    /// `worker()` when `mode` is `"worker"`, else unchanged (`"in_process"`).
    pub fn mode(self, mode: &str) -> Self {
        match mode {
            "worker" => self.worker(),
            "in_process" => self,
            other => panic!("unknown mode {other}"),
        }
    }
    /// Starts the kernel with SIGINT ignored or blocked, as some parents leave it.
    pub fn parent_signals(mut self, p: ParentSignals) -> Self {
        self.parent = p;
        self
    }
    /// Starts the kernel through `wrap` (a program and its arguments, then the kernel's
    /// command line): `unshare`, `sh -c`, ...
    pub fn wrap(mut self, wrap: Vec<String>) -> Self {
        self.wrap = wrap;
        self
    }
    /// Starts the kernel as a session leader with this terminal (`pty::Pty::slave`) as its
    /// controlling terminal, as from an interactive shell (stdin and stdout stay pipes).
    pub fn controlling_terminal(mut self, slave: &std::ffi::CStr) -> Self {
        self.terminal = Some(slave.to_owned());
        self
    }
    /// Uses this log directory instead of a fresh temporary one.
    pub fn log_dir(mut self, dir: &Path) -> Self {
        self.log_dir = Some(dir.to_path_buf());
        self
    }
    /// Starts the kernel and waits for its `ready` notification.
    pub fn start(self) -> Kernel {
        Kernel::start_with(self)
    }
}

/// A running kernel.
pub struct Kernel {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Result<Value, String>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The params of the `ready` notification.
    pub ready: Value,
    /// The working directory and (unless given) log directory; removed on drop.
    pub dir: tempfile::TempDir,
    /// The log directory in use.
    pub log_dir: PathBuf,
    next_id: u64,
}

impl Kernel {
    /// Options to start one.
    pub fn options() -> KernelOptions {
        KernelOptions::default()
    }

    /// A kernel with default options.
    pub fn start() -> Kernel {
        KernelOptions::default().start()
    }

    fn start_with(opts: KernelOptions) -> Kernel {
        let dir = tempfile::tempdir().unwrap();
        let log_dir = opts
            .log_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("logs"));
        let mut cmd = match opts.wrap.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(flowrepl_bin());
                c
            }
            None => Command::new(flowrepl_bin()),
        };
        cmd.args(&opts.args)
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, _) in std::env::vars() {
            if k.starts_with("FLOWREPL_")
                || k.starts_with("FLOW_")
                || k == "VIRTUAL_ENV"
                || k == "USE_SUBPROCESS_WORKER"
            {
                cmd.env_remove(k);
            }
        }
        cmd.env("FLOWREPL_LOG_DIR", &log_dir);
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        if let Some(slave) = opts.terminal.clone() {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || pty::take_as_controlling_terminal(&slave));
            }
        }
        let parent = opts.parent;
        if parent != ParentSignals::Default {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if parent == ParentSignals::IgnoreSigint {
                        libc::signal(libc::SIGINT, libc::SIG_IGN);
                    } else {
                        let mut set: libc::sigset_t = std::mem::zeroed();
                        libc::sigemptyset(&mut set);
                        libc::sigaddset(&mut set, libc::SIGINT);
                        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn flowrepl");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let msg = match serde_json::from_slice::<Value>(&buf) {
                    Ok(v) if v.get("jsonrpc") == Some(&json!("2.0")) && buf.ends_with(b"\n") => {
                        Ok(v)
                    }
                    _ => Err(String::from_utf8_lossy(&buf[..buf.len().min(2000)]).into_owned()),
                };
                if tx.send(msg).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut child_err = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = child_err.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        let stdin = child.stdin.take();
        let mut k = Kernel {
            child,
            stdin,
            lines,
            stderr,
            ready: Value::Null,
            dir,
            log_dir,
            next_id: 0,
        };
        let ready = k.recv();
        assert_eq!(
            ready["method"], "ready",
            "first line must be the ready notification: {ready}"
        );
        k.ready = ready["params"].clone();
        k
    }

    /// Waits (bounded) until the kernel's stderr contains `needle` (it is read by a thread of
    /// its own, so what was written before a reply may not have been read yet); returns it.
    pub fn stderr_with(&self, needle: &str) -> String {
        wait_for(Duration::from_secs(10), || self.stderr().contains(needle));
        self.stderr()
    }

    /// What the kernel wrote to stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Writes raw bytes to the kernel's stdin.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// The next protocol message; fails the test on a non-protocol line or a timeout.
    pub fn recv(&mut self) -> Value {
        self.recv_timeout(REPLY_TIMEOUT).unwrap_or_else(|| {
            panic!(
                "no reply within {REPLY_TIMEOUT:?}; stderr:\n{}",
                self.stderr()
            )
        })
    }

    /// The next protocol message, or `None` after `timeout` or at EOF.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Option<Value> {
        match self.lines.recv_timeout(timeout) {
            Ok(Ok(v)) => Some(v),
            Ok(Err(line)) => panic!("stdout carried a non-protocol line: {line:?}"),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Sends a request and returns the whole response.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut req = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            req["params"] = params;
        }
        let mut line = serde_json::to_vec(&req).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
        let resp = self.recv();
        assert_eq!(resp["id"], json!(id), "reply out of order: {resp}");
        resp
    }

    /// Runs `code` and returns the result object.
    pub fn execute(&mut self, code: &str) -> Value {
        self.execute_params(json!({"code": code}))
    }

    /// Runs a cell with explicit params and returns the result object.
    pub fn execute_params(&mut self, params: Value) -> Value {
        let resp = self.call("execute_code", params);
        assert!(resp.get("error").is_none(), "execute_code failed: {resp}");
        resp["result"].clone()
    }

    /// Runs `code` and asserts it succeeded.
    pub fn ok(&mut self, code: &str) -> Value {
        let r = self.execute(code);
        assert_eq!(r["success"], true, "cell failed: {code}\n{r:#}");
        r
    }

    /// Waits (bounded) until `status` says a cell runs: a request sent before has reached
    /// the executor's thread. Use it instead of sleeping while a long cell starts.
    pub fn wait_busy(&mut self) {
        let until = Instant::now() + REPLY_TIMEOUT;
        loop {
            let st = self.call("status", Value::Null);
            if st["result"]["busy"] == true {
                return;
            }
            assert!(Instant::now() < until, "the cell never started: {st}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Sends `interrupt` until it reaches the running cell (`busy` is set a moment before the
    /// cell's code starts, when nothing can be interrupted yet); returns when one did.
    pub fn interrupt_running(&mut self) {
        self.wait_busy();
        let until = Instant::now() + REPLY_TIMEOUT;
        loop {
            let ack = self.call("interrupt", Value::Null);
            if ack["result"]["interrupted"] == true {
                return;
            }
            assert!(
                Instant::now() < until,
                "no cell could be interrupted: {ack}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A barrier for the task log: records are written right after their reply, so once a
    /// later request is answered every earlier record is in the file.
    pub fn sync(&mut self) {
        let r = self.call("status", Value::Null);
        assert!(r.get("result").is_some(), "status failed: {r}");
    }

    /// Waits (bounded) until the automatic checkpoint holds the state after cell `count`
    /// (it is written once the kernel is idle after a successful cell); returns `checkpoints`.
    pub fn wait_checkpoint(&mut self, count: u64) -> Value {
        let until = Instant::now() + REPLY_TIMEOUT;
        loop {
            let r = self.call("checkpoints", Value::Null)["result"].clone();
            let auto = r["checkpoints"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["name"] == "auto"))
                .map(|c| c["execution_count"].as_u64().unwrap_or(0));
            if auto >= Some(count) {
                return r;
            }
            assert!(
                Instant::now() < until,
                "no checkpoint after cell {count}: {r}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The task log file named in the ready notification.
    pub fn log_file(&self) -> PathBuf {
        let p = PathBuf::from(self.ready["log_file"].as_str().unwrap());
        if p.is_absolute() {
            p
        } else {
            self.dir.path().join(p)
        }
    }

    /// Closes the kernel's stdin without waiting.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Closes stdin and waits (bounded) for the kernel to exit.
    pub fn close(&mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.wait()
    }

    /// Waits (bounded) for the kernel to exit; checks nothing else came on stdout.
    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Drain what is left: it must all be protocol.
                if let Some(v) = self.recv_timeout(Duration::from_millis(200)) {
                    panic!("unexpected message after exit: {v}");
                }
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "kernel did not exit; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its working directory: the workspace of an unsandboxed kernel.
    pub fn workspace(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The kernel's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Every record the kernel wrote matches the published schema (not while a failing
        // test unwinds: its own message matters more).
        if !std::thread::panicking() {
            schema::validate_logs(&self.log_dir);
        }
    }
}

/// Reads the task log with the project's tolerant reader; asserts nothing was skipped.
pub fn read_log(path: &Path) -> Vec<flowrepl_task_logger::ExecutionRecord<'static>> {
    read_log_all(path).records
}

/// Every record of a task log (execution and event records), asserting no line was bad.
pub fn read_log_all(path: &Path) -> flowrepl_task_logger::ReadOutcome {
    let out =
        flowrepl_task_logger::read_records(path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
    assert!(
        out.skipped.is_empty(),
        "log has bad lines: {:?}",
        out.skipped
    );
    out
}

/// Both execution modes, for tests that must hold in each.
pub const MODES: [&str; 2] = ["in_process", "worker"];

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (bounded by `within`) until something listens on loopback port `port`.
pub fn wait_listening(port: u16, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not listen within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether every thread of process `pid` has exited (a killed process's main thread turns
/// zombie first; its files, pipes included, close only when the last thread is gone), and
/// every process of its group that its parent did not start (a worker's: in the sandbox's PID
/// namespace the Python process is another process of the worker's group, which dies just
/// after it; the worker's guard, also the kernel's child, stays).
pub fn exited(pid: u32) -> bool {
    let gone = |p: u32| {
        !alive(p) && std::fs::read_dir(format!("/proc/{p}/task")).map_or(0, |d| d.count()) <= 1
    };
    let parent = stat_field(pid, 1);
    gone(pid)
        && group_of(pid)
            .into_iter()
            .filter(|&p| stat_field(p, 1) != parent)
            .all(gone)
}

/// Field `n` after the parenthesised command name of `/proc/<pid>/stat` (0: state, 1: ppid,
/// 2: process group).
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit(')')
            .next()?
            .split_whitespace()
            .nth(n)?
            .to_owned(),
    )
}

/// The processes of group `pgid`.
pub fn group_of(pgid: u32) -> Vec<u32> {
    all_pids()
        .filter(|&p| stat_field(p, 2) == Some(pgid.to_string()))
        .collect()
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat_field(pid, 0).is_some_and(|state| state != "Z" && state != "X")
}

/// Waits up to `timeout` for `cond`.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Zombie children of `parent` (processes it has not reaped).
pub fn zombie_children(parent: u32) -> Vec<u32> {
    let parent = parent.to_string();
    all_pids()
        .filter(|&p| {
            stat_field(p, 0).as_deref() == Some("Z") && stat_field(p, 1).as_ref() == Some(&parent)
        })
        .collect()
}

/// Every process on the host.
pub fn all_pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
}

/// Host processes (not zombies) whose command line is exactly `args`.
pub fn processes_running(args: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    all_pids()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want) && alive(*pid)
        })
        .collect()
}

/// A `sleep` a cell starts, named by an argument no other test uses, so that the test finds
/// it on the host whatever PID namespace the cell sees; any left is killed on drop.
pub struct Sleeper {
    /// The argument of `sleep` (about 300 seconds).
    pub arg: String,
}

impl Sleeper {
    /// A new, unique argument.
    pub fn new() -> Sleeper {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Sleeper {
            arg: format!("300.{}{n:03}", std::process::id()),
        }
    }

    /// The running `sleep` processes with this argument.
    pub fn running(&self) -> Vec<u32> {
        processes_running(&["sleep", &self.arg])
    }

    /// Whether none runs.
    pub fn gone(&self) -> bool {
        self.running().is_empty()
    }
}

impl Default for Sleeper {
    fn default() -> Self {
        Sleeper::new()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        for pid in self.running() {
            kill(pid, libc::SIGKILL);
        }
    }
}

/// Sends `sig` to `pid`.
pub fn kill(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::kill(pid as i32, sig) };
}

/// `flowrepl --help` names `command`'s tools, `tools` (the names a server listed), in its
/// line: `(tools: a, b, ...)`, from the server's own list.
pub fn assert_help_lists_tools(command: &str, tools: &[serde_json::Value]) {
    let help = std::process::Command::new(flowrepl_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{command} ")))
        .unwrap_or_else(|| panic!("no {command} line in --help: {help}"));
    let names: Vec<&str> = tools.iter().map(|t| t.as_str().unwrap()).collect();
    assert!(
        line.contains(&format!("(tools: {})", names.join(", "))),
        "{line}"
    );
}

/// A folder in the user's home (outside every place a sandbox may touch: the place a cell's
/// planted code would leave its mark if it ran outside), removed on drop.
pub struct HomeDir(pub PathBuf);

impl HomeDir {
    /// `~/.flowrepl-test-<tag>-<pid>`, made.
    pub fn new(tag: &str) -> HomeDir {
        let home = std::env::var_os("HOME").expect("HOME");
        let dir = Path::new(&home).join(format!(".flowrepl-test-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        HomeDir(dir)
    }
}

impl Drop for HomeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
