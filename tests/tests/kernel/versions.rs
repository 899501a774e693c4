//! Every CPython the machine has: the core results in both modes on each version found, and a
//! clear one-line error for every interpreter flowrepl cannot serve.
//!
//! `FLOWREPL_REQUIRE_PYTHONS=N` (CI sets 3) fails the matrix when fewer than N versions are
//! found, so that a machine without them cannot pass it by testing one.

use flowrepl_tests::{flowrepl_bin, python_lib, Kernel, MODES};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A venv of `python` with a module in its site-packages; `None` when the interpreter has no
/// `venv` module (Debian's without python3-venv): then the base interpreter is used, with the
/// module on `PYTHONPATH`.
fn venv_with_module(python: &Path, dir: &Path) -> (PathBuf, Option<PathBuf>) {
    let venv = dir.join("venv");
    let made = Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let site = if made {
        let lib = venv.join("lib");
        let pyver = std::fs::read_dir(&lib).unwrap().next().unwrap().unwrap();
        pyver.path().join("site-packages")
    } else {
        dir.join("pythonpath")
    };
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("flowmatrix_mod.py"), "VALUE = 42\n").unwrap();
    if made {
        (venv, None)
    } else {
        (python.to_path_buf(), Some(site))
    }
}

#[test]
fn every_python_found_gives_the_same_results_in_both_modes() {
    let found = flowrepl_pythons::discover();
    let mut versions: Vec<_> = found.iter().map(|f| f.version).collect();
    versions.dedup();
    let need: usize = std::env::var("FLOWREPL_REQUIRE_PYTHONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    assert!(
        versions.len() >= need,
        "FLOWREPL_REQUIRE_PYTHONS={need}, but only these CPython versions were found: {found:?}"
    );
    for f in &found {
        let tmp = tempfile::tempdir().unwrap();
        let (target, pythonpath) = venv_with_module(&f.program, tmp.path());
        let what = format!("{} ({})", f.program.display(), f.version);
        eprintln!(
            "version matrix: {what}{}",
            if pythonpath.is_some() {
                ", no venv module: the base interpreter"
            } else {
                ", in a venv"
            }
        );
        for mode in MODES {
            let mut opts = Kernel::options()
                .mode(mode)
                .arg("--python")
                .arg(target.display().to_string());
            if let Some(p) = &pythonpath {
                opts = opts.env("PYTHONPATH", p.display().to_string());
            }
            let mut k = opts.start();
            assert_eq!(k.ready["python_source"], "flag", "{what} {mode}");
            assert!(
                k.ready["python_version"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{}.", f.version)),
                "{what} {mode}: {}",
                k.ready
            );
            let r = k.ok("import os, sys, flowmatrix_mod\n\
                 print('out')\n\
                 os.write(1, b'raw\\n')\n\
                 sys.stderr.write('err\\n')\n\
                 (sys.version_info[:2], flowmatrix_mod.VALUE)");
            assert_eq!(
                r["result"],
                format!("(({}, {}), 42)", f.version.major, f.version.minor),
                "{what} {mode}"
            );
            assert_eq!(r["stdout"], "out\nraw\n", "{what} {mode}");
            assert_eq!(r["stderr"], "err\n", "{what} {mode}");
            assert_eq!(
                r["added_vars"],
                json!(["flowmatrix_mod", "os", "sys"]),
                "{what} {mode}"
            );
            assert!(
                r["added_imports"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("flowmatrix_mod")),
                "{what} {mode}: {r}"
            );
            // The session is the venv's: prefix and executable (what subprocess starts).
            let r = k.ok("sys.prefix, sys.executable");
            let want = if pythonpath.is_none() {
                format!(
                    "('{}', '{}')",
                    target.display(),
                    target.join("bin/python").display()
                )
            } else {
                format!("'{}')", f.program.display())
            };
            assert!(
                r["result"].as_str().unwrap().ends_with(&want),
                "{what} {mode}: {} vs {want}",
                r["result"]
            );
            // Errors: the type, the message, a plain-text traceback with the cell's lines.
            let r = k.execute("def f():\n    return 1 / 0\nf()");
            assert_eq!(r["error"]["type"], "ZeroDivisionError", "{what} {mode}");
            assert_eq!(r["error"]["message"], "division by zero", "{what} {mode}");
            let tb = r["error"]["traceback"].as_str().unwrap();
            assert!(
                tb.contains("line 2, in f") && tb.contains("return 1 / 0"),
                "{what} {mode}: {tb}"
            );
            assert!(!tb.contains('\x1b'), "{what} {mode}: colours in {tb:?}");
            let r = k.execute("def f(:");
            assert_eq!(r["error"]["type"], "SyntaxError", "{what} {mode}");
            // A timeout stops the cell and keeps the session.
            let r =
                k.execute_params(json!({"code": "import time\ntime.sleep(10)", "timeout_ms": 300}));
            assert_eq!(r["timed_out"], true, "{what} {mode}");
            assert_eq!(r["error"]["type"], "KeyboardInterrupt", "{what} {mode}");
            let r = k.ok("flowmatrix_mod.VALUE + 1");
            assert_eq!(r["result"], "43", "{what} {mode}");
            assert!(k.close().success(), "{what} {mode}");
        }
    }
}

/// Runs `flowrepl --python <python>` expecting it to refuse: exit code 2, one line on stderr
/// that contains `says`, nothing on stdout.
fn refused(python: &Path, says: &str) {
    let out = Command::new(flowrepl_bin())
        .arg("--python")
        .arg(python)
        .env_remove("VIRTUAL_ENV")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{python:?}: {err}");
    assert!(out.stdout.is_empty(), "{python:?}: stdout {:?}", out.stdout);
    assert_eq!(err.trim_end().lines().count(), 1, "{python:?}: {err}");
    assert!(
        err.starts_with("flowrepl: ") && err.contains(says),
        "{python:?}: {err}"
    );
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn interpreters_it_cannot_serve_get_one_clear_line_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    refused(&t.join("nowhere/python3"), "not found");
    // Not Python: a program that answers nothing, and a file that is not a program.
    refused(Path::new("/bin/true"), "is not a Python interpreter");
    std::fs::write(t.join("notes.txt"), "hello").unwrap();
    refused(&t.join("notes.txt"), "is not a Python interpreter");
    // Too old, by name (without running them) and for real where pyenv has them.
    for (name, says) in [
        ("python2.7", "is Python 2.7"),
        ("python3.9", "is CPython 3.9"),
    ] {
        executable(&t.join(name), "#!/bin/sh\nexit 1\n");
        refused(&t.join(name), says);
    }
    let pyenv = std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv/versions"));
    for entry in pyenv
        .and_then(|p| std::fs::read_dir(p).ok())
        .into_iter()
        .flatten()
        .flatten()
    {
        let v = entry.file_name().into_string().unwrap();
        if v.starts_with("2.") || v.starts_with("3.9") || v.starts_with("3.8") {
            refused(
                &entry.path().join("bin/python"),
                "flowrepl supports CPython 3.10 to",
            );
        }
    }
    // A venv whose base interpreter was deleted.
    let base = flowrepl_pythons::discover()
        .into_iter()
        .next()
        .expect("a CPython 3.10+");
    let copy = t.join("base/bin");
    std::fs::create_dir_all(&copy).unwrap();
    let name = base.program.file_name().unwrap();
    std::os::unix::fs::symlink(
        std::fs::canonicalize(&base.program).unwrap(),
        copy.join(name),
    )
    .unwrap();
    let ok = Command::new(copy.join(name))
        .args(["-m", "venv", "--without-pip"])
        .arg(t.join("venv"))
        .status()
        .unwrap();
    if ok.success() {
        std::fs::remove_dir_all(t.join("base")).unwrap();
        refused(&t.join("venv"), "is broken");
    }
}

/// `flowrepl` and `flowrepl-worker` copied into a folder of their own, beside `library` under
/// the build Python's library name: what they load for the build's Python.
fn kernel_with_library(dir: &Path, library: &[u8]) -> PathBuf {
    for exe in ["flowrepl", "flowrepl-worker"] {
        std::fs::copy(flowrepl_bin().with_file_name(exe), dir.join(exe)).unwrap();
    }
    std::fs::write(dir.join("libflowrepl_pylib.so"), library).unwrap();
    dir.join("flowrepl")
}

/// The kernel loads a Python library only when it was built from the same sources by the
/// same compiler (Rust has no stable ABI): a library of another build, or a shared library
/// that is not flowrepl's, is refused with one clear error in both modes, before any of its
/// code runs; the same copy with the build's own library serves.
#[test]
fn a_python_library_of_another_build_is_refused() {
    let ours = std::fs::read(python_lib()).unwrap();
    let abi = flowrepl_exec::python::library::ABI.to_bytes();
    let other: Vec<u8> = abi
        .iter()
        .map(|b| if *b == b'0' { b'1' } else { b'0' })
        .collect();
    let mut patched = ours.clone();
    let mut found = 0;
    for at in 0..patched.len() - abi.len() {
        if &patched[at..at + abi.len()] == abi && patched[at + abi.len()] == 0 {
            patched[at..at + abi.len()].copy_from_slice(&other);
            found += 1;
        }
    }
    assert!(found > 0, "the library holds its ABI hash");
    let not_ours = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
    ]
    .iter()
    .map(|d| Path::new(d).join("libm.so.6"))
    .find(|p| p.is_file())
    .map(|p| std::fs::read(p).unwrap());
    let mut cases = vec![
        (ours, None),
        (patched, Some("belongs to another flowrepl build")),
    ];
    if let Some(lib) = not_ours {
        cases.push((lib, Some("is not a flowrepl Python library")));
    }
    for (library, refused) in cases {
        for worker in ["0", "1"] {
            let dir = tempfile::tempdir().unwrap();
            let exe = kernel_with_library(dir.path(), &library);
            let mut cmd = Command::new(&exe);
            cmd.args(["--no-log", "--python", &flowrepl_tests::base_python()])
                .env("USE_SUBPROCESS_WORKER", worker)
                .env("FLOWREPL_LOG_DIR", dir.path().join("logs"))
                .env_remove("VIRTUAL_ENV")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // The copy was just written: a child another test thread forks meanwhile holds
            // its write fd until it execs, and exec then fails with ETXTBSY. Try again.
            let mut child = (0..100)
                .find_map(|_| match cmd.spawn() {
                    Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        None
                    }
                    other => Some(other.unwrap()),
                })
                .expect("the copied kernel stays busy");
            use std::io::Write;
            // A kernel that refuses the library may have exited already (EPIPE): what it
            // said is checked below.
            let _ = child
                .stdin
                .take()
                .unwrap()
                .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"execute\",\"params\":{\"code\":\"6 * 7\"}}\n");
            let out = child.wait_with_output().unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            let what = format!("worker={worker} {refused:?}: {stdout} {stderr}");
            match refused {
                None => assert!(stdout.contains("\"result\":\"42\""), "{what}"),
                Some(says) => {
                    assert!(stderr.contains(says), "{what}");
                    assert!(!stdout.contains("\"result\":\"42\""), "{what}");
                }
            }
        }
    }
}

