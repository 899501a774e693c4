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

/// Where the text between the lines `<!-- begin NAME -->` and `<!-- end NAME -->` of a document
/// starts and ends.
fn between(doc: &str, name: &str) -> Option<(usize, usize)> {
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

/// The first sentence of a source file's module documentation (`//!` lines, or a Python
/// module's docstring), on one line.
fn first_sentence(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut para = Vec::new();
    if path.extension().is_some_and(|e| e == "py") {
        let body = text.trim_start();
        let body = body
            .strip_prefix("\"\"\"")
            .unwrap_or_else(|| panic!("{}: no module docstring", path.display()));
        for line in body.lines() {
            let line = line.trim().trim_end_matches("\"\"\"");
            if line.is_empty() {
                break;
            }
            para.push(line.to_owned());
        }
    } else {
        for line in text.lines().skip_while(|l| !l.starts_with("//!")) {
            let Some(doc) = line.strip_prefix("//!") else {
                break;
            };
            let doc = doc.trim();
            if doc.is_empty() {
                break;
            }
            para.push(doc.to_owned());
        }
    }
    let para = para.join(" ");
    assert!(
        !para.is_empty(),
        "{}: no module documentation",
        path.display()
    );
    let end = para
        .match_indices(". ")
        .map(|(i, _)| i + 1)
        .next()
        .unwrap_or(para.len());
    plain_links(&para[..end]).replace('|', "\\|")
}

/// Rustdoc links as plain text: `[`x`](path)` and `[`x`]` become `` `x` ``.
fn plain_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find("[`") {
        let Some(close) = rest[open..].find("`]").map(|i| open + i) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close + 1]);
        rest = &rest[close + 2..];
        if let Some(target) = rest.strip_prefix('(') {
            if let Some(end) = target.find(')').filter(|&e| !target[..e].contains(' ')) {
                rest = &target[end + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The workspace's crates, from Cargo.toml's `members`.
fn crates() -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let line = manifest.lines().find(|l| l.starts_with("members")).unwrap();
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The room map: one row per source file of every crate (`src/`, the vendored code left
/// out), with the first sentence of its module documentation.
fn room_map() -> String {
    let root = workspace_root();
    let mut files = Vec::new();
    for krate in crates() {
        let src = root.join(&krate).join("src");
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    if name != "vendor" {
                        stack.push(path);
                    }
                } else if name.ends_with(".rs") || name.ends_with(".py") {
                    files.push(path);
                }
            }
        }
    }
    files.sort();
    let mut out = String::from("| file | its job |\n| --- | --- |\n");
    for f in files {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        out.push_str(&format!("| `{rel}` | {} |\n", first_sentence(&f)));
    }
    out
}

/// The map of crates and rooms cannot drift: README's layout table names every crate of the
/// workspace, every source file the docs name exists, and docs/design.md's room map, one row per source file with the first
/// sentence of its module documentation, is what the files say now (`FLOWREPL_BLESS=1`
/// rewrites it).
#[test]
fn the_crate_and_room_maps_name_every_crate_and_file() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let layout = &readme[readme.find("## Layout").expect("README's layout")..];
    for krate in crates() {
        assert!(
            layout.contains(&format!("| `{krate}/` |")),
            "README's layout table does not name {krate}/"
        );
    }
    let path = workspace_root().join("docs/design.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (start, stop) =
        between(&doc, "room map").expect("the room map's markers in docs/design.md");
    let map = room_map();
    if std::env::var_os("FLOWREPL_BLESS").is_some() {
        std::fs::write(&path, format!("{}{map}{}", &doc[..start], &doc[stop..])).unwrap();
    } else {
        assert!(
            doc[start..stop] == map,
            "docs/design.md's room map is not what the files say: run this test with FLOWREPL_BLESS=1"
        );
    }
    // Every source path the docs name (`a/b.rs`, `a/b.py`) exists.
    let root = workspace_root();
    let mut docs: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.push(root.join("README.md"));
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        for named in text.split('`').skip(1).step_by(2) {
            let source = named.ends_with(".rs") || named.ends_with(".py");
            if !source || !named.contains('/') || named.contains(' ') {
                continue;
            }
            let found = root.join(named).exists()
                || crates()
                    .iter()
                    .any(|c| root.join(c).join("src").join(named).exists());
            assert!(
                found,
                "{} names {named}, which does not exist",
                doc.display()
            );
        }
    }
}
