//! `--sandbox`: every layer, tried from inside a cell. Each attempt fails with the layer in
//! force, and the same attempt is shown to get through with that layer left out
//! (`FLOWREPL_SANDBOX_SKIP`), so that each test proves the layer is what stops it. The
//! kernel keeps serving after every attempt. Network attempts target only a listener this
//! test opens on the host's 127.0.0.1.

use flowrepl_tests::{HomeDir, Kernel};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A sandboxed kernel on `workspace`, with `skip` layers left out and `extra` flags.
fn sandboxed(workspace: &Path, skip: &[&str], extra: &[&str]) -> Kernel {
    let mut o = Kernel::options()
        .arg("--sandbox")
        .arg("--workspace")
        .arg(workspace.display().to_string())
        .env("FLOWREPL_SANDBOX_SKIP", skip.join(","))
        .env("FLOWREPL_TEST_SECRET", "s3cr3t-in-the-kernel");
    for a in extra {
        o = o.arg(*a);
    }
    o.start()
}

/// Runs `code`, whose last line is an expression, and returns its repr (the cell must not
/// fail: attempts catch their own errors).
fn attempt(k: &mut Kernel, code: &str) -> String {
    let r = k.ok(code);
    r["result"].as_str().unwrap_or_default().to_owned()
}

