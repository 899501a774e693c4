//! A per-version Python library: what it exports ([`export_python!`](crate::export_python))
//! and how the kernel and the worker load it ([`load`]).
//!
//! The boundary is Rust's own (the [`PythonBuild`] table and the [`PythonExecutor`] trait
//! object), which has no stable ABI. It holds because both sides are compiled by the same
//! compiler from the same sources with the same profile, which [`ABI`] certifies: the library
//! says its hash first, through a C function, and a library of another build is refused with
//! a clear error before anything else in it is touched. Both sides allocate with the system
//! allocator, so boxes and strings cross freely; the library is never unloaded.
//!
//! [`PythonExecutor`]: super::PythonExecutor

use super::PythonBuild;
use std::ffi::{c_char, CStr};
use std::path::{Path, PathBuf};

/// The hash of the compiler, the profile and the sources of every type that crosses the
/// boundary (`exec/build.rs`).
pub const ABI: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("FLOWREPL_EXEC_ABI"), "\0").as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("the ABI hash is one C string"),
    };

/// The exported function that returns the library's [`ABI`] (a C string).
pub const ABI_SYMBOL: &str = "flowrepl_python_abi";
/// The exported function that returns the library's [`PythonBuild`].
pub const BUILD_SYMBOL: &str = "flowrepl_python_build";

/// Exports `$build` (a `static` [`PythonBuild`]) from the library crate that calls it, under
/// the names [`load`] asks for.
#[macro_export]
macro_rules! export_python {
    ($build:path) => {
        /// This library's interface hash ([`flowrepl_exec::python::library::ABI`]).
        #[no_mangle]
        pub extern "C" fn flowrepl_python_abi() -> *const ::std::ffi::c_char {
            $crate::python::library::ABI.as_ptr()
        }

        /// This library's executor table; call only after checking `flowrepl_python_abi`.
        #[no_mangle]
        pub extern "C" fn flowrepl_python_build() -> *const $crate::python::PythonBuild {
            &$build
        }
    };
}

/// Why a library cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No library was named, and this build links no executor.
    #[error("this flowrepl build links no Python executor: name the Python library of the interpreter's version")]
    NoneNamed,
    /// The loader refused it (missing, not a shared library, libpython not found).
    #[error("cannot load the Python library {path}: {reason}")]
    Open {
        /// The library.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// It is not a flowrepl Python library.
    #[error("{path} is not a flowrepl Python library (no {symbol})")]
    NotOurs {
        /// The library.
        path: PathBuf,
        /// The missing symbol.
        symbol: &'static str,
    },
    /// It was built from other sources, by another compiler or with another profile.
    #[error("the Python library {path} belongs to another flowrepl build (interface {theirs}, this build's {ours}); rebuild with `cargo build`")]
    OtherBuild {
        /// The library.
        path: PathBuf,
        /// Its interface hash.
        theirs: String,
        /// This build's.
        ours: String,
    },
}

/// Loads the library at `path` (for good: its code backs every executor it starts) and
/// returns its table, after checking it was built with this build ([`ABI`]).
///
/// It is loaded with `RTLD_GLOBAL`, so that libpython (its dependency, found through its
/// rpath) lends its symbols to the extension modules cells import, as when a program links it.
pub fn load(path: &Path) -> Result<&'static PythonBuild, LoadError> {
    use libloading::os::unix::{Library, Symbol, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading runs the library's initializers: libpython's, which only set up its
    // statics, and Rust's, which registers nothing (no life-before-main in our crates).
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
        LoadError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    let not_ours = |symbol| LoadError::NotOurs {
        path: path.to_path_buf(),
        symbol,
    };
    // SAFETY: the symbol is the function `export_python!` defines, with this signature; a
    // library that is not ours and has the name anyway is out of what we guard against.
    let abi: Symbol<extern "C" fn() -> *const c_char> =
        unsafe { library.get(ABI_SYMBOL.as_bytes()) }.map_err(|_| not_ours(ABI_SYMBOL))?;
    // SAFETY: it returns a pointer to a static, NUL-terminated string (`ABI.as_ptr()`).
    let theirs = unsafe { CStr::from_ptr(abi()) };
    if theirs != ABI {
        return Err(LoadError::OtherBuild {
            path: path.to_path_buf(),
            theirs: theirs.to_string_lossy().into_owned(),
            ours: ABI.to_string_lossy().into_owned(),
        });
    }
    // SAFETY: as for the ABI symbol.
    let build: Symbol<extern "C" fn() -> *const PythonBuild> =
        unsafe { library.get(BUILD_SYMBOL.as_bytes()) }.map_err(|_| not_ours(BUILD_SYMBOL))?;
    let build = build();
    // Never unloaded: the table and every executor's code live in it.
    std::mem::forget(library);
    // SAFETY: the pointer is to a `static` of the library, which stays loaded; its type is
    // laid out as ours, since both were compiled from the same sources by the same compiler
    // with the same profile (the ABI hash just checked).
    Ok(unsafe { &*build })
}
