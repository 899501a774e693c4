//! The docs say what runs: every thread of a running kernel and worker is named in
//! docs/design.md's list of threads.

use flowrepl_tests::{workspace_root, Kernel};

/// The names of process `pid`'s threads other than its main one (`comm`: at most 15 bytes).
fn threads(pid: u32) -> Vec<String> {
    let mut names = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        if task.file_name().to_str() == Some(&pid.to_string()) {
            continue;
        }
        if let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) {
            names.push(comm.trim_end().to_owned());
        }
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_thread_is_named_in_the_design_doc() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/design.md")).unwrap();
    let start = doc.find("The other threads, by").expect("the thread list");
    let list = &doc[start..start + doc[start..].find("\n\n").unwrap()];
    for mode in ["in_process", "worker"] {
        let mut k = Kernel::options().mode(mode).start();
        k.ok("x = 1");
        k.wait_checkpoint(1);
        let mut seen = threads(k.pid());
        if let Some(w) = k.call("status", serde_json::Value::Null)["result"]["worker_pid"].as_u64()
        {
            seen.extend(threads(w as u32));
        }
        assert!(seen.iter().any(|t| t.starts_with("flowrepl-")), "{seen:?}");
        for t in &seen {
            assert!(
                list.contains(&format!("`{t}")),
                "{mode}: thread {t:?} is not in docs/design.md's list of threads:\n{list}"
            );
        }
        k.close();
    }
}
