//! What a caller may ask for, as the operator set it: packages on or off, the index, the
//! allow list, whether sdists may be built, the timeout. Nothing here comes from a caller.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest requirement accepted, in bytes.
pub const MAX_REQUIREMENT_BYTES: usize = 256;

/// The operator's settings (`--packages`, `--uv`, `--index-url`, `--extra-index-url`,
/// `--packages-allow`, `--packages-build`, `--packages-timeout-s`, `--packages-cache`).
#[derive(Debug, Clone)]
pub struct Policy {
    /// `--packages on` (the default).
    pub enabled: bool,
    /// `--uv PATH`; `None`: `uv` on `PATH`, else pip.
    pub uv: Option<PathBuf>,
    /// `--index-url`; `None`: the installer's default (PyPI).
    pub index_url: Option<String>,
    /// `--extra-index-url`, in order.
    pub extra_index_urls: Vec<String>,
    /// `--packages-allow FILE`, read; `None`: every name.
    pub allow: Option<AllowList>,
    /// `--packages-build`: sdists may be built, in a sandboxed worker.
    pub build: bool,
    /// How long one install may take.
    pub timeout: Duration,
    /// `--packages-cache`: the root of the shared caches (one per trust level, see
    /// [`crate::Trust`]); `None`: [`Policy::cache_root`]'s default.
    pub cache_dir: Option<PathBuf>,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            enabled: true,
            uv: None,
            index_url: None,
            extra_index_urls: Vec::new(),
            allow: None,
            build: false,
            timeout: Duration::from_secs(300),
            cache_dir: None,
        }
    }
}

/// The hosts of uv's and pip's default index (PyPI): its pages, and where its files are.
pub const DEFAULT_INDEX_HOSTS: [&str; 2] = ["pypi.org:443", "files.pythonhosted.org:443"];

/// The root of the shared caches without `--packages-cache`:
/// `$XDG_CACHE_HOME/flowrepl-packages`, else `~/.cache/flowrepl-packages` (`None`: no home).
pub fn default_cache_root() -> Option<PathBuf> {
    let home = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    home("XDG_CACHE_HOME")
        .or_else(|| home("HOME").map(|h| h.join(".cache")))
        .map(|c| c.join("flowrepl-packages"))
}

impl Policy {
    /// The root of the shared caches: `--packages-cache`, else
    /// `$XDG_CACHE_HOME/flowrepl-packages`, else `~/.cache/flowrepl-packages` (`None`: no
    /// home). Not uv's own cache: the user's uv links it into the user's venvs, which any
    /// program of the user may edit.
    pub fn cache_root(&self) -> Option<PathBuf> {
        self.cache_dir.clone().or_else(default_cache_root)
    }

    /// Where the installer fetches from, as `host:port` (an IPv6 address in brackets): the
    /// hosts of `--index-url` (by default PyPI's, [`DEFAULT_INDEX_HOSTS`]) and of each
    /// `--extra-index-url`, each once. A `file:` index names none. `Err`: a URL that is not
    /// `http`, `https` or `file`, or has no host.
    pub fn index_hosts(&self) -> Result<Vec<String>, String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |h: String| {
            if !out.contains(&h) {
                out.push(h);
            }
        };
        match &self.index_url {
            None => DEFAULT_INDEX_HOSTS
                .iter()
                .for_each(|h| add((*h).to_owned())),
            Some(u) => {
                if let Some(h) = url_host(u)? {
                    add(h);
                }
            }
        }
        for u in &self.extra_index_urls {
            if let Some(h) = url_host(u)? {
                add(h);
            }
        }
        Ok(out)
    }
}

/// `host:port` of an `http(s)` URL (the scheme's port when none is written); `None` for a
/// `file:` URL.
fn url_host(url: &str) -> Result<Option<String>, String> {
    let bad = |why: &str| Err(format!("the index URL {url:?} {why}"));
    let Some((scheme, rest)) = url.split_once(':') else {
        return bad("has no scheme");
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "file" => return Ok(None),
        "http" => 80,
        "https" => 443,
        _ => return bad("is not http, https or file"),
    };
    let Some(rest) = rest.strip_prefix("//") else {
        return bad("has no host");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Credentials (`user:password@`) are not part of the host.
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(inner) = host_port.strip_prefix('[') {
        let Some((addr, after)) = inner.split_once(']') else {
            return bad("has an unclosed [");
        };
        (format!("[{addr}]"), after.strip_prefix(':'))
    } else {
        match host_port.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (host_port.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return bad("has no host");
    }
    let port = match port {
        None | Some("") => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return bad("has a port that is not one"),
        },
    };
    Ok(Some(format!("{}:{port}", host.to_ascii_lowercase())))
}

/// Why a requirement or the allow list is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// Not a requirement this kernel takes.
    #[error("{0:?} is not a requirement flowrepl installs: {1}")]
    Bad(String, &'static str),
    /// Not on the operator's allow list.
    #[error("{0} is not on the operator's allow list (--packages-allow {1})")]
    NotAllowed(String, String),
    /// The allow list cannot be read.
    #[error("--packages-allow {0}: {1}")]
    AllowList(String, String),
}

/// One requirement, checked: a name, optional extras, version specifiers and a marker, as
/// pip writes them; never a URL, a path or an option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// As given, trimmed.
    pub text: String,
    /// The name, normalized (PEP 503: lower case, runs of `-_.` as one `-`).
    pub name: String,
}

