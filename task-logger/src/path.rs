//! Log path layout: `<log_dir>/<safe(plan_id)>/<safe(task_id)>.jsonl`.
//!
//! [`safe_component`] turns any id into one path component that
//! - is never empty, `.`, `..`, hidden, or contains `/` or NUL, so it cannot leave `log_dir`;
//! - is injective: two different ids never give the same name. Letters and digits (any script,
//!   so Hangul stays readable), `-`, `_` and non-leading `.` are kept; every other byte becomes
//!   `%XX`. The empty id becomes `%empty` (an encoding never yields `%` followed by non-hex).
//! - stays short: past [`MAX_COMPONENT_BYTES`] the name is cut and `~` plus 128 bits of the
//!   id's SHA-256 are appended. `~` itself is always escaped, so only such names contain it.

use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Longest name [`safe_component`] returns (well under the 255-byte limit of file names,
/// leaving room for `.jsonl`).
pub const MAX_COMPONENT_BYTES: usize = 120;
const KEEP_BYTES_WHEN_HASHED: usize = 80;
/// Longest plan or task id `flowrepl serve` takes from a client (its table of tasks, its
/// kernels' environment and error messages hold it): longer is a clear -32602.
pub const MAX_ID_BYTES: usize = 1024;

fn is_kept(c: char, first: bool) -> bool {
    c.is_alphanumeric() || c == '-' || c == '_' || (c == '.' && !first)
}

/// The task backend's environment variables: the plan, the task, the task's name.
pub const PLAN_ID_ENV: &str = "FLOW_PLAN_ID";
/// See [`PLAN_ID_ENV`].
pub const TASK_ID_ENV: &str = "FLOW_TASK_ID";
/// See [`PLAN_ID_ENV`].
pub const TASK_NAME_ENV: &str = "FLOW_TASK_NAME";

/// `FLOW_PLAN_ID` (default `local`) and `FLOW_TASK_ID` (default `adhoc`): the task a kernel
/// started here logs to, and the one `flowrepl log` reads when none is named. Values that are
/// not UTF-8 are converted lossily.
pub fn plan_and_task_from_env() -> (String, String) {
    let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    (
        var(PLAN_ID_ENV).unwrap_or_else(|| "local".into()),
        var(TASK_ID_ENV).unwrap_or_else(|| "adhoc".into()),
    )
}

/// One safe, collision-free path component for `id`.
pub fn safe_component(id: &str) -> String {
    if id.is_empty() {
        return "%empty".to_owned();
    }
    let mut out = String::with_capacity(id.len());
    for (i, c) in id.char_indices() {
        if is_kept(c, i == 0) {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    if out.len() <= MAX_COMPONENT_BYTES {
        return out;
    }
    // Cut on a char boundary, and never inside a `%XX` escape.
    let mut cut = KEEP_BYTES_WHEN_HASHED;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    if let Some(pct) = out[..cut].rfind('%') {
        if cut - pct < 3 {
            cut = pct;
        }
    }
    out.truncate(cut);
    out.push('~');
    for b in &Sha256::digest(id.as_bytes())[..16] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// `<log_dir>/<safe(plan_id)>/<safe(task_id)>.jsonl`.
pub fn task_log_path(log_dir: &Path, plan_id: &str, task_id: &str) -> PathBuf {
    let mut p = log_dir.join(safe_component(plan_id));
    p.push(format!("{}.jsonl", safe_component(task_id)));
    p
}

/// The log folder of a task log made by [`task_log_path`].
pub fn log_dir_of(log_file: &Path) -> Option<&Path> {
    log_file.parent().and_then(Path::parent)
}

/// `<log_dir>/<plan>/<task>.files`: touched whenever a client changes the task's workspace
/// files (an upload or a delete, by the kernel or by `serve`), so that the store's uploader
/// (`--store`), which watches it, keeps the workspace with a new state.
pub fn workspace_marker(log_file: &Path) -> PathBuf {
    log_file.with_extension("files")
}

/// `<log_dir>/<plan>/<task>.packages`: the task's package layer (its generations and the
/// `current` link cells import from). Beside the log, so hidden from cells with it; the
/// sandbox binds it back read-only.
pub fn packages_root(log_file: &Path) -> PathBuf {
    log_file.with_extension("packages")
}

/// `<log_dir>/<plan>/<task>.packages.json`: what the task's layer was resolved from and to
/// (written after each install; the log's last install record says the same).
pub fn packages_state(log_file: &Path) -> PathBuf {
    log_file.with_extension("packages.json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::Component;

    fn stays_inside(id: &str) {
        let p = task_log_path(Path::new("/logs"), id, id);
        let rel = p.strip_prefix("/logs").unwrap();
        let comps: Vec<_> = rel.components().collect();
        assert_eq!(comps.len(), 2, "{id:?} -> {p:?}");
        for c in comps {
            match c {
                Component::Normal(s) => {
                    let s = s.to_str().unwrap();
                    assert!(
                        !s.is_empty() && !s.starts_with('.') && s.len() <= 255,
                        "{s:?}"
                    );
                    assert!(!s.contains('\0') && !s.contains('/'));
                }
                other => panic!("{id:?} gave component {other:?}"),
            }
        }
    }

    #[test]
    fn hostile_ids_stay_inside() {
        let long = "x".repeat(10_000);
        let long_hangul = "작업".repeat(3_000);
        for id in [
            "",
            ".",
            "..",
            "../../x",
            "/etc/passwd",
            "a/../../b",
            "\0",
            "a\0b",
            "~",
            "%",
            "%empty",
            "작업-1",
            &long,
            &long_hangul,
            " ",
            "\n",
            ".hidden",
            "con",
            "a\\b",
        ] {
            stays_inside(id);
        }
    }

    #[test]
    fn readable_when_harmless() {
        assert_eq!(safe_component("task-42_v1.2"), "task-42_v1.2");
        assert_eq!(safe_component("작업"), "작업");
        assert_eq!(safe_component("../x"), "%2E.%2Fx");
        assert_eq!(safe_component(""), "%empty");
        assert_eq!(safe_component("%empty"), "%25empty");
    }

    #[test]
    fn no_collisions() {
        let long_a = "a".repeat(5_000);
        let mut long_b = long_a.clone();
        long_b.push('b');
        let ids = [
            "",
            "%empty",
            "%",
            "%25",
            "a/b",
            "a%2Fb",
            "a_b",
            "a.b",
            ".a",
            "%2Ea",
            "~",
            "%7E",
            "\0",
            "%00",
            &long_a,
            &long_b,
            "작업",
            "%EC%9E%91%EC%97%85",
        ];
        let names: HashSet<_> = ids.iter().map(|i| safe_component(i)).collect();
        assert_eq!(names.len(), ids.len());
    }

    #[test]
    fn long_names_are_bounded_and_distinct() {
        for unit in ["x", "작", "/", "a%"] {
            let a = unit.repeat(4_000);
            let b = format!("{a}!");
            let (na, nb) = (safe_component(&a), safe_component(&b));
            assert!(na.len() <= MAX_COMPONENT_BYTES, "{}", na.len());
            assert_ne!(na, nb);
            assert!(na.contains('~'));
        }
    }
}
