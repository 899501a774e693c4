//! The library links libpython (rpath, build facts), and one `cargo build` makes it for every
//! other CPython 3.10+ on the machine too, so that one build serves them all.
//!
//! pyo3 builds against one interpreter per cargo invocation, so each other version is a
//! nested `cargo build` of this package with `PYO3_PYTHON` set. The nested builds share one
//! target directory, `<target>/flowrepl-python/build/`, where only the crates that depend on
//! the Python version (pyo3, the worker, this library) are built per version (see
//! [`VERSION_KEY`]); each version's library is then placed in
//! `<target>/flowrepl-python/<major.minor>/<profile>/`, where the kernel finds it
//! (`flowrepl_cli::choice`). The kernel itself is built once, without Python. Figures:
//! docs/design.md. Which interpreters:
//! - `FLOWREPL_PYTHONS` unset: every supported CPython found (pyenv, /usr/local/bin,
//!   /usr/bin), one per version, preferring one with a shared libpython;
//! - `FLOWREPL_PYTHONS=path:path`: those; `FLOWREPL_PYTHONS=build`: only the build's own.
//!
//! A version whose build fails is reported as a cargo warning and not served; the rest of the
//! build goes on.

include!("../executor/build/python_env.rs");

use std::path::Path;

fn main() {
    let facts = emit_python_link_facts();
    let root = versions_dir();
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "debug".into());
    for var in ["FLOWREPL_PYTHONS", "FLOWREPL_NESTED_BUILD", "PYENV_ROOT"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let wanted = std::env::var("FLOWREPL_PYTHONS").ok();
    if std::env::var_os("FLOWREPL_NESTED_BUILD").is_some() || wanted.as_deref() == Some("build") {
        return;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    // The nested builds compile these sources too: build again when they change.
    for dir in [
        "pylib",
        "executor",
        "exec",
        "os",
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
        build_library(&workspace, &root, &profile, &other);
    }
}

/// The crates whose build differs by Python version (pyo3 reads the interpreter's config in
/// its build scripts; the worker and this library link libpython). The nested builds share
/// one target directory, so that the rest (serde, clap, nix, tracing, ...) is built once for
/// all versions; a profile override of [`VERSION_KEY`] keeps these crates' artifacts apart
/// by version (cargo hashes a crate's profile, and its dependencies' hashes, into its
/// artifact names), so that building one version never overwrites another's and a rebuild
/// after an edit rebuilds only what the edit touched.
const VERSION_KEY: &str = "pyo3-build-config";

/// This package's library file, as cargo names a cdylib.
fn library_file() -> String {
    format!("lib{}.so", env!("CARGO_PKG_NAME").replace('-', "_"))
}

fn build_library(workspace: &Path, root: &Path, profile: &str, python: &PythonFacts) {
    let started = std::time::Instant::now();
    tell(&format!(
        "flowrepl: building the Python library for Python {} ({}), so that this build serves every CPython found (FLOWREPL_PYTHONS=build: only the build's own)",
        python.version, python.executable
    ));
    let shared = root.join("build");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        env!("CARGO_PKG_NAME"),
        "--lib",
        "--manifest-path",
    ])
    .arg(workspace.join("Cargo.toml"))
    .arg("--target-dir")
    .arg(&shared)
    .arg("--config")
    .arg(version_key(profile, &python.version));
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
        Ok(s) => {
            println!(
                "cargo:warning=flowrepl: the Python library for Python {} ({}) did not build ({s}); that version is not served",
                python.version, python.executable
            );
            return;
        }
        Err(e) => {
            println!(
                "cargo:warning=flowrepl: cannot run cargo for Python {}: {e}",
                python.version
            );
            return;
        }
    }
    // Out of the shared directory, before the next version's build replaces it there: into
    // `<root>/<version>/<profile>/`, where the kernel looks.
    let to = root.join(&python.version).join(profile);
    if to.join(".fingerprint").is_dir() {
        // A whole target directory of an older layout: only the library belongs here now.
        let _ = std::fs::remove_dir_all(&to);
    }
    // Per-version kernels of the layout before the library.
    for old in ["flowrepl-kernel", "flowrepl-worker"] {
        let _ = std::fs::remove_file(to.join(old));
    }
    let file = library_file();
    if let Err(e) = place(&shared.join(profile).join(&file), &to.join(&file)) {
        println!(
            "cargo:warning=flowrepl: the Python library for Python {} was built but not placed ({e}); that version is not served",
            python.version
        );
        return;
    }
    tell(&format!(
        "flowrepl: the Python library for Python {} is ready ({:.0} s)",
        python.version,
        started.elapsed().as_secs_f64()
    ));
}

/// The `--config` override that keeps version `version`'s artifacts apart: codegen units of
/// a small build-time crate (no effect on the library's code), a number per version.
fn version_key(profile: &str, version: &str) -> String {
    let cargo_profile = if profile == "release" {
        "release"
    } else {
        "dev"
    };
    let minor: u32 = version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    format!(
        "profile.{cargo_profile}.package.{VERSION_KEY}.codegen-units={}",
        100 + minor
    )
}

/// Hard-links `from` to `to` (a copy where links are refused) through a temporary name and a
/// rename, so that a kernel that has the old library loaded keeps its file as it was.
fn place(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to.parent().expect("a file in a folder"))?;
    let tmp = to.with_extension("so.new");
    let _ = std::fs::remove_file(&tmp);
    std::fs::hard_link(from, &tmp).or_else(|_| std::fs::copy(from, &tmp).map(drop))?;
    std::fs::rename(&tmp, to)
}

/// One line for the person watching the build: cargo shows a build script's output only
/// after it ends, so it goes to the terminal itself (nowhere when there is none, as in CI).
fn tell(line: &str) {
    use std::io::Write;
    if let Ok(mut tty) = std::fs::OpenOptions::new().write(true).open("/dev/tty") {
        let _ = writeln!(tty, "{line}");
    }
}
