//! Timeouts stop running cells and keep the namespace.

use flowrepl_tests::Kernel;
use serde_json::json;
use std::time::Instant;

#[test]
fn busy_loop_and_sleep_are_stopped() {
    let mut k = Kernel::start();
    k.ok("kept = 'yes'");
    // (A single C call that never checks for signals, like `sum(range(10**12))`, cannot be
    // interrupted in-process; that is what worker mode is for.)
    for code in [
        "while True: pass",
        "import time; time.sleep(1000)",
        "n = 0\nwhile True:\n    n += 1",
    ] {
        let t = Instant::now();
        let r = k.execute_params(json!({"code": code, "timeout_ms": 300}));
        let took = t.elapsed();
        assert_eq!(r["timed_out"], true, "{code}: {r}");
        assert_eq!(r["success"], false);
        assert_eq!(r["error"]["type"], "KeyboardInterrupt");
        assert!(r["error"]["message"].as_str().unwrap().contains("300 ms"));
        assert!(took.as_millis() < 5_000, "{code} took {took:?}");
    }
    assert_eq!(k.ok("kept")["result"], "'yes'");
    // The next cell is not hit by a late interrupt.
    assert_eq!(
        k.ok("import time; time.sleep(0.05); 'fine'")["result"],
        "'fine'"
    );
}

#[test]
fn cells_that_swallow_one_interrupt_get_another() {
    let mut k = Kernel::start();
    let r = k.execute_params(json!({
        "code": "import time\ncaught = 0\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        caught += 1\n        if caught == 1: continue\n        raise",
        "timeout_ms": 200
    }));
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(k.ok("caught")["result"], "2");
}

#[test]
fn default_timeout_from_the_environment() {
    let mut k = Kernel::options().env("FLOWREPL_TIMEOUT_MS", "250").start();
    assert_eq!(k.ready["default_timeout_ms"], 250);
    let r = k.execute("import time; time.sleep(30)");
    assert_eq!(r["timed_out"], true);
    // A per-call timeout overrides it.
    let r = k.execute_params(
        json!({"code": "import time; time.sleep(0.5); 'done'", "timeout_ms": 5000}),
    );
    assert_eq!(r["result"], "'done'");
}

#[test]
fn a_user_keyboard_interrupt_is_not_a_timeout() {
    let mut k = Kernel::start();
    let r = k.execute("raise KeyboardInterrupt");
    assert_eq!(r["error"]["type"], "KeyboardInterrupt");
    assert_eq!(r["timed_out"], false);
}

#[test]
fn sigint_while_idle_does_not_hit_the_next_cell() {
    let mut k = Kernel::start();
    k.ok("x = 1");
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(k.pid() as i32, libc::SIGINT) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(k.ok("x + 1")["result"], "2");
}
