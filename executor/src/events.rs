//! Events a cell reports through `flow` (`flow.event`, `flow.step`): each is timestamped and
//! placed in the cell's stdout (the bytes written before it, so that the kernel can order it
//! among the `MCP::` lines the cell printed), then collected for the cell's outcome
//! (in-process) or sent to the kernel at once (worker mode: an event reported just before a
//! crash reaches the kernel).

use flowrepl_exec::capture::file_size;
use flowrepl_exec::sink::OutputSink;
use flowrepl_os::lock;
use flowrepl_protocol::{CellEvent, EventData};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Receives the events of the running cell.
pub struct Emitter {
    stdout: Arc<OwnedFd>,
    cell_start: AtomicU64,
    /// A cell runs.
    in_cell: AtomicBool,
    /// The running cell's `execution_count` (read by `flow.execution_count`).
    execution_count: AtomicU64,
    sink: Option<Arc<dyn OutputSink>>,
    /// In-process: the running cell's events, and its context changes (each the whole new
    /// context).
    collected: Mutex<(Vec<CellEvent>, Vec<String>)>,
}

impl std::fmt::Debug for Emitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitter")
            .field("streaming", &self.sink.is_some())
            .finish()
    }
}

impl Emitter {
    /// Events of cells whose stdout is captured in `stdout`; with a sink, sent there.
    pub fn new(stdout: Arc<OwnedFd>, sink: Option<Arc<dyn OutputSink>>) -> Emitter {
        Emitter {
            stdout,
            cell_start: AtomicU64::new(0),
            in_cell: AtomicBool::new(false),
            execution_count: AtomicU64::new(0),
            sink,
            collected: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// Cell `execution_count` starts; its stdout starts at `stdout_start` in the capture file.
    pub fn begin(&self, execution_count: u64, stdout_start: u64) {
        self.cell_start.store(stdout_start, Ordering::Relaxed);
        self.execution_count
            .store(execution_count, Ordering::Relaxed);
        self.in_cell.store(true, Ordering::Relaxed);
    }

    /// The cell ended.
    pub fn end(&self) {
        self.in_cell.store(false, Ordering::Relaxed);
    }

    /// Whether a cell runs.
    pub fn in_cell(&self) -> bool {
        self.in_cell.load(Ordering::Relaxed)
    }

    /// The running (or last) cell's `execution_count`.
    pub fn execution_count(&self) -> u64 {
        self.execution_count.load(Ordering::Relaxed)
    }

    /// Reports an event of the running cell. `data` must be a JSON object's text (the
    /// Python side checked it); the caller flushed `sys.stdout` first.
    pub fn emit(&self, name: String, data: String, step: Option<String>) -> Result<(), String> {
        let start = self.cell_start.load(Ordering::Relaxed);
        let size = file_size(self.stdout.as_fd()).unwrap_or(start);
        let event = CellEvent {
            name,
            data: EventData::from_json(data).map_err(|e| e.to_string())?,
            timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            step,
            offset: size.saturating_sub(start),
        };
        match &self.sink {
            Some(sink) => sink.event(&event),
            None => lock(&self.collected).0.push(event),
        }
        Ok(())
    }

    /// The running cell changed the task's context to `json` (a JSON object).
    pub fn set_context(&self, json: String) {
        match &self.sink {
            Some(sink) => sink.context(&json),
            None => lock(&self.collected).1.push(json),
        }
    }

    /// The events and context changes collected since the last call (in-process; a worker
    /// sent them as they came).
    pub fn take(&self) -> (Vec<CellEvent>, Vec<String>) {
        if self.sink.is_some() {
            return Default::default();
        }
        std::mem::take(&mut *lock(&self.collected))
    }
}

/// Why a value cannot be event data.
#[derive(Debug)]
enum NotJson {
    Type(String),
    Deep,
}

const MAX_DEPTH: usize = 100;

/// Appends `obj` as JSON: `None`, `bool`, `int`, finite `float`, `str`, `list`, `tuple` and
/// `dict` (keys `str`, or `int`/`float`/`bool`/`None` written as strings, as `json.dumps`
/// does). Anything else (or nesting deeper than 100, as a cycle would be) is refused.
fn write_json(obj: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> Result<(), NotJson> {
    if depth > MAX_DEPTH {
        return Err(NotJson::Deep);
    }
    let type_name = || {
        NotJson::Type(
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string()),
        )
    };
    if obj.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(b) = obj.cast::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if obj.cast::<PyInt>().is_ok() {
        // Any size, as Python writes it (valid JSON digits).
        out.extend_from_slice(
            obj.str()
                .map_err(|_| type_name())?
                .to_string_lossy()
                .as_bytes(),
        );
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        if !v.is_finite() {
            return Err(type_name());
        }
        serde_json::to_writer(&mut *out, &v).map_err(|_| type_name())?;
    } else if let Ok(s) = obj.cast::<PyString>() {
        serde_json::to_writer(&mut *out, &*s.to_string_lossy()).map_err(|_| type_name())?;
    } else if let Ok(d) = obj.cast::<PyDict>() {
        out.push(b'{');
        for (i, (k, v)) in d.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_key(&k, out).ok_or_else(type_name)?;
            out.push(b':');
            write_json(&v, out, depth + 1)?;
        }
        out.push(b'}');
    } else if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        out.push(b'[');
        for (i, item) in obj.try_iter().map_err(|_| type_name())?.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json(&item.map_err(|_| type_name())?, out, depth + 1)?;
        }
        out.push(b']');
    } else {
        return Err(type_name());
    }
    Ok(())
}

/// A dict key as a JSON string, as `json.dumps` converts keys.
fn write_key(k: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> Option<()> {
    let text = if let Ok(s) = k.cast::<PyString>() {
        s.to_string_lossy().into_owned()
    } else if k.is_none() {
        "null".into()
    } else if let Ok(b) = k.cast::<PyBool>() {
        if b.is_true() { "true" } else { "false" }.into()
    } else if k.cast::<PyInt>().is_ok() || k.cast::<PyFloat>().is_ok() {
        k.str().ok()?.to_string_lossy().into_owned()
    } else {
        return None;
    };
    serde_json::to_writer(&mut *out, &text).ok()
}

/// The JSON text of an event's data, or a `TypeError` naming the offending key.
pub(crate) fn data_json(event: &str, data: &Bound<'_, PyDict>) -> PyResult<String> {
    dict_json(&format!("flow.event({event:?})"), data)
}

/// The JSON text of a dict, or a `TypeError` (starting with `what`) naming the offending key.
pub(crate) fn dict_json(what: &str, data: &Bound<'_, PyDict>) -> PyResult<String> {
    let event = what;
    let mut out = Vec::with_capacity(64);
    out.push(b'{');
    for (i, (k, v)) in data.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let key = k
            .str()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if write_key(&k, &mut out).is_none() {
            return Err(PyTypeError::new_err(format!(
                "{event}: data key {key:?} is not a string"
            )));
        }
        out.push(b':');
        if let Err(e) = write_json(&v, &mut out, 0) {
            let why = match e {
                NotJson::Type(t) => format!("contains a {t}, which is not JSON-serialisable"),
                NotJson::Deep => "is nested too deeply (or circular)".to_owned(),
            };
            return Err(PyTypeError::new_err(format!(
                "{event}: data[{key:?}] {why}"
            )));
        }
    }
    out.push(b'}');
    Ok(String::from_utf8(out).expect("JSON text is UTF-8"))
}
