//! Packages installed into a task's layer (`install`, `install_packages`): from a package
//! index the test serves on 127.0.0.1 (tests/packages/index.py), never a public one. Each
//! refusal is shown, and where a protection is what stops an attempt, the same attempt is
//! shown getting through without it.

use flowrepl_tests::index::Index;
use flowrepl_tests::mcp::{mcp_venv, Scenario};
use flowrepl_tests::serve::Server;
use flowrepl_tests::{read_log_all, Kernel, KernelOptions, MODES};
use serde_json::{json, Value};
use std::path::Path;

fn uv() -> String {
    mcp_venv().join("bin/uv").display().to_string()
}

/// A kernel installing from `index` into layers that share the wheel cache `cache`.
fn kernel(mode: &str, index: &Index, cache: &Path) -> KernelOptions {
    Kernel::options()
        .mode(mode)
        .arg("--python")
        .arg(mcp_venv().join("bin/python").display().to_string())
        .arg("--uv")
        .arg(uv())
        .arg("--index-url")
        .arg(index.url())
        .arg("--packages-cache")
        .arg(cache.display().to_string())
}

fn install(k: &mut Kernel, packages: &[&str]) -> Value {
    k.call("install", json!({ "packages": packages }))
}

/// The error of a refused install (panics on a result).
fn refused(reply: &Value) -> String {
    assert_eq!(reply["error"]["code"], -32003, "not refused: {reply}");
    reply["error"]["message"].as_str().unwrap().to_owned()
}

/// What the task's layer holds, as its current generation says.
fn layer(k: &Kernel) -> Value {
    let marker = k
        .log_file()
        .with_extension("packages")
        .join("current/.flowrepl-layer.json");
    serde_json::from_slice(&std::fs::read(&marker).unwrap()).unwrap()
}

#[test]
fn a_package_installs_into_the_layer_and_the_next_cell_imports_it() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    for mode in MODES {
        let mut k = kernel(mode, &index, cache.path()).start();
        let r = install(&mut k, &["tinypkg==2.0"]);
        let res = &r["result"];
        assert_eq!(
            res["installed"],
            json!(["tinydep==1.0", "tinypkg==2.0"]),
            "{mode}: {r}"
        );
        assert_eq!(res["added"], res["installed"]);
        assert_eq!(res["installer"], "uv");
        assert_eq!(res["restart_needed"], json!([]));
        let r = k.ok("import tinypkg, tinydep\nprint(tinypkg.VERSION, tinydep.DEP)");
        assert_eq!(r["stdout"], "2.0 1\n", "{mode}: {r}");
        // Another version: the layer is resolved again whole (tinydep is not needed now), and
        // the imported module is named: it stays as loaded until a restart.
        let r = install(&mut k, &["tinypkg==1.0"]);
        assert_eq!(r["result"]["installed"], json!(["tinypkg==1.0"]), "{r}");
        assert_eq!(r["result"]["restart_needed"], json!(["tinypkg"]), "{r}");
        if mode == "worker" {
            k.call("restart", Value::Null);
            assert_eq!(
                k.ok("import tinypkg\nprint(tinypkg.VERSION)")["stdout"],
                "1.0\n"
            );
        }
        // Asking again for what the layer has: nothing new, at once.
        let r = install(&mut k, &["tinypkg==1.0"]);
        assert_eq!(r["result"]["added"], json!([]), "{r}");
        let log = k.log_file();
        k.close();
        let installs = read_log_all(&log).installs;
        assert_eq!(installs.len(), 3, "{mode}");
        assert!(installs
            .iter()
            .all(|i| i.error.is_none() && i.trigger == "call"));
        assert_eq!(installs[0].resolved, ["tinydep==1.0", "tinypkg==2.0"]);
        assert_eq!(installs[1].requirements, ["tinypkg==1.0"]);
        assert_eq!(installs[0].index.as_deref(), Some(index.url().as_str()));
    }
}

