"""Checkpoint and restore figures (issue 11), measured in one run, with targets.

1. A cell that touches one name in a namespace of 10,000 names: what its automatic checkpoint
   costs (the write's own time, from the journal via `checkpoints`), in both modes.
2. A worker crash with 10,000 small names checkpointed: from the crash's reply to the next
   cell's reply (a fresh worker started and the namespace restored), and the restore alone.
3. A 200 MB numpy array: `checkpoint` and `restore` next to pickle.dump to a file and
   pickle.load from it in plain Python.
4. Restoring against re-running: a task of 20 cells that compute (numpy, ~25 ms each) rebuilt
   by `restart {restore}` and by `flowrepl log replay`.

Usage: bench/checkpoints.py --flowrepl target/release/flowrepl [--quick]
Runs under target/mcp-venv's python (numpy, cloudpickle), which the kernels use too.
"""

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time


def target(name, value, limit, unit=""):
    ok = value <= limit
    print(f"  target: {name}: {value:.2f}{unit} <= {limit}{unit} [{'PASS' if ok else 'FAIL'}]")


class Kernel:
    def __init__(self, flowrepl, logs, task, worker=False, extra=()):
        env = dict(os.environ, FLOW_PLAN_ID="bench-snap", FLOW_TASK_ID=task, FLOWREPL_LOG="warn")
        for k in ("FLOWREPL_CHECKPOINTS", "FLOWREPL_RESUME", "USE_SUBPROCESS_WORKER"):
            env.pop(k, None)
        if worker:
            env["USE_SUBPROCESS_WORKER"] = "1"
        self.p = subprocess.Popen(
            [flowrepl, "--log-dir", logs, "--python", sys.executable, *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.n = 0
        assert json.loads(self.p.stdout.readline())["method"] == "ready"

    def call(self, method, params=None):
        self.n += 1
        msg = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            msg["params"] = params
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()
        while True:
            r = json.loads(self.p.stdout.readline())
            if r.get("id") == self.n:
                if "error" in r:
                    raise RuntimeError(f"{method}: {r['error']}")
                return r["result"]

    def ok(self, code):
        r = self.call("execute_code", {"code": code})
        assert r["success"], r
        return r

    def auto(self, count):
        """Waits for the automatic checkpoint of cell `count`; returns its listing."""
        deadline = time.time() + 120
        while time.time() < deadline:
            for c in self.call("checkpoints")["checkpoints"]:
                if c["name"] == "auto" and c["execution_count"] >= count:
                    return c
            time.sleep(0.002)
        raise RuntimeError(f"no checkpoint after cell {count}")

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def one_name_in_ten_thousand(args, logs):
    print("\n1. a cell touching one name among 10,000: cost of its automatic checkpoint (ms)")
    n = 20 if args.quick else 100
    for mode, worker in (("in-process", False), ("worker", True)):
        k = Kernel(args.flowrepl, logs, f"tenk-{mode}", worker)
        k.ok("for _i in range(10_000):\n    globals()[f'v{_i}'] = _i")
        first = k.auto(1)
        costs = []
        for i in range(n):
            k.ok("v5 = v5 + 1")
            c = k.auto(2 + i)
            assert c["last_write_names"] == 1, c
            costs.append(c["last_write_ms"])
        k.close()
        p50 = statistics.median(costs)
        print(f"  {mode:<11} p50 {p50:.3f} ms, max {max(costs):.3f} ms ({n} cells; "
              f"the first, full write of 10,000 names: {first['last_write_ms']:.1f} ms)")
        target(f"checkpoint of a one-name cell among 10,000 names, {mode}, p50", p50, 1.0, " ms")


def every_cell(args, logs):
    print("\n1b. every-cell against on-success: round trip of cells sent back to back (ms)")
    n = 50 if args.quick else 300
    for mode, worker in (("in-process", False), ("worker", True)):
        rows = {}
        for policy in ("on-success", "every-cell"):
            k = Kernel(args.flowrepl, logs, f"every-{mode}-{policy}", worker,
                       extra=("--checkpoints", policy))
            k.ok("for _i in range(10_000):\n    globals()[f'v{_i}'] = _i")
            k.auto(1)
            for cell in ("x = 1", "v5 = v5 + 1"):
                times = []
                for _ in range(n):
                    t = time.perf_counter()
                    k.ok(cell)
                    times.append((time.perf_counter() - t) * 1000)
                rows[(policy, cell)] = statistics.median(times)
            k.close()
        for cell in ("x = 1", "v5 = v5 + 1"):
            a, b = rows[("every-cell", cell)], rows[("on-success", cell)]
            print(f"  {mode:<11} {cell!r:<14} (10,000 names) every-cell p50 {a:.3f} ms, "
                  f"on-success {b:.3f} ms: +{a - b:.3f} ms ({a / b:.2f}x)")


def crash_to_ready(args, logs):
    print("\n2. worker crash -> namespace of 10,000 small names restored and ready (ms)")
    rounds = 3 if args.quick else 10
    k = Kernel(args.flowrepl, logs, "crash", worker=True)
    k.ok("for _i in range(10_000):\n    globals()[f'v{_i}'] = _i")
    k.auto(1)
    total, restore = [], []
    for _ in range(rounds):
        k.call("execute_code", {"code": "import os; os._exit(1)"})
        t = time.perf_counter()
        r = k.ok("v9999")
        total.append((time.perf_counter() - t) * 1000)
        assert r["restored"] and len(r["restored_vars"]) >= 10_000, len(r["restored_vars"])
        restore.append(r["restore_ms"])
    k.close()
    print(f"  crash reply -> next cell's reply: p50 {statistics.median(total):.1f} ms "
          f"(restore alone {statistics.median(restore):.1f} ms, the rest starts a worker)")
    target("crash -> 10,000 names restored and the next cell answered, p50",
           statistics.median(total), 150, " ms")


def big_array(args, logs):
    print("\n3. a 200 MB numpy array (ms)")
    import numpy as np

    arr = np.random.default_rng(1).random(25_000_000)  # 200 MB
    d = tempfile.mkdtemp(dir=logs)
    path = os.path.join(d, "plain.pkl")
    dumps, loads = [], []
    for _ in range(3):  # the best of three, as the page cache warms
        t = time.perf_counter()
        with open(path, "wb") as f:
            pickle.dump(arr, f, protocol=5)
        dumps.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        with open(path, "rb") as f:
            back = pickle.load(f)
        loads.append((time.perf_counter() - t) * 1000)
        assert (back == arr).all()
        del back
        os.unlink(path)
    dump_ms, load_ms = min(dumps), min(loads)
    del arr
    k = Kernel(args.flowrepl, logs, "big", extra=("--checkpoints", "manual"))
    k.ok("import numpy as np\narr = np.random.default_rng(1).random(25_000_000)")
    saves, restores = [], []
    for _ in range(3):
        t = time.perf_counter()
        k.call("checkpoint")
        saves.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        r = k.call("restore")
        restores.append((time.perf_counter() - t) * 1000)
        assert "arr" in r["restored_vars"], r
    save_ms, restore_ms = min(saves), min(restores)
    k.close()
    print(f"  plain Python: pickle.dump to a file {dump_ms:.0f}, pickle.load from it {load_ms:.0f} (best of 3)")
    print(f"  flowrepl: checkpoint {save_ms:.0f}, restore {restore_ms:.0f} (best of 3, "
          f"round trips of `checkpoint` and `restore`)")
    print(f"  ratio: checkpoint / pickle.dump {save_ms / dump_ms:.2f}x, "
          f"restore / pickle.load {restore_ms / load_ms:.2f}x")


def restore_vs_replay(args, logs):
    print("\n4. rebuilding a task's state: restore against replay (ms)")
    cells = 10 if args.quick else 20
    k = Kernel(args.flowrepl, logs, "replay")
    k.ok("import numpy as np\nrng = np.random.default_rng(0)\nacc = []")
    for i in range(cells):
        k.ok(f"m = rng.random((400, 400))\nacc.append(float(np.linalg.eigvals(m).real.sum()))  # cell {i}")
    k.auto(cells + 1)
    t = time.perf_counter()
    r = k.call("restart", {"restore": True})
    restore_ms = (time.perf_counter() - t) * 1000
    assert r["restored"], r
    k.close()
    t = time.perf_counter()
    out = subprocess.run(
        [args.flowrepl, "--log-dir", logs, "--python", sys.executable, "log", "replay",
         "--plan", "bench-snap", "--task", "replay", "--json"],
        capture_output=True, text=True, env=dict(os.environ, FLOWREPL_LOG="warn"))
    replay_ms = (time.perf_counter() - t) * 1000
    doc = json.loads(out.stdout)
    assert doc["replayed"] == cells + 1, doc
    print(f"  restart {{restore: true}} {restore_ms:.1f}, log replay {replay_ms:.0f} "
          f"({cells + 1} cells; {doc['differ']} outputs differ)")
    target("restore / replay", restore_ms / replay_ms, 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--quick", action="store_true")
    args, _ = ap.parse_known_args()
    args.flowrepl = os.path.abspath(args.flowrepl)
    with tempfile.TemporaryDirectory() as logs:
        print("checkpoints and restores (issue 11)")
        one_name_in_ten_thousand(args, logs)
        every_cell(args, logs)
        crash_to_ready(args, logs)
        big_array(args, logs)
        restore_vs_replay(args, logs)


if __name__ == "__main__":
    main()
