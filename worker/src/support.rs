//! Loading the executor's Python code: `support.py` (the module `_flowrepl`, at start), the
//! checkpoint package (the Python modules in `checkpoint/`, on the first checkpoint or
//! restore) and the cloudpickle it uses (`_flowrepl_cloudpickle`, a pinned copy in
//! `worker/vendor/`).
//!
//! Compiling it costs about 2 ms, on every kernel and every worker start. The compiled code is
//! therefore kept, marshalled, in the user's cache directory
//! (`flowrepl_exec::setup::support_cache_dir`: `$XDG_CACHE_HOME/flowrepl`, else
//! `~/.cache/flowrepl`, made 0700; a sandboxed worker reads it and cannot write it), under a name that holds the source's hash and the
//! interpreter's bytecode magic number, so that another flowrepl build or Python version
//! never reads it. Any miss or failure (no cache directory, a torn or foreign file) falls
//! back to compiling, and a cache that cannot be written is simply not used. The file is
//! written to a temporary name and renamed, so a reader never sees half of one.

use flowrepl_exec::setup::CallError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCode, PyCodeMethods, PyModule};

/// A [`CallError`] from what the executor's own Python code raised: its `str`.
pub fn py_err(e: PyErr) -> CallError {
    CallError(e.to_string())
}

/// A Python module of the executor's, compiled from source embedded in the binary.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// The module's name.
    pub module: &'static str,
    /// Its file name in tracebacks.
    pub filename: &'static str,
    /// Its source.
    pub text: &'static str,
}

/// `_flowrepl`: loaded by every executor at start.
pub const SUPPORT: Source = Source {
    module: "_flowrepl",
    filename: "<flowrepl-support>",
    text: include_str!("support.py"),
};

/// The checkpoint package (`worker/src/checkpoint/*.py`), in load order: each module is given
/// the ones before it as globals under their short names, once loaded (`picklable`, `files`, ...), and
/// the last, `_flowrepl_checkpoint`, is the package's face to the Rust side. Loaded on the
/// first checkpoint or restore ([`load_checkpoint`]).
pub const CHECKPOINT: [(&str, Source); 5] = [
    (
        "picklable",
        Source {
            module: "_flowrepl_checkpoint_picklable",
            filename: "<flowrepl-checkpoint/picklable.py>",
            text: include_str!("checkpoint/picklable.py"),
        },
    ),
    (
        "files",
        Source {
            module: "_flowrepl_checkpoint_files",
            filename: "<flowrepl-checkpoint/files.py>",
            text: include_str!("checkpoint/files.py"),
        },
    ),
    (
        "graph",
        Source {
            module: "_flowrepl_checkpoint_graph",
            filename: "<flowrepl-checkpoint/graph.py>",
            text: include_str!("checkpoint/graph.py"),
        },
    ),
    (
        "restore",
        Source {
            module: "_flowrepl_checkpoint_restore",
            filename: "<flowrepl-checkpoint/restore.py>",
            text: include_str!("checkpoint/restore.py"),
        },
    ),
    (
        "store",
        Source {
            module: "_flowrepl_checkpoint",
            filename: "<flowrepl-checkpoint/store.py>",
            text: include_str!("checkpoint/store.py"),
        },
    ),
];

/// The version of the cloudpickle copy in `worker/vendor/cloudpickle`.
pub const CLOUDPICKLE_VERSION: &str = "3.1.2";

/// `_flowrepl_cloudpickle`: flowrepl's own cloudpickle, loaded with the checkpoint package
/// and known only to it (never in `sys.modules`).
pub const CLOUDPICKLE: Source = Source {
    module: "_flowrepl_cloudpickle",
    filename: "<flowrepl-cloudpickle>",
    text: include_str!("../vendor/cloudpickle/cloudpickle.py"),
};

impl Source {
    /// FNV-1a of the source: a cache key that changes with every change of the file.
    fn hash(&self) -> u64 {
        self.text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }
}

/// The module `_flowrepl`, from the cached code when there is one.
pub fn load(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    load_source(py, &SUPPORT, &[])
}

/// The checkpoint package ([`CHECKPOINT`]) with flowrepl's cloudpickle: its last module.
pub fn load_checkpoint(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let cloudpickle = load_source(py, &CLOUDPICKLE, &[])?;
    cloudpickle.setattr("__version__", CLOUDPICKLE_VERSION)?;
    let mut loaded: Vec<(&str, Bound<'_, PyModule>)> = Vec::with_capacity(CHECKPOINT.len());
    for (name, src) in &CHECKPOINT {
        let module = load_source(py, src, &loaded)?;
        if *name == "picklable" {
            // Its by-value pickler: private to it, never in sys.modules.
            module.setattr("cloudpickle", &cloudpickle)?;
        }
        loaded.push((name, module));
    }
    Ok(loaded.pop().expect("the package has modules").1)
}

/// Module `src`, from the cached code when there is one, with `globals` set once its code has
/// run (it declares them as `None`, and uses them only in its functions).
pub fn load_source<'py>(
    py: Python<'py>,
    src: &Source,
    globals: &[(&str, Bound<'py, PyModule>)],
) -> PyResult<Bound<'py, PyModule>> {
    let marshal = py.import("marshal")?;
    let magic: Vec<u8> = py
        .import("importlib._bootstrap_external")?
        .getattr("MAGIC_NUMBER")?
        .extract()?;
    let magic: String = magic.iter().map(|b| format!("{b:02x}")).collect();
    let path = flowrepl_exec::setup::support_cache_dir().map(|d| {
        d.join(format!(
            "{}-{:016x}-{magic}.marshal",
            src.module,
            src.hash()
        ))
    });
    let cached = path
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|bytes| {
            marshal
                .call_method1("loads", (PyBytes::new(py, &bytes),))
                .ok()
        });
    let code = match cached {
        Some(code) => code,
        None => {
            let builtins = py.import("builtins")?;
            let code = builtins.call_method1("compile", (src.text, src.filename, "exec"))?;
            if let Some(p) = &path {
                if let Ok(bytes) = marshal.call_method1("dumps", (&code,)) {
                    store(p, bytes.cast::<PyBytes>()?.as_bytes());
                }
            }
            code
        }
    };
    let module = PyModule::new(py, src.module)?;
    module.setattr("__builtins__", py.import("builtins")?)?;
    module.setattr("__file__", src.filename)?;
    let dict = module.dict();
    code.cast_into::<PyCode>()?.run(Some(&dict), Some(&dict))?;
    for (name, value) in globals {
        module.setattr(*name, value)?;
    }
    Ok(module)
}

/// Writes the cache file atomically; failures only mean no cache.
fn store(path: &std::path::Path, bytes: &[u8]) {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = path.parent() else { return };
    if std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .is_err()
    {
        return;
    }
    let tmp = dir.join(format!(".support-{}.tmp", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