/// The second task installs the same wheels from the shared cache: no request reaches the
/// index.
#[test]
fn a_second_task_installs_from_the_shared_cache_without_the_index() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let mut first = kernel("worker", &index, cache.path())
        .env("FLOW_TASK_ID", "first")
        .start();
    let r = install(&mut first, &["tinypkg==2.0"]);
    assert_eq!(r["result"]["source"], "index", "{r}");
    let asked = index.requests();
    assert!(asked > 0);
    let mut second = kernel("worker", &index, cache.path())
        .env("FLOW_TASK_ID", "second")
        .start();
    let r = install(&mut second, &["tinypkg==2.0"]);
    assert_eq!(r["result"]["source"], "cache", "{r}");
    assert_eq!(
        r["result"]["installed"],
        json!(["tinydep==1.0", "tinypkg==2.0"])
    );
    assert_eq!(index.requests(), asked, "the index was asked again");
    assert_eq!(
        second.ok("import tinypkg\nprint(tinypkg.VERSION)")["stdout"],
        "2.0\n"
    );
    // A different cache: the index is asked.
    let other = tempfile::tempdir().unwrap();
    let mut third = kernel("worker", &index, other.path())
        .env("FLOW_TASK_ID", "third")
        .start();
    assert_eq!(
        install(&mut third, &["tinypkg==2.0"])["result"]["source"],
        "index"
    );
    assert!(index.requests() > asked);
}

/// Unknown names, conflicts, sdists (their build is code), URLs and options, names off the
/// allow list, `--packages off`: each a clear error, the layer as it was, the kernel up.
#[test]
fn refusals_leave_the_layer_as_it_was() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let marker = &index.marker;
    let mut k = kernel("worker", &index, cache.path()).start();
    install(&mut k, &["tinypkg==1.0"]);
    let before = layer(&k);
    for (packages, says) in [
        (vec!["nosuchpkg"], "nosuchpkg was not found"),
        (vec!["needsold", "tinypkg==2.0"], "No solution found"),
        (vec!["evilsdist"], "building from source is disabled"),
        (vec!["x @ http://127.0.0.1:9/x.whl"], "direct references"),
        (
            vec!["--index-url=http://169.254.169.254/"],
            "options are not taken",
        ),
        (vec!["tinypkg; os.system('x')"], "environment marker"),
        (vec![], "no packages named"),
    ] {
        let r = install(&mut k, &packages);
        let e = refused(&r);
        assert!(e.contains(says), "{packages:?}: {e}");
        assert_eq!(layer(&k), before, "{packages:?} changed the layer");
        assert_eq!(
            k.ok("import tinypkg\nprint(tinypkg.VERSION)")["stdout"],
            "1.0\n"
        );
    }
    assert!(!marker.exists(), "the sdist's build backend ran");
    // Without --no-build (uv as the kernel runs it, the flag left out), the same sdist's
    // backend runs with the installer's rights and writes outside.
    let target = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(uv())
        .args([
            "pip",
            "install",
            "--no-config",
            "--index-url",
            &index.url(),
            "--target",
        ])
        .arg(target.path())
        .arg("--python")
        .arg(mcp_venv().join("bin/python"))
        .arg("--cache-dir")
        .arg(cache.path())
        .arg("evilsdist")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        marker.exists(),
        "without --no-build the backend runs outside"
    );
    let log = k.log_file();
    k.close();
    let installs = read_log_all(&log).installs;
    assert_eq!(installs.len(), 8);
    assert!(installs[1..]
        .iter()
        .all(|i| i.error.is_some() && i.source == "none"));
    assert!(installs[1..].iter().all(|i| i.resolved == ["tinypkg==1.0"]));

    // The allow list: dependencies count too; without the list the same install works
    // (a_package_installs_into_the_layer_and_the_next_cell_imports_it).
    let allow = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(allow.path(), "# what tasks may install\nTinyPkg\nneed*\n").unwrap();
    let mut k = kernel("in_process", &index, cache.path())
        .arg("--packages-allow")
        .arg(allow.path().display().to_string())
        .start();
    let e = refused(&install(&mut k, &["tinydep"]));
    assert!(
        e.contains("tinydep is not on the operator's allow list"),
        "{e}"
    );
    let e = refused(&install(&mut k, &["tinypkg==2.0"]));
    assert!(
        e.contains("tinydep (a dependency of what was asked for)"),
        "{e}"
    );
    let r = install(&mut k, &["tinypkg==1.0", "needsold"]);
    assert_eq!(
        r["result"]["installed"],
        json!(["needsold==1.0", "tinypkg==1.0"]),
        "{r}"
    );

    let mut k = kernel("in_process", &index, cache.path())
        .arg("--packages=off")
        .start();
    let e = refused(&install(&mut k, &["tinypkg"]));
    assert!(e.contains("--packages off"), "{e}");
}

