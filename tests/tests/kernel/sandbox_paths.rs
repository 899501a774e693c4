//! `--sandbox`: what the kernel, outside the sandbox, reads or runs by path must be out of a
//! cell's reach (docs/sandbox.md, "What the kernel touches that a cell could"), and the
//! kernel's settings stay read-only. Each attempt is made from a cell and fails; the same
//! attempt gets through with only that protection left out (`FLOWREPL_SANDBOX_SKIP` takes
//! the mount namespace's protections by name), and what it would have led to is shown.

use flowrepl_tests::{HomeDir, Kernel, KernelOptions};
use std::path::{Path, PathBuf};

fn sandboxed(o: KernelOptions, workspace: &Path, skip: &[&str]) -> KernelOptions {
    o.arg("--sandbox")
        .arg("--workspace")
        .arg(workspace.display().to_string())
        .env("FLOWREPL_SANDBOX_SKIP", skip.join(","))
}

/// A venv (without pip) at `<dir>/.venv`, as users make one in their project.
fn make_venv(dir: &Path) -> PathBuf {
    let venv = dir.join(".venv");
    let made = std::process::Command::new(flowrepl_tests::base_python())
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    venv
}

/// The repr of `code`'s last expression (the cell must not fail).
fn attempt(k: &mut Kernel, code: &str) -> String {
    let r = k.ok(code);
    r["result"].as_str().unwrap_or_default().to_owned()
}

/// The default layout (the workspace is the current folder, the log folder
/// `./.flowrepl/logs` in it). A cell renames `.flowrepl` (a folder holding a mount may be
/// renamed) and makes a folder of its own where the kernel looks: the next cells'
/// checkpoints land there, without the task's `.sandboxed` mark, and a kernel without the
/// sandbox resuming the task unpickles what the cell planted. `.flowrepl` is a mount point in
/// the sandbox: the rename is refused (EBUSY), and the resume refuses the marked checkpoint.
#[test]
fn a_cell_cannot_move_the_folders_above_the_log_folder() {
    for (skip, moved) in [(&[][..], false), (&["pinned_folders"][..], true)] {
        let home = HomeDir::new("moved");
        let planted = home.0.join("ran-outside.txt");
        let ws = tempfile::tempdir().unwrap();
        let logs = ws.path().join(".flowrepl/logs");
        let task = |o: KernelOptions| {
            o.log_dir(&logs)
                .env("FLOW_PLAN_ID", "p")
                .env("FLOW_TASK_ID", "moved")
        };
        let mut k = task(sandboxed(Kernel::options(), ws.path(), skip)).start();
        let r = attempt(
            &mut k,
            "import os\nseen = [d for d, _, _ in os.walk('.flowrepl')]\ntry:\n    os.rename('.flowrepl', '.x')\n    for d in seen:\n        os.makedirs(d, exist_ok=True)\n        os.chmod(d, 0o700)\n    r = 'moved'\nexcept OSError as e:\n    r = f'refused {e.errno}'\nr",
        );
        assert_eq!(
            r,
            if moved { "'moved'" } else { "'refused 16'" },
            "{skip:?}"
        );
        k.ok(&format!(
            "class Evil:\n    def __reduce__(self):\n        return (exec, ({:?},))\nevil = Evil()\nn = 7",
            format!(
                "try:\n    open({:?}, 'w').write('ran')\nexcept OSError:\n    pass",
                planted.display().to_string()
            )
        ));
        eprintln!(
            "DEBUG {skip:?} {}",
            k.call("checkpoints", serde_json::Value::Null)
        );
        k.wait_checkpoint(2);
        drop(k);
        assert!(!planted.exists());
        // The task's mark is where the kernel made it, in the real log folder; the folder the
        // kernel now reads (the cell's, in the control) has none.
        let mut k = task(Kernel::options()).arg("--resume").start();
        let r = k.ok("'n' in globals()");
        assert_eq!(
            r["result"],
            if moved { "True" } else { "False" },
            "{skip:?}: {r}"
        );
        assert_eq!(planted.exists(), moved, "{skip:?}: the pickle ran outside");
    }
}

