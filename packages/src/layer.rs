//! The task's package layer on disk: its generations, the `current` link cells import from,
//! and what each holds (`<log_dir>/<plan>/<task>.packages/`).
//!
//! ```text
//! <task>.packages/
//!   current -> gen-3         the folder cells import from (on sys.path as .../current)
//!   gen-3/                   one generation: the packages, installed whole by one install
//!     .flowrepl-layer.json   what it holds (LayerState)
//!   work/                    the installer's scratch files
//! <task>.packages.json       the task's state: every requirement asked for and the layer
//! ```
//!
//! An install writes a new generation beside the current one and switches `current` to it
//! with one `rename` of a symlink: cells see the old layer or the new one, never a half of
//! either, and a failed install leaves `current` as it was. The folder is bound read-only
//! into the sandbox at start (so it exists from the kernel's start), beside the hidden log.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The link cells import from.
pub const CURRENT: &str = "current";
/// What a generation holds, inside it.
pub const MARKER: &str = ".flowrepl-layer.json";
/// A generation's name prefix.
const GENERATION: &str = "gen-";
/// The format of [`LayerState`].
pub const STATE_VERSION: u32 = 1;
/// The largest state file read (a hostile or broken one is refused, not read whole).
const MAX_STATE_BYTES: u64 = 1 << 20;

/// What a layer was resolved from and to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Every requirement the task asked for, in order, the latest for each name.
    pub requirements: Vec<String>,
    /// The layer: `name==version`, sorted by name.
    pub resolved: Vec<String>,
    /// The shared cache its files are linked from ([`crate::Trust::name`]): a kernel of the
    /// other trust level rebuilds the layer from its own cache before it uses it. `None`: a
    /// layer written before this was recorded, or a state read from the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
}

/// A task's layer folder.
#[derive(Debug, Clone)]
pub struct Layer {
    root: PathBuf,
}

impl Layer {
    /// The layer at `root` (made when missing).
    pub fn open(root: PathBuf) -> std::io::Result<Layer> {
        std::fs::create_dir_all(root.join("work"))?;
        Ok(Layer { root })
    }

    /// Its folder (bound read-only into the sandbox).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path cells put on `sys.path`: `<root>/current`.
    pub fn current(&self) -> PathBuf {
        self.root.join(CURRENT)
    }

    /// The installer's scratch folder (never writable to a build).
    pub fn work(&self) -> PathBuf {
        self.root.join("work")
    }

    /// A confined build's folder (its working folder, its cache, its `/tmp`): the only part
    /// of the layer a build may write besides the generation it installs into. Hostile to
    /// the kernel: nothing here is read by the kernel, only by confined builds.
    pub fn build_dir(&self) -> PathBuf {
        self.work().join("build")
    }

    /// Empties [`Layer::build_dir`] (at the start of an install that may build).
    pub fn fresh_build_dir(&self) -> std::io::Result<PathBuf> {
        let dir = self.build_dir();
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(dir.join("cache"))?;
        Ok(dir)
    }

    /// What the current generation holds (`None`: no generation, or an unreadable marker).
    pub fn state(&self) -> Option<LayerState> {
        read_state(&self.current().join(MARKER)).ok().flatten()
    }

    /// A new, empty generation folder.
    pub fn new_generation(&self) -> std::io::Result<PathBuf> {
        let next = self
            .generations()?
            .into_iter()
            .map(|(n, _)| n)
            .max()
            .unwrap_or(0)
            + 1;
        let dir = self.root.join(format!("{GENERATION}{next}"));
        std::fs::create_dir(&dir)?;
        Ok(dir)
    }

