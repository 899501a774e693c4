//! Stdout carries only protocol lines and stdin only requests, whatever the cells do.
//! (Every message read by the helpers is checked to be JSON-RPC, so these tests fail on the
//! first stray byte.)

use flowrepl_tests::Kernel;
use serde_json::json;
use std::time::Duration;

#[test]
fn writes_to_fd_1_are_captured_not_leaked() {
    let mut k = Kernel::start();
    let r = k.ok("import os; os.write(1, b'raw fd write\\n')");
    assert_eq!(r["stdout"], "raw fd write\n");
    let r = k.ok("import ctypes; libc = ctypes.CDLL(None); libc.printf(b'from C %d\\n', 42)");
    assert_eq!(r["stdout"], "from C 42\n");
    let r = k.ok("import subprocess; subprocess.run(['echo', 'from child']); subprocess.run('echo to-stderr >&2', shell=True)");
    assert_eq!(r["stdout"], "from child\n");
    assert_eq!(r["stderr"], "to-stderr\n");
    let r = k.ok("import os; os.system('printf via-system')");
    assert_eq!(r["stdout"], "via-system");
}

#[test]
fn closing_or_redirecting_stdout_does_not_break_the_session() {
    let mut k = Kernel::start();
    k.ok("import sys, os; sys.stdout.close()");
    assert_eq!(k.ok("print('after close')")["stdout"], "after close\n");
    k.ok("sys.stdout = None");
    assert_eq!(k.ok("print('after None')")["stdout"], "after None\n");
    let r = k.ok("os.close(1)");
    assert!(r["warnings"].to_string().contains("fd 1"), "{r}");
    assert_eq!(k.ok("os.write(1, b'fd back\\n')")["stdout"], "fd back\n");
    let r = k.ok("fd = os.open('/dev/null', os.O_WRONLY); os.dup2(fd, 1); os.dup2(fd, 2)");
    assert!(r["warnings"].to_string().contains("fd 2"), "{r}");
    assert_eq!(k.ok("print('restored')")["stdout"], "restored\n");
    k.ok("os.close(2)");
    assert_eq!(k.ok("os.write(2, b'e\\n')")["stderr"], "e\n");
}

#[test]
fn stdin_is_at_eof_with_a_clear_message() {
    let mut k = Kernel::start();
    let r = k.execute("input('name? ')");
    assert_eq!(r["error"]["type"], "EOFError");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("no interactive stdin"),
        "{r}"
    );
    let r = k.ok("import sys; data = sys.stdin.read(); data");
    assert_eq!(r["result"], "''");
    assert!(r["stderr"].as_str().unwrap().contains("sys.stdin.read()"));
    assert_eq!(k.ok("import os; os.read(0, 100)")["result"], "b''");
    let r =
        k.ok("import subprocess; subprocess.run(['cat'], capture_output=True, timeout=10).stdout");
    assert_eq!(r["result"], "b''");
    // Requests sent while cells read stdin were not consumed by them.
    let mut batch = Vec::new();
    for code in [
        "import os; os.read(0, 1 << 20)",
        "import sys; sys.stdin.readline()",
        "7 * 6",
    ] {
        batch.extend_from_slice(
            json!({"jsonrpc":"2.0","id":code,"method":"execute_code","params":{"code":code}})
                .to_string()
                .as_bytes(),
        );
        batch.push(b'\n');
    }
    k.send_raw(&batch);
    assert_eq!(k.recv()["result"]["result"], "b''");
    assert_eq!(k.recv()["result"]["result"], "''");
    assert_eq!(k.recv()["result"]["result"], "42");
}

#[test]
fn background_output_goes_to_the_next_cell_never_to_stdout() {
    let mut k = Kernel::start();
    k.ok("import threading, time, sys, subprocess\n\
          def late():\n    time.sleep(0.3); print('late thread', flush=True)\n\
          threading.Thread(target=late).start()\n\
          p = subprocess.Popen('sleep 0.3; echo late child', shell=True)");
    // Nothing may appear on stdout in between.
    assert!(k.recv_timeout(Duration::from_millis(800)).is_none());
    let r = k.ok("p.wait()");
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.contains("late thread") && out.contains("late child"),
        "{out:?}"
    );
}

#[test]
fn kernel_diagnostics_go_to_stderr_only() {
    let mut k = Kernel::options().env("FLOWREPL_LOG", "debug").start();
    k.ok("x = 1");
    k.send_raw(b"not json\n"); // logged at debug level
    assert_eq!(k.recv()["error"]["code"], -32700);
    let exit = {
        // `wait` checks that nothing but protocol came on stdout.
        let st = k.call("shutdown", serde_json::Value::Null);
        assert_eq!(st["result"]["shutting_down"], true);
        k.wait()
    };
    assert!(exit.success());
    let err = k.stderr();
    assert!(
        err.contains("flowrepl ready") && err.contains("bad request line"),
        "{err}"
    );
}
