//! Starting the embedded interpreter so it finds the right standard library and venv.
//!
//! The interpreter derives `sys.prefix` (and so the stdlib and site-packages) from its program
//! name. We initialise through `PyConfig` with `program_name` set to the python to emulate:
//! `--python PATH` (an interpreter, or a venv directory), else `$VIRTUAL_ENV/bin/python`, else
//! the interpreter flowrepl was built against. Its `sys.executable` then names that python,
//! which is what `subprocess` and `multiprocessing` start. A venv must be of the same
//! major.minor version as the embedded libpython; that is checked before starting.

use pyo3::ffi;
use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The interpreter flowrepl was built against (its real executable, not a shim).
pub const BUILD_PYTHON: &str = env!("FLOWREPL_BUILD_PYTHON");
/// Its `major.minor`.
pub const BUILD_PYTHON_VERSION: &str = env!("FLOWREPL_BUILD_PYTHON_VERSION");

/// Why the interpreter could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The python or venv named does not exist.
    #[error("python interpreter not found: {0}")]
    NotFound(PathBuf),
    /// The venv was made with another Python version.
    #[error("{venv} was made with Python {found}, but flowrepl embeds Python {BUILD_PYTHON_VERSION}; make the venv with that version")]
    VersionMismatch {
        /// The venv directory.
        venv: PathBuf,
        /// The version its pyvenv.cfg names.
        found: String,
    },
    /// CPython refused to start.
    #[error("python initialisation failed: {0}")]
    Python(String),
    /// A path contains a NUL byte.
    #[error("path contains a NUL byte: {0}")]
    Nul(PathBuf),
}

/// Which python to emulate: `explicit` (`--python`), else `virtual_env` (`VIRTUAL_ENV`), else
/// the build interpreter. Checks that it exists and that a venv's version matches.
pub fn resolve_python(
    explicit: Option<&Path>,
    virtual_env: Option<&OsStr>,
) -> Result<PathBuf, InitError> {
    let program = match (explicit, virtual_env.filter(|v| !v.is_empty())) {
        (Some(p), _) if p.is_dir() => p.join("bin/python"),
        (Some(p), _) => p.to_path_buf(),
        (None, Some(venv)) => Path::new(venv).join("bin/python"),
        (None, None) => PathBuf::from(BUILD_PYTHON),
    };
    if !program.exists() {
        return Err(InitError::NotFound(program));
    }
    if let Some(venv) = program.parent().and_then(Path::parent) {
        check_venv_version(venv)?;
    }
    Ok(program)
}

fn check_venv_version(venv: &Path) -> Result<(), InitError> {
    let Ok(cfg) = std::fs::read_to_string(venv.join("pyvenv.cfg")) else {
        return Ok(()); // not a venv
    };
    for line in cfg.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if k == "version" || k == "version_info" {
            let v = v.trim();
            let mm: Vec<&str> = v.split('.').take(2).collect();
            if mm.join(".") != BUILD_PYTHON_VERSION {
                return Err(InitError::VersionMismatch {
                    venv: venv.to_path_buf(),
                    found: v.to_owned(),
                });
            }
            return Ok(());
        }
    }
    Ok(())
}

fn status_error(status: ffi::PyStatus) -> Option<String> {
    // SAFETY: PyStatus_Exception only reads the struct.
    if unsafe { ffi::PyStatus_Exception(status) } == 0 {
        return None;
    }
    let msg = if status.err_msg.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: CPython sets err_msg to a static C string.
        unsafe { CStr::from_ptr(status.err_msg) }
            .to_string_lossy()
            .into_owned()
    };
    Some(msg)
}

/// Initialises CPython on the calling thread (which becomes Python's main thread: signal
/// handlers run there) emulating `program`, then releases the GIL so `Python::attach` works
/// from any thread. Call once per process.
pub fn initialize(program: &Path) -> Result<(), InitError> {
    let program_c = CString::new(program.as_os_str().as_bytes())
        .map_err(|_| InitError::Nul(program.to_path_buf()))?;
    // SAFETY: the PyConfig API is used as documented: init, set fields through the setters,
    // initialise, clear. Nothing else touches Python before this.
    unsafe {
        let mut config = std::mem::MaybeUninit::<ffi::PyConfig>::uninit();
        ffi::PyConfig_InitPythonConfig(config.as_mut_ptr());
        let config = config.assume_init_mut();
        config.parse_argv = 0;
        config.install_signal_handlers = 1;
        let sets: [(*mut *mut libc::wchar_t, &CStr); 3] = [
            (&mut config.program_name, program_c.as_c_str()),
            (&mut config.stdio_encoding, c"utf-8"),
            // print() of a lone surrogate writes `\udcff` instead of raising.
            (&mut config.stdio_errors, c"backslashreplace"),
        ];
        for (field, value) in sets {
            if let Some(e) =
                status_error(ffi::PyConfig_SetBytesString(config, field, value.as_ptr()))
            {
                ffi::PyConfig_Clear(config);
                return Err(InitError::Python(e));
            }
        }
        let status = ffi::Py_InitializeFromConfig(config);
        ffi::PyConfig_Clear(config);
        if let Some(e) = status_error(status) {
            return Err(InitError::Python(e));
        }
        ffi::PyEval_SaveThread();
    }
    Ok(())
}
