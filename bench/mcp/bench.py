"""flowrepl mcp against a Python MCP server (official SDK MCPServer, exec + redirect_stdout),
both driven by the same official Python SDK client, measured in one run.

Prints p50 times and ratios with the targets of the MCP issue:
  tools/call round trip for `x = 1`   <= 0.5x the Python server
  start to initialized                <= 0.2x
  1 MB print through MCP              <= 0.5x (at flowrepl's default 20000-character budget,
                                       and again with the budget raised past 1 MB, where
                                       flowrepl returns the whole output like the anchor)
Usage: bench.py --flowrepl BIN [--quick]
"""
import argparse
import os
import statistics
import sys
import time

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

HERE = os.path.dirname(os.path.abspath(__file__))


def servers(flowrepl, logs):
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    base["FLOWREPL_LOG_DIR"] = logs
    base["FLOWREPL_LOG"] = "error"
    venv = os.path.dirname(os.path.dirname(sys.executable))
    return {
        "python": StdioServerParameters(command=sys.executable,
                                        args=[os.path.join(HERE, "anchor_server.py")], env=base),
        "flowrepl": StdioServerParameters(command=flowrepl, args=["mcp", "--python", venv],
                                          env=base),
        "flowrepl-full": StdioServerParameters(
            command=flowrepl, args=["mcp", "--python", venv],
            env={**base, "FLOWREPL_MCP_MAX_CHARS": "2000000"}),
        "flowrepl-worker": StdioServerParameters(
            command=flowrepl, args=["mcp", "--worker", "--python", venv], env=base),
    }


async def start_time(params):
    t0 = time.perf_counter()
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            took = time.perf_counter() - t0
    return took


async def round_trips(params, code, n, check):
    times = []
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for _ in range(max(3, n // 10)):  # warm up
                res = await s.call_tool("execute_code", {"code": code})
            check(res)
            for _ in range(n):
                t0 = time.perf_counter()
                await s.call_tool("execute_code", {"code": code})
                times.append(time.perf_counter() - t0)
    return times


def p50(xs):
    return statistics.median(xs)


def fmt(seconds):
    return f"{seconds * 1e3:9.3f} ms"


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--logs", default="/tmp/flowrepl-bench-mcp-logs")
    opts = ap.parse_args()
    n_small, n_big, n_start = (100, 10, 3) if opts.quick else (500, 30, 10)
    sv = servers(opts.flowrepl, opts.logs)

    def ok(res):
        assert not res.is_error, res

    def full_mb(res):
        text = "".join(c.text for c in res.content if c.type == "text")
        assert len(text) >= 1_000_000, len(text)

    rows = {}
    for name in ("python", "flowrepl", "flowrepl-worker"):
        starts = [await start_time(sv[name]) for _ in range(n_start)]
        rows[(name, "start")] = p50(starts)
        rows[(name, "x1")] = p50(await round_trips(sv[name], "x = 1", n_small, ok))
    big = "print('a' * 1_000_000)"
    rows[("python", "big")] = p50(await round_trips(sv["python"], big, n_big, full_mb))
    rows[("flowrepl", "big")] = p50(await round_trips(sv["flowrepl"], big, n_big, ok))
    rows[("flowrepl-full", "big")] = p50(await round_trips(sv["flowrepl-full"], big, n_big,
                                                           full_mb))
    rows[("flowrepl-worker", "big")] = p50(await round_trips(sv["flowrepl-worker"], big, n_big,
                                                             ok))

    print(f"\nflowrepl mcp vs a Python MCP server (official SDK MCPServer), same SDK client; "
          f"p50 of {n_small} x=1 calls, {n_big} 1 MB prints, {n_start} starts")
    print(f"{'':44} {'Python server':>12} {'flowrepl':>12} {'ratio':>7}  target")

    def line(label, fl, anchor, target):
        ratio = rows[fl] / rows[anchor]
        verdict = "PASS" if ratio <= target else "MISS"
        print(f"{label:44} {fmt(rows[anchor])} {fmt(rows[fl])} {ratio:6.2f}x  <= {target}x {verdict}")

    line("start to initialized (in-process)", ("flowrepl", "start"), ("python", "start"), 0.2)
    line("start to initialized (worker)", ("flowrepl-worker", "start"), ("python", "start"), 0.2)
    line("tools/call x = 1 (in-process)", ("flowrepl", "x1"), ("python", "x1"), 0.5)
    line("tools/call x = 1 (worker)", ("flowrepl-worker", "x1"), ("python", "x1"), 0.5)
    line("1 MB print, default budget (in-process)", ("flowrepl", "big"), ("python", "big"), 0.5)
    line("1 MB print, default budget (worker)", ("flowrepl-worker", "big"), ("python", "big"), 0.5)
    line("1 MB print, whole output returned", ("flowrepl-full", "big"), ("python", "big"), 0.5)


if __name__ == "__main__":
    anyio.run(main)