/// PEP 503 normalization of a distribution's name.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

impl Requirement {
    /// Checks `text`. Refused: anything but `name[extras] specifiers ; marker` (URLs, `@`
    /// direct references, paths, options, control characters, more than
    /// [`MAX_REQUIREMENT_BYTES`]).
    pub fn parse(text: &str) -> Result<Requirement, PolicyError> {
        let bad = |why| Err(PolicyError::Bad(text.chars().take(80).collect(), why));
        let t = text.trim();
        if t.is_empty() {
            return bad("it is empty");
        }
        if t.len() > MAX_REQUIREMENT_BYTES {
            return bad("it is too long");
        }
        if t.chars().any(char::is_control) {
            return bad("it holds control characters");
        }
        if t.starts_with('-') {
            return bad("options are not taken; the operator sets the installer's options");
        }
        if t.contains('@') || t.contains("://") {
            return bad("direct references (URLs, `name @ url`) are not taken; packages come from the operator's index");
        }
        if t.contains('/')
            || t.contains('\\')
            || t.starts_with(['.', '~'])
            || t.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("file:"))
        {
            return bad(NOT_A_FILE);
        }
        let (spec, marker) = match t.split_once(';') {
            Some((s, m)) => (s.trim(), Some(m.trim())),
            None => (t, None),
        };
        let end = spec.find(|c| !name_char(c)).unwrap_or(spec.len());
        let name = &spec[..end];
        if name.is_empty()
            || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
            || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
        {
            return bad("it does not start with a package name");
        }
        if file_name(name) {
            return bad(NOT_A_FILE);
        }
        let mut rest = spec[end..].trim_start();
        if let Some(after) = rest.strip_prefix('[') {
            let Some((extras, tail)) = after.split_once(']') else {
                return bad("its extras are not closed with ]");
            };
            if !extras
                .split(',')
                .all(|e| !e.trim().is_empty() && e.trim().chars().all(name_char))
            {
                return bad("its extras are not names");
            }
            rest = tail.trim_start();
        }
        let version_char = |c: char| c.is_ascii_alphanumeric() || " .,*+!<>=~()".contains(c);
        if !rest.is_empty()
            && (!rest.starts_with(['<', '>', '=', '!', '~', '('])
                || !rest.chars().all(version_char))
        {
            return bad("its version specifiers are not like `>=2`, `==1.15`, `~=1.0,<2`");
        }
        if let Some(m) = marker {
            if !marker_ok(m) {
                return bad("its environment marker is not one (PEP 508: python_version >= '3.10', sys_platform == 'linux', ...)");
            }
        }
        Ok(Requirement {
            text: t.to_owned(),
            name: normalize(name),
        })
    }
}

/// Why a path or a file name is refused (uv and pip would look for a local file).
const NOT_A_FILE: &str = "file names and paths are not requirements (the installer would look for a local file); packages come from the operator's index by name, e.g. six==1.16.0 (a package whose name ends in .whl, .zip, .tar... is named with - instead: foo-zip)";

/// The endings of the files installers take for a path rather than a name: wheels, sdists and
/// other archives (uv reads `foo.tar.gz` or `six-1.16.0-py2.py3-none-any.whl` as a file in its
/// working folder).
const FILE_ENDINGS: [&str; 16] = [
    ".whl",
    ".zip",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tbz2",
    ".tar.xz",
    ".txz",
    ".tar.zst",
    ".tzst",
    ".tar.lz",
    ".tlz",
    ".tar.lzma",
    ".egg",
];

/// Whether `name` ends as a file an installer would read does.
fn file_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    FILE_ENDINGS.iter().any(|e| lower.ends_with(e))
}

/// PEP 508's marker variables and operators: a marker holds these, quoted strings and
/// comparison signs, nothing else.
const MARKER_WORDS: [&str; 16] = [
    "python_version",
    "python_full_version",
    "os_name",
    "sys_platform",
    "platform_release",
    "platform_system",
    "platform_version",
    "platform_machine",
    "platform_python_implementation",
    "implementation_name",
    "implementation_version",
    "extra",
    "and",
    "or",
    "in",
    "not",
];

fn marker_ok(m: &str) -> bool {
    if m.is_empty() {
        return false;
    }
    let mut outside = String::new();
    let mut quote: Option<char> = None;
    for c in m.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {
                if !(c.is_ascii_alphanumeric() || " .*+!-_".contains(c)) {
                    return false;
                }
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                outside.push(' ');
            }
            None if c.is_ascii_alphanumeric() || c == '_' || c == '.' => outside.push(c),
            None if " <>=!~()".contains(c) => outside.push(' '),
            None => return false,
        }
    }
    quote.is_none()
        && outside
            .split_whitespace()
            .all(|w| MARKER_WORDS.contains(&w))
}

