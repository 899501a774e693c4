//! The `flowrepl-worker` command line, run as built. (Also makes `cargo test --workspace`
//! build the binary that worker mode starts.)

use std::process::{Command, Stdio};

fn worker(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flowrepl-worker"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn help_says_who_starts_it() {
    let out = worker(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("flowrepl --worker") && text.contains("--python"),
        "{text}"
    );
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &[][..],
        &["--python"],
        &["--python", "p", "--max-images", "x"],
        &["--nope"],
    ] {
        let out = worker(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty());
    }
}