/// Sandboxed: the kernel installs (outside, with the index), the cell imports; the cell's own
/// `pip install` and sockets still fail, and the layer is read-only to it. The same attempts
/// from outside the sandbox get through.
#[test]
fn a_sandboxed_task_installs_while_its_cells_stay_without_network() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut k = kernel("in_process", &index, cache.path())
        .log_dir(logs.path())
        .arg("--sandbox")
        .arg("--workspace")
        .arg(ws.path().display().to_string())
        .start();
    assert_eq!(k.ready["sandbox"]["network"], "none", "{}", k.ready);
    let r = install(&mut k, &["tinypkg==2.0"]);
    assert_eq!(
        r["result"]["added"],
        json!(["tinydep==1.0", "tinypkg==2.0"]),
        "{r}"
    );
    let r = k.ok(&format!(
        r##"import tinypkg, socket, subprocess, sys
print(tinypkg.VERSION)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("connected")
except OSError as e:
    print("socket refused", type(e).__name__)
p = subprocess.run([sys.executable, "-m", "pip", "install", "--index-url", "{url}", "--target", "t", "tinydep"], capture_output=True, text=True)
print("pip exit", p.returncode)
try:
    open(tinypkg.__file__, "a").write("# planted")
    print("layer written")
except OSError as e:
    print("layer read-only", type(e).__name__)
"##,
        port = index.port,
        url = index.url(),
    ));
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with("2.0\nsocket refused"), "{out}");
    assert!(!out.contains("pip exit 0"), "{out}");
    assert!(out.contains("layer read-only"), "{out}");
    // Outside the sandbox: the index answers, and the layer's files can be written.
    std::net::TcpStream::connect(("127.0.0.1", index.port)).unwrap();
    let file = logs
        .path()
        .join("local/adhoc.packages/current/tinypkg/__init__.py");
    assert!(std::fs::OpenOptions::new().append(true).open(&file).is_ok());

    // A wheel's `.pth` file runs in the task's (sandboxed) Python as the layer is taken in,
    // never in the installer: it wrote in the workspace, and nothing outside.
    let outside = std::path::PathBuf::from(format!("{}-pth", index.marker.display()));
    let r = install(&mut k, &["dotpth"]);
    assert!(r["result"]["added"] == json!(["dotpth==1.0"]), "{r}");
    assert!(
        ws.path().join("pth-ran").exists(),
        "the .pth did not run in the task"
    );
    assert!(!outside.exists(), "the .pth ran outside the sandbox");
    // The same wheel in a task without the sandbox: its Python writes outside.
    let mut plain = kernel("in_process", &index, cache.path()).start();
    install(&mut plain, &["dotpth"]);
    assert!(outside.exists());
}

