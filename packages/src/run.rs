//! Running the installer: its own process group, its output collected, a deadline after
//! which the whole group is killed.

use flowrepl_os::process::{Group, Supervision, Supervisor};
use nix::sys::signal::Signal;
use std::io::{BufRead, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How one run ended.
#[derive(Debug)]
pub(crate) struct Ran {
    /// Exit code 0.
    pub ok: bool,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr (uv and pip say what they did there).
    pub stderr: String,
    /// Killed at the deadline.
    pub timed_out: bool,
}

/// Runs `cmd` (stdin from `input`) until it ends or `deadline`; then its group is killed.
/// Each line it writes to stderr becomes `progress`'s text as it comes.
pub(crate) fn run(
    mut cmd: Command,
    input: Option<&str>,
    deadline: Instant,
    progress: &Arc<Mutex<String>>,
) -> std::io::Result<Ran> {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    Supervision {
        group: Group::Own,
        death_signal: Signal::SIGKILL,
    }
    .apply(&mut cmd);
    let mut child = cmd.spawn()?;
    let (tx, rx) = std::sync::mpsc::channel::<(bool, Vec<u8>)>();
    for (is_out, pipe) in [
        (
            true,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
        (
            false,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
    ] {
        let tx = tx.clone();
        let mut pipe = pipe.expect("piped");
        let progress = Arc::clone(progress);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if is_out {
                let _ = pipe.read_to_end(&mut buf);
            } else {
                let mut lines = std::io::BufReader::new(pipe);
                loop {
                    let start = buf.len();
                    match lines.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let line = String::from_utf8_lossy(&buf[start..]);
                            let line = line.trim();
                            if !line.is_empty() {
                                *flowrepl_os::lock(&progress) = line.chars().take(200).collect();
                            }
                        }
                    }
                }
            }
            let _ = tx.send((is_out, buf));
        });
    }
    drop(tx);
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        // A child that exits early closes the pipe: its exit says why.
        let _ = stdin.write_all(text.as_bytes());
    }
    let mut sup = Supervisor::of(child);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut timed_out = false;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((true, b)) => stdout = b,
            Ok((false, b)) => stderr = b,
            Err(_) => {
                timed_out = true;
                break;
            }
        }
    }
    let reaped = if timed_out {
        sup.kill()
    } else {
        // Both pipes closed: it has ended, or a process it left holds nothing of ours.
        sup.stop(None, Duration::from_secs(5)).reaped
    };
    Ok(Ran {
        ok: !timed_out && reaped.exit.and_then(|e| e.code()) == Some(0),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        timed_out,
    })
}
