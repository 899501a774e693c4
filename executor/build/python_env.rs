// Shared by the build scripts of every crate that links libpython (included with `include!`).
//
// pyo3 links libpython with `-L` only and emits no rpath, so without one the loader silently
// picks Debian's system libpython instead of the interpreter we built against. We ask that
// interpreter (PYO3_PYTHON, else `python3`, as pyo3 does) for its LIBDIR and add an rpath, and
// record its executable and version so the binary can find its standard library at run time.

/// What an interpreter says about itself: LIBDIR, `sys.executable`, `major.minor`, and
/// whether its shared libpython exists.
#[allow(dead_code)]
struct PythonFacts {
    libdir: String,
    executable: String,
    version: String,
    shared: bool,
}

fn python_facts(python: &str) -> Result<PythonFacts, String> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import os, sys, sysconfig\n\
             v = sysconfig.get_config_var\n\
             lib = os.path.join(v('LIBDIR') or '', v('LDLIBRARY') or '')\n\
             print(v('LIBDIR')); print(sys.executable); print('%d.%d' % sys.version_info[:2])\n\
             print(int(bool(v('Py_ENABLE_SHARED')) or (lib.endswith('.so') and os.path.exists(lib))))",
        ])
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let text = String::from_utf8(out.stdout).map_err(|e| e.to_string())?;
    let mut lines = text.lines().map(str::to_owned);
    let mut next = |what: &str| lines.next().ok_or(format!("{python} did not say its {what}"));
    Ok(PythonFacts {
        libdir: next("LIBDIR")?,
        executable: next("executable")?,
        version: next("version")?,
        shared: next("shared")? == "1",
    })
}

/// The interpreter pyo3 builds against.
fn build_python() -> String {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// The build's interpreter, as `FLOWREPL_BUILD_PYTHON` and `FLOWREPL_BUILD_PYTHON_VERSION`
/// for the crate being built.
fn emit_python_facts() -> PythonFacts {
    let python = build_python();
    let facts = python_facts(&python).unwrap_or_else(|e| panic!("locating libpython: {e}"));
    println!("cargo:rustc-env=FLOWREPL_BUILD_PYTHON={}", facts.executable);
    println!("cargo:rustc-env=FLOWREPL_BUILD_PYTHON_VERSION={}", facts.version);
    facts
}

/// [`emit_python_facts`], and the rpath to the build interpreter's libpython for what this
/// crate links.
#[allow(dead_code)]
fn emit_python_link_facts() -> PythonFacts {
    let facts = emit_python_facts();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", facts.libdir);
    facts
}

/// `<target>/flowrepl-python`: the per-version Python libraries, one folder per version
/// (`<major.minor>/<profile>/`), and the nested builds' shared target directory (`build/`).
#[allow(dead_code)]
fn versions_dir() -> std::path::PathBuf {
    use std::path::{Path, PathBuf};
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => {
            // OUT_DIR is <target>/[<triple>/]<profile>/build/<pkg>/out.
            let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
            out.ancestors()
                .find(|a| a.join("CACHEDIR.TAG").is_file())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| {
                    out.ancestors()
                        .nth(4)
                        .expect("OUT_DIR is deep")
                        .to_path_buf()
                })
        }
    };
    std::path::absolute(target.join("flowrepl-python")).expect("absolute target dir")
}
