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

/// `text` between the line `<!-- begin NAME -->` and `<!-- end NAME -->` of a document.
fn between<'a>(doc: &'a str, name: &str) -> Option<(usize, usize)> {
    let begin = format!("<!-- begin {name} -->\n");
    let end = format!("<!-- end {name} -->");
    let start = doc.find(&begin)? + begin.len();
    let stop = start + doc[start..].find(&end)?;
    Some((start, stop))
}

/// The execution record is declared once, in `flowrepl_task_logger::ExecutionRecord`: its
/// JSON Schema in docs/schema/v1 and the field table of docs/task-log.md are generated from
/// it, and differ from the committed copies only when someone forgot to run this test with
/// `FLOWREPL_BLESS=1` (which rewrites them).
#[test]
fn the_execution_records_schema_and_table_are_generated_from_its_type() {
    use flowrepl_task_logger::schema::{execution_schema, field_table};
    let bless = std::env::var_os("FLOWREPL_BLESS").is_some();
    let schema = execution_schema();
    let path = workspace_root().join("docs/schema/v1/execution.schema.json");
    let generated = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if bless {
        std::fs::write(&path, &generated).unwrap();
    } else {
        assert!(
            committed == generated,
            "docs/schema/v1/execution.schema.json is not what ExecutionRecord generates: run this test with FLOWREPL_BLESS=1"
        );
    }
    let doc_path = workspace_root().join("docs/task-log.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let (start, stop) = between(&doc, "execution fields").expect("the markers in docs/task-log.md");
    let table = field_table(&schema);
    if bless {
        let doc = format!("{}{table}{}", &doc[..start], &doc[stop..]);
        std::fs::write(&doc_path, doc).unwrap();
    } else {
        assert!(
            doc[start..stop] == table,
            "docs/task-log.md's execution field table is not what ExecutionRecord generates: run this test with FLOWREPL_BLESS=1"
        );
    }
}