/// A task resumed elsewhere (its layer and state file gone, its log kept) gets its layer back
/// from the log's last install before its checkpoint is restored: an object of the installed
/// package's class comes back. A killed worker's fresh one finds the layer too.
#[test]
fn a_resumed_task_gets_its_layer_back_before_the_restore() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let start = |resume: bool| {
        let o = kernel("worker", &index, cache.path())
            .log_dir(logs.path())
            .env("FLOW_PLAN_ID", "p")
            .env("FLOW_TASK_ID", "resumed");
        if resume { o.arg("--resume") } else { o }.start()
    };
    let mut k = start(false);
    install(&mut k, &["tinypkg==2.0"]);
    k.ok("import tinypkg\nthing = tinypkg.Thing(41)");
    k.wait_checkpoint(1);
    // The worker killed: a fresh one restores, the layer is there.
    let pid = k.ready["worker_pid"].as_u64().unwrap() as u32;
    flowrepl_tests::kill(pid, 9);
    // Gone with its group (the sandbox's relay, init and Python): the next cell notices.
    assert!(flowrepl_tests::wait_for(
        std::time::Duration::from_secs(10),
        || flowrepl_tests::exited(pid)
    ));
    let r = k.execute("print(type(thing).__module__, thing.v)");
    assert_eq!(r["stdout"], "tinypkg 41\n", "{r:#}");
    let log = k.log_file();
    assert!(k.close().success());
    // A fresh machine: no layer, no state file, the log and the checkpoints.
    std::fs::remove_dir_all(log.with_extension("packages")).unwrap();
    std::fs::remove_file(log.with_extension("packages.json")).unwrap();
    let mut k = start(true);
    let r = k.execute("print(type(thing).__module__, thing.v, tinypkg.VERSION)");
    assert_eq!(r["stdout"], "tinypkg 41 2.0\n", "{r:#}");
    assert_eq!(r["restored"], true);
    k.close();
    let installs = read_log_all(&log).installs;
    let rebuilt = installs.last().unwrap();
    assert_eq!(rebuilt.trigger, "rebuild");
    assert_eq!(rebuilt.resolved, ["tinydep==1.0", "tinypkg==2.0"]);
    assert_eq!(rebuilt.source, "cache");
    assert!(rebuilt.error.is_none());
}

/// `install_packages` over MCP (the official Python SDK's client), on `flowrepl mcp` and on
/// `serve` (whose kernels are sandboxed), where one task's layer is not another's.
#[test]
fn install_packages_over_mcp_and_through_serve() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().display().to_string();
    for mode in MODES {
        let (facts, log, _logs) = Scenario::mode(mode)
            .env("FLOWREPL_UV", uv())
            .env("FLOWREPL_INDEX_URL", index.url())
            .env("FLOWREPL_PACKAGES_CACHE", &cache_dir)
            .env("FLOWREPL_PACKAGES_TIMEOUT_S", "3")
            .run("packages");
        assert!(!facts["progress"].as_array().unwrap().is_empty(), "{facts}");
        assert!(
            facts["refused"]["nosuchpkg"]
                .as_str()
                .unwrap()
                .contains("nosuchpkg was not found"),
            "{facts}"
        );
        assert!(facts["refused"]["x @ http://127.0.0.1:9/x.whl"]
            .as_str()
            .unwrap()
            .contains("direct references"));
        let installs = read_log_all(&log).installs;
        assert_eq!(installs.len(), 4, "{mode}");
    }
    let url = index.url();
    let server = Server::start(&[
        "--uv",
        &uv(),
        "--index-url",
        &url,
        "--packages-cache",
        &cache_dir,
    ]);
    server.run(
        "packages",
        &[
            "--task",
            "with",
            "--other-task",
            "without",
            "--plan",
            "local",
        ],
    );
    let installs = read_log_all(&server.log_of("with")).installs;
    assert_eq!(installs.len(), 1);
    // serve's kernels are sandboxed: they install from the sandboxed tasks' cache, which the
    // kernels above (without the sandbox) did not fill.
    assert_eq!(installs[0].source, "index", "{:?}", installs[0]);
}

/// `--packages-build`: an sdist is built, in the sandbox (whatever the task's own setting):
/// its backend cannot write outside, the package imports, and the shared cache holds nothing
/// of it (a task without builds is still refused it). Without the confinement the same
/// backend writes outside (refusals_leave_the_layer_as_it_was runs it through uv directly).
#[test]
fn with_packages_build_an_sdist_is_built_confined() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    for mode in MODES {
        let mut k = kernel(mode, &index, cache.path())
            .arg("--packages-build")
            .start();
        let r = install(&mut k, &["evilsdist"]);
        assert_eq!(
            r["result"]["installed"],
            json!(["evilsdist==1.0"]),
            "{mode}: {r}"
        );
        assert!(
            !index.marker.exists(),
            "{mode}: the build wrote outside the sandbox"
        );
        let r = k.ok("import evilsdist\nprint(evilsdist.BUILT)");
        assert_eq!(r["stdout"], "True\n", "{mode}: {r}");
    }
    let mut k = kernel("in_process", &index, cache.path()).start();
    let e = refused(&install(&mut k, &["evilsdist"]));
    assert!(e.contains("building from source is disabled"), "{e}");
}

