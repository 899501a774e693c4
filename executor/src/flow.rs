//! `flow`, the object cells report through (a builtin, and `flowrepl.flow`): its Python side
//! is `install_flow` in `support/flow.py`; this wires it to the kernel's side, the events
//! ([`crate::events::Emitter`]), the approvals ([`crate::approval::Approvals`]) and the
//! task's identity and context ([`FlowSetup`]).

use crate::approval::Approvals;
use crate::events::{data_json, dict_json, Emitter};
use flowrepl_exec::setup::FlowSetup;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyCFunction, PyDict, PyList, PyString, PyTuple};
use std::sync::Arc;

/// Installs `flow` (a builtin, and `flowrepl.flow`) for cells reporting to `emitter`;
/// returns the `flow` object.
pub fn install_flow(
    py: Python<'_>,
    support: &crate::support::Loaded<'_>,
    emitter: Arc<Emitter>,
    approvals: Approvals,
    setup: &FlowSetup,
) -> PyResult<Py<PyAny>> {
    let emitter_for_count = Arc::clone(&emitter);
    let emit = PyCFunction::new_closure(
        py,
        Some(c"_emit"),
        None,
        move |args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>| -> PyResult<()> {
            let (name, data, step): (String, Bound<'_, PyDict>, Option<String>) = args.extract()?;
            let json = data_json(&name, &data)?;
            emitter
                .emit(name, json, step)
                .map_err(PyValueError::new_err)
        },
    )?;
    let started = std::time::Instant::now();
    let clock = PyCFunction::new_closure(
        py,
        Some(c"_clock"),
        None,
        move |_: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| -> PyResult<f64> {
            Ok(started.elapsed().as_secs_f64())
        },
    )?;
    let counts = Arc::clone(&emitter_for_count);
    let count = PyCFunction::new_closure(
        py,
        Some(c"_count"),
        None,
        move |_: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| -> PyResult<u64> {
            Ok(counts.execution_count())
        },
    )?;
    let ids = PyDict::new(py);
    ids.set_item("plan_id", &setup.plan_id)?;
    ids.set_item("task_id", &setup.task_id)?;
    ids.set_item("task_name", &setup.task_name)?;
    ids.set_item("session_id", &setup.session_id)?;
    let saver = Arc::clone(&emitter_for_count);
    let save_context = PyCFunction::new_closure(
        py,
        Some(c"_save_context"),
        None,
        move |args: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| -> PyResult<Py<PyAny>> {
            let (new,): (Bound<'_, PyDict>,) = args.extract()?;
            let json = dict_json("flow.context.update", &new)?;
            let limit = flowrepl_protocol::limits::MAX_CONTEXT_BYTES;
            if json.len() > limit {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "flow.context.update: the new context is {} bytes of JSON; a task's context holds at most {limit} ({} KiB). Nothing was saved: keep large data in files.",
                    json.len(),
                    limit >> 10
                )));
            }
            let copy = json_to_py(args.py(), &serde_json::from_str(&json).expect("valid JSON"))?;
            saver.set_context(json);
            Ok(copy)
        },
    )?;
    let approve = PyCFunction::new_closure(
        py,
        Some(c"_approve"),
        None,
        move |args: &Bound<'_, PyTuple>,
              _: Option<&Bound<'_, PyDict>>|
              -> PyResult<(&'static str, Option<String>)> {
            let (message, data, timeout_s, step): (
                String,
                Bound<'_, PyDict>,
                Option<f64>,
                Option<String>,
            ) = args.extract()?;
            let json = dict_json("flow.request_approval", &data)?;
            approvals.ask(args.py(), message, json, timeout_s, step)
        },
    )?;
    let initial: serde_json::Value = match &setup.context {
        Some(text) => serde_json::from_str(text).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the task's saved context is not JSON; starting from {{}}");
            serde_json::json!({})
        }),
        None => serde_json::json!({}),
    };
    let initial = json_to_py(py, &initial)?;
    let flow = support.get("install_flow")?.call1((
        emit,
        clock,
        count,
        save_context,
        approve,
        initial,
        ids,
    ))?;
    Ok(flow.unbind())
}

/// A JSON value as Python objects (objects become dicts, in order).
fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.into_pyobject(py)?.into_any().unbind(),
            (_, Some(u), _) => u.into_pyobject(py)?.into_any().unbind(),
            (_, _, Some(f)) => f.into_pyobject(py)?.into_any().unbind(),
            _ => py.None(),
        },
        Value::String(s) => PyString::new(py, s).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for i in items {
                list.append(json_to_py(py, i)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let d = PyDict::new(py);
            for (k, v) in map {
                d.set_item(k, json_to_py(py, v)?)?;
            }
            d.into_any().unbind()
        }
    })
}