    /// Makes `generation` (holding `state`) the current one, then removes the others. The
    /// marker is written beneath the generation without following links (a build wrote
    /// there).
    pub fn switch(&self, generation: &Path, state: &LayerState) -> std::io::Result<()> {
        let beneath =
            flowrepl_os::beneath::Beneath::open(generation).map_err(std::io::Error::other)?;
        let mut w = beneath.write(MARKER).map_err(std::io::Error::other)?;
        std::io::Write::write_all(
            w.file(),
            &serde_json::to_vec(state).map_err(std::io::Error::other)?,
        )?;
        w.commit().map_err(std::io::Error::other)?;
        let name = generation
            .file_name()
            .ok_or_else(|| std::io::Error::other("a generation has a name"))?;
        let tmp = self.root.join(format!(".{CURRENT}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(name, &tmp)?;
        std::fs::rename(&tmp, self.current())?;
        for (_, dir) in self.generations()? {
            if dir.file_name() != Some(name) {
                self.discard(&dir);
            }
        }
        Ok(())
    }

    /// Removes a generation that will not be used (best effort).
    pub fn discard(&self, generation: &Path) {
        if let Err(e) = std::fs::remove_dir_all(generation) {
            tracing::warn!(error = %e, folder = %generation.display(), "an unused package generation was not removed");
        }
    }

    fn generations(&self) -> std::io::Result<Vec<(u64, PathBuf)>> {
        Ok(std::fs::read_dir(&self.root)?
            .flatten()
            .filter_map(|e| {
                let n = e
                    .file_name()
                    .to_str()?
                    .strip_prefix(GENERATION)?
                    .parse()
                    .ok()?;
                Some((n, e.path()))
            })
            .collect())
    }
}

/// The top-level modules the distributions `names` (normalized) installed in `generation`,
/// from their `RECORD`s: what a cell imports them as.
pub fn modules_of(generation: &Path, names: &[String]) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(generation) else {
        return Vec::new();
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(dist) = file.to_str().and_then(|f| f.strip_suffix(".dist-info")) else {
            continue;
        };
        let name = dist.rsplit_once('-').map_or(dist, |(n, _)| n);
        if !names.iter().any(|n| *n == crate::policy::normalize(name)) {
            continue;
        }
        let Some(record) = read_record(&e.path()) else {
            continue;
        };
        for line in record.lines() {
            let path = line.split(',').next().unwrap_or("");
            let Some((first, rest)) = path.split_once('/').or(Some((path, ""))) else {
                continue;
            };
            if first.is_empty()
                || first == ".."
                || first.ends_with(".dist-info")
                || first.ends_with(".data")
                || first == "__pycache__"
                || first.ends_with(".pth")
            {
                continue;
            }
            let module = if rest.is_empty() {
                // A module file: `six.py`, `_cffi.cpython-311-x86_64-linux-gnu.so`.
                match first.split_once('.') {
                    Some((m, ext)) if ext == "py" || ext.ends_with("so") => m,
                    _ => continue,
                }
            } else {
                first
            };
            if module.chars().all(|c| c.is_alphanumeric() || c == '_') {
                out.insert(module.to_owned());
            }
        }
    }
    out.into_iter().collect()
}

/// The `RECORD` of a `.dist-info` folder (a build may have written it).
fn read_record(dist_info: &Path) -> Option<String> {
    read_untrusted(&dist_info.join("RECORD"), 4 << 20)
}

/// A file a build may have written, read as hostile input (task-logger's `untrusted`, as
/// for the checkpoint folder): neither it nor its folder through a link, never a FIFO or a
/// device, at most `max` bytes (`None` for anything else, a larger file too).
pub fn read_untrusted(path: &Path, max: u64) -> Option<String> {
    use flowrepl_task_logger::untrusted::{open_beneath, read_bounded};
    let dir = path.parent()?;
    let file = open_beneath(
        dir.parent()?,
        dir.file_name()?.to_str()?,
        path.file_name()?.to_str()?,
    )
    .ok()??;
    String::from_utf8(read_bounded(file, max, path).ok()?).ok()
}

/// The first entry below `dir` that is neither a regular file nor a folder (a link, a FIFO,
/// a socket, a device), named relative to `dir` with its kind; or a note that `dir` holds more
/// than `max` entries. Nothing is followed. A wheel holds only files and folders: anything
/// else in a generation a build wrote into was put there by the build's code.
pub fn special_entry(dir: &Path, max: usize) -> Option<String> {
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => return Some(format!("{} (unreadable: {e})", d.display())),
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > max {
                return Some(format!("more than {max} entries"));
            }
            let Ok(kind) = e.file_type() else { continue };
            let path = e.path();
            let shown = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_symlink() {
                return Some(format!("a link, {shown}"));
            } else if !kind.is_file() {
                return Some(format!("a FIFO, socket or device, {shown}"));
            }
        }
    }
    None
}

