//! The library as built here loads through the kernel's loader (`flowrepl_exec::python::
//! library::load`) and says it serves the build's Python.

#[test]
fn the_built_library_loads_and_names_its_python() {
    // Tests run from target/<profile>/deps/, where `cargo test` builds the library.
    let exe = std::env::current_exe().unwrap();
    let lib = exe.with_file_name("libflowrepl_pylib.so");
    let build = flowrepl_exec::python::library::load(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    assert_eq!(build.python, env!("FLOWREPL_BUILD_PYTHON"));
    assert_eq!(build.python_version, env!("FLOWREPL_BUILD_PYTHON_VERSION"));
}
