"""`flowrepl serve` (MCP over streamable HTTP, many kernels) against its anchors, in one run.

Prints figures and ratios with the targets of the serve issue:
  tools/call `x = 1`, kernel running, official Python SDK client over HTTP
      <= 0.5x the same call to a Python SDK MCPServer over streamable HTTP (the anchor)
  the server's own cost: `x = 1` with a lean HTTP client (http.client, one keep-alive
      connection) minus the same request over stdio to `flowrepl mcp` (raw lines)
      <= +300 us p50
  first call on a new task (its kernel started, sandboxed)   <= 60 ms p50
  50 concurrent clients on 10 tasks, `x = 1`: throughput and p99 (target p99 <= 25 ms;
      the clients are 50 threads of this one Python process, so they are part of what is
      measured)
  100 idle kernels under one server: total PSS of the server and everything under it
      <= 1.5 GB

Usage: serve_bench.py --flowrepl BIN [--quick]
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "bench-token-0123456789abcdef"
ACCEPT = "application/json, text/event-stream"


def p(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def ms(s):
    return f"{s * 1000:8.2f} ms"


def us(s):
    return f"{s * 1e6:8.1f} us"


def start_serve(flowrepl, work, *extra):
    os.makedirs(work, exist_ok=True)
    err = open(os.path.join(work, "serve.log"), "w+")
    proc = subprocess.Popen(
        [flowrepl, "serve", "--listen", "127.0.0.1:0", "--log-dir", f"{work}/logs",
         "--workspace-root", f"{work}/ws", "--state-dir", f"{work}/state", *extra],
        env={**os.environ, "FLOWREPL_TOKEN": TOKEN, "FLOWREPL_LOG": "warn"},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    for _ in range(600):
        err.seek(0)
        m = re.search(r"MCP at (http://\S+)", err.read())
        if m:
            return proc, m.group(1)
        time.sleep(0.05)
    raise SystemExit("flowrepl serve did not start: " + open(err.name).read())


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def sdk_calls(url, headers, args, n):
    """Round trips of `execute_code` through the official SDK client over HTTP."""
    times = []
    async with httpx2.AsyncClient(headers=headers, timeout=60) as h, \
            streamable_http_client(url, http_client=h) as (r, w, *_):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for _ in range(20):
                await s.call_tool("execute_code", args)
            for _ in range(n):
                t0 = time.perf_counter()
                res = await s.call_tool("execute_code", args)
                times.append(time.perf_counter() - t0)
                assert not res.is_error, res
    return times


class RawHttp:
    """A lean MCP client over one keep-alive HTTP/1.1 connection (http.client)."""

    def __init__(self, url):
        u = httpx2.URL(url)
        self.path = u.path
        self.conn = http.client.HTTPConnection(u.host, u.port)
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Accept": ACCEPT,
                        "Content-Type": "application/json"}
        self.id = 0
        r = self.post({"method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}})
        assert "result" in r, r
        self.post({"method": "notifications/initialized"}, notify=True)

    def post(self, msg, notify=False):
        msg = {"jsonrpc": "2.0", **msg}
        if not notify:
            self.id += 1
            msg["id"] = self.id
        # bytes: http.client sends a str body in a second write (Nagle + delayed ACK).
        self.conn.request("POST", self.path, json.dumps(msg).encode(), self.headers)
        resp = self.conn.getresponse()
        sid = resp.getheader("mcp-session-id")
        if sid:
            self.headers["mcp-session-id"] = sid
        body = resp.read().decode()
        if notify:
            return None
        if resp.getheader("content-type", "").startswith("text/event-stream"):
            datas = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
            for d in datas:
                if d:
                    m = json.loads(d)
                    if m.get("id") == msg["id"]:
                        return m
            raise AssertionError(body)
        return json.loads(body)

    def call(self, args):
        return self.post({"method": "tools/call",
                          "params": {"name": "execute_code", "arguments": args}})


def raw_http_calls(url, args, n):
    c = RawHttp(url)
    for _ in range(20):
        c.call(args)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = c.call(args)
        times.append(time.perf_counter() - t0)
        assert not r["result"].get("isError"), r
    return times


def raw_stdio_calls(flowrepl, work, n):
    """The same request as raw lines to `flowrepl mcp` on stdio (sandboxed, as serve's)."""
    proc = subprocess.Popen(
        [flowrepl, "mcp", "--sandbox", "--workspace", work, "--log-dir", f"{work}/stdio-logs"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "FLOWREPL_LOG": "warn"})

    def ask(i, method, params, notify=False):
        msg = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            msg["id"] = i
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()
        if not notify:
            while True:
                m = json.loads(proc.stdout.readline())
                if m.get("id") == i:
                    return m

    ask(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "bench", "version": "1"}})
    ask(0, "notifications/initialized", {}, notify=True)
    args = {"name": "execute_code", "arguments": {"code": "x = 1"}}
    for i in range(20):
        ask(i + 1, "tools/call", args)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        ask(100 + i, "tools/call", args)
        times.append(time.perf_counter() - t0)
    proc.stdin.close()
    proc.wait(30)
    return times


async def first_calls(url, headers, n):
    times = []
    async with httpx2.AsyncClient(headers=headers, timeout=60) as h, \
            streamable_http_client(url, http_client=h) as (r, w, *_):
        async with ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("execute_code", {"code": "1", "task": "warm"})
            for i in range(n):
                t0 = time.perf_counter()
                res = await s.call_tool("execute_code", {"code": "x = 1", "task": f"new-{i}"})
                times.append(time.perf_counter() - t0)
                assert not res.is_error, res
                # Stopped again, so that every start is measured with the same kernels up.
                await s.call_tool("stop_kernel", {"task": f"new-{i}"})
    return times


