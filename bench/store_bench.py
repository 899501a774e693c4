"""--store's figures (issue 33), measured in one run on loopback with moto's S3 server as the
store (started here), with targets. (`x = 1` with and without --store is flowrepl-bench's:
`bench/run --store` runs both.)

1. Handover: a task with 10,000 names and 10 MB of workspace files, stopped cleanly by one
   kernel (EOF: its state uploaded, its lease released), taken by a kernel in another, empty
   folder: from that kernel's start to its first answered cell (restored). Anchored against
   downloading the same objects with boto3 plus today's local restore of the same checkpoint
   (a kernel started with --resume on a disk that has it, no store).
2. After a SIGKILL (lease 2 s): from the second kernel's start to its first answer.
3. Upload delay: how long after a cell's reply its record is in the store (the head counts
   its bytes), cells 50 ms apart.
4. `x = 1` with --store-sync against the async default (interleaved, p50).
5. Requests (issue 46), counted in moto's request log: per cell at 1 cell/s, and idle, with
   their cost per task-hour at S3 Standard's request prices.

Usage: bench/store_bench.py --flowrepl target/release/flowrepl [--quick]
Runs under target/mcp-venv's python (moto, boto3).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import boto3
import checkpoints  # bench/checkpoints.py: its Kernel speaks JSON-RPC to a kernel

BUCKET = "bench"
PLAN = "local"


def target(name, value, limit, unit=""):
    ok = value <= limit
    print(f"  target: {name}: {value:.2f}{unit} <= {limit}{unit} [{'PASS' if ok else 'FAIL'}]")


class Moto:
    def __init__(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
        # Its request log (stderr: one line per request), for the request counts.
        self.log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log")
        self.p = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(self.port)],
                                  stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                assert time.time() < deadline, "moto_server did not start"
                time.sleep(0.05)
        self.env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
        }
        self.s3 = boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"],
                               aws_access_key_id="bench", aws_secret_access_key="bench",
                               region_name="us-east-1")
        self.s3.create_bucket(Bucket=BUCKET)

    def head(self, prefix, task):
        key = f"{prefix}/tasks/{PLAN}/{task}/head.json"
        return json.loads(self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def download(self, prefix, into):
        """Every object under the prefix into a folder (boto3, one GET each): the anchor."""
        n = 0
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for page in pages:
            for o in page.get("Contents", []):
                path = os.path.join(into, o["Key"])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(self.s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
                n += 1
        return n

    def requests(self, prefix):
        """(method, path) of every request served so far under the bucket's `prefix`."""
        want = f"/{BUCKET}/{prefix}"
        out = []
        with open(self.log.name, errors="replace") as f:
            for line in f:
                if '"' not in line:
                    continue
                req = line.split('"', 2)[1]
                req = req.replace("\x1b[31m", "").replace("\x1b[1m", "").replace("\x1b[33m", "")
                req = req.replace("\x1b[0m", "").replace("\x1b[32m", "").replace("\x1b[36m", "")
                parts = req.split()
                if len(parts) >= 2 and parts[1].startswith(want):
                    out.append((parts[0], parts[1]))
        return out

    def close(self):
        self.p.kill()
        self.p.wait()


class Kernel(checkpoints.Kernel):
    """A JSON-RPC kernel in its own folder (its disk), worker mode, as serve runs them; the
    calls are checkpoints.py's."""

    def __init__(self, args, moto, folder, task, prefix, extra=(), store=True):
        env = dict(os.environ, FLOW_PLAN_ID=PLAN, FLOW_TASK_ID=task, FLOWREPL_LOG="warn",
                   USE_SUBPROCESS_WORKER="1")
        for k in ("FLOWREPL_CHECKPOINTS", "FLOWREPL_RESUME", "FLOWREPL_STORE"):
            env.pop(k, None)
        cmd = [args.flowrepl, "--log-dir", os.path.join(folder, "logs"), "--python",
               sys.executable, *extra]
        if store:
            env.update(moto.env)
            cmd += ["--store", f"s3://{BUCKET}/{prefix}"]
        self.started = time.perf_counter()
        self.p = subprocess.Popen(cmd, cwd=folder, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env)
        self.n = 0
        line = self.p.stdout.readline()
        assert line and json.loads(line)["method"] == "ready", line

    def stored(self, moto, prefix, task, count):
        """Until the store has the checkpoint of cell `count` and every record."""
        deadline = time.time() + 60
        while time.time() < deadline:
            st = self.call("status")["store"]
            head = moto.head(prefix, task)
            if st["pending_log_bytes"] == 0 and head.get("state"):
                key = f"{prefix}/{head['state']}"
                m = json.loads(moto.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
                journal = m["checkpoints"].get("auto", {}).get("journal", "")
                if any(json.loads(line).get("execution_count") == count
                       for line in journal.splitlines()):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"the store did not get cell {count}")


