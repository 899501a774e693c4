//! The kernel links libpython like the worker library (rpath, build facts), and makes one
//! kernel per other CPython 3.10+ on the machine, so that one `cargo build` serves them all.
//!
//! pyo3 builds against one interpreter per cargo invocation, so each other version is a
//! nested `cargo build` of this package with `PYO3_PYTHON` set, into its own target directory
//! `<target>/flowrepl-python/<major.minor>/` (the same profile as this build). The launcher
//! finds them there (`FLOWREPL_KERNELS_DIR`). Which interpreters:
//! - `FLOWREPL_PYTHONS` unset: every supported CPython found (pyenv, /usr/local/bin,
//!   /usr/bin), one per version, preferring one with a shared libpython;
//! - `FLOWREPL_PYTHONS=path:path`: those; `FLOWREPL_PYTHONS=build` (or the `single-python`
//!   feature): only the build's own.
//!
//! A version whose build fails is reported as a cargo warning and not served; the rest of the
//! build goes on.

include!("../worker/build/python_env.rs");

use std::path::{Path, PathBuf};

fn main() {
    let facts = emit_python_link_facts();
    let root = kernels_dir();
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "debug".into());
    println!("cargo:rustc-env=FLOWREPL_KERNELS_DIR={}", root.display());
    println!("cargo:rustc-env=FLOWREPL_KERNELS_PROFILE={profile}");
    for var in ["FLOWREPL_PYTHONS", "FLOWREPL_NESTED_BUILD", "PYENV_ROOT"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let wanted = std::env::var("FLOWREPL_PYTHONS").ok();
    if std::env::var_os("FLOWREPL_NESTED_BUILD").is_some()
        || std::env::var_os("CARGO_FEATURE_SINGLE_PYTHON").is_some()
        || wanted.as_deref() == Some("build")
    {
        return;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    // The nested builds compile these sources too: build again when they change.
    for dir in [
        "kernel/src",
        "kernel/Cargo.toml",
        "worker",
        "protocol",
        "task-logger",
        "pythons",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    let candidates: Vec<String> = match &wanted {
        Some(list) => list
            .split(':')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
        None => flowrepl_pythons::discover()
            .into_iter()
            .map(|f| f.program.display().to_string())
            .collect(),
    };
    let mut done = vec![facts.version.clone()];
    for python in candidates {
        let other = match python_facts(&python) {
            Ok(f) => f,
            Err(e) => {
                println!("cargo:warning=flowrepl: skipping {python}: {e}");
                continue;
            }
        };
        if done.contains(&other.version) {
            continue;
        }
        if !other.shared {
            if wanted.is_some() {
                println!("cargo:warning=flowrepl: {python} has no shared libpython; Python {} is not served", other.version);
            }
            continue;
        }
        done.push(other.version.clone());
        build_kernel(&workspace, &root, &profile, &other);
    }
}

/// `<target>/flowrepl-python`.
fn kernels_dir() -> PathBuf {
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

fn build_kernel(workspace: &Path, root: &Path, profile: &str, python: &PythonFacts) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "flowrepl",
        "--bins",
        "--manifest-path",
    ])
    .arg(workspace.join("Cargo.toml"))
    .arg("--target-dir")
    .arg(root.join(&python.version));
    if profile == "release" {
        cmd.arg("--release");
    }
    // The nested build is a plain build of this package (not clippy's, not this script's).
    cmd.env("PYO3_PYTHON", &python.executable)
        .env("FLOWREPL_NESTED_BUILD", "1")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .stdout(std::process::Stdio::null());
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => println!(
            "cargo:warning=flowrepl: the kernel for Python {} ({}) did not build ({s}); that version is not served",
            python.version, python.executable
        ),
        Err(e) => println!("cargo:warning=flowrepl: cannot run cargo for Python {}: {e}", python.version),
    }
}