/// Reads a state file (`None`: there is none). A file over 1 MiB, not JSON, or of another
/// version is an error; so is anything but a regular file (opened without following a link
/// and without blocking, the type checked on the descriptor: a FIFO put there would stop the
/// kernel, which reads it outside the sandbox).
pub fn read_state(path: &Path) -> std::io::Result<Option<LayerState>> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::SFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    let fd = match nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(std::io::Error::other(format!("{}: {e}", path.display()))),
    };
    let kind = SFlag::from_bits_truncate(nix::sys::stat::fstat(&fd)?.st_mode) & SFlag::S_IFMT;
    if kind != SFlag::S_IFREG {
        return Err(std::io::Error::other(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    let bytes = flowrepl_task_logger::untrusted::read_bounded(
        std::fs::File::from(fd),
        MAX_STATE_BYTES,
        path,
    )
    .map_err(|_| std::io::Error::other("over 1 MiB"))?;
    let text = String::from_utf8(bytes).map_err(std::io::Error::other)?;
    let state: LayerState = serde_json::from_str(&text).map_err(std::io::Error::other)?;
    if state.version != STATE_VERSION {
        return Err(std::io::Error::other(format!(
            "format version {} (this kernel reads {STATE_VERSION})",
            state.version
        )));
    }
    Ok(Some(state))
}

/// Writes `value` as JSON to `path` through a temporary file and a rename.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec(value).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_one_rename_and_leaves_one_generation() {
        let dir = tempfile::tempdir().unwrap();
        let layer = Layer::open(dir.path().join("t.packages")).unwrap();
        assert_eq!(layer.state(), None);
        let one = layer.new_generation().unwrap();
        std::fs::write(one.join("a.py"), "A = 1\n").unwrap();
        let s1 = LayerState {
            version: STATE_VERSION,
            requirements: vec!["a".into()],
            resolved: vec!["a==1".into()],
            cache: Some("sandboxed".into()),
        };
        layer.switch(&one, &s1).unwrap();
        assert_eq!(layer.state(), Some(s1));
        assert!(layer.current().join("a.py").is_file());
        let two = layer.new_generation().unwrap();
        assert_ne!(one, two);
        let s2 = LayerState {
            version: STATE_VERSION,
            requirements: vec!["b".into()],
            resolved: vec!["b==2".into()],
            cache: None,
        };
        layer.switch(&two, &s2).unwrap();
        assert_eq!(layer.state(), Some(s2));
        assert!(!one.exists(), "the old generation is removed");
        assert!(!layer.current().join("a.py").exists());
    }

    #[test]
    fn modules_come_from_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let g = dir.path();
        std::fs::create_dir_all(g.join("Tiny_Pkg-2.0.dist-info")).unwrap();
        std::fs::write(
            g.join("Tiny_Pkg-2.0.dist-info/RECORD"),
            "tinypkg/__init__.py,sha256=x,1\ntinypkg/sub/x.py,,\nsix.py,,\n_speed.cpython-311-x86_64-linux-gnu.so,,\nx.pth,,\nTiny_Pkg-2.0.dist-info/METADATA,,\n../../bin/evil,,\n",
        )
        .unwrap();
        assert_eq!(
            modules_of(g, &["tiny-pkg".into()]),
            ["_speed", "six", "tinypkg"]
        );
        assert!(modules_of(g, &["other".into()]).is_empty());
    }

    #[test]
    fn what_a_build_wrote_is_read_through_no_link_and_no_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("secret"), "host secret").unwrap();
        std::fs::write(d.join("plain"), "ok").unwrap();
        std::os::unix::fs::symlink(d.join("secret"), d.join("link")).unwrap();
        std::os::unix::fs::symlink(d, d.join("linkdir")).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(read_untrusted(&d.join("plain"), 100).as_deref(), Some("ok"));
        // Opened by path, the link leads to the secret; read as hostile input, nothing.
        assert_eq!(
            std::fs::read_to_string(d.join("link")).unwrap(),
            "host secret"
        );
        assert_eq!(read_untrusted(&d.join("link"), 100), None);
        assert_eq!(read_untrusted(&d.join("linkdir/secret"), 100), None);
        let started = std::time::Instant::now();
        assert_eq!(read_untrusted(&d.join("fifo"), 100), None);
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // A switch writes its marker beside a planted link without following it.
        let layer = Layer::open(d.join("t.packages")).unwrap();
        let g = layer.new_generation().unwrap();
        std::os::unix::fs::symlink(d.join("secret"), g.join(MARKER)).unwrap();
        let state = LayerState {
            version: STATE_VERSION,
            ..LayerState::default()
        };
        layer.switch(&g, &state).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join("secret")).unwrap(),
            "host secret"
        );
        assert_eq!(layer.state(), Some(state));
    }

    #[test]
    fn links_and_fifos_a_build_left_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("pkg/sub")).unwrap();
        std::fs::write(d.join("pkg/sub/m.py"), "").unwrap();
        assert_eq!(special_entry(d, 100), None);
        std::os::unix::fs::symlink("/root", d.join("pkg/zz_link")).unwrap();
        assert_eq!(special_entry(d, 100).unwrap(), "a link, pkg/zz_link");
        std::fs::remove_file(d.join("pkg/zz_link")).unwrap();
        nix::unistd::mkfifo(
            &d.join("pkg/sub/RECORD"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(special_entry(d, 100).unwrap().contains("FIFO"));
        assert!(special_entry(d, 2).unwrap().contains("more than 2"));
    }

    #[test]
    fn a_state_file_of_another_version_or_too_big_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        assert!(read_state(&p).unwrap().is_none());
        // A FIFO or a link in its place is an error at once, not a kernel stopped reading it.
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_state(&p).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &p).unwrap();
        assert!(read_state(&p).is_err());
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, r#"{"version":9,"requirements":[],"resolved":[]}"#).unwrap();
        assert!(read_state(&p).is_err());
        std::fs::write(&p, " ".repeat(2 << 20)).unwrap();
        assert!(read_state(&p).is_err());
    }
}
