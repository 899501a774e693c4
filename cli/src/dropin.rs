//! Drop-in mode: `flowrepl` started as if it were `python [flags] json_repl_session.py [args]`,
//! the way the original system's clients start their REPL (`$PYTHON_PATH -u -X utf8
//! <root>/python/json_repl_session.py`).
//!
//! The script is **not** run: flowrepl serves the session itself. Its folder goes first on
//! `sys.path` (the original imported its helper package from there) and `sys.argv` is
//! `[SCRIPT, args...]`. Interpreter flags are accepted; those that mean something for the
//! session are honoured through the environment the interpreter reads at start (so worker
//! mode honours them too), the others are ignored (see [`Python::ignored`] and
//! `docs/protocol.md`). A failing `execute` call is then answered as the original answered it
//! (a JSON-RPC error, see `Config::legacy_errors`), and the default cell timeout stays under
//! the client's 300 s.

use std::ffi::OsString;
use std::path::PathBuf;

/// Flags taking no value that Python accepts (grouped like `-uB` too).
const BOOL_FLAGS: &str = "bBdEhiIOPqsSuvVx";

/// A Python command line, as drop-in mode understood it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Python {
    /// The REPL script (not run): its folder goes first on `sys.path`.
    pub script: PathBuf,
    /// `sys.argv[1:]`.
    pub args: Vec<String>,
    /// Environment variables that carry the honoured flags to the interpreter.
    pub env: Vec<(&'static str, String)>,
    /// Flags accepted but without effect on the session.
    pub ignored: Vec<String>,
}

/// Why a Python-style command line was refused (exit code 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DropInError {
    /// A flag Python does not have, or one drop-in mode cannot serve.
    #[error("unknown or unsupported interpreter option {0} (drop-in mode takes [-bBdEiIOqsSuvx] [-X opt] [-W arg] SCRIPT [args...])")]
    Unsupported(String),
    /// `-X`/`-W` without its value.
    #[error("option {0} needs a value")]
    MissingValue(String),
    /// Flags but no script.
    #[error("no script given: drop-in mode is `flowrepl [interpreter flags] SCRIPT [args...]`")]
    NoScript,
    /// An argument that is not UTF-8.
    #[error("argument {0:?} is not UTF-8")]
    NotUtf8(OsString),
}

/// Whether `args` (without the program name) is a Python command line rather than flowrepl's
/// own: it starts with a single-dash interpreter flag, or with a `*.py` script.
pub fn looks_like_python(args: &[OsString]) -> bool {
    let Some(first) = args.first().and_then(|a| a.to_str()) else {
        return false;
    };
    // `-h` and `-V` with no script are flowrepl's own (its help, its version): Python's
    // meaning of a flag wins only when the arguments are a Python invocation.
    let flags_only = args
        .iter()
        .all(|a| a.to_str().is_some_and(|s| s.starts_with('-')));
    if flags_only && args.iter().any(|a| a == "-h" || a == "-V") {
        return false;
    }
    match first.strip_prefix('-') {
        Some(rest) => {
            !rest.starts_with('-')
                && rest
                    .chars()
                    .next()
                    .is_some_and(|c| c == 'X' || c == 'W' || BOOL_FLAGS.contains(c))
        }
        None => first.ends_with(".py"),
    }
}

/// Parses `[flags] SCRIPT [args...]` as Python does.
pub fn parse(args: &[OsString]) -> Result<Python, DropInError> {
    let mut py = Python::default();
    let mut warnings = Vec::new();
    let mut it = args.iter();
    let script = loop {
        let arg = it.next().ok_or(DropInError::NoScript)?;
        let arg = arg
            .to_str()
            .ok_or_else(|| DropInError::NotUtf8(arg.clone()))?;
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            break arg.to_owned();
        };
        if arg == "--" {
            let s = it.next().ok_or(DropInError::NoScript)?;
            break s
                .to_str()
                .ok_or_else(|| DropInError::NotUtf8(s.clone()))?
                .to_owned();
        }
        for (i, c) in flags.char_indices() {
            match c {
                'X' | 'W' => {
                    let rest = &flags[i + 1..];
                    let value = if rest.is_empty() {
                        let v = it
                            .next()
                            .ok_or_else(|| DropInError::MissingValue(format!("-{c}")))?;
                        v.to_str()
                            .ok_or_else(|| DropInError::NotUtf8(v.clone()))?
                            .to_owned()
                    } else {
                        rest.to_owned()
                    };
                    if c == 'X' {
                        py.x_option(&value);
                    } else {
                        warnings.push(value);
                    }
                    break;
                }
                'B' => py.env.push(("PYTHONDONTWRITEBYTECODE", "1".into())),
                's' => py.env.push(("PYTHONNOUSERSITE", "1".into())),
                'O' => {
                    let level = py.optimize() + 1;
                    py.env.retain(|(k, _)| *k != "PYTHONOPTIMIZE");
                    py.env.push(("PYTHONOPTIMIZE", level.to_string()));
                }
                'u' => {} // output is captured and flushed per cell anyway
                c if BOOL_FLAGS.contains(c) && !"hV".contains(c) => {
                    py.ignored.push(format!("-{c}"))
                }
                _ => return Err(DropInError::Unsupported(format!("-{c}"))),
            }
        }
    };
    if !warnings.is_empty() {
        let mut all: Vec<String> = std::env::var("PYTHONWARNINGS")
            .ok()
            .filter(|w| !w.is_empty())
            .into_iter()
            .collect();
        all.extend(warnings);
        py.env.push(("PYTHONWARNINGS", all.join(",")));
    }
    py.script = PathBuf::from(script);
    for a in it {
        py.args.push(
            a.to_str()
                .ok_or_else(|| DropInError::NotUtf8(a.clone()))?
                .to_owned(),
        );
    }
    Ok(py)
}

