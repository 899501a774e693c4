//! Which interpreter and venv the embedded Python uses.

use flowrepl_tests::{base_python, Kernel};
use std::path::Path;
use std::process::Command;

fn make_venv(dir: &Path) -> std::path::PathBuf {
    let venv = dir.join("venv");
    let st = Command::new(base_python())
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(st.success());
    let site = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("site-packages");
    std::fs::write(
        site.join("flowrepl_probe.py"),
        "WHERE = 'venv site-packages'\n",
    )
    .unwrap();
    venv
}

#[test]
fn uses_the_build_interpreter_with_its_stdlib() {
    let mut k = Kernel::start();
    let r = k.ok("import sys, math, json, sqlite3, ssl\nsys.executable");
    let exe = r["result"].as_str().unwrap().trim_matches('\'').to_owned();
    assert_eq!(exe, base_python());
    assert_eq!(k.ready["python_executable"], exe.as_str());
    assert_eq!(k.ok("sys.prefix == sys.base_prefix")["result"], "True");
    // The interpreter's own libpython, not Debian's system one.
    let r = k.ok("import sysconfig, platform\nplatform.python_version()");
    assert_eq!(r["result"].as_str().unwrap().trim_matches('\''), "3.11.7");
}

#[test]
fn virtual_env_and_python_flag_select_a_venv() {
    let tmp = tempfile::tempdir().unwrap();
    let venv = make_venv(tmp.path());
    let venv_s = venv.to_str().unwrap().to_owned();
    let mut via_env = Kernel::options().env("VIRTUAL_ENV", venv_s.clone()).start();
    let mut via_flag = Kernel::options()
        .arg("--python")
        .arg(format!("{venv_s}/bin/python"))
        .start();
    let mut via_dir = Kernel::options()
        .arg("--python")
        .arg(venv_s.clone())
        .start();
    for k in [&mut via_env, &mut via_flag, &mut via_dir] {
        assert_eq!(
            k.ok("import flowrepl_probe; flowrepl_probe.WHERE")["result"],
            "'venv site-packages'"
        );
        let r = k.ok("import sys; (sys.executable, sys.prefix)");
        assert_eq!(r["result"], format!("('{venv_s}/bin/python', '{venv_s}')"));
        // Child processes started through sys.executable use the venv too.
        let r = k.ok("import subprocess; subprocess.run([sys.executable, '-c', 'import flowrepl_probe, sys; print(sys.prefix)'], capture_output=True, text=True).stdout.strip()");
        assert_eq!(r["result"], format!("'{venv_s}'"));
    }
    // Without a venv the probe module is not importable.
    let mut plain = Kernel::start();
    assert_eq!(
        plain.execute("import flowrepl_probe")["error"]["type"],
        "ModuleNotFoundError"
    );
}

#[test]
fn a_missing_or_unsupported_python_is_a_clear_start_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(flowrepl_tests::flowrepl_bin())
        .args(["--python", "/nonexistent/python"])
        .env("FLOWREPL_LOG_DIR", tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let venv = tmp.path().join("fake");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(venv.join("bin/python"), "").unwrap();
    std::fs::write(
        venv.join("pyvenv.cfg"),
        "home = /usr/bin\nversion = 3.99.1\n",
    )
    .unwrap();
    let out = Command::new(flowrepl_tests::flowrepl_bin())
        .env("VIRTUAL_ENV", &venv)
        .env("FLOWREPL_LOG_DIR", tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is CPython 3.99") && err.contains("supports CPython 3.10 to"),
        "{err}"
    );
}

#[test]
fn works_without_pythonunbuffered_and_with_it() {
    for unbuffered in [None, Some("1")] {
        let mut opts = Kernel::options().env("PYTHONDONTWRITEBYTECODE", "");
        if let Some(v) = unbuffered {
            opts = opts.env("PYTHONUNBUFFERED", v);
        } else {
            opts = opts.env("PYTHONUNBUFFERED", "");
        }
        let mut k = opts.start();
        let r = k.ok("import sys, ctypes, os\nprint('a', end='')\nsys.stderr.write('b')\nctypes.CDLL(None).printf(b'c')\nos.write(1, b'd')\nprint('e')");
        let out = r["stdout"].as_str().unwrap();
        for part in ["a", "c", "d", "e"] {
            assert!(out.contains(part), "{unbuffered:?}: {out:?}");
        }
        assert_eq!(r["stderr"], "b");
    }
}

/// The executor's compiled support code is cached per user; a corrupt or foreign cache file,
/// or a cache directory that cannot be made, never stops a kernel from starting.
#[test]
fn the_support_code_cache_can_never_break_a_start() {
    let cache = tempfile::tempdir().unwrap();
    for mode in flowrepl_tests::MODES {
        let start = |dir: &str| {
            flowrepl_tests::Kernel::options()
                .mode(mode)
                .env("XDG_CACHE_HOME", dir)
                .start()
        };
        let dir = cache.path().display().to_string();
        assert_eq!(start(&dir).ok("1 + 1")["result"], "2", "{mode}");
        // The support package's modules, one file each (checkpoints may have cached theirs
        // too, and cloudpickle).
        let files: Vec<_> = std::fs::read_dir(cache.path().join("flowrepl"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    [
                        "_flowrepl_session-",
                        "_flowrepl_flow-",
                        "_flowrepl_results-",
                    ]
                    .iter()
                    .any(|m| n.starts_with(m))
                })
            })
            .collect();
        assert_eq!(files.len(), 3, "{mode}: {files:?}");
        for f in &files {
            std::fs::write(f, b"not marshal data").unwrap();
        }
        assert_eq!(
            start(&dir).ok("2 + 2")["result"],
            "4",
            "{mode}: corrupt cache"
        );
        assert_eq!(
            start("/dev/null/no").ok("3 + 3")["result"],
            "6",
            "{mode}: no cache dir"
        );
    }
}
