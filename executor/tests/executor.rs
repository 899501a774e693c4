//! The executor by itself, in this process, against the build's CPython: what one cell
//! reports (value, output, diff, imports, errors and tracebacks, timeouts).
//!
//! The executor takes over fds 1 and 2 as its capture files, so this test has its own main
//! (no test harness, which reports on fd 1) and reports on a private copy of stderr: one line
//! per check, and exit status 1 if any failed.

use flowrepl_exec::setup::{CellOutcome, ExecutorConfig, SessionSetup};
use flowrepl_executor::Executor;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

struct Checks {
    out: std::fs::File,
    failed: usize,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, outcome: &CellOutcome) {
        if ok {
            let _ = writeln!(self.out, "ok   {name}");
        } else {
            self.failed += 1;
            let _ = writeln!(
                self.out,
                "FAIL {name}: stdout={:?} stderr={:?} report={:?}",
                outcome.stdout, outcome.stderr, outcome.report
            );
        }
    }
}

fn main() {
    let stdio = flowrepl_exec::stdio::take_protocol_stdio().expect("stdio");
    let mut checks = Checks {
        out: stdio.diagnostics,
        failed: 0,
    };
    let mut ex = Executor::start(&ExecutorConfig {
        pid: std::process::id(),
        python: PathBuf::from(flowrepl_executor::interpreter::BUILD_PYTHON),
        max_output_bytes: 1 << 20,
        sink: None,
        images: None,
        setup: SessionSetup::default(),
        approver: None,
        capture: None,
        checkpoints: None,
    })
    .expect("the executor starts");
    let long = Duration::from_secs(30);
    let mut n = 0;
    let mut run = |ex: &mut Executor, code: &str, timeout: Duration| {
        n += 1;
        ex.execute(code, timeout, n)
    };

    let o = run(&mut ex, "x = 20\nx + 22", long);
    checks.check(
        "a final expression's repr is the result, names bound are added",
        o.report.result.as_deref() == Some("42")
            && o.report.added_vars == ["x"]
            && o.report.error.is_none(),
        &o,
    );

    let o = run(&mut ex, "x = 1", long);
    checks.check(
        "an assignment has no result",
        o.report.result.is_none() && o.report.added_vars.is_empty(),
        &o,
    );

    let o = run(
        &mut ex,
        "import os\nprint('out')\nos.write(2, b'err\\n')\nNone",
        long,
    );
    checks.check(
        "fd 1 and fd 2 are captured apart, None is no result",
        o.stdout == "out\n" && o.stderr == "err\n" && o.report.result.is_none(),
        &o,
    );

    let o = run(&mut ex, "import colorsys", long);
    checks.check(
        "a new module is an added import",
        o.report.added_imports.iter().any(|m| m == "colorsys")
            && o.report.added_vars == ["colorsys"],
        &o,
    );

    let o = run(&mut ex, "x = [1]\ny = x\nx = [2]", long);
    checks.check(
        "a name bound to another object is rebound",
        o.report.rebound_vars == ["x"] && o.report.added_vars == ["y"],
        &o,
    );

    let o = run(&mut ex, "del y", long);
    checks.check(
        "a deleted name is removed",
        o.report.removed_vars == ["y"],
        &o,
    );

    let o = run(&mut ex, "def f():\n    return 1 / 0\n\nf()", long);
    checks.check(
        "an exception is its type, message and a traceback that shows the cell's lines",
        o.report.error.as_ref().is_some_and(|e| {
            e.kind == "ZeroDivisionError"
                && e.message == "division by zero"
                && e.traceback.contains("return 1 / 0")
        }) && o.stderr.contains("ZeroDivisionError"),
        &o,
    );

    let o = run(&mut ex, "f()", long);
    checks.check(
        "a function from an earlier cell still shows its source",
        o.report
            .error
            .as_ref()
            .is_some_and(|e| e.traceback.contains("return 1 / 0")),
        &o,
    );

    let o = run(&mut ex, "def (:", long);
    checks.check(
        "a syntax error is an error, nothing runs",
        o.report
            .error
            .as_ref()
            .is_some_and(|e| e.kind == "SyntaxError"),
        &o,
    );

    let o = run(&mut ex, "while True:\n    pass", Duration::from_millis(200));
    checks.check(
        "a timeout stops a busy loop with KeyboardInterrupt, the session goes on",
        o.report.timed_out
            && o.report
                .error
                .as_ref()
                .is_some_and(|e| e.kind == "KeyboardInterrupt"),
        &o,
    );

    let o = run(&mut ex, "x", long);
    checks.check(
        "the namespace survived every cell",
        o.report.result.as_deref() == Some("[2]"),
        &o,
    );

    let listed = ex.list_variables().unwrap_or_default();
    let names: Vec<&str> = listed.iter().map(|v| v.name.as_str()).collect();
    let ok = names == ["colorsys", "f", "os", "x"];
    if !ok {
        let _ = writeln!(checks.out, "FAIL list_variables: {names:?}");
        checks.failed += 1;
    } else {
        let _ = writeln!(checks.out, "ok   list_variables lists the session's names");
    }
    ex.finish();
    if checks.failed > 0 {
        let _ = writeln!(checks.out, "{} check(s) failed", checks.failed);
        std::process::exit(1);
    }
}
