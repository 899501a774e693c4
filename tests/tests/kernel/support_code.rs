//! The executor's embedded Python (the packages in `executor/src/support/` and
//! `executor/src/checkpoint/`) has unit tests of its own (`executor/tests/python/`, one file
//! per module, `unittest`): they run here in a plain interpreter of every CPython version
//! found, as the code runs embedded in each.

use flowrepl_tests::workspace_root;
use std::process::Command;

#[test]
fn the_support_code_passes_its_unit_tests_on_every_python_found() {
    let found = flowrepl_pythons::discover();
    assert!(!found.is_empty(), "no CPython 3.10+ found");
    let dir = workspace_root().join("executor/tests/python");
    for python in found {
        let out = Command::new(&python.program)
            .args(["-m", "unittest", "-v"])
            .current_dir(&dir)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTHONPATH")
            .output()
            .expect("python runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{} ({}): the support code's unit tests failed:\n{stderr}",
            python.program.display(),
            python.version
        );
        // Discovery found them (a module that fails to import is an error, not zero tests).
        assert!(!stderr.contains("Ran 0 tests"), "{stderr}");
    }
}
