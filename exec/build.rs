//! The executor interface's identity ([`FLOWREPL_EXEC_ABI`]): a hash of the compiler and of
//! the sources of every type that crosses between the kernel and a per-version Python library
//! (`flowrepl_exec::python`). Rust has no stable ABI, so a kernel loads only a library built
//! by the same compiler from the same sources, with the same profile: both sides compile this
//! crate, and the library says its hash before the kernel uses anything in it.

use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};

/// The crates whose types cross the boundary (this one and what its interface names), and the
/// lock file that pins their dependencies.
const SOURCES: [&str; 5] = ["exec", "protocol", "os", "task-logger", "Cargo.lock"];

fn main() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut h = DefaultHasher::new();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    if let Ok(out) = std::process::Command::new(rustc).arg("-vV").output() {
        h.write(&out.stdout);
    }
    h.write(std::env::var("PROFILE").unwrap_or_default().as_bytes());
    for source in SOURCES {
        let path = workspace.join(source);
        println!("cargo:rerun-if-changed={}", path.display());
        let mut files = Vec::new();
        walk(&path, &mut files);
        files.sort();
        for f in files {
            h.write(
                f.strip_prefix(workspace)
                    .unwrap_or(&f)
                    .as_os_str()
                    .as_encoded_bytes(),
            );
            h.write(&std::fs::read(&f).unwrap_or_default());
        }
    }
    println!("cargo:rustc-env=FLOWREPL_EXEC_ABI={:016x}", h.finish());
}

fn walk(path: &Path, out: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            for e in entries.flatten() {
                walk(&e.path(), out);
            }
        }
        Err(_) if path.is_file() => out.push(path.to_path_buf()),
        Err(_) => {}
    }
}
