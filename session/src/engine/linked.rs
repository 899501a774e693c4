//! The executor linked into this binary (the `static-python` feature), if any. Shared as a
//! source file by the engine and the `flowrepl-worker` binary, which links neither the
//! session nor the fronts (its thin-LTO link would take them in).

use flowrepl_exec::python::library::LoadError;
use flowrepl_exec::python::PythonBuild;

/// The linked executor, or [`LoadError::NoneNamed`] in a build that links none.
pub fn linked() -> Result<&'static PythonBuild, LoadError> {
    #[cfg(feature = "static-python")]
    return Ok(&flowrepl_executor::PYTHON);
    #[cfg(not(feature = "static-python"))]
    Err(LoadError::NoneNamed)
}