SETUP = """
import os
for i in range(10000):
    globals()[f"v{i}"] = i
os.makedirs("data", exist_ok=True)
for i in range(10):
    with open(f"data/f{i}.bin", "wb") as f:
        f.write(os.urandom(1 << 20))
"""


def handover(args, moto, root):
    print("\n1. handover: a task with 10,000 names and 10 MB of workspace files, stopped cleanly,"
          " taken by a kernel on an empty disk (ms, start to first answer)")
    task, prefix = "handover", "h"
    first = os.path.join(root, "h0")
    os.makedirs(first)
    k = Kernel(args, moto, first, task, prefix)
    k.ok(SETUP)
    k.stored(moto, prefix, task, 1)
    k.close()
    took, folders = [], []
    for i in range(3 if args.quick else 7):
        folder = os.path.join(root, f"h{i + 1}")
        os.makedirs(folder)
        k = Kernel(args, moto, folder, task, prefix, extra=("--resume",))
        r = k.ok("v9999 + len(os.listdir('data'))")
        took.append((time.perf_counter() - k.started) * 1000)
        assert r.get("restored") and r["result"] == "10009", r
        k.close()
        folders.append(folder)
    download, local = [], []
    for i in range(len(took)):
        into = os.path.join(root, f"dl{i}")
        t0 = time.perf_counter()
        n = moto.download(f"{prefix}/tasks/{PLAN}/{task}/", into)
        download.append((time.perf_counter() - t0) * 1000)
        # Today's local restore of the same checkpoint: the disk already has it, no store.
        k = Kernel(args, moto, folders[-1], task, prefix, extra=("--resume",), store=False)
        r = k.ok("v9999 + len(os.listdir('data'))")
        local.append((time.perf_counter() - k.started) * 1000)
        assert r.get("restored"), r
        k.close()
    h, d, lo = (statistics.median(x) for x in (took, download, local))
    print(f"  handover p50 {h:.0f} ms (all: {', '.join(f'{t:.0f}' for t in took)})")
    print(f"  anchor: boto3 download of the task's {n} objects p50 {d:.0f} ms"
          f" + local --resume p50 {lo:.0f} ms = {d + lo:.0f} ms")
    target("handover / (boto3 download + local restore), p50", h / (d + lo), 1.5, "x")
    target("handover p50", h, 500, " ms")


def killed(args, moto, root):
    print("\n2. after a SIGKILL (--lease-s 2): the next kernel's first answer (s, from its start)")
    took = []
    for i in range(2 if args.quick else 3):
        task, prefix = f"killed{i}", "k"
        a_dir, b_dir = os.path.join(root, f"ka{i}"), os.path.join(root, f"kb{i}")
        os.makedirs(a_dir)
        os.makedirs(b_dir)
        a = Kernel(args, moto, a_dir, task, prefix, extra=("--lease-s", "2"))
        a.ok("x = 41")
        a.stored(moto, prefix, task, 1)
        a.p.send_signal(signal.SIGKILL)
        a.p.wait()
        b = Kernel(args, moto, b_dir, task, prefix, extra=("--lease-s", "2", "--resume"))
        r = b.ok("x + 1")
        took.append(time.perf_counter() - b.started)
        assert r.get("restored") and r["result"] == "42", r
        b.close()
    m = statistics.median(took)
    print(f"  p50 {m:.2f} s (all: {', '.join(f'{t:.2f}' for t in took)})")
    target("next call after a SIGKILL, p50 (lease 2 s)", m, 2 + 1, " s")


