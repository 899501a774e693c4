"""`flowrepl serve` (MCP over streamable HTTP, many kernels) against its anchors, in one run.

Prints figures and ratios with the targets of the serve issue:
  tools/call `x = 1`, kernel running, official Python SDK client over HTTP
      <= 0.5x the same call to a Python SDK MCPServer over streamable HTTP (the anchor);
      with the handshake (2025-11-25) and with the SDK's default Client (2026-07-28), and
      the client's own CPU per call, which no server can go under
  the server's own cost: `x = 1` from a lean client (flowrepl-bench mcp-calls: HTTP/1.1 by
      hand, one keep-alive connection) minus the same request as lines on stdio to
      `flowrepl mcp --sandbox`       <= +300 us p50
  first call on a new task (its kernel started, sandboxed)   <= 60 ms p50
  50 concurrent clients on 10 tasks, `x = 1` (lean clients, 50 threads): throughput and
      p99 (target p99 <= 25 ms)
  100 idle kernels under one server: total PSS of the server and everything under it
      <= 1.5 GB

Usage: serve_bench.py --flowrepl BIN [--quick]   (flowrepl-bench next to BIN)
"""
import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import anyio
import httpx2
from mcp import ClientSession
from mcp.client import Client as SdkClient
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


async def sdk_calls(url, headers, args, n, modern=False):
    """Round trips of `execute_code` through the official SDK client over HTTP: ClientSession
    with `initialize` (protocol 2025-11-25, a session), or with `modern` the SDK's own Client
    (2026-07-28 after server/discover, no session). Returns the round trips and the client's
    own CPU time per call (the floor of any round trip it measures)."""
    times = []
    async with httpx2.AsyncClient(headers=headers, timeout=60) as h:
        async with contextlib.AsyncExitStack() as stack:
            transport = streamable_http_client(url, http_client=h)
            if modern:
                s = await stack.enter_async_context(SdkClient(transport))
                assert s.session.protocol_version == "2026-07-28", s.session.protocol_version
            else:
                r, w, *_ = await stack.enter_async_context(transport)
                s = await stack.enter_async_context(ClientSession(r, w))
                await s.initialize()
            for _ in range(20):
                await s.call_tool("execute_code", args)
            cpu = time.process_time()
            for _ in range(n):
                t0 = time.perf_counter()
                res = await s.call_tool("execute_code", args)
                times.append(time.perf_counter() - t0)
                assert not res.is_error, res
            cpu = (time.process_time() - cpu) / n
    return times, cpu


def lean(bench, *args):
    """`flowrepl-bench mcp-calls`: lean clients in Rust (hand-written HTTP/1.1 over one
    keep-alive connection each, or lines on stdio), so the figures are the server's."""
    out = subprocess.run([bench, "mcp-calls", *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"mcp-calls {args}: {out.stderr}")
    return json.loads(out.stdout)


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
    ap.add_argument("--bench", help="flowrepl-bench (default: next to --flowrepl)")
    opts, _ = ap.parse_known_args()
    bench = opts.bench or os.path.join(os.path.dirname(opts.flowrepl), "flowrepl-bench")
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
            # 1. Python SDK client: flowrepl serve against the anchor, interleaved rounds, with
            # the handshake (2025-11-25) and with the SDK's default Client (2026-07-28). The
            # client's own CPU per call bounds what any server can reach: the floor line.
            for modern, name in ((False, "2025-11-25"), (True, "2026-07-28")):
                fl, an, fl_cpu, an_cpu = [], [], [], []
                for _ in range(3 if not opts.quick else 1):
                    t, c = anyio.run(sdk_calls, url, headers, args, n // 2, modern)
                    fl += t
                    fl_cpu.append(c)
                    t, c = anyio.run(sdk_calls, anchor_url, {}, {"code": "x = 1"}, n // 2, modern)
                    an += t
                    an_cpu.append(c)
                f50, a50 = p(fl, 0.5), p(an, 0.5)
                results.append((f"tools/call x = 1, Python SDK ({name}), p50",
                                ms(f50), ms(a50), f50 / a50, "<= 0.5x"))
                fc, ac = statistics.median(fl_cpu), statistics.median(an_cpu)
                results.append((f"  the SDK client's own CPU per call ({name})", ms(fc), ms(ac),
                                fc / a50, "the lowest ratio this client allows"))
            # 2. The server's own cost: lean clients, HTTP against stdio, interleaved.
            hx, sx = [], []
            for _ in range(3 if not opts.quick else 1):
                hx.append(lean(bench, "--url", url, "--token", TOKEN, "--calls", n)["p50_us"])
                sx.append(lean(bench, "--stdio", opts.flowrepl, "--calls", n)["p50_us"])
            h50, s50 = statistics.median(hx), statistics.median(sx)
            results.append(("x = 1, lean client: HTTP vs stdio lines, p50",
                            f"{h50:8.1f} us", f"{s50:8.1f} us", h50 - s50, "<= +300 us"))
            # 3. First call on a new task.
            fc = anyio.run(first_calls, url, headers, 10 if opts.quick else 30)
            results.append(("first call on a new task (kernel start), p50",
                            ms(p(fc, 0.5)), "", p(fc, 0.5) * 1000, "<= 60 ms"))
            # 4. 50 clients on 10 tasks.
            c = lean(bench, "--url", url, "--token", TOKEN, "--clients", 50, "--tasks", 10,
                     "--calls", 40 if opts.quick else 200)
            results.append((f"50 clients on 10 tasks: {c['per_s']:.0f} calls/s, p50",
                            f"{c['p50_us'] / 1000:8.2f} ms", "", None, ""))
            results.append(("50 clients on 10 tasks, p99", f"{c['p99_us'] / 1000:8.2f} ms", "",
                            c["p99_us"] / 1000, "<= 25 ms"))
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
    print("lean client: flowrepl-bench mcp-calls (Rust, hand-written HTTP/1.1; stdio: lines to")
    print("`flowrepl mcp --sandbox`).")


if __name__ == "__main__":
    main()