/// An install that does not end in time is stopped (the installer's whole process group
/// killed) at `--packages-timeout-s`, with the layer as it was; the kernel goes on.
#[test]
fn an_install_over_its_timeout_is_stopped_and_changes_nothing() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let mut k = kernel("worker", &index, cache.path())
        .arg("--packages-timeout-s")
        .arg("2")
        .start();
    install(&mut k, &["tinydep"]);
    let before = layer(&k);
    let started = std::time::Instant::now();
    let e = refused(&install(&mut k, &["slowpkg"]));
    assert!(e.contains("did not finish within 2s"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(layer(&k), before);
    // No process of the installer's (`uv pip ...` naming this index) is left.
    let url = index.url();
    let left: Vec<u32> = flowrepl_tests::all_pids()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.contains(&b"pip".as_slice()) && args.contains(&url.as_bytes())
            })
        })
        .collect();
    assert!(left.is_empty(), "the installer was left running: {left:?}");
    assert_eq!(k.ok("import tinydep\nprint(tinydep.DEP)")["stdout"], "1\n");
}

/// Without uv (none on PATH, no --uv), pip in the task's interpreter installs, and the reply
/// and the record say so.
#[test]
fn without_uv_pip_installs_and_says_so() {
    let index = Index::start();
    let mut k = Kernel::options()
        .arg("--python")
        .arg(mcp_venv().join("bin/python").display().to_string())
        .arg("--index-url")
        .arg(index.url())
        .env("PATH", "/usr/bin:/bin")
        .start();
    let r = install(&mut k, &["tinypkg==2.0"]);
    assert_eq!(r["result"]["installer"], "pip", "{r}");
    assert_eq!(
        r["result"]["installed"],
        json!(["tinydep==1.0", "tinypkg==2.0"]),
        "{r}"
    );
    assert!(r["result"]["message"]
        .as_str()
        .unwrap()
        .contains("uv was not found"));
    assert_eq!(
        k.ok("import tinypkg\nprint(tinypkg.VERSION)")["stdout"],
        "2.0\n"
    );
    let e = refused(&install(&mut k, &["evilsdist"]));
    assert!(!index.marker.exists(), "pip built the sdist: {e}");
    let log = k.log_file();
    k.close();
    assert_eq!(read_log_all(&log).installs[0].installer, "pip");
}

/// A cell cannot point the installer at another index: uv runs with `--no-config`, so the
/// `uv.toml` a cell writes in the workspace (above the layer's folder in the default layout,
/// where uv looks for configuration) is never read. The same uv run from the same folder
/// without `--no-config` takes the cell's index.
#[test]
fn a_cells_uv_config_does_not_reach_the_installer() {
    let index = Index::start();
    let evil = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let mut k = kernel("worker", &index, cache.path()).start();
    k.ok(&format!(
        "open('uv.toml', 'w').write('[pip]\\nindex-url = \"{}\"\\n')",
        evil.url()
    ));
    let r = install(&mut k, &["tinypkg==2.0"]);
    assert_eq!(r["result"]["source"], "index", "{r}");
    assert_eq!(evil.requests(), 0, "the cell's index was asked");
    let work = k.log_file().with_extension("packages").join("work");
    assert!(k.workspace().join("uv.toml").is_file() && work.starts_with(k.workspace()));
    let other_cache = tempfile::tempdir().unwrap();
    let mut uv_run = std::process::Command::new(uv())
        .args(["pip", "compile", "--quiet", "-", "--python"])
        .arg(mcp_venv().join("bin/python"))
        .arg("--cache-dir")
        .arg(other_cache.path())
        .current_dir(&work)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    uv_run
        .stdin
        .take()
        .unwrap()
        .write_all(b"tinydep\n")
        .unwrap();
    uv_run.wait().unwrap();
    assert!(
        evil.requests() > 0,
        "without --no-config uv reads the cell's uv.toml"
    );
}

