//! `flowrepl log export`: a task's cells as a Python script (its successful cells, in order)
//! or as an nbformat 4.5 notebook (every cell, with stdout/stderr as stream outputs, the
//! final value as `execute_result`, the exception as an `error` output; execution counts
//! kept).

use super::show::{read_task, Cell};
use super::{io_err, one_task, print_json, say, task_file, LogCmdError, Read, Scope};
use serde_json::{json, Value};
use std::path::Path;

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A Python script of the successful cells.
    Py,
    /// A Jupyter notebook (nbformat 4) with outputs.
    Ipynb,
}

/// Lines of `text` as nbformat stores multi-line strings (each keeps its `\n`).
fn nb_lines(text: &str) -> Value {
    Value::Array(
        text.split_inclusive('\n')
            .map(|l| Value::String(l.to_owned()))
            .collect(),
    )
}

/// The script: a header, then each successful cell after an `# In[n]` marker.
fn script(plan: &str, task: &str, cells: &[&Cell]) -> String {
    let mut out = format!(
        "# flowrepl export: plan {plan:?}, task {task:?}, {} successful cells\n# Re-running it repeats the cells' side effects.\n",
        cells.len()
    );
    for c in cells {
        let r = &c.record;
        out.push_str(&format!(
            "\n# In[{}] (session {}, {})\n{}\n",
            r.execution_count,
            super::short_id(&r.session_id),
            r.timestamp,
            r.code.trim_end_matches('\n')
        ));
    }
    out
}

/// The traceback at the end of a failed cell's stderr, and what came before it.
fn split_traceback(stderr: &str) -> (&str, &str) {
    match stderr.rfind("Traceback (most recent call last):") {
        Some(i) => (&stderr[..i], &stderr[i..]),
        None => (stderr, ""),
    }
}

/// The notebook.
fn notebook(plan: &str, task: &str, python: Option<&str>, cells: &[Cell]) -> Value {
    let nb_cells: Vec<Value> = cells
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let r = &c.record;
            let mut outputs = Vec::new();
            if !r.stdout.is_empty() {
                outputs.push(json!({"output_type": "stream", "name": "stdout", "text": nb_lines(&r.stdout)}));
            }
            let (stderr, tb) = if r.success {
                (&*r.stderr, "")
            } else {
                split_traceback(&r.stderr)
            };
            if !stderr.is_empty() {
                outputs.push(json!({"output_type": "stream", "name": "stderr", "text": nb_lines(stderr)}));
            }
            if let Some(v) = &r.result {
                outputs.push(json!({
                    "output_type": "execute_result",
                    "execution_count": r.execution_count,
                    "data": {"text/plain": nb_lines(v)},
                    "metadata": {},
                }));
            }
            if !r.success {
                outputs.push(json!({
                    "output_type": "error",
                    "ename": r.error_type.as_deref().unwrap_or("Error"),
                    "evalue": r.error_message.as_deref().unwrap_or(""),
                    "traceback": tb.lines().collect::<Vec<_>>(),
                }));
            }
            json!({
                "cell_type": "code",
                "id": format!("cell-{}", i + 1),
                "metadata": {"flowrepl": {"session_id": r.session_id, "timestamp": r.timestamp, "elapsed_ms": r.elapsed_ms}},
                "execution_count": r.execution_count,
                "source": nb_lines(&r.code),
                "outputs": outputs,
            })
        })
        .collect();
    json!({
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python", "version": python.unwrap_or("3")},
            "flowrepl": {"plan_id": plan, "task_id": task},
        },
        "cells": nb_cells,
    })
}

/// `export`.
pub fn run(
    log_dir: &Path,
    scope: &Scope,
    format: Format,
    output: Option<&Path>,
) -> Result<Read, LogCmdError> {
    let (plan, task) = one_task(scope);
    let file = task_file(log_dir, &plan, &task)?;
    let log = read_task(&file);
    let python = log.sessions.last().and_then(|s| {
        s.python_version
            .split_whitespace()
            .next()
            .map(str::to_owned)
    });
    let (doc, cells, text) = match format {
        Format::Py => {
            let ok: Vec<&Cell> = log.cells.iter().filter(|c| c.record.success).collect();
            let text = script(&plan, &task, &ok);
            (
                json!({"format": "py", "cells": ok.len(), "text": text}),
                ok.len(),
                text,
            )
        }
        Format::Ipynb => {
            let nb = notebook(&plan, &task, python.as_deref(), &log.cells);
            let text = serde_json::to_string_pretty(&nb).expect("a notebook serializes") + "\n";
            (
                json!({"format": "ipynb", "cells": log.cells.len(), "notebook": nb}),
                log.cells.len(),
                text,
            )
        }
    };
    match output {
        Some(path) => {
            std::fs::write(path, &text).map_err(io_err(format!("writing {}", path.display())))?;
            if scope.json {
                print_json(&json!({"format": doc["format"], "cells": cells, "output": path}))?;
            } else {
                eprintln!("flowrepl log: wrote {cells} cells to {}", path.display());
            }
        }
        None if scope.json => print_json(&doc)?,
        None => say(text.trim_end_matches('\n'))?,
    }
    Ok(Read::from_count(log.records))
}
