//! A real nginx (Debian's, installed by `.ci/run`) in front of `flowrepl serve` processes,
//! routing each task's own URL to one of them by its path (`hash $uri consistent`), as a
//! deployment would; started per test on a free loopback port, in a folder of its own.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nginx.
pub struct Nginx {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its folder (config, temp files, error log).
    pub dir: tempfile::TempDir,
}

/// The nginx binary: on `PATH`, or where Debian puts it.
pub fn nginx_bin() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
        .expect("nginx is not installed (.ci/run installs Debian's nginx-light)")
}

impl Nginx {
    /// nginx on a free port, proxying `/mcp/` to the servers on `upstreams` (loopback ports),
    /// one server per path. A server that refuses the connection is skipped for 2 s and the
    /// request goes to the next one (for POST too: nothing was sent).
    pub fn start(upstreams: &[u16]) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::free_port();
        let d = dir.path().display();
        let servers: String = upstreams
            .iter()
            .map(|p| format!("    server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;\n"))
            .collect();
        let conf = format!(
            r#"worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 512; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  upstream flowrepl {{
    hash $uri consistent;
{servers}  }}
  server {{
    listen 127.0.0.1:{port};
    location /mcp/ {{
      proxy_pass http://flowrepl;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host localhost;
      proxy_buffering off;
      proxy_read_timeout 300s;
      proxy_connect_timeout 2s;
      proxy_next_upstream error timeout non_idempotent;
    }}
  }}
}}
"#
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(nginx_bin())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx starts");
        crate::wait_listening(port, Duration::from_secs(10), "nginx");
        Nginx { child, port, dir }
    }

    /// The URL of a task's own endpoint through nginx.
    pub fn task_url(&self, plan: &str, task: &str) -> String {
        format!("http://127.0.0.1:{}/mcp/{plan}/{task}", self.port)
    }

    /// Its error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        crate::kill(self.child.id(), libc::SIGQUIT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
