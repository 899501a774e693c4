"""The kernel as a user's client drives it: a Python program on plain pipes (like the MCP SDK
clients and the original TypeScript server's Node process), next to the Rust driver
(`flowrepl-bench`), in one run, interleaved, with ratios against the anchors.

Anchors: a plain 28-line Python NDJSON REPL (bench/plain_repl.py) and a raw pipe echo
(`flowrepl-bench echo`). Targets (issue 15): in-process `x = 1` <= 0.7x the plain REPL, worker
`x = 1` <= 1.3x in-process, the 1 MB print <= 0.5x the plain REPL in-process and <= 0.7x in
worker mode.

Placement (--placement) decides most of a round trip on a VM whose idle vCPUs are slow to wake
(docs/design.md, "Where a round trip goes"): `os` leaves it to the scheduler, `same` puts the
client and every server on one CPU, `apart` the client on one CPU and the servers (with their
workers) on another. A server that shares the client's CPU costs its CPU time; one on another
CPU costs the wake-ups of a halted vCPU.

Usage: bench/py_client.py --flowrepl target/release/flowrepl --bench target/release/flowrepl-bench
       [--quick] [--unbuffered] [--placement os|same|apart]
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time


def request(code):
    return (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "execute_code",
                        "params": {"code": code}}) + "\n").encode()


class Peer:
    """A process spoken to one line at a time, as a client library would: a buffered
    writer flushed per request and a buffered reader (or raw os.write/os.read)."""

    def __init__(self, cmd, env=None, ready=True, unbuffered=False, cpus=None):
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  preexec_fn=pin)
        self.unbuffered = unbuffered
        self.buf = b""
        if ready:
            self.line()

    def line(self):
        if not self.unbuffered:
            return self.p.stdout.readline()
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def round_trip(self, req):
        t = time.perf_counter()
        if self.unbuffered:
            os.write(self.p.stdin.fileno(), req)
        else:
            self.p.stdin.write(req)
            self.p.stdin.flush()
        line = self.line()
        return (time.perf_counter() - t) * 1e6, line

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def mcp_peer(flowrepl, env, unbuffered, cpus):
    """`flowrepl mcp` after the MCP handshake, spoken to with raw lines (no SDK)."""
    p = Peer([flowrepl, "mcp"], env=env, ready=False, unbuffered=unbuffered, cpus=cpus)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "1"}}}
    p.round_trip((json.dumps(init) + "\n").encode())
    note = (json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n").encode()
    if unbuffered:
        os.write(p.p.stdin.fileno(), note)
    else:
        p.p.stdin.write(note)
        p.p.stdin.flush()
    return p


def mcp_request(code):
    return (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "execute_code", "arguments": {"code": code}}}) + "\n").encode()


def measure(peer, req, warm, n, check=True):
    for _ in range(warm):
        peer.round_trip(req)
    out = []
    for _ in range(n):
        us, line = peer.round_trip(req)
        if check and b'"success":true' not in line and b'"success": true' not in line and b'"isError":false' not in line:
            raise RuntimeError(line[:300])
        out.append(us)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--bench", required=True, help="flowrepl-bench (its `echo` is the raw pipe)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--unbuffered", action="store_true", help="os.write/os.read instead of file objects")
    ap.add_argument("--placement", choices=["os", "same", "apart"], default="os",
                    help="CPUs of the client and the servers (see the module's doc)")
    args, _ = ap.parse_known_args()
    cpus = sorted(os.sched_getaffinity(0))
    if args.placement != "os" and len(cpus) < 2:
        print(f"\n--placement {args.placement}: needs two CPUs; this process may use {len(cpus)}")
        return
    client_cpus, server_cpus = {
        "os": (None, None),
        "same": ({cpus[-1]}, {cpus[-1]}),
        "apart": ({cpus[0]}, {cpus[-1]}),
    }[args.placement]
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    rounds = 4 if args.quick else 10
    n_small, n_big = (300, 5) if args.quick else (1000, 15)
    small, big = request("x = 1"), request("print('a' * 1_000_000)")
    logs = tempfile.mkdtemp()
    env = dict(os.environ, FLOWREPL_LOG_DIR=logs, FLOWREPL_LOG="warn")
    env.pop("USE_SUBPROCESS_WORKER", None)
    worker_env = dict(env, USE_SUBPROCESS_WORKER="1")
    python = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                            capture_output=True, text=True).stdout.strip()
    here = os.path.dirname(os.path.abspath(__file__))
    ub = args.unbuffered
    on = server_cpus
    peers = {
        "raw pipe": Peer([args.bench, "echo"], ready=False, unbuffered=ub, cpus=on),
        "plain REPL": Peer([python, os.path.join(here, "plain_repl.py")], unbuffered=ub, cpus=on),
        "in-process": Peer([args.flowrepl], env=env, unbuffered=ub, cpus=on),
        "worker": Peer([args.flowrepl], env=worker_env, unbuffered=ub, cpus=on),
        "mcp": mcp_peer(args.flowrepl, env, ub, on),
    }
    requests = {k: (mcp_request("x = 1"), mcp_request("print('a' * 1_000_000)")) if k == "mcp"
                else (small, big) for k in peers}
    small_us = {k: [] for k in peers}
    big_us = {k: [] for k in peers if k != "raw pipe"}
    order = list(peers)
    for r in range(rounds):
        # Rotate which goes first, so that machine noise hits all alike.
        for name in order[r % len(order):] + order[:r % len(order)]:
            p = peers[name]
            check = name != "raw pipe"
            small_us[name] += measure(p, requests[name][0], 50, n_small, check)
            if name in big_us:
                big_us[name] += measure(p, requests[name][1], 2, n_big, check)
    for p in peers.values():
        p.close()
    med = {k: statistics.median(v) for k, v in small_us.items()}
    medb = {k: statistics.median(v) for k, v in big_us.items()}
    client = "os.write/os.read" if ub else "buffered file objects"
    where = {"os": "placed by the scheduler",
             "same": f"client and servers on CPU {cpus[-1]}",
             "apart": f"client on CPU {cpus[0]}, servers on CPU {cpus[-1]}"}[args.placement]
    print(f"\nthe Python client ({client}; {where}), {rounds} interleaved rounds, p50 µs")
    print(f"{'':<14} {'x = 1':>10} {'/ plain':>9} {'1 MB print':>12} {'/ plain':>9}")
    for k in peers:
        b = f"{medb[k]:>12.1f} {medb[k] / medb['plain REPL']:>8.2f}x" if k in medb else ""
        print(f"{k:<14} {med[k]:>10.1f} {med[k] / med['plain REPL']:>8.2f}x {b}")
    def target(name, v, limit):
        print(f"  [{'PASS' if v <= limit else 'MISS'}] {name}: {v:.2f} <= {limit}")
    target("in-process x = 1 / plain REPL (Python client)", med["in-process"] / med["plain REPL"], 0.7)
    target("worker x = 1 / in-process x = 1 (Python client)", med["worker"] / med["in-process"], 1.3)
    target("1 MB print in-process / plain REPL (Python client)", medb["in-process"] / medb["plain REPL"], 0.5)
    target("1 MB print worker / plain REPL (Python client)", medb["worker"] / medb["plain REPL"], 0.7)
    extra = med["mcp"] - med["in-process"]
    print(f"  [{'PASS' if extra <= 40 else 'MISS'}] flowrepl mcp x = 1 - JSON-RPC x = 1 (raw client): {extra:.1f} µs <= 40")


if __name__ == "__main__":
    main()
