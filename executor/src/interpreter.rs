//! Starting the embedded interpreter so it finds the right standard library and venv.
//!
//! The interpreter derives `sys.prefix` (and so the stdlib and site-packages) from its program
//! name. We initialise through `PyConfig` with `program_name` set to the python to emulate:
//! the interpreter or venv the kernel chose (`flowrepl_pythons`), whose `major.minor` is the
//! embedded libpython's (the kernel loads the Python library built for it). Its `sys.executable`
//! then names that python, which is what `subprocess` and `multiprocessing` start.

use flowrepl_exec::setup::InitError;
use pyo3::ffi;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The interpreter flowrepl was built against (its real executable, not a shim).
pub const BUILD_PYTHON: &str = env!("FLOWREPL_BUILD_PYTHON");
/// Its `major.minor`.
pub const BUILD_PYTHON_VERSION: &str = env!("FLOWREPL_BUILD_PYTHON_VERSION");

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

/// Unit tests: the build's Python, started once per test process.
#[cfg(test)]
pub(crate) fn test_python() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| initialize(std::path::Path::new(BUILD_PYTHON)).expect("python starts"));
}
