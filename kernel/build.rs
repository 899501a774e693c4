//! What the kernel knows about Python at build time: the build's interpreter (the one it
//! serves when nothing else is asked for) and where the per-version Python libraries are
//! (`pylib/build.rs` puts them there). The kernel links no Python, except with the
//! `static-python` feature (`pip install`), which links the build interpreter's executor into
//! it: then it needs libpython's rpath as the library does.

include!("../executor/build/python_env.rs");

fn main() {
    if std::env::var_os("CARGO_FEATURE_STATIC_PYTHON").is_some() {
        emit_python_link_facts();
    } else {
        emit_python_facts();
    }
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "debug".into());
    println!(
        "cargo:rustc-env=FLOWREPL_VERSIONS_DIR={}",
        versions_dir().display()
    );
    println!("cargo:rustc-env=FLOWREPL_VERSIONS_PROFILE={profile}");
}
