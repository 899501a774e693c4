"""Packages (issue 35), measured in one run on loopback, with targets.

1. A cached install into a new task: a fresh kernel for a new task, `install
   ["tinypkg==1.0"]` (a small pure-Python wheel some other task installed before, so it is in
   the shared cache), timed from the call to its reply. Target: <= 150 ms p50, and <= 0.2x
   the same install with `pip install --no-index --find-links DIR` into a fresh venv (only
   pip's run timed). The index the wheels come from (tests/packages/index.py) counts requests:
   the cached installs must make none.
2. `x = 1` in a task with a package layer against the same task without one
   (`--packages off`), both modes, interleaved. Target: <= 1.02x.

Usage: bench/packages_bench.py --flowrepl target/release/flowrepl [--quick]
Runs under target/mcp-venv's python (it has uv).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, "target", "mcp-venv", "bin", "python")
UV = os.path.join(ROOT, "target", "mcp-venv", "bin", "uv")


class Kernel:
    def __init__(self, flowrepl, args, env, cwd):
        self.p = subprocess.Popen([flowrepl] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env, cwd=cwd)
        self.n = 0
        self.ready = json.loads(self.p.stdout.readline())

    def call(self, method, params):
        self.n += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(30)


def start_index(folder, marker):
    p = subprocess.Popen([VENV_PY, os.path.join(ROOT, "tests/packages/index.py"), folder, marker],
                         stdout=subprocess.PIPE)
    port = int(p.stdout.readline())
    return p, f"http://127.0.0.1:{port}/"


def requests(url):
    return int(urllib.request.urlopen(url + "_requests").read())


def p50(xs):
    return statistics.median(xs)


def cached_installs(flowrepl, work, url, rounds):
    cache = os.path.join(work, "cache")
    logs = os.path.join(work, "logs")
    base = ["--python", VENV_PY, "--uv", UV, "--index-url", url, "--packages-cache", cache]
    env = dict(os.environ, FLOWREPL_LOG_DIR=logs, FLOW_PLAN_ID="bench")
    # Another task installs it first: the shared cache has it.
    k = Kernel(flowrepl, base, dict(env, FLOW_TASK_ID="warm"), work)
    r = k.call("install", {"packages": ["tinypkg==1.0"]})
    assert "result" in r, r
    k.close()
    asked = requests(url)
    times = []
    for i in range(rounds):
        k = Kernel(flowrepl, base, dict(env, FLOW_TASK_ID=f"task-{i}"), work)
        t = time.perf_counter()
        r = k.call("install", {"packages": ["tinypkg==1.0"]})
        times.append(time.perf_counter() - t)
        assert r["result"]["source"] == "cache", r
        k.close()
    assert requests(url) == asked, "a cached install asked the index"
    return times


def pip_installs(work, find_links, rounds):
    times = []
    for i in range(rounds):
        venv = os.path.join(work, f"venv-{i}")
        subprocess.run([VENV_PY, "-m", "venv", venv], check=True)
        t = time.perf_counter()
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--quiet",
                        "--disable-pip-version-check", "--no-index", "--find-links", find_links,
                        "tinypkg==1.0"], check=True)
        times.append(time.perf_counter() - t)
        shutil.rmtree(venv)
    return times


def x_equals_1(flowrepl, work, url, mode, calls, batches):
    cache = os.path.join(work, "cache")
    base = ["--python", VENV_PY, "--uv", UV, "--index-url", url, "--packages-cache", cache]
    if mode == "worker":
        base.append("--worker")
    env = dict(os.environ, FLOWREPL_LOG_DIR=os.path.join(work, "logs-x"), FLOW_PLAN_ID="bench")
    with_layer = Kernel(flowrepl, base, dict(env, FLOW_TASK_ID=f"layer-{mode}"), work)
    assert "result" in with_layer.call("install", {"packages": ["tinypkg==1.0"]})
    without = Kernel(flowrepl, base + ["--packages", "off"], dict(env, FLOW_TASK_ID=f"none-{mode}"), work)
    samples = {"layer": [], "none": []}
    # Call by call, alternating which goes first: both see the same machine.
    for i in range(calls * batches):
        order = [("layer", with_layer), ("none", without)]
        if i % 2:
            order.reverse()
        for name, k in order:
            t = time.perf_counter()
            r = k.call("execute_code", {"code": "x = 1"})
            samples[name].append(time.perf_counter() - t)
            assert r["result"]["success"], r
    with_layer.close()
    without.close()
    return p50(samples["layer"]), p50(samples["none"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    opts.flowrepl = os.path.abspath(opts.flowrepl)
    rounds = 5 if opts.quick else 15
    work = tempfile.mkdtemp(prefix="flowrepl-packages-bench-")
    index, url = start_index(os.path.join(work, "simple"), os.path.join(work, "marker"))
    try:
        ours = cached_installs(opts.flowrepl, work, url, rounds)
        pip = pip_installs(work, os.path.join(work, "simple", "tinypkg"), rounds)
        print("packages: cached install of a small wheel into a new task (call to reply)")
        print(f"  flowrepl install (uv, shared cache)  p50 {p50(ours) * 1e3:7.1f} ms  "
              f"(min {min(ours) * 1e3:.1f}, max {max(ours) * 1e3:.1f}; no index request)")
        print(f"  pip --no-index --find-links, fresh venv  p50 {p50(pip) * 1e3:7.1f} ms")
        ratio = p50(ours) / p50(pip)
        print(f"  ratio {ratio:.3f}x (target <= 0.2x: {'PASS' if ratio <= 0.2 else 'FAIL'}); "
              f"150 ms p50 target: {'PASS' if p50(ours) <= 0.150 else 'FAIL'}")
        calls, batches = (300, 4) if opts.quick else (1000, 10)
        print("packages: x = 1 with a package layer against without (--packages off), p50")
        for mode in ("in_process", "worker"):
            layer, none = x_equals_1(opts.flowrepl, work, url, mode, calls, batches)
            r = layer / none
            print(f"  {mode:10}  layer {layer * 1e6:6.1f} us  none {none * 1e6:6.1f} us  "
                  f"ratio {r:.3f}x (target <= 1.02x: {'PASS' if r <= 1.02 else 'FAIL'})")
    finally:
        index.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