/// The layers as the `ready` notification reports them: name → enforced.
fn layers(k: &Kernel) -> Vec<(String, bool, bool)> {
    k.ready["sandbox"]["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("no sandbox report: {:#}", k.ready))
        .iter()
        .map(|l| {
            (
                l["layer"].as_str().unwrap().to_owned(),
                l["enforced"] == Value::Bool(true),
                l["wanted"] == Value::Bool(true),
            )
        })
        .collect()
}

/// What the `ready` notification says of `layer` (its `detail`).
fn detail(k: &Kernel, layer: &str) -> String {
    k.ready["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == layer)
        .unwrap_or_else(|| panic!("no layer {layer}: {:#}", k.ready))["detail"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn the_ready_notification_and_status_name_every_layer_in_force() {
    let ws = tempfile::tempdir().unwrap();
    let mut k = sandboxed(ws.path(), &[], &[]);
    let all = layers(&k);
    for name in [
        "user_namespace",
        "network_namespace",
        "ipc_namespace",
        "mount_namespace",
        "pid_namespace",
        "environment",
        "landlock_filesystem",
        "landlock_network",
        "landlock_scopes",
        "seccomp",
    ] {
        assert!(
            all.iter()
                .any(|(n, enforced, wanted)| n == name && *enforced && *wanted),
            "{name}: {all:?}"
        );
    }
    assert_eq!(k.ready["mode"], "worker");
    assert_eq!(
        k.call("status", Value::Null)["result"]["sandbox"],
        k.ready["sandbox"]
    );
    // The session record says the same.
    let log = std::fs::read_to_string(k.log_file()).unwrap();
    let start: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(start["type"], "session");
    assert_eq!(start["sandbox"], k.ready["sandbox"]);
    // A skipped layer is reported as not enforced, never claimed.
    let mut k2 = sandboxed(ws.path(), &["seccomp"], &[]);
    assert!(layers(&k2)
        .iter()
        .any(|(n, enforced, wanted)| n == "seccomp" && !enforced && !wanted));
    assert_eq!(attempt(&mut k2, "6 * 7"), "42");
    assert_eq!(attempt(&mut k, "6 * 7"), "42");
}

/// A TCP connect to a listener on the host's 127.0.0.1: each of the three network layers
/// stops it alone (the network namespace: lo is down; Landlock: connect denied; seccomp: no
/// AF_INET socket), and it gets through with all three left out or with `--sandbox-net`.
#[test]
fn no_tcp_reaches_the_host_unless_every_network_layer_is_left_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = tempfile::tempdir().unwrap();
    let code = format!(
        "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n    r = 'connected'\nexcept OSError as e:\n    r = f'refused {{e.errno}}'\nr"
    );
    let net = ["network_namespace", "landlock_network", "seccomp"];
    for (skip, expect) in [
        (vec![], "refused"),
        (vec![net[1], net[2]], "refused 101"), // ENETUNREACH: only lo, down
        (vec![net[0], net[2]], "refused 13"),  // EACCES: Landlock
        (vec![net[0], net[1]], "refused 97"),  // EAFNOSUPPORT: seccomp
        (net.to_vec(), "connected"),
    ] {
        let mut k = sandboxed(ws.path(), &skip, &[]);
        let got = attempt(&mut k, &code);
        assert!(got.contains(expect), "skip {skip:?}: {got}");
        assert_eq!(attempt(&mut k, "1 + 1"), "2");
    }
    let mut k = sandboxed(ws.path(), &[], &["--sandbox-net"]);
    assert_eq!(k.ready["sandbox"]["network"], "host");
    assert!(attempt(&mut k, &code).contains("connected"));
    // Without the network: no interface but lo, and no route.
    let mut k = sandboxed(ws.path(), &[], &[]);
    let ifaces = attempt(
        &mut k,
        "sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]), open('/proc/net/route').read().splitlines()[1:]",
    );
    assert_eq!(ifaces, "(['lo'], [])");
}

/// Files: the user's home is not readable, nothing outside the workspace is writable
/// (directly, through a symlink or a hard link made in the workspace), and the task log
/// cannot be appended to; with the filesystem layers left out, the same attempts succeed.
#[test]
fn files_outside_the_workspace_are_out_of_reach() {
    let home = HomeDir::new("files");
    let secret = home.0.join("secret.txt");
    std::fs::write(&secret, "private").unwrap();
    let outside = home.0.join("out");
    std::fs::create_dir_all(&outside).unwrap();
    // The support cache exists (as after any kernel ran), so that a denied write there is
    // the sandbox's doing, not a missing folder's.
    let cache = flowrepl_exec::setup::support_cache_dir().unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let code = format!(
        r#"import os
def tryit(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return f'denied {{e.errno}}'
secret, outside = {secret:?}, {outside:?}
def write(p):
    with open(p, 'w') as f:
        f.write('x')
def via_symlink():
    os.symlink(outside, 'link')
    write('link/through-symlink.txt')
def via_hardlink():
    os.link(secret, 'hard.txt')
    write('hard.txt')
r = dict(
    read_home=tryit(lambda: open(secret).read()),
    write_outside=tryit(lambda: write(os.path.join(outside, 'direct.txt'))),
    symlink=tryit(via_symlink),
    hardlink=tryit(via_hardlink),
    workspace=tryit(lambda: write('inside.txt')),
    # The compiled support code a kernel outside loads: readable, never writable.
    support_cache=tryit(lambda: write(os.path.join(os.environ['FLOWREPL_SUPPORT_CACHE'], 'planted'))),
)
r"#,
        secret = secret.display().to_string(),
        outside = outside.display().to_string(),
    );
    let mut k = sandboxed(ws.path(), &[], &[]);
    let got = attempt(&mut k, &code);
    for what in [
        "read_home",
        "write_outside",
        "symlink",
        "hardlink",
        "support_cache",
    ] {
        // EACCES/EPERM: Landlock; ENOENT: not in the new root; EXDEV: a link across
        // mounts; EROFS: bound read-only.
        assert!(
            ["13", "1", "2", "18", "30"]
                .iter()
                .any(|e| got.contains(&format!("'{what}': 'denied {e}'"))),
            "{what}: {got}"
        );
    }
    assert!(got.contains("'workspace': 'ok'"), "{got}");
    assert!(!outside.join("direct.txt").exists());
    assert!(!outside.join("through-symlink.txt").exists());
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "private");
    // The task log: hidden (mount namespace: the path names a file of the private /tmp, or
    // nothing) and not writable (Landlock). The real file never changes.
    let append = |log: &Path| {
        format!(
            "try:\n    open({:?}, 'a').write('forged\\n')\n    r = 'appended'\nexcept OSError as e:\n    r = f'denied {{e.errno}}'\nr",
            log.display().to_string()
        )
    };
    let log = k.log_file();
    attempt(&mut k, &append(&log));
    k.sync();
    // (The cell's code, with the word, is in the log as a record: only a line of its own
    // would be the forgery.)
    let forged = |log: &Path| {
        std::fs::read_to_string(log)
            .unwrap()
            .lines()
            .any(|l| l == "forged")
    };
    assert!(!forged(&log));
    drop(k);
    // Each layer alone: the new root (the home is not in it) and Landlock (not readable).
    for (skip, errno) in [("landlock_filesystem", "2"), ("mount_namespace", "13")] {
        let ws1 = tempfile::tempdir().unwrap();
        let mut k1 = sandboxed(ws1.path(), &[skip], &[]);
        let got = attempt(&mut k1, &code);
        assert!(
            got.contains(&format!("'read_home': 'denied {errno}'")),
            "{skip}: {got}"
        );
    }
    // The same, with the filesystem layers left out.
    let ws2 = tempfile::tempdir().unwrap();
    let mut k = sandboxed(ws2.path(), &["landlock_filesystem", "mount_namespace"], &[]);
    let got = attempt(&mut k, &code);
    for what in ["read_home", "write_outside", "symlink"] {
        assert!(got.contains(&format!("'{what}': 'ok'")), "{what}: {got}");
    }
    assert!(outside.join("through-symlink.txt").exists());
    let _ = std::fs::remove_file(cache.join("planted"));
    let log = k.log_file();
    assert!(attempt(&mut k, &append(&log)).contains("appended"));
    assert!(forged(&log));
}

/// Unix sockets the test opens outside the workspace (in the host's /tmp and in the user's
/// home): the mount namespace's new root does not hold them (ENOENT); without it, both are
/// reached (Landlock does not cover connect()).
#[test]
fn a_unix_socket_of_the_host_is_out_of_reach() {
    // One in the host's /tmp, one in the user's home (an ssh ControlMaster, a gpg or
    // password-manager agent lives there): neither exists in the sandbox's new root.
    let dir = tempfile::tempdir().unwrap();
    let home = HomeDir::new("socket");
    for path in [dir.path().join("host.sock"), home.0.join("agent.sock")] {
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let ws = tempfile::tempdir().unwrap();
        let code = format!(
            "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    r = 'connected'\nexcept OSError as e:\n    r = f'refused {{e.errno}}'\nr",
            path.display().to_string()
        );
        let mut k = sandboxed(ws.path(), &[], &[]);
        assert_eq!(attempt(&mut k, &code), "'refused 2'", "{}", path.display());
        let mut k = sandboxed(ws.path(), &["mount_namespace"], &[]);
        assert_eq!(attempt(&mut k, &code), "'connected'", "{}", path.display());
        drop(listener);
    }
}

/// The kernel's process: no signal and no `/proc/<pid>/environ` (in the PID namespace the
/// kernel's pid names nothing; without it, Landlock's signal scope and ptrace rule deny
/// both), and its variables are not the cell's (the environment layer).
#[test]
fn the_kernel_is_out_of_reach() {
    let ws = tempfile::tempdir().unwrap();
    let code = |pid: u32| {
        format!(
            r#"import os
def tryit(f):
    try:
        return f'ok {{f()}}'
    except OSError as e:
        return f'denied {{e.errno}}'
dict(
    kill=tryit(lambda: os.kill({pid}, 0)),
    environ=tryit(lambda: 's3cr3t' in open('/proc/{pid}/environ').read()),
    secret='FLOWREPL_TEST_SECRET' in os.environ,
)"#
        )
    };
    let mut k = sandboxed(ws.path(), &[], &[]);
    let pid = k.pid();
    let got = attempt(&mut k, &code(pid));
    assert!(got.contains("'kill': 'denied 3'"), "ESRCH: {got}");
    assert!(got.contains("'environ': 'denied 2'"), "ENOENT: {got}");
    assert!(got.contains("'secret': False"), "{got}");
    let mut k = sandboxed(ws.path(), &["pid_namespace"], &[]);
    let pid = k.pid();
    let got = attempt(&mut k, &code(pid));
    assert!(got.contains("'kill': 'denied 1'"), "EPERM: {got}");
    assert!(got.contains("'environ': 'denied 13'"), "EACCES: {got}");
    // Without Landlock, the user namespace alone still denies `environ` to a kernel that
    // runs as root (its capabilities are out of the namespace's reach), and so does dropping
    // every capability: leave all three out.
    let mut k = sandboxed(
        ws.path(),
        &[
            "landlock_filesystem",
            "landlock_network",
            "landlock_scopes",
            "user_namespace",
            "environment",
            "capabilities",
        ],
        &[],
    );
    let pid = k.pid();
    let got = attempt(&mut k, &code(pid));
    assert!(got.contains("'kill': 'ok None'"), "{got}");
    assert!(got.contains("'environ': 'ok True'"), "{got}");
    assert!(got.contains("'secret': True"), "{got}");
}

/// The PID namespace: a cell sees only the sandbox's processes (init and itself, not the
/// kernel nor a process the test starts), is PID 2, leaves no zombie when it orphans a
/// process (init reaps it), and a process it starts in a new session (outside the worker's
/// process group, which is what the kernel kills) dies with the worker. With the layer left
/// out, the kernel and the test's process are listed and the new session survives.
#[test]
fn processes_outside_are_out_of_sight_and_none_inside_outlives_the_worker() {
    let ws = tempfile::tempdir().unwrap();
    let mut host = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let code = |session: &str| {
        format!(
            r#"import os, subprocess, time
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
subprocess.Popen(['sleep', '{session}'], start_new_session=True)
subprocess.run(['sh', '-c', 'sleep 0.2 &'])
time.sleep(0.6)
def state(p):
    try:
        return open(f'/proc/{{p}}/stat').read().rsplit(')', 1)[1].split()[0]
    except OSError:
        return '?'
zombies = [p for p in os.listdir('/proc') if p.isdigit() and state(p) == 'Z']
(pids, os.getpid(), zombies)"#
        )
    };
    for (skip, inside) in [(vec![], true), (vec!["pid_namespace"], false)] {
        let session = flowrepl_tests::Sleeper::new();
        let mut k = sandboxed(ws.path(), &skip, &[]);
        let kernel = k.pid();
        let got = attempt(&mut k, &code(&session.arg));
        if inside {
            assert_eq!(got, "([1, 2], 2, [])", "only init and the cell, no zombie");
        } else {
            for pid in [kernel, host.id()] {
                assert!(got.contains(&format!(" {pid},")), "{pid} listed: {got}");
            }
        }
        assert_eq!(attempt(&mut k, "1 + 1"), "2");
        assert_eq!(session.running().len(), 1);
        assert!(k.close().success());
        let gone = flowrepl_tests::wait_for(std::time::Duration::from_secs(5), || session.gone());
        assert_eq!(
            gone, inside,
            "the new session's process ended with the worker"
        );
    }
    host.kill().unwrap();
    host.wait().unwrap();
}

/// The system calls sandboxes are escaped through answer EPERM (clone3: ENOSYS) from the
/// filter; without it, the same calls reach the kernel, which answers otherwise.
#[test]
fn escape_syscalls_are_denied_by_the_filter() {
    let ws = tempfile::tempdir().unwrap();
    let code = r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(*args):
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()
SYS = dict(ptrace=101, io_uring_setup=425, clone3=435, unshare=272, bpf=321)
import json
json.dumps(dict(
    ptrace=call(SYS['ptrace'], 16, 0x3fffffff, 0, 0),          # PTRACE_ATTACH, no such pid
    io_uring_setup=call(SYS['io_uring_setup'], 1, 0),          # NULL params
    clone3=call(SYS['clone3'], 0, 0),                          # NULL args
    unshare=call(SYS['unshare'], 0x04000000),                  # CLONE_NEWUTS
    bpf=call(SYS['bpf'], 0, 0, 0),
))"#;
    let errnos = |k: &mut Kernel| -> Value {
        let text = attempt(k, code);
        serde_json::from_str(text.trim_matches('\'')).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    let mut k = sandboxed(ws.path(), &[], &[]);
    let got = errnos(&mut k);
    for (call, errno) in [
        ("ptrace", 1),
        ("io_uring_setup", 1),
        ("clone3", 38),
        ("unshare", 1),
        ("bpf", 1),
    ] {
        assert_eq!(got[call], errno, "{call}: {got}");
    }
    // (Without capabilities, `unshare` is EPERM even without the filter: leave both out.)
    let mut k = sandboxed(ws.path(), &["seccomp", "capabilities"], &[]);
    let got = errnos(&mut k);
    for (call, errno) in [
        ("ptrace", 3),          // ESRCH
        ("io_uring_setup", 14), // EFAULT
        ("clone3", 22),         // EINVAL
        ("unshare", 0),         // allowed in its own user namespace
    ] {
        assert_eq!(got[call], errno, "{call}: {got}");
    }
}

/// A host that refuses user namespaces, as many containers do: the kernel runs in a user
/// namespace whose limit on nested ones is 0 (`user.max_user_namespaces`).
const NO_USER_NAMESPACES: [&str; 7] = [
    "unshare",
    "--user",
    "--map-root-user",
    "sh",
    "-c",
    "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"",
    "sh",
];

/// On a host that refuses user namespaces, best-effort starts with what can be enforced
/// (Landlock and seccomp) and reports the namespaces as not enforced, with the host's reason;
/// `--sandbox=strict` exits 2 with one line naming what is missing.
#[test]
fn without_user_namespaces_best_effort_says_so_and_strict_refuses() {
    let ws = tempfile::tempdir().unwrap();
    let mut k = Kernel::options()
        .wrap(NO_USER_NAMESPACES.iter().map(|s| s.to_string()).collect())
        .arg("--sandbox")
        .arg("--workspace")
        .arg(ws.path().display().to_string())
        .start();
    let all = layers(&k);
    for ns in [
        "user_namespace",
        "network_namespace",
        "mount_namespace",
        "pid_namespace",
    ] {
        assert!(
            all.iter().any(|(n, e, w)| n == ns && !e && *w),
            "{ns}: {all:?}"
        );
    }
    for layer in ["landlock_filesystem", "landlock_network", "seccomp"] {
        assert!(
            all.iter().any(|(n, e, _)| n == layer && *e),
            "{layer}: {all:?}"
        );
    }
    let detail = detail(&k, "user_namespace");
    assert!(detail.contains("refused"), "{detail}");
    // What still holds: no TCP (Landlock, seccomp), the home unreadable.
    let got = attempt(
        &mut k,
        "import socket\ntry:\n    socket.socket()\n    r = 'socket'\nexcept OSError as e:\n    r = e.errno\nr",
    );
    assert_eq!(got, "97");
    let log = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(NO_USER_NAMESPACES[0]);
    cmd.args(&NO_USER_NAMESPACES[1..])
        .arg(flowrepl_tests::flowrepl_bin())
        .arg("--sandbox=strict")
        .arg("--workspace")
        .arg(ws.path())
        .env("FLOWREPL_LOG_DIR", log.path())
        .stdin(std::process::Stdio::null());
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("--sandbox=strict"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("user_namespace"), "{err}");
}

/// Over MCP (the official Python SDK), with and without `--sandbox-net`: the instructions
/// name the enforced layers, TCP to a listener on the host is refused (or, with the network
/// kept, connects), and numpy with a matplotlib figure still works, writing into the
/// workspace.
#[test]
fn over_mcp_the_sandbox_holds_and_figures_still_work() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    for (net, expect) in [("0", "refused"), ("1", "connected")] {
        let ws = tempfile::tempdir().unwrap();
        let (facts, _, _logs) = flowrepl_tests::mcp::Scenario::default()
            .env("FLOWREPL_SANDBOX", "1")
            .env("FLOWREPL_SANDBOX_NET", net)
            .env("FLOWREPL_WORKSPACE", ws.path().display().to_string())
            .env(
                "SANDBOX_TEST_PORT",
                listener.local_addr().unwrap().port().to_string(),
            )
            .env("SANDBOX_TEST_EXPECT", expect)
            .run("sandboxed");
        let real = std::fs::canonicalize(ws.path()).unwrap();
        assert_eq!(facts["cwd"], format!("'{}'", real.display()));
        assert!(real.join("made-in-sandbox.txt").is_file());
        let network = if net == "1" { "host" } else { "none" };
        assert!(
            facts["instructions"]
                .as_str()
                .unwrap()
                .contains(&format!("network: {network}")),
            "{facts}"
        );
    }
}

/// Bad sandbox settings are a clear error and exit code 2, before any worker starts.
#[test]
fn bad_sandbox_settings_exit_2_with_a_clear_error() {
    let log = tempfile::tempdir().unwrap();
    for (args, env, says) in [
        (
            vec!["--sandbox", "--workspace", "/nonexistent/flowrepl-ws"],
            ("FLOWREPL_SANDBOX_SKIP", ""),
            "--workspace /nonexistent/flowrepl-ws: not a folder",
        ),
        (
            vec!["--sandbox"],
            ("FLOWREPL_SANDBOX_SKIP", "seccomp,firewall"),
            "no sandbox layer or protection \"firewall\"",
        ),
        // Strict means every layer: a skip is refused (the same skip with `--sandbox` starts
        // and reports the layer as not enforced: the first test here).
        (
            vec!["--sandbox=strict"],
            ("FLOWREPL_SANDBOX_SKIP", "seccomp"),
            "--sandbox=strict refuses FLOWREPL_SANDBOX_SKIP (seccomp)",
        ),
        (
            vec!["--sandbox=maybe"],
            ("FLOWREPL_SANDBOX_SKIP", ""),
            "expected on, strict or off",
        ),
    ] {
        let out = std::process::Command::new(flowrepl_tests::flowrepl_bin())
            .args(&args)
            .env("FLOWREPL_LOG_DIR", log.path())
            .env(env.0, env.1)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A kernel started from an interactive shell has a controlling terminal. A cell tries to
/// push a command into it with `ioctl(TIOCSTI)` through `/dev/tty` (the user's shell would
/// run it once flowrepl exits): the worker's session of its own leaves it no terminal
/// (ENXIO); seccomp refuses the ioctl on a terminal it does reach (EPERM); with both left
/// out, the command reaches the terminal.
#[test]
fn a_cell_cannot_type_into_the_users_terminal() {
    let code = "import os, fcntl, termios\ntry:\n    fd = os.open('/dev/tty', os.O_RDWR)\nexcept OSError as e:\n    r = f'open {e.errno}'\nelse:\n    try:\n        for b in b'echo pwned-by-a-cell\\n':\n            fcntl.ioctl(fd, termios.TIOCSTI, bytes([b]))\n        r = 'typed'\n    except OSError as e:\n        r = f'ioctl {e.errno}'\nr";
    for (skip, expect) in [
        (&[][..], "'open 6'"),
        (&["terminal"][..], "'ioctl 1'"),
        (&["terminal", "seccomp"][..], "'typed'"),
    ] {
        let pty = flowrepl_tests::pty::Pty::open();
        let ws = tempfile::tempdir().unwrap();
        let mut k = Kernel::options()
            .controlling_terminal(&pty.slave)
            .arg("--sandbox")
            .arg("--workspace")
            .arg(ws.path().display().to_string())
            .env("FLOWREPL_SANDBOX_SKIP", skip.join(","))
            .start();
        let terminal = layers(&k)
            .into_iter()
            .find(|(n, _, _)| n == "terminal")
            .unwrap();
        assert_eq!(terminal.1, skip.is_empty(), "{skip:?}: {terminal:?}");
        assert_eq!(attempt(&mut k, code), expect, "{skip:?}");
        let typed = expect == "'typed'";
        let shown = pty.shown(std::time::Duration::from_millis(if typed {
            3000
        } else {
            300
        }));
        assert_eq!(
            String::from_utf8_lossy(&shown).contains("pwned-by-a-cell"),
            typed,
            "{skip:?}: the terminal shows {:?}",
            String::from_utf8_lossy(&shown)
        );
        assert_eq!(attempt(&mut k, "6 * 7"), "42");
    }
}

/// The task's checkpoint folder is writable from inside; the kernel reads it outside the
/// sandbox (`checkpoints`, `restore`). A cell plants a FIFO as a checkpoint's journal (an
/// `open` or `read` of it would block the kernel for ever), a symlink to `/dev/zero` (a read
/// that never ends), a journal that is a symlink to a file outside, and a checkpoint folder
/// that is a symlink: every call still answers at once, the planted ones are not listed,
/// restoring one is a clear error, and the session goes on. (Before the kernel opened these
/// files as untrusted input, `checkpoints` hung on the FIFO and the symlink to `/dev/zero`
/// read until memory ran out.)
#[test]
fn files_planted_in_the_checkpoint_folder_neither_hang_nor_exhaust_the_kernel() {
    let ws = tempfile::tempdir().unwrap();
    let mut k = sandboxed(ws.path(), &[], &[]);
    k.ok("x = 1");
    k.wait_checkpoint(1);
    let root = flowrepl_task_logger::checkpoint::checkpoint_root(&k.log_file());
    let plant = format!(
        r#"import os
root = {root:?}
for d in ('fifo', 'zero', 'outside'):
    os.makedirs(os.path.join(root, d), exist_ok=True)
os.mkfifo(os.path.join(root, 'fifo', 'journal.jsonl'))
os.symlink('/dev/zero', os.path.join(root, 'zero', 'journal.jsonl'))
os.symlink('/etc/hostname', os.path.join(root, 'outside', 'journal.jsonl'))
os.symlink('/etc', os.path.join(root, 'linked'))
sorted(os.listdir(root))"#,
        root = root.display().to_string()
    );
    assert_eq!(
        attempt(&mut k, &plant),
        "['auto', 'fifo', 'linked', 'outside', 'zero']"
    );
    let t0 = std::time::Instant::now();
    let list = k.call("checkpoints", Value::Null)["result"].clone();
    let names: Vec<&str> = list["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["auto"], "{list:#}");
    for name in ["fifo", "zero", "outside", "linked"] {
        let e = k.call("restore", serde_json::json!({ "name": name }));
        assert!(e["error"]["message"].is_string(), "{name}: {e}");
        assert!(
            !e["error"]["message"].as_str().unwrap().contains("hostname"),
            "{name}: {e}"
        );
    }
    assert!(t0.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(k.call("status", Value::Null)["result"]["busy"], false);
    let r = k.call("restore", serde_json::json!({ "name": "auto" }))["result"].clone();
    assert_eq!(r["checkpoint"], "auto", "{r}");
    assert_eq!(attempt(&mut k, "x + 41"), "42");
}

/// Done frames a cell forges for `ids`, each claiming capture offsets near 2^64, as hex.
fn forged_done_frames(ids: std::ops::RangeInclusive<u64>) -> String {
    use flowrepl_protocol::frame::{DoneReport, Frame};
    let mut report = flowrepl_protocol::CellReport::new(flowrepl_protocol::Mode::Worker);
    report.result = Some("'forged'".into());
    let done: DoneReport = serde_json::from_value(serde_json::json!({
        "report": report,
        "cpu_total_ms": 0.0,
        "capture_ends": [u64::MAX - 8, u64::MAX - 8],
        "output_in_capture": true,
    }))
    .unwrap();
    let mut out = Vec::new();
    for id in ids {
        Frame::Done {
            id,
            report: std::borrow::Cow::Borrowed(&done),
        }
        .encode(&mut out)
        .unwrap();
    }
    out.iter().map(|b| format!("{b:02x}")).collect()
}

/// A cell writes `hex` to every pipe of its process open for writing (the worker's frame
/// pipe to the kernel is one of them).
fn forge(hex: &str) -> String {
    format!(
        r#"import os
data = bytes.fromhex({hex:?})
hit = 0
for fd in map(int, os.listdir('/proc/self/fd')):
    try:
        flags = int(open(f'/proc/self/fdinfo/{{fd}}').read().split('flags:')[1].split()[0], 8)
        if os.readlink(f'/proc/self/fd/{{fd}}').startswith('pipe:') and flags & 3 == 1:
            os.write(fd, data)
            hit += 1
    except OSError:
        pass
hit"#
    )
}

/// A cell can write to its worker's frame pipe. What it forges never answers a request the
/// kernel has not sent (the worker is stopped, the call says so, and the next cell runs on a
/// fresh worker), never makes the kernel read or allocate past the real capture files
/// (offsets near 2^64 once aborted the kernel), and never becomes a record of a call that was
/// not made.
#[test]
fn forged_frames_neither_answer_other_calls_nor_take_the_kernel_down() {
    let ws = tempfile::tempdir().unwrap();
    let mut k = sandboxed(ws.path(), &[], &[]);
    k.ok("x = 1");
    // A Done for a request far in the future, during a cell: the worker is stopped at once.
    let r = k.execute(&forge(&forged_done_frames(1_000_000..=1_000_000)));
    assert_eq!(r["success"], false, "{r}");
    assert_ne!(r["result"], "'forged'", "{r}");
    assert_eq!(attempt(&mut k, "6 * 7"), "42");
    // Done frames for every id up to 100: the one for the running cell ends it (the cell's
    // own word, with offsets cut to the real capture files); those for requests not sent yet
    // stop the worker before the next call, which runs on a fresh one and is answered by it.
    let r = k.execute(&forge(&forged_done_frames(1..=100)));
    assert_eq!(r["stdout"], "", "{r}");
    let r = k.execute("'real'");
    assert_eq!(r["result"], "'real'", "{r}");
    assert!(
        r["warnings"].to_string().contains("frames for no request"),
        "{r}"
    );
    assert_eq!(attempt(&mut k, "6 * 7"), "42");
    k.sync();
    let records = flowrepl_tests::read_log(&k.log_file());
    assert_eq!(records.len(), 6, "one record per call made");
    assert_eq!(k.call("status", Value::Null)["result"]["busy"], false);
}

/// A sandboxed worker's private `/tmp` is a host folder only this user can open (0700), and
/// one left behind by a kernel killed with SIGKILL (it could not remove it) is removed when
/// the next sandboxed kernel starts.
#[test]
fn the_private_tmp_is_0700_and_a_killed_kernels_is_removed_at_the_next_start() {
    use std::os::unix::fs::PermissionsExt;
    let ws = tempfile::tempdir().unwrap();
    let mut k = sandboxed(ws.path(), &[], &[]);
    k.ok("open('/tmp/left.txt', 'w').write('x')");
    let prefix = format!("flowrepl-sandbox-{}-", k.pid());
    let find = || -> Vec<PathBuf> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect()
    };
    let dirs = find();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let mode = std::fs::metadata(&dirs[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    assert!(dirs[0].join("left.txt").is_file());
    flowrepl_tests::kill(k.pid(), libc::SIGKILL);
    k.wait();
    // Killed, the kernel could not remove it.
    assert_eq!(find(), dirs);
    let ws2 = tempfile::tempdir().unwrap();
    let mut k2 = sandboxed(ws2.path(), &[], &[]);
    assert_eq!(attempt(&mut k2, "6 * 7"), "42");
    assert!(find().is_empty(), "{:?}", find());
    // A tree deeper than a process holds descriptors for by default (1024; the standard
    // library's removal fails on it with EMFILE: os/src/tree.rs) is removed with the worker
    // all the same. (Landlock checks each access along the whole path, so a cell pays for
    // depth: 3000 levels take a few seconds.)
    let deep = "import os\nos.chdir('/tmp')\nfor i in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nos.mkdir('locked', 0)\nos.chdir('/')\n'made'";
    assert_eq!(attempt(&mut k2, deep), "'made'");
    let prefix2 = format!("flowrepl-sandbox-{}-", k2.pid());
    let mine = || {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix2))
    };
    assert!(mine());
    assert!(k2.close().success());
    assert!(!mine(), "the deep tree was left behind");
}

/// With `--python /bin/python3` (Debian's, where `/bin` is a link to `/usr/bin`) the
/// interpreter's folder's parent is `/`: the readable set once widened to the whole
/// filesystem. It is found as CPython finds its prefix (`/usr`), so a file in the user's home
/// and `/etc/shadow` stay unreadable, numpy-free stdlib imports work, and `ready` says what
/// was made readable; with the filesystem layers left out (Landlock, and the new root, where
/// neither file is), the same reads succeed.
#[test]
fn the_readable_set_never_widens_to_the_root_or_the_home() {
    let python = Path::new("/bin/python3");
    let supported = std::fs::canonicalize(python)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| {
            ["3.10", "3.11", "3.12", "3.13", "3.14"]
                .iter()
                .any(|v| n == format!("python{v}"))
        });
    if !supported {
        eprintln!("skipped: no supported CPython at /bin/python3 on this machine");
        return;
    }
    let home = HomeDir::new("wide");
    let secret = home.0.join("secret.txt");
    std::fs::write(&secret, "private").unwrap();
    let code = format!(
        "import json, sqlite3, decimal\ndef tryit(p):\n    try:\n        open(p).read()\n        return 'read'\n    except OSError as e:\n        return f'denied {{e.errno}}'\n(tryit({:?}), tryit('/etc/shadow'))",
        secret.display().to_string()
    );
    for (skip, expect) in [
        // (`/etc/shadow` does not exist inside: `/etc` holds only what Python reads.)
        (&[][..], "('denied 2', 'denied 2')"),
        // Landlock alone (the readable set under test).
        (&["mount_namespace"][..], "('denied 13', 'denied 13')"),
        (
            &["landlock_filesystem", "mount_namespace"][..],
            "('read', 'read')",
        ),
    ] {
        let ws = tempfile::tempdir().unwrap();
        let mut k = sandboxed(ws.path(), skip, &["--python", "/bin/python3"]);
        assert_eq!(attempt(&mut k, &code), expect, "{skip:?}");
        if skip.is_empty() {
            let fs = detail(&k, "landlock_filesystem");
            let readable: Vec<&str> = fs
                .split_once("readable: the system and ")
                .and_then(|(_, r)| r.split_once("; writable"))
                .map(|(r, _)| r.split(", ").collect())
                .unwrap_or_else(|| panic!("{fs}"));
            assert!(readable.contains(&"/usr"), "{fs}");
            let home = std::env::var("HOME").unwrap();
            for p in readable {
                assert!(p != "/" && !Path::new(&home).starts_with(p), "{p} in {fs}");
            }
        }
    }
}

/// On a host without user namespaces (no mount namespace to hide the log folder) and the
/// default layout (workspace = the current folder, logs in a folder inside it), a cell could
/// append forged records to the real task log: the sandbox refuses to start (exit 2, one line
/// naming the log folder). With the filesystem layer left out (nothing claims to protect the
/// log) the kernel starts, and the same cell does append to its task log.
#[test]
fn without_a_mount_namespace_a_log_folder_inside_the_workspace_is_refused() {
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(NO_USER_NAMESPACES[0]);
    cmd.args(&NO_USER_NAMESPACES[1..])
        .arg(flowrepl_tests::flowrepl_bin())
        .arg("--sandbox")
        .current_dir(cwd.path())
        .env("FLOWREPL_LOG_DIR", cwd.path().join(".flowrepl/logs"))
        .env_remove("FLOWREPL_SANDBOX_SKIP")
        .stdin(std::process::Stdio::null());
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.contains("the log folder"), "{err}");
    // The control: nothing claims the log is out of reach, and a cell writes it.
    let mut k = Kernel::options()
        .wrap(NO_USER_NAMESPACES.iter().map(|s| s.to_string()).collect())
        .arg("--sandbox")
        .env("FLOWREPL_SANDBOX_SKIP", "landlock_filesystem")
        .start();
    assert!(k.log_file().starts_with(k.dir.path()));
    k.ok("x = 1");
    k.sync();
    let forged = format!(
        "with open({:?}, 'a') as f:\n    f.write('{{\"type\": \"forged\"}}\\n')\n'appended'",
        k.log_file().display().to_string()
    );
    assert_eq!(attempt(&mut k, &forged), "'appended'");
    k.sync();
    let log = std::fs::read_to_string(k.log_file()).unwrap();
    assert!(log.contains("\"forged\""), "{log}");
    // (Taken out again, so that the harness's schema check of every log passes.)
    let kept: String = log
        .lines()
        .filter(|l| !l.contains("\"forged\""))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(k.log_file(), kept).unwrap();
}

/// A kernel run as root on a host without user namespaces (the user namespace left out
/// here, which leaves out every namespace): the worker would hold every capability of the
/// host's root, and `CAP_SYS_PTRACE` lets a cell read the kernel's `/proc/<pid>/environ` past
/// Landlock's ptrace rule. The capabilities layer drops them all (EACCES, and the cell's
/// capability sets are empty); with it left out as well, the kernel's secret is read.
#[test]
fn as_root_without_user_namespaces_a_cell_holds_no_capability() {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the kernel does not run as root here");
        return;
    }
    for (skip, expect) in [
        (&["user_namespace"][..], "denied 13"),
        (&["user_namespace", "capabilities"][..], "read"),
    ] {
        let ws = tempfile::tempdir().unwrap();
        let mut k = sandboxed(ws.path(), skip, &[]);
        let code = format!(
            "try:\n    r = 'read' if 's3cr3t' in open('/proc/{}/environ').read() else 'no secret'\nexcept OSError as e:\n    r = f'denied {{e.errno}}'\nr",
            k.pid()
        );
        assert_eq!(attempt(&mut k, &code), format!("'{expect}'"), "{skip:?}");
        let caps = attempt(
            &mut k,
            "[l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapBnd'))]",
        );
        assert_eq!(
            caps == "['0000000000000000', '0000000000000000']",
            skip.len() == 1,
            "{skip:?}: {caps}"
        );
    }
}

/// A sandboxed cell binds an object whose `__reduce__` makes unpickling create a file in the
/// user's home (any code could run there). A kernel without the sandbox resuming the task
/// (in-process: inside the kernel itself) does not unpickle it: it starts, says why, and
/// refuses `restore`, and does not write the automatic checkpoint over the sandboxed
/// session's (before, its first write, a whole one, replaced it: the last step found no `n`);
/// with `--trust-sandboxed-checkpoints` (the risk named) it restores, and the planted code
/// runs outside the sandbox.
#[test]
fn a_sandboxed_sessions_checkpoint_is_not_unpickled_outside_the_sandbox() {
    let home = HomeDir::new("pickle");
    let planted = home.0.join("ran-outside.txt");
    let logs = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let task = |o: flowrepl_tests::KernelOptions| {
        o.log_dir(logs.path())
            .env("FLOW_PLAN_ID", "p")
            .env("FLOW_TASK_ID", "pickled")
    };
    let mut k = task(Kernel::options())
        .arg("--sandbox")
        .arg("--workspace")
        .arg(ws.path().display().to_string())
        .start();
    k.ok(&format!(
        "class Evil:\n    def __reduce__(self):\n        return (exec, ({:?},))\nevil = Evil()\nn = 7",
        // Quiet in the sandbox (the checkpoint's own load-back there passes), harmful outside.
        format!(
            "try:\n    open({:?}, 'w').write('ran')\nexcept OSError:\n    pass",
            planted.display().to_string()
        )
    ));
    k.wait_checkpoint(1);
    drop(k);
    assert!(!planted.exists());
    let mut k = task(Kernel::options()).arg("--resume").start();
    let r = k.ok("'n' in globals()");
    assert_eq!(r["result"], "False");
    // Nor does it write the automatic checkpoint over the sandboxed session's (its first
    // write would be a whole one, without `n`): it says so, and refuses an explicit one.
    assert!(
        r["warnings"]
            .to_string()
            .contains("automatic checkpoints are off"),
        "{r}"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let e = k.call("checkpoint", Value::Null);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("automatic checkpoints are off"),
        "{e}"
    );
    let e = k.call("restore", Value::Null);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("written by a sandboxed session"),
        "{e}"
    );
    assert!(!planted.exists(), "the pickle ran outside the sandbox");
    drop(k);
    let mut k = task(Kernel::options())
        .arg("--resume")
        .arg("--trust-sandboxed-checkpoints")
        .start();
    let r = k.ok("n");
    assert_eq!(r["result"], "7");
    assert!(planted.exists(), "trusted: the planted code ran: {r}");
}

/// The kernel's stderr is a file (`flowrepl 2>>kernel.log`). A cell looks for it among its
/// process's descriptors to truncate it and write a line that reads as the kernel's: a
/// sandboxed worker's stderr is a pipe the kernel relays, each line marked as the worker's,
/// so the file is neither found nor truncated (the worker's own lines still arrive: the strict
/// refusal's line, in the test without user namespaces). A worker without the sandbox (no
/// relay) holds the file itself, and the same cell truncates it.
#[test]
fn a_cell_cannot_truncate_or_forge_the_kernels_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let diag = dir.path().join("kernel.log");
    let code = format!(
        r#"import os
hit = []
for fd in map(int, os.listdir('/proc/self/fd')):
    try:
        if os.readlink(f'/proc/self/fd/{{fd}}') == {diag:?}:
            os.ftruncate(fd, 0)
            os.write(fd, b'2026-01-01T00:00:00Z ERROR flowrepl: forged by a cell\n')
            hit.append(fd)
    except OSError:
        pass
hit"#,
        diag = diag.display().to_string()
    );
    for sandbox in [true, false] {
        std::fs::write(&diag, "").unwrap();
        let ws = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(flowrepl_tests::flowrepl_bin());
        cmd.env("USE_SUBPROCESS_WORKER", "1")
            .env("FLOWREPL_LOG_DIR", dir.path().join("logs"))
            .env_remove("FLOWREPL_SANDBOX")
            .env_remove("FLOWREPL_SANDBOX_SKIP")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&diag)
                    .unwrap(),
            );
        if sandbox {
            cmd.arg("--sandbox").arg("--workspace").arg(ws.path());
        }
        let mut child = cmd.spawn().unwrap();
        let request = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "execute_code", "params": {"code": code}});
        std::io::Write::write_all(
            child.stdin.as_mut().unwrap(),
            format!("{request}\n").as_bytes(),
        )
        .unwrap();
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        let reply = String::from_utf8_lossy(&out.stdout);
        let log = std::fs::read_to_string(&diag).unwrap();
        if sandbox {
            assert!(reply.contains(r#""result":"[]""#), "{reply}");
            assert!(log.contains("flowrepl ready"), "not truncated: {log}");
            assert!(!log.contains("forged by a cell"), "{log}");
        } else {
            assert!(!reply.contains(r#""result":"[]""#), "{reply}");
            assert!(!log.contains("flowrepl ready"), "truncated: {log}");
        }
    }
}