/// A venv inside the workspace (`./.venv`, the most common layout) is what the kernel, outside
/// the sandbox, serves at its next start (it probes the interpreter when `pyvenv.cfg` names no
/// version; the installer runs it). A cell rewrites `pyvenv.cfg` and replaces `bin/python`
/// with a script: the venv is bound read-only (EROFS) and is itself a mount point (EBUSY on a
/// rename). With that protection left out, the next kernel start runs the cell's script.
#[test]
fn a_cell_cannot_change_a_venv_in_the_workspace() {
    for (skip, changed) in [(&[][..], false), (&["read_only_tools"][..], true)] {
        let home = HomeDir::new("venv");
        let planted = home.0.join("ran-outside.txt");
        let ws = tempfile::tempdir().unwrap();
        let venv = make_venv(ws.path());
        let python = venv.join("bin/python").display().to_string();
        let start = |skip: &[&str]| {
            sandboxed(Kernel::options(), ws.path(), skip)
                .arg("--python")
                .arg(python.clone())
                .start()
        };
        let mut k = start(skip);
        let code = format!(
            "import os\nout = []\ntry:\n    open('.venv/pyvenv.cfg', 'w').write('home = /nowhere-at-all\\n'.replace('/nowhere-at-all', os.path.dirname(os.path.realpath('.venv/bin/python'))))\n    with open('.venv/bin/python.new', 'w') as f:\n        f.write('#!/bin/sh\\necho ran > {}\\necho cpython 3.11\\n')\n    os.chmod('.venv/bin/python.new', 0o755)\n    os.replace('.venv/bin/python.new', '.venv/bin/python')\n    out.append('written')\nexcept OSError as e:\n    out.append(f'refused {{e.errno}}')\ntry:\n    os.rename('.venv', '.venv2')\n    os.rename('.venv2', '.venv')\n    out.append('renamed')\nexcept OSError as e:\n    out.append(f'refused {{e.errno}}')\nout",
            planted.display()
        );
        let r = attempt(&mut k, &code);
        let expect = if changed {
            "['written', 'renamed']"
        } else {
            "['refused 30', 'refused 16']"
        };
        assert_eq!(r, expect, "{skip:?}");
        drop(k);
        assert!(!planted.exists());
        // The next start: the kernel reads the venv's pyvenv.cfg and, naming no version, runs
        // its interpreter to ask.
        let mut cmd = std::process::Command::new(flowrepl_tests::flowrepl_bin());
        let out = cmd
            .args(["--sandbox", "--python", &python, "--workspace"])
            .arg(ws.path())
            .env("FLOWREPL_LOG_DIR", home.0.join("logs"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            planted.exists(),
            changed,
            "{skip:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Without the mount namespace nothing can make a venv inside the workspace read-only
/// (Landlock only grants): the sandbox refuses to start, at any level, naming it.
#[test]
fn without_a_mount_namespace_a_venv_inside_the_workspace_is_refused() {
    let ws = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let venv = make_venv(ws.path());
    let out = std::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"",
            "sh",
        ])
        .arg(flowrepl_tests::flowrepl_bin())
        .args(["--sandbox", "--python"])
        .arg(venv.join("bin/python"))
        .arg("--workspace")
        .arg(ws.path())
        .env("FLOWREPL_LOG_DIR", logs.path())
        .env_remove("FLOWREPL_SANDBOX_SKIP")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.contains(".venv") && err.contains("read-only"), "{err}");
}

/// `/proc/sys` is read-only in the sandbox whatever else holds: with Landlock left out, a
/// cell (uid 0 in its namespace, mapped to a root kernel's uid) writing the hostname (here
/// the value it already has) is refused (EROFS); with this protection left out as well, the
/// write reaches the host's kernel.
#[test]
fn the_kernels_settings_are_read_only_inside() {
    let ws = tempfile::tempdir().unwrap();
    let code = "try:\n    h = open('/proc/sys/kernel/hostname').read()\n    open('/proc/sys/kernel/hostname', 'w').write(h)\n    r = 'written'\nexcept OSError as e:\n    r = f'refused {e.errno}'\nr";
    let mut k = sandboxed(Kernel::options(), ws.path(), &["landlock_filesystem"]).start();
    assert_eq!(attempt(&mut k, code), "'refused 30'");
    for part in ["/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern"] {
        let r = attempt(&mut k, &format!("import os\nos.access({part:?}, os.W_OK)"));
        assert_eq!(r, "False", "{part}");
    }
    drop(k);
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("the control needs a kernel run as root: skipped");
        return;
    }
    let mut k = sandboxed(
        Kernel::options(),
        ws.path(),
        &["landlock_filesystem", "read_only_kernel_files"],
    )
    .start();
    assert_eq!(attempt(&mut k, code), "'written'");
}