/// A checkpoint written under one Python version restores nothing under another (its pickles
/// would not load), and the first cell says so, name by name.
#[test]
fn a_checkpoint_of_another_python_version_is_named_not_loaded() {
    let found = flowrepl_pythons::discover();
    let Some(a) = found.first() else { return };
    let Some(b) = found.iter().find(|f| f.version != a.version) else {
        eprintln!("only one CPython version here: nothing to compare");
        return;
    };
    eprintln!(
        "checkpoint by {} ({}), resumed by {} ({})",
        a.program.display(),
        a.version,
        b.program.display(),
        b.version
    );
    let logs = tempfile::tempdir().unwrap();
    let start = |python: &Path, resume: bool| {
        let mut o = Kernel::options()
            .log_dir(logs.path())
            .env("FLOW_PLAN_ID", "plan-versions")
            .env("FLOW_TASK_ID", "resume")
            .arg("--python")
            .arg(python.display().to_string());
        if resume {
            o = o.arg("--resume");
        }
        o.start()
    };
    let mut k = start(&a.program, false);
    k.ok("x = 41");
    assert!(k.close().success());
    let mut k = start(&b.program, true);
    let r = k.ok("'x' in globals()");
    assert_eq!(r["result"], "False", "{r:#}");
    assert_eq!(r["restored"], true, "{r:#}");
    assert_eq!(r["state_lost"], true);
    let why = r["lost_vars"]["x"].as_str().unwrap_or_default();
    assert!(why.contains("saved by Python"), "{r:#}");
}
