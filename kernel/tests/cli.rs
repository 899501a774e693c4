//! The `flowrepl` command line, run as built. (Also makes `cargo test --workspace` build the
//! binary that the integration tests in `tests/` drive.)

use std::process::{Command, Stdio};

fn flowrepl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flowrepl"))
        .args(args)
        .stdin(Stdio::null())
        .env(
            "FLOWREPL_LOG_DIR",
            std::env::temp_dir().join("flowrepl-cli-test"),
        )
        .output()
        .unwrap()
}

#[test]
fn help_names_the_subcommands_and_flags() {
    let out = flowrepl(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for word in [
        "mcp",
        "--worker",
        "--python",
        "--timeout-ms",
        "--kill-grace-ms",
    ] {
        assert!(text.contains(word), "{word} missing from --help:\n{text}");
    }
}

#[test]
fn bad_arguments_exit_2_with_nothing_on_stdout() {
    for args in [
        &["--no-such-flag"][..],
        &["--timeout-ms", "0"],
        &["--python", "/no/such/python"],
    ] {
        let out = flowrepl(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", out.stdout);
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
}