/// `/sys` is a sysfs of the sandbox's own network namespace: `/sys/class/net` names only
/// `lo`, not the host's interfaces (their addresses and counters); with the protection left
/// out it is the host's.
#[test]
fn the_hosts_interfaces_are_out_of_sight_in_sys() {
    let host: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let ws = tempfile::tempdir().unwrap();
    let code = "import os\nsorted(os.listdir('/sys/class/net'))";
    let mut k = sandboxed(Kernel::options(), ws.path(), &[]).start();
    assert_eq!(attempt(&mut k, code), "['lo']");
    // Read-only too, and the cgroup tree is not the host's.
    let r = attempt(
        &mut k,
        "import os\n[os.access('/sys/kernel', os.W_OK), os.listdir('/sys/fs/cgroup')]",
    );
    assert_eq!(r, "[False, []]");
    drop(k);
    if host.iter().all(|n| n == "lo") {
        eprintln!("this host has no interface but lo: the control shows nothing");
        return;
    }
    let mut k = sandboxed(Kernel::options(), ws.path(), &["private_sysfs"]).start();
    let seen = attempt(&mut k, code);
    assert!(
        host.iter()
            .filter(|n| *n != "lo")
            .all(|n| seen.contains(n.as_str())),
        "{seen} / {host:?}"
    );
    // The host's /sys is still read-only, every mount under it included.
    let r = attempt(
        &mut k,
        "import os\n[os.access(p, os.W_OK) for p in ('/sys/kernel', '/sys/fs/cgroup') if os.path.exists(p)]",
    );
    assert!(!r.contains("True"), "{r}");
}

/// `/etc` holds what Python reads (certificates, the resolver's files, users, services) and
/// nothing else: another service's file (`pip.conf`, `fstab`, `login.defs`, whichever this
/// host has) and `ssl/private` do not exist inside; with the allow list left out (the host's
/// `/etc` minus its best-known secrets, as before) they are read.
#[test]
fn etc_holds_only_what_python_reads() {
    let other = ["pip.conf", "fstab", "login.defs", "adduser.conf", "apt"]
        .into_iter()
        .map(|n| Path::new("/etc").join(n))
        .find(|p| p.exists())
        .expect("a file of another service in /etc");
    let ws = tempfile::tempdir().unwrap();
    let probe = format!(
        "import os, ssl, socket, pwd\n[os.path.exists({:?}), os.path.exists('/etc/ssl/private'), ssl.create_default_context().cert_store_stats()['x509_ca'] > 0, socket.getservbyname('http'), pwd.getpwuid(os.getuid()).pw_name != '']",
        other.display().to_string()
    );
    let mut k = sandboxed(Kernel::options(), ws.path(), &[]).start();
    assert_eq!(attempt(&mut k, &probe), "[False, False, True, 80, True]");
    drop(k);
    let mut k = sandboxed(Kernel::options(), ws.path(), &["etc_allow_list"]).start();
    let r = attempt(&mut k, &probe);
    assert!(r.starts_with("[True,"), "{r}");
}

/// A checkout used as the workspace holds the kernel's own executables (`target/`): the
/// kernel starts its next worker from there, outside the sandbox. A cell replaces
/// `flowrepl-worker` with a script: refused (the kernel's folder is bound read-only, EROFS);
/// with that protection left out, the next worker start runs the cell's script.
#[test]
fn a_cell_cannot_replace_the_kernels_own_executables_in_the_workspace() {
    let built = flowrepl_tests::flowrepl_bin()
        .parent()
        .unwrap()
        .to_path_buf();
    for (skip, replaced) in [(&[][..], false), (&["read_only_tools"][..], true)] {
        let home = HomeDir::new("exe");
        let planted = home.0.join("ran-outside.txt");
        let ws = tempfile::tempdir().unwrap();
        let bin = ws.path().join("target/debug");
        std::fs::create_dir_all(&bin).unwrap();
        for name in ["flowrepl", "flowrepl-worker", "libflowrepl_pylib.so"] {
            std::fs::copy(built.join(name), bin.join(name)).unwrap();
        }
        let code = format!(
            "import os\ntry:\n    with open('target/debug/w.new', 'w') as f:\n        f.write('#!/bin/sh\\necho ran > {}\\n')\n    os.chmod('target/debug/w.new', 0o755)\n    os.replace('target/debug/w.new', 'target/debug/flowrepl-worker')\n    r = 'replaced'\nexcept OSError as e:\n    r = f'refused {{e.errno}}'\nr",
            planted.display()
        );
        let mut cmd = std::process::Command::new(bin.join("flowrepl"));
        cmd.args(["--sandbox", "--workspace"])
            .arg(ws.path())
            .env("FLOWREPL_LOG_DIR", home.0.join("logs"))
            .env("FLOWREPL_SANDBOX_SKIP", skip.join(","))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().unwrap();
        use std::io::{BufRead, Write};
        let mut stdin = child.stdin.take().unwrap();
        let request = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": {"code": code}});
        writeln!(stdin, "{request}").unwrap();
        // The restart starts a new worker from the (replaced) executable.
        writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"restart"}}"#).unwrap();
        drop(stdin);
        let mut answer = None;
        for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
            let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
            if v["id"] == 1 {
                answer = Some(
                    v["result"]["result"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
            }
        }
        let _ = child.wait();
        let expect = if replaced {
            "'replaced'"
        } else {
            "'refused 30'"
        };
        assert_eq!(answer.as_deref(), Some(expect), "{skip:?}");
        assert_eq!(planted.exists(), replaced, "{skip:?}");
    }
}

