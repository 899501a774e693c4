//! `libflowrepl_pylib.so`: flowrepl's Python executor built against one CPython version, as
//! the kernel loads it (`flowrepl_exec::python::library`). It is the only part of flowrepl
//! built once per Python version; `build.rs` builds it for every other CPython found.

flowrepl_exec::export_python!(flowrepl_executor::PYTHON);