impl Python {
    fn optimize(&self) -> u32 {
        self.env
            .iter()
            .find(|(k, _)| *k == "PYTHONOPTIMIZE")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    }

    /// `-X opt`: the options that change the session, through their environment variables.
    fn x_option(&mut self, opt: &str) {
        let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
        let var = match name {
            "utf8" => ("PYTHONUTF8", if value == "0" { "0" } else { "1" }),
            "dev" => ("PYTHONDEVMODE", "1"),
            "warn_default_encoding" => ("PYTHONWARNDEFAULTENCODING", "1"),
            _ => {
                self.ignored.push(format!("-X {opt}"));
                return;
            }
        };
        self.env.push((var.0, var.1.to_owned()));
    }

    /// `sys.argv` of the session.
    pub fn argv(&self) -> Vec<String> {
        let mut v = vec![self.script.display().to_string()];
        v.extend(self.args.iter().cloned());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_original_clients_command_line() {
        let a = args(&["-u", "-X", "utf8", "/srv/app/python/json_repl_session.py"]);
        assert!(looks_like_python(&a));
        let py = parse(&a).unwrap();
        assert_eq!(
            py.script,
            PathBuf::from("/srv/app/python/json_repl_session.py")
        );
        assert_eq!(py.argv(), ["/srv/app/python/json_repl_session.py"]);
        assert_eq!(py.env, [("PYTHONUTF8", "1".to_owned())]);
        assert!(py.ignored.is_empty());
    }

    #[test]
    fn grouped_flags_values_and_script_args() {
        let a = args(&[
            "-uBO",
            "-Xdev",
            "-W",
            "error",
            "-Wignore::DeprecationWarning",
            "-q",
            "-X",
            "importtime",
            "s.py",
            "-v",
            "x",
        ]);
        let py = parse(&a).unwrap();
        assert_eq!(py.args, ["-v", "x"]);
        assert!(py.env.contains(&("PYTHONDONTWRITEBYTECODE", "1".into())));
        assert!(py.env.contains(&("PYTHONOPTIMIZE", "1".into())));
        assert!(py.env.contains(&("PYTHONDEVMODE", "1".into())));
        let w = py.env.iter().find(|(k, _)| *k == "PYTHONWARNINGS").unwrap();
        assert!(w.1.ends_with("error,ignore::DeprecationWarning"), "{w:?}");
        assert_eq!(py.ignored, ["-q", "-X importtime"]);
        assert_eq!(parse(&args(&["-OO", "s.py"])).unwrap().optimize(), 2);
    }

    #[test]
    fn flowrepl_command_lines_are_not_python() {
        for a in [
            &[][..],
            &["mcp"],
            &["--worker"],
            &["--python", "x"],
            &["log"],
            &["script"],
            // flowrepl's own help and version (they exited 2 as unsupported Python flags).
            &["-h"],
            &["-V"],
            &["-B", "-V"],
        ] {
            assert!(!looks_like_python(&args(a)), "{a:?}");
        }
        assert!(looks_like_python(&args(&["repl.py"])));
        assert!(looks_like_python(&args(&["-B", "repl"])));
        // With a script, Python's meaning wins (and drop-in mode refuses them).
        assert!(looks_like_python(&args(&["-V", "repl.py"])));
    }

    #[test]
    fn refused_with_a_reason() {
        assert_eq!(parse(&args(&["-u"])), Err(DropInError::NoScript));
        assert_eq!(
            parse(&args(&["-X"])),
            Err(DropInError::MissingValue("-X".into()))
        );
        assert_eq!(
            parse(&args(&["-c", "print(1)"])),
            Err(DropInError::Unsupported("-c".into()))
        );
        assert_eq!(
            parse(&args(&["-m", "http.server"])),
            Err(DropInError::Unsupported("-m".into()))
        );
        assert_eq!(
            parse(&args(&["-uZ", "s.py"])),
            Err(DropInError::Unsupported("-Z".into()))
        );
    }
}