/// `--packages-build`: the build's only network is the index. An sdist whose build backend
/// asks a service on 127.0.0.1 that is not the index (the index's secret server), with urllib
/// (through the proxy the build gets) and with a bare socket, gets no answer: the install's
/// error carries the backend's failures and not the service's answer, and the service saw no
/// connection. The index itself (an explicit rule for its 127.0.0.1:port) still serves the
/// build: evilsdist builds (with_packages_build_an_sdist_is_built_confined), and the build's
/// connections are egress records. The same build with the host's network (the proxy left
/// out, FLOWREPL_PACKAGES_BUILD_NET=host) reaches the service and the answer comes back.
#[test]
fn a_build_reaches_the_index_and_nothing_else() {
    use flowrepl_tests::index::SECRET;
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let mut k = kernel("in_process", &index, cache.path())
        .arg("--packages-build")
        .start();
    let e = refused(&install(&mut k, &["netsdist"]));
    assert!(e.contains("netsdist asked the secret server"), "{e}");
    assert!(!e.contains(SECRET), "the build reached the service: {e}");
    assert!(e.contains("urllib failed"), "{e}");
    assert!(e.contains("socket failed"), "{e}");
    assert_eq!(index.secret_hits(), 0, "the service saw the build");
    let r = install(&mut k, &["evilsdist"]);
    assert_eq!(r["result"]["installed"], json!(["evilsdist==1.0"]), "{r}");
    let log = k.log_file();
    k.close();
    let egress = read_log_all(&log).egress;
    assert!(
        egress.iter().any(|e| e.port == index.port && e.allowed),
        "{egress:?}"
    );
    assert!(
        egress
            .iter()
            .any(|e| e.port == index.secret_port && !e.allowed),
        "{egress:?}"
    );

    let mut k = kernel("in_process", &index, cache.path())
        .arg("--packages-build")
        .env("FLOWREPL_PACKAGES_BUILD_NET", "host")
        .start();
    let e = refused(&install(&mut k, &["netsdist"]));
    assert!(
        e.contains(&format!("urllib got: {SECRET}")),
        "with the host's network the build reaches the service: {e}"
    );
    assert!(index.secret_hits() > 0);
}