/// The operator's allow list: names or patterns (`*` for any run of characters), one per
/// line, `#` comments; matched against normalized names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    /// Where it was read from (said in refusals).
    pub path: PathBuf,
    patterns: Vec<String>,
}

impl AllowList {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<AllowList, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::AllowList(path.display().to_string(), e.to_string()))?;
        Ok(AllowList::parse(path, &text))
    }

    /// The list in `text`.
    pub fn parse(path: &Path, text: &str) -> AllowList {
        let patterns = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(normalize)
            .collect();
        AllowList {
            path: path.to_path_buf(),
            patterns,
        }
    }

    /// Whether `name` (normalized) is on it.
    pub fn allows(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| glob(p, name))
    }

    /// `Ok` when `name` is on it, else the refusal.
    pub fn check(&self, name: &str) -> Result<(), PolicyError> {
        if self.allows(name) {
            Ok(())
        } else {
            Err(PolicyError::NotAllowed(
                name.to_owned(),
                self.path.display().to_string(),
            ))
        }
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_are_names_with_specifiers_never_urls_paths_or_options() {
        for ok in [
            "pandas",
            "pandas>=2",
            "polars==1.15",
            "Foo_Bar.baz ~= 1.0, <2",
            "httpx[http2,cli]>=0.27",
            "tinypkg; python_version >= '3.10'",
            "numpy (>=1.0)",
            "foo-zip",
            "backports.tarfile",
            "zipp",
            "wheel",
        ] {
            let r = Requirement::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert!(!r.name.is_empty());
        }
        assert_eq!(
            Requirement::parse("Foo_Bar.baz>=1").unwrap().name,
            "foo-bar-baz"
        );
        for bad in [
            "",
            "--index-url=http://169.254.169.254/",
            "-e .",
            "pkg @ https://evil.example/pkg.whl",
            "https://evil.example/pkg.whl",
            "./local",
            "/abs/path.whl",
            "six-1.16.0-py2.py3-none-any.whl",
            "Foo.TAR.GZ",
            "pkg.zip>=1",
            "pkg.tgz; python_version > '3'",
            "pkg.tar",
            "pkg.egg",
            "..",
            "../pkg",
            "~/pkg",
            "~pkg",
            ".hidden",
            "file:pkg.whl",
            "FILE:///tmp/x",
            "pkg @ file:///tmp/pkg.whl",
            "C:\\pkg.whl",
            "pkg\n--extra-index-url http://x",
            "pkg --index-url http://x",
            "pkg[",
            "pkg; os.system('x')",
            "-",
            "_pkg",
            &"a".repeat(300),
        ] {
            assert!(Requirement::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn file_names_are_refused_as_files() {
        for f in [
            "six-1.16.0-py2.py3-none-any.whl",
            "./x",
            "file:x",
            "x.tar.gz",
        ] {
            let e = Requirement::parse(f).unwrap_err().to_string();
            assert!(
                e.contains("file names and paths are not requirements"),
                "{f}: {e}"
            );
        }
    }

    #[test]
    fn the_index_hosts_are_the_urls_hosts_and_ports() {
        let mut p = Policy::default();
        assert_eq!(p.index_hosts().unwrap(), DEFAULT_INDEX_HOSTS);
        p.index_url = Some("http://127.0.0.1:8081/simple/".into());
        p.extra_index_urls = vec![
            "https://user:pw@Pypi.Example.internal/simple".into(),
            "http://[::1]:9000".into(),
            "file:///srv/wheels".into(),
            "http://127.0.0.1:8081/other/".into(),
        ];
        assert_eq!(
            p.index_hosts().unwrap(),
            ["127.0.0.1:8081", "pypi.example.internal:443", "[::1]:9000"]
        );
        for bad in ["ftp://x/", "http:x", "https:///simple", "http://x:0/", "x"] {
            p.extra_index_urls = vec![bad.into()];
            assert!(p.index_hosts().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_allow_list_takes_names_and_patterns() {
        let list = AllowList::parse(
            Path::new("allow.txt"),
            "# data\npandas\nTiny_Pkg\nflowrepl-*  # ours\n*-utils\n",
        );
        for yes in [
            "pandas",
            "tiny-pkg",
            "flowrepl-x",
            "flowrepl-a-b",
            "my-utils",
        ] {
            assert!(list.allows(yes), "{yes}");
        }
        for no in ["numpy", "pandas2", "tinypkg", "flowrepl", "utils"] {
            assert!(!list.allows(no), "{no}");
        }
        assert!(list
            .check("numpy")
            .unwrap_err()
            .to_string()
            .contains("allow.txt"));
    }
}
