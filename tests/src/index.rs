//! A package index on 127.0.0.1 for the package tests: `tests/packages/index.py` builds tiny
//! wheels and an sdist into a folder of the test's and serves it as a PEP 503 simple index,
//! counting the requests it answers; beside it, a "secret" server on another port of
//! 127.0.0.1 (a host service that is not the index) that builds must not reach.

use crate::mcp::mcp_venv;
use crate::workspace_root;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};

/// What the secret server answers.
pub const SECRET: &str = "flowrepl-secret-answer";

/// A running index; killed when dropped.
pub struct Index {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The secret server's port on 127.0.0.1: it answers every request with [`SECRET`].
    pub secret_port: u16,
    /// Where the sdist's build backend writes when it runs (a folder of its own, outside
    /// everything an installer writes).
    pub marker: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Index {
    /// Builds the packages and starts serving them.
    pub fn start() -> Index {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("outside/evil-marker");
        std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
        let mut child = Command::new(mcp_venv().join("bin/python"))
            .arg(workspace_root().join("tests/packages/index.py"))
            .arg(dir.path().join("simple"))
            .arg(&marker)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start tests/packages/index.py");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut port = || {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            line.trim().parse().expect("the index's ports")
        };
        let (port, secret_port) = (port(), port());
        Index {
            child,
            port,
            secret_port,
            marker,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// How many requests it answered so far.
    pub fn requests(&self) -> u64 {
        self.count("/_requests")
    }

    /// How many connections the secret server took so far.
    pub fn secret_hits(&self) -> u64 {
        self.count("/_secret_hits")
    }

    fn count(&self, path: &str) -> u64 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body.rsplit("\r\n\r\n")
            .next()
            .and_then(|b| b.trim().parse().ok())
            .unwrap_or_else(|| panic!("the index's count: {body}"))
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