def crowd(url, clients, calls, tasks):
    """`clients` threads, each its own lean HTTP client, `calls` calls each on `tasks`."""
    lat = []
    lock = threading.Lock()
    errors = []
    conns = [RawHttp(url) for _ in range(clients)]
    for i, c in enumerate(conns):  # every task's kernel up first
        if i < tasks:
            c.call({"code": "x = 1", "task": f"crowd-{i}"})
    barrier = threading.Barrier(clients)

    def run(i):
        c = conns[i]
        mine = []
        barrier.wait()
        for _ in range(calls):
            t0 = time.perf_counter()
            r = c.call({"code": "x = 1", "task": f"crowd-{i % tasks}"})
            mine.append(time.perf_counter() - t0)
            if r["result"].get("isError"):
                errors.append(r)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert not errors, errors[:3]
    return lat, wall


def tree_pss_kb(pid):
    total, todo = 0, [pid]
    while todo:
        q = todo.pop()
        try:
            for line in open(f"/proc/{q}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
            for t in os.listdir(f"/proc/{q}/task"):
                todo += [int(c) for c in open(f"/proc/{q}/task/{t}/children").read().split()]
        except OSError:
            pass
    return total


async def idle_kernels(url, headers, n):
    async with httpx2.AsyncClient(headers=headers, timeout=120) as h, \
            streamable_http_client(url, http_client=h) as (r, w, *_):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for i in range(n):
                res = await s.call_tool("execute_code", {"code": "x = 1", "task": f"idle-{i}"})
                assert not res.is_error, res
            listed = (await s.call_tool("list_kernels", {})).structured_content["kernels"]
            assert len(listed) == n, len(listed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--quick", action="store_true")
    opts, _ = ap.parse_known_args()
    n = 100 if opts.quick else 500
    headers = {"Authorization": f"Bearer {TOKEN}"}
    args = {"code": "x = 1", "task": "bench"}
    results = []
    with tempfile.TemporaryDirectory() as work:
        proc, url = start_serve(opts.flowrepl, work, "--max-kernels", "200")
        port = free_port()
        anchor = subprocess.Popen([sys.executable, os.path.join(HERE, "anchor_server.py"),
                                   "--http", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        anchor_url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(200):
            try:
                http.client.HTTPConnection("127.0.0.1", port).request("GET", "/")
                break
            except OSError:
                time.sleep(0.05)
        try:
            # 1. Python SDK client: flowrepl serve against the anchor, interleaved rounds.
            fl, an = [], []
            for _ in range(3 if not opts.quick else 1):
                fl += anyio.run(sdk_calls, url, headers, args, n // 2)
                an += anyio.run(sdk_calls, anchor_url, {}, {"code": "x = 1"}, n // 2)
            results.append(("tools/call x = 1, Python SDK over HTTP, p50",
                            ms(p(fl, 0.5)), ms(p(an, 0.5)), p(fl, 0.5) / p(an, 0.5), "<= 0.5x"))
            # 2. The server's own cost: lean HTTP client vs raw stdio lines.
            hx, sx = [], []
            for _ in range(3 if not opts.quick else 1):
                hx += raw_http_calls(url, args, n)
                sx += raw_stdio_calls(opts.flowrepl, work, n)
            over = p(hx, 0.5) - p(sx, 0.5)
            results.append(("x = 1, lean HTTP client vs stdio raw lines, p50",
                            us(p(hx, 0.5)), us(p(sx, 0.5)), over * 1e6, "<= +300 us"))
            # 3. First call on a new task.
            fc = anyio.run(first_calls, url, headers, 10 if opts.quick else 30)
            results.append(("first call on a new task (kernel start), p50",
                            ms(p(fc, 0.5)), "", p(fc, 0.5) * 1000, "<= 60 ms"))
            # 4. 50 clients on 10 tasks.
            lat, wall = crowd(url, 50, 10 if opts.quick else 40, 10)
            results.append((f"50 clients on 10 tasks: {len(lat) / wall:.0f} calls/s, p50",
                            ms(p(lat, 0.5)), "", None, ""))
            results.append(("50 clients on 10 tasks, p99", ms(p(lat, 0.99)), "",
                            p(lat, 0.99) * 1000, "<= 25 ms"))
        finally:
            anchor.terminate()
            stop(proc)
        # 5. 100 idle kernels under one server.
        proc, url = start_serve(opts.flowrepl, work + "/idle", "--max-kernels", "200")
        try:
            anyio.run(idle_kernels, url, headers, 100)
            time.sleep(1)
            pss = tree_pss_kb(proc.pid)
            results.append(("100 idle kernels: PSS of the server and all under it",
                            f"{pss / 1024:8.0f} MB", "", pss / 1024 / 1024, "<= 1.5 GB"))
        finally:
            stop(proc)
    print("\nflowrepl serve (streamable HTTP; kernels sandboxed) against its anchors, one run\n")
    print(f"{'':56} {'serve':>12} {'anchor':>12}   figure")
    for label, a, b, ratio, target in results:
        fig = "" if ratio is None else (f"{ratio:.2f}" if isinstance(ratio, float) else str(ratio))
        print(f"{label:56} {a:>12} {b:>12}   {fig} {target}")
    print("\nanchor: a Python SDK MCPServer over streamable HTTP (bench/mcp/anchor_server.py);")
    print("stdio: `flowrepl mcp --sandbox` spoken to with raw lines by the same Python process.")


if __name__ == "__main__":
    main()
