//! Loading the executor's Python code, two packages of a module per job: the support package
//! (the Python modules in `support/`, at start), the checkpoint package (in `checkpoint/`, on
//! the first checkpoint or restore) and the cloudpickle it uses (`_flowrepl_cloudpickle`, a
//! pinned copy in `executor/vendor/`).
//!
//! Compiling the support package costs about 2 ms, on every kernel and every worker start. The compiled code is
//! therefore kept, marshalled, in the user's cache directory
//! (`flowrepl_exec::setup::support_cache_dir`: `$XDG_CACHE_HOME/flowrepl`, else
//! `~/.cache/flowrepl`, made 0700; a sandboxed worker reads it and cannot write it), under a
//! name that holds the source's hash and the interpreter's bytecode magic number, so that another flowrepl build or Python version
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

/// A module of a [`Package`]: its short name (what the modules after it call it) and source.
pub type Part = (&'static str, Source);

/// The executor's Python modules of one job, in load order: each module is given the ones
/// before it as globals under their short names once its code has run (it declares them as
/// `None` and uses them only inside functions). None of them is in `sys.modules`, so a cell
/// cannot import or replace them.
#[derive(Debug, Clone, Copy)]
pub struct Package(pub &'static [Part]);

/// Declares a package's modules once: `short => "path.py"` in load order, each the module
/// `<prefix>_<short>` with the file name `<package/short.py>` in tracebacks.
macro_rules! package {
    ($prefix:literal, $dir:literal: $($short:literal),+ $(,)?) => {
        Package(&[$((
            $short,
            Source {
                module: concat!($prefix, "_", $short),
                filename: concat!("<flowrepl-", $dir, "/", $short, ".py>"),
                text: include_str!(concat!($dir, "/", $short, ".py")),
            },
        )),+])
    };
}

/// The support package (`support/`): loaded by every executor at start ([`load`]).
pub const SUPPORT: Package = package!("_flowrepl", "support": "session", "flow", "results");

/// The checkpoint package (`checkpoint/`), loaded on the first checkpoint or restore
/// ([`load_checkpoint`]); `store` is its face to the Rust side, and `picklable` gets
/// flowrepl's cloudpickle.
pub const CHECKPOINT: Package = package!("_flowrepl_checkpoint", "checkpoint": "picklable", "files", "graph", "restore", "store");

/// A loaded [`Package`].
pub struct Loaded<'py>(Vec<(&'static str, Bound<'py, PyModule>)>);

impl<'py> Loaded<'py> {
    /// The module `short`.
    pub fn module(&self, short: &str) -> PyResult<&Bound<'py, PyModule>> {
        self.0
            .iter()
            .find(|(name, _)| *name == short)
            .map(|(_, m)| m)
            .ok_or_else(|| pyo3::exceptions::PyLookupError::new_err(format!("no module {short}")))
    }

    /// `name` from the first module that has it.
    pub fn get(&self, name: &str) -> PyResult<Bound<'py, PyAny>> {
        for (_, m) in &self.0 {
            if let Some(v) = m.dict().get_item(name)? {
                return Ok(v);
            }
        }
        Err(pyo3::exceptions::PyAttributeError::new_err(format!(
            "the executor's Python has no {name}"
        )))
    }
}

impl Package {
    /// Loads every module in order; `prepare` sees each one before the next is loaded.
    pub fn load<'py>(
        self,
        py: Python<'py>,
        mut prepare: impl FnMut(&str, &Bound<'py, PyModule>) -> PyResult<()>,
    ) -> PyResult<Loaded<'py>> {
        let mut loaded: Vec<(&'static str, Bound<'py, PyModule>)> =
            Vec::with_capacity(self.0.len());
        for (short, src) in self.0 {
            let module = load_source(py, src)?;
            for (name, before) in &loaded {
                module.setattr(*name, before)?;
            }
            prepare(short, &module)?;
            loaded.push((short, module));
        }
        Ok(Loaded(loaded))
    }
}

/// The version of the cloudpickle copy in `executor/vendor/cloudpickle`.
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

/// The support package, from the cached code when there is one.
pub fn load(py: Python<'_>) -> PyResult<Loaded<'_>> {
    SUPPORT.load(py, |_, _| Ok(()))
}

/// The checkpoint package with flowrepl's cloudpickle: its face, `store`.
pub fn load_checkpoint(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let cloudpickle = load_source(py, &CLOUDPICKLE)?;
    cloudpickle.setattr("__version__", CLOUDPICKLE_VERSION)?;
    let loaded = CHECKPOINT.load(py, |short, module| {
        if short == "picklable" {
            // Its by-value pickler: private to it, never in sys.modules.
            module.setattr("cloudpickle", &cloudpickle)?;
        }
        Ok(())
    })?;
    loaded.module("store").cloned()
}

/// Module `src`, from the cached code when there is one.
pub fn load_source<'py>(py: Python<'py>, src: &Source) -> PyResult<Bound<'py, PyModule>> {
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