/// File names and anything path-like are not requirements: refused before the installer
/// runs (uv takes `tinypkg-1.0-py3-none-any.whl` or `foo.tar.gz` for a file in its working
/// folder). The same name given to uv as the kernel runs it, in the layer's scratch folder
/// holding such a file, resolves to that file.
#[test]
fn file_names_and_paths_are_refused_before_the_installer_runs() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let mut k = kernel("in_process", &index, cache.path()).start();
    install(&mut k, &["tinydep"]);
    let before = layer(&k);
    let asked = index.requests();
    for bad in [
        "six-1.16.0-py2.py3-none-any.whl",
        "tinypkg-1.0-py3-none-any.whl",
        "tinypkg-1.0.tar.gz",
        "tinypkg.zip",
        "./tinypkg",
        "../tinypkg",
        "..",
        "~/tinypkg",
        "file:tinypkg-1.0-py3-none-any.whl",
        "/tmp/tinypkg-1.0-py3-none-any.whl",
    ] {
        let e = refused(&install(&mut k, &[bad]));
        assert!(
            e.contains("file names and paths are not requirements"),
            "{bad}: {e}"
        );
        assert_eq!(layer(&k), before, "{bad}");
    }
    for bad in [
        "tinypkg @ file:///tmp/tinypkg-1.0-py3-none-any.whl",
        "http://127.0.0.1:9/tinypkg-1.0-py3-none-any.whl",
    ] {
        let e = refused(&install(&mut k, &[bad]));
        assert!(e.contains("direct references"), "{bad}: {e}");
    }
    assert_eq!(index.requests(), asked, "the installer ran");
    // uv as the kernel runs it, in the same folder, with such a file there: it installs the
    // file, not the index's package.
    let work = k.log_file().with_extension("packages").join("work");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", index.port)).unwrap();
    use std::io::{Read as _, Write as _};
    s.write_all(b"GET /tinypkg/tinypkg-1.0-py3-none-any.whl HTTP/1.0\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let body = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    std::fs::write(work.join("tinypkg-1.0-py3-none-any.whl"), &got[body..]).unwrap();
    let mut uv_run = std::process::Command::new(uv())
        .args([
            "pip",
            "compile",
            "--no-config",
            "--quiet",
            "--offline",
            "-",
            "--python",
        ])
        .arg(mcp_venv().join("bin/python"))
        .arg("--cache-dir")
        .arg(cache.path())
        .current_dir(&work)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    uv_run
        .stdin
        .take()
        .unwrap()
        .write_all(b"tinypkg-1.0-py3-none-any.whl\n")
        .unwrap();
    let out = uv_run.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    // Resolved to the file itself (as a path), not to a version from the cache or index.
    assert!(
        out.status.success()
            && said.lines().any(|l| l == "tinypkg-1.0-py3-none-any.whl")
            && !said.contains("tinypkg=="),
        "uv took the name for a file: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An install answers in its turn, but `status` (busy) and `interrupt` sent while it runs are
/// answered at once, as while a cell runs (the index stalls on slowpkg until the install's
/// timeout). A requirement whose environment marker excludes it is said to be so.
#[test]
fn status_is_answered_while_an_install_runs() {
    use std::time::{Duration, Instant};
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    for mode in MODES {
        let mut k = kernel(mode, &index, cache.path())
            .arg("--packages-timeout-s")
            .arg("4")
            .start();
        let started = Instant::now();
        k.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"slow\",\"method\":\"install\",\"params\":{\"packages\":[\"slowpkg\"]}}\n");
        // Until the install shows as running (a status read before it started is answered
        // idle); each answered within 2 s, long before the install's 4 s.
        loop {
            let asked = Instant::now();
            let st = k.call("status", Value::Null);
            assert!(
                asked.elapsed() < Duration::from_secs(2),
                "{mode}: status waited {:?} for the install",
                asked.elapsed()
            );
            if st["result"]["busy"] == true {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{mode}: the install never showed as busy: {st}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let asked = Instant::now();
        let ack = k.call("interrupt", Value::Null);
        assert!(asked.elapsed() < Duration::from_secs(2), "{mode}");
        assert_eq!(ack["result"]["interrupted"], false, "{mode}: {ack}");
        let r = k.recv();
        assert_eq!(r["id"], "slow", "{mode}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("did not finish within 4s"),
            "{mode}: {r}"
        );
        assert!(started.elapsed() >= Duration::from_secs(3), "{mode}");
        // The kernel goes on, and status is not busy.
        assert_eq!(k.call("status", Value::Null)["result"]["busy"], false);
        assert_eq!(k.ok("print(1)")["stdout"], "1\n");

        let r = install(&mut k, &["tinydep; python_version < '3'"]);
        let message = r["result"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(
                "nothing installed: the environment markers excluded tinydep; python_version < '3' on this Python"
            ),
            "{mode}: {r}"
        );
        let r = install(&mut k, &["tinypkg==1.0", "tinydep; python_version < '3'"]);
        assert_eq!(r["result"]["added"], json!(["tinypkg==1.0"]), "{r}");
        let message = r["result"]["message"].as_str().unwrap();
        assert!(
            message.contains("the environment markers excluded tinydep; python_version < '3'"),
            "{message}"
        );
    }
}

/// One shared cache per trust level. A cell without the sandbox rewrites a file of a package
/// in its layer (a hard link into its cache); another task without the sandbox installing the
/// same package from that cache imports the change (the shared-cache behaviour), while a
/// sandboxed task installing it with the same --packages-cache imports the original, and so
/// does the first task itself once it runs sandboxed (its layer, linked from the other
/// cache, is rebuilt before its first cell).
#[test]
fn a_cell_without_the_sandbox_cannot_change_what_sandboxed_tasks_install() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let task = |id: &str, sandboxed: bool| {
        let o = kernel("in_process", &index, cache.path())
            .log_dir(logs.path())
            .env("FLOW_TASK_ID", id);
        if sandboxed {
            o.arg("--sandbox")
                .arg("--workspace")
                .arg(ws.path().display().to_string())
        } else {
            o
        }
        .start()
    };
    let probe = "import tinypkg\nprint(getattr(tinypkg, 'PLANTED', 'original'))";
    let mut a = task("plain-a", false);
    install(&mut a, &["tinypkg==1.0"]);
    a.ok("import tinypkg\nopen(tinypkg.__file__, 'a').write('\\nPLANTED = \"changed\"\\n')");
    assert_eq!(
        a.ok(&format!("import importlib\n{probe}"))["stdout"],
        "original\n"
    );
    a.close();

    // Another task without the sandbox, the same cache: the change is there.
    let mut b = task("plain-b", false);
    let r = install(&mut b, &["tinypkg==1.0"]);
    assert_eq!(r["result"]["source"], "cache", "{r}");
    assert_eq!(b.ok(probe)["stdout"], "changed\n");
    b.close();

    // A sandboxed task, the same --packages-cache: its own cache, the original.
    let mut s = task("sandboxed", true);
    let r = install(&mut s, &["tinypkg==1.0"]);
    assert_eq!(r["result"]["source"], "index", "{r}");
    assert_eq!(s.ok(probe)["stdout"], "original\n");
    s.close();
    // The first task, now sandboxed: its layer is rebuilt from the sandboxed cache.
    let mut a = task("plain-a", true);
    assert_eq!(a.ok(probe)["stdout"], "original\n");
    let log = a.log_file();
    a.close();
    let installs = read_log_all(&log).installs;
    let last = installs.last().unwrap();
    assert_eq!(last.trigger, "rebuild", "{last:?}");
    assert_eq!(last.source, "cache", "{last:?}");
}

/// The operator's `PYTHONPATH` names a folder in the workspace (`./lib`, where the user's
/// modules are). A sandboxed cell writes a `sitecustomize.py` there: the installer runs the
/// task's interpreter outside the sandbox (pip, when uv is not there), which would import it
/// with the kernel's rights; it runs isolated (`-I`, and no `PYTHON*` variable), and the
/// cell's file never runs outside. The control: the same interpreter with that `PYTHONPATH`
/// runs the cell's file.
#[test]
fn a_cells_sitecustomize_on_the_pythonpath_never_runs_in_the_installer() {
    let index = Index::start();
    let ws = tempfile::tempdir().unwrap();
    let lib = ws.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    let planted = tempfile::tempdir().unwrap();
    let ran = planted.path().join("ran-outside.txt");
    let mut k = Kernel::options()
        .arg("--sandbox")
        .arg("--workspace")
        .arg(ws.path().display().to_string())
        .arg("--python")
        .arg(mcp_venv().join("bin/python").display().to_string())
        .arg("--index-url")
        .arg(index.url())
        .env("PATH", "/usr/bin:/bin")
        .env("PYTHONPATH", lib.display().to_string())
        .start();
    k.ok(&format!(
        "open('lib/sitecustomize.py', 'w').write('open({:?}, \"w\").write(\"ran\")\\n')",
        ran.display().to_string()
    ));
    let r = install(&mut k, &["tinypkg==2.0"]);
    assert_eq!(r["result"]["installer"], "pip", "{r}");
    assert!(
        !ran.exists(),
        "the cell's sitecustomize ran outside the sandbox"
    );
    drop(k);
    let control = std::process::Command::new(mcp_venv().join("bin/python"))
        .args(["-c", "pass"])
        .env("PYTHONPATH", &lib)
        .status()
        .unwrap();
    assert!(control.success());
    assert!(ran.exists(), "the control: the interpreter imports it");
}

/// A relative `--python` names the interpreter in the folder the kernel was started in; the
/// installer runs from the layer's scratch folder, where `.venv/bin/python` named nothing (or
/// what a build left there): it gets the path made absolute at the start.
#[test]
fn a_relative_python_is_the_start_folders() {
    let index = Index::start();
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new(flowrepl_tests::base_python())
        .args(["-m", "venv", "--without-pip", ".venv"])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(made.success());
    let mut k = Kernel::options()
        .arg("--python")
        .arg(".venv")
        .arg("--uv")
        .arg(uv())
        .arg("--index-url")
        .arg(index.url())
        .arg("--packages-cache")
        .arg(cache.path().display().to_string())
        .wrap(vec![
            "sh".into(),
            "-c".into(),
            format!("cd {} && exec \"$@\"", dir.path().display()),
            "sh".into(),
        ])
        .start();
    let r = install(&mut k, &["tinypkg==2.0"]);
    assert_eq!(
        r["result"]["installed"],
        json!(["tinydep==1.0", "tinypkg==2.0"]),
        "{r}"
    );
}