/// A workspace inside the venv the kernel serves (`serve --workspace-root W --python W/venv`
/// made task (venv, bin)'s workspace `W/venv/bin`): no mount can keep the interpreter from
/// the cell, so the sandbox refuses to start, and serve refuses the layout at its start.
/// With the protection left out, the cell replaces the interpreter the kernel runs outside.
#[test]
fn a_workspace_inside_the_served_venv_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let venv = make_venv(dir.path());
    let bin = venv.join("bin");
    let start = |skip: &str| {
        std::process::Command::new(flowrepl_tests::flowrepl_bin())
            .args(["--sandbox", "--python"])
            .arg(&venv)
            .arg("--workspace")
            .arg(&bin)
            .env("FLOWREPL_LOG_DIR", logs.path())
            .env("FLOWREPL_SANDBOX_SKIP", skip)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let out = start("");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("lies inside") && err.contains(".venv"),
        "{err}"
    );
    // The control: started, a cell rewrites the interpreter in its workspace.
    let mut k = sandboxed(Kernel::options(), &bin, &["read_only_tools"])
        .arg("--python")
        .arg(venv.display().to_string())
        .start();
    let r = attempt(
        &mut k,
        "import os\nos.unlink('python')\nopen('python', 'w').write('#!/bin/sh\\n')\n'replaced'",
    );
    assert_eq!(r, "'replaced'");
    drop(k);
    // serve refuses the layout before any task runs.
    let out = std::process::Command::new("timeout")
        .args(["-k", "5", "20"])
        .arg(flowrepl_tests::flowrepl_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
        .arg(dir.path())
        .arg("--python")
        .arg(&venv)
        .arg("--log-dir")
        .arg(logs.path().join("l"))
        .arg("--state-dir")
        .arg(logs.path().join("s"))
        .env("FLOWREPL_TOKEN", flowrepl_tests::serve::TOKEN)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("--python") && said.contains("lies inside"),
        "{said}"
    );
}

/// The caches the server's kernels share: with `XDG_CACHE_HOME` inside `--workspace-root`,
/// the sandboxed tasks' package cache was the workspace of task (xdg, flowrepl-packages),
/// whose cell rewrote a cached file that every other task then imported. serve refuses such a
/// layout at its start; the control: the same server with the caches elsewhere starts.
#[test]
fn serve_refuses_shared_caches_inside_the_workspace_root() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("W");
    std::fs::create_dir(&w).unwrap();
    let serve = |cache: &Path| {
        std::process::Command::new("timeout")
            .args(["-k", "2", "4"])
            .arg(flowrepl_tests::flowrepl_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
            .arg(&w)
            .arg("--log-dir")
            .arg(dir.path().join("l"))
            .arg("--state-dir")
            .arg(dir.path().join("s"))
            .env("XDG_CACHE_HOME", cache)
            .env("FLOWREPL_TOKEN", flowrepl_tests::serve::TOKEN)
            .output()
            .unwrap()
    };
    let out = serve(&w.join("xdg"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("cache") && said.contains("lies inside --workspace-root"),
        "{said}"
    );
    let out = serve(&dir.path().join("xdg"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("MCP at"), "{said}");
}

/// A workspace under the host's `/tmp` (`/tmp/x/ws`) lies inside the sandbox's private `/tmp`
/// there: a cell renamed `/tmp/x` and made a link in its place, and the worker's checkpoints
/// (written through the moved mounts' paths) failed or went to the cell's folder. The folders
/// above such a mount are mount points too; with the protection left out, the rename works.
#[test]
fn a_cell_cannot_move_the_folders_above_its_workspace_in_tmp() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let code = format!(
        "import os\ntry:\n    os.rename({:?}, '/tmp/moved')\n    r = 'moved'\nexcept OSError as e:\n    r = f'refused {{e.errno}}'\nr",
        dir.path().display().to_string()
    );
    for (skip, expect) in [
        (&[][..], "'refused 16'"),
        (&["pinned_folders"][..], "'moved'"),
    ] {
        let mut k = sandboxed(Kernel::options(), &ws, skip).start();
        assert_eq!(attempt(&mut k, &code), expect, "{skip:?}");
    }
}
