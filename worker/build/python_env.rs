// Shared by the build scripts of every crate that links libpython (included with `include!`).
//
// pyo3 links libpython with `-L` only and emits no rpath, so without one the loader silently
// picks Debian's system libpython instead of the interpreter we built against. We ask that
// interpreter (PYO3_PYTHON, else `python3`, as pyo3 does) for its LIBDIR and add an rpath, and
// record its executable and version so the binary can find its standard library at run time.

fn python_build_facts() -> (String, String, String) {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import sys, sysconfig; print(sysconfig.get_config_var('LIBDIR')); \
             print(sys.executable); print('%d.%d' % sys.version_info[:2])",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} to locate libpython: {e}"));
    assert!(out.status.success(), "{python} failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("python printed UTF-8");
    let mut lines = text.lines().map(str::to_owned);
    let libdir = lines.next().expect("LIBDIR");
    let executable = lines.next().expect("sys.executable");
    let version = lines.next().expect("version");
    (libdir, executable, version)
}

fn emit_python_link_facts() {
    let (libdir, executable, version) = python_build_facts();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    println!("cargo:rustc-env=FLOWREPL_BUILD_PYTHON={executable}");
    println!("cargo:rustc-env=FLOWREPL_BUILD_PYTHON_VERSION={version}");
}