def delay(args, moto, root):
    print("\n3. a record in the store after its cell's reply (ms), cells 50 ms apart")
    task, prefix = "delay", "d"
    folder = os.path.join(root, "delay")
    os.makedirs(folder)
    k = Kernel(args, moto, folder, task, prefix)
    seen = []  # (time, log bytes in the store)
    stop = threading.Event()

    def watch():
        s3 = boto3.client("s3", endpoint_url=moto.env["AWS_ENDPOINT_URL"],
                          aws_access_key_id="bench", aws_secret_access_key="bench",
                          region_name="us-east-1")
        key = f"{prefix}/tasks/{PLAN}/{task}/head.json"
        while not stop.is_set():
            head = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
            seen.append((time.perf_counter(), sum(r["bytes"] for r in head["log"])))
            time.sleep(0.01)

    t = threading.Thread(target=watch)
    t.start()
    cells = []
    for i in range(40 if args.quick else 150):
        k.ok(f"x{i} = {i}")
        replied = time.perf_counter()
        # `status` waits until the cell's record is in the file: its end is the file's size.
        size = os.path.getsize(k.call("status")["log_file"])
        cells.append((replied, size))
        time.sleep(0.05)
    time.sleep(2.5)
    stop.set()
    t.join()
    k.close()
    delays = []
    for replied, size in cells:
        arrived = next((ts for ts, b in seen if b >= size), None)
        assert arrived is not None, "a record never reached the store"
        delays.append(max(0.0, arrived - replied) * 1000)
    delays.sort()
    p50 = statistics.median(delays)
    p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
    print(f"  p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {delays[-1]:.0f} ms"
          f" ({len(delays)} cells; the head polled every ~10 ms)")
    target("a record in the store after its reply, p99", p99 / 1000, 1.2, " s")


def sync_cost(args, moto, root):
    print("\n4. x = 1 with --store-sync against the async default (us), interleaved")
    ks = {}
    for name, extra in (("async", ()), ("sync", ("--store-sync",))):
        folder = os.path.join(root, f"sync-{name}")
        os.makedirs(folder)
        ks[name] = Kernel(args, moto, folder, f"sync-{name}", "s", extra)
        ks[name].ok("x = 0")
    took = {"async": [], "sync": []}
    for _ in range(50 if args.quick else 300):
        for name, k in ks.items():
            t = time.perf_counter()
            k.ok("x = 1")
            took[name].append((time.perf_counter() - t) * 1e6)
    for k in ks.values():
        k.close()
    a, s = statistics.median(took["async"]), statistics.median(took["sync"])
    print(f"  p50 async {a:.0f} us, --store-sync {s:.0f} us: {s / a:.1f}x")
    target("--store-sync / async, p50", s / a, 1.5, "x")


# S3 Standard, us-east-1: PUT, COPY, POST, LIST per 1,000; GET per 1,000; DELETE free.
PRICE = {"PUT": 0.005 / 1000, "POST": 0.005 / 1000, "GET": 0.0004 / 1000, "HEAD": 0.0004 / 1000,
         "DELETE": 0.0}


def requests(args, moto, root):
    print("\n5. requests per task (default lease, 15 s): 1 cell/s, then idle")
    task, prefix = "req", "q"
    folder = os.path.join(root, "req")
    os.makedirs(folder)
    k = Kernel(args, moto, folder, task, prefix)
    k.ok("x = 0")
    k.stored(moto, prefix, task, 1)
    time.sleep(1.5)
    n = 20 if args.quick else 60
    base = len(moto.requests(prefix + "/"))
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        k.ok(f"x = {i}")
        time.sleep(max(0.0, t0 + i - time.perf_counter()))
    active = moto.requests(prefix + "/")[base:]
    by = {}
    for m, _ in active:
        by[m] = by.get(m, 0) + 1
    heads = sum(1 for m, p in active if m == "PUT" and p.endswith("head.json"))
    cost = sum(PRICE.get(m, 0.005 / 1000) * c for m, c in by.items()) / n * 3600
    print(f"  1 cell/s for {n} s: {by} = {by.get('PUT', 0) / n:.2f} PUT per cell"
          f" ({heads} head swaps); ${cost:.4f} per task-hour")
    target("PUTs per cell at 1 cell/s", by.get("PUT", 0) / n, 3)
    # Idle: parked once everything is up.
    deadline = time.time() + 10
    while time.time() < deadline and not moto.head(prefix, task).get("released"):
        time.sleep(0.1)
    base = len(moto.requests(prefix + "/"))
    idle_s = 10 if args.quick else 60
    time.sleep(idle_s)
    idle = len(moto.requests(prefix + "/")) - base
    print(f"  idle for {idle_s} s: {idle} requests (${idle / idle_s * 3600 * 0.005 / 1000:.4f}"
          " per task-hour at most)")
    target("requests per lease third (5 s) idle", idle / (idle_s / 5), 1)
    k.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only-46", action="store_true",
                    help="only the --store-sync and request figures")
    args, _ = ap.parse_known_args()
    # The kernels run in folders of their own.
    args.flowrepl = os.path.abspath(args.flowrepl)
    moto = Moto()
    root = tempfile.mkdtemp(prefix="flowrepl-store-bench-")
    try:
        if not args.only_46:
            handover(args, moto, root)
            killed(args, moto, root)
            delay(args, moto, root)
        sync_cost(args, moto, root)
        requests(args, moto, root)
    finally:
        moto.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
