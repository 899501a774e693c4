"""Files in and out of a task (issue 34), measured in one run on loopback, with targets.

1. HTTP PUT and GET of 1 GiB through `flowrepl serve` (`/files/<plan>/<task>/<path>`, the
   bearer token, sha256 recorded) against Debian's nginx (started here, same disk, `sendfile`
   for GET, the DAV module for PUT), both driven by curl. Target: >= 0.5x nginx's speed.
2. `download_file` of a 1 MB text file over MCP (official Python SDK client, stdio
   `flowrepl mcp`) against the same 1 MB printed by a cell and returned by `execute_code`,
   and against reading it back with `read_output` pages. Target: <= 1.2x the printed cell.

Usage: bench/files_bench.py --flowrepl target/release/flowrepl [--quick]
Runs under target/mcp-venv's python (the MCP SDK).
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import anyio

TOKEN = "bench-token-0123456789"
NGINX = "/usr/sbin/nginx"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, within=30):
    deadline = time.time() + within
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            assert time.time() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


def curl(args):
    t = time.perf_counter()
    subprocess.run(["curl", "-sS", "--fail", "--http1.1"] + args, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def http(flowrepl, size, runs):
    work = tempfile.mkdtemp(prefix="flowrepl-files-bench-")
    try:
        src = os.path.join(work, "src.bin")
        with open(src, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(size >> 20):
                f.write(block)
        # nginx: GET from its root (sendfile), PUT through the DAV module.
        root = os.path.join(work, "nginx-root")
        os.makedirs(root)
        shutil.copy(src, os.path.join(root, "big.bin"))
        nport = free_port()
        conf = os.path.join(work, "nginx.conf")
        os.makedirs(os.path.join(work, "tmp"))
        # Its worker writes the uploads into this private folder: as this user.
        user = "user root;" if os.geteuid() == 0 else ""
        with open(conf, "w") as f:
            f.write(f"""
daemon off; {user} worker_processes 1; pid {work}/nginx.pid; error_log {work}/nginx.err;
events {{ worker_connections 64; }}
http {{
  access_log off; sendfile on; client_max_body_size 0; client_body_temp_path {work}/tmp;
  server {{ listen 127.0.0.1:{nport}; root {root};
    location / {{ dav_methods PUT; create_full_put_path on; }} }}
}}
""")
        nginx = subprocess.Popen([NGINX, "-c", conf, "-p", work], stderr=subprocess.DEVNULL)
        # flowrepl serve with the task's workspace on the same disk.
        sport = free_port()
        env = dict(os.environ, FLOWREPL_TOKEN=TOKEN, FLOWREPL_LOG="warn")
        serve = subprocess.Popen(
            [flowrepl, "serve", "--listen", f"127.0.0.1:{sport}", "--no-sandbox",
             "--log-dir", os.path.join(work, "logs"), "--workspace-root",
             os.path.join(work, "ws"), "--state-dir", os.path.join(work, "state")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(nport)
            wait_port(sport)
            auth = ["-H", f"Authorization: Bearer {TOKEN}"]
            times = {"nginx PUT": [], "serve PUT": [], "nginx GET": [], "serve GET": []}
            serve_ws = os.path.join(work, "ws", "bench", "t")
            runs_of = {
                "nginx PUT": lambda i: curl(["-T", src, f"http://127.0.0.1:{nport}/up/{i}.bin"]),
                "serve PUT": lambda i: curl(auth + ["-T", src, f"http://127.0.0.1:{sport}/files/bench/t/up{i}.bin"]),
                "nginx GET": lambda i: curl(["-o", "/dev/null", f"http://127.0.0.1:{nport}/big.bin"]),
                "serve GET": lambda i: curl(auth + ["-o", "/dev/null", f"http://127.0.0.1:{sport}/files/bench/t/up{i}.bin"]),
            }
            for i in range(runs):
                # Interleaved, in turn first, each after the disk has written back what the
                # one before wrote (a writer must not pay for another's dirty pages).
                order = ["nginx PUT", "serve PUT", "nginx GET", "serve GET"]
                if i % 2:
                    order = ["serve PUT", "nginx PUT", "serve GET", "nginx GET"]
                for name in order:
                    os.sync()
                    times[name].append(runs_of[name](i))
                os.remove(os.path.join(root, "up", f"{i}.bin"))
                if i:
                    os.remove(os.path.join(serve_ws, f"up{i - 1}.bin"))
            mb = size / 1e6
            print(f"HTTP, {size >> 20} MiB on loopback, curl, best of {runs} (MB/s):")
            for op in ("PUT", "GET"):
                n, s = min(times[f"nginx {op}"]), min(times[f"serve {op}"])
                ratio = n / s
                print(f"  {op}: nginx {mb / n:7.0f}  flowrepl serve {mb / s:7.0f}  ratio {ratio:.2f}x")
                ok = ratio >= 0.5
                print(f"  target: serve {op} >= 0.5x nginx: {ratio:.2f}x [{'PASS' if ok else 'FAIL'}]")
        finally:
            serve.terminate()
            nginx.terminate()
            serve.wait(30)
            nginx.wait(30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def mcp_download(flowrepl, calls):
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    work = tempfile.mkdtemp(prefix="flowrepl-files-bench-")
    text = "".join(f"{i:09d}\n" for i in range(100_000))  # 1,000,000 bytes
    with open(os.path.join(work, "one.txt"), "w") as f:
        f.write(text)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env.update(FLOWREPL_LOG_DIR=os.path.join(work, "logs"), FLOWREPL_LOG="warn",
               FLOWREPL_MCP_MAX_CHARS="2000000")
    params = StdioServerParameters(command=flowrepl, args=["mcp"], env=env, cwd=work)
    try:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                await s.call_tool("execute_code", {"code": "data = open('one.txt').read()"})

                async def timed(name, args):
                    out = []
                    for _ in range(calls):
                        t = time.perf_counter()
                        r = await s.call_tool(name, args)
                        out.append(time.perf_counter() - t)
                        assert not r.is_error, r.content
                    return statistics.median(out)

                down = await timed("download_file", {"path": "one.txt"})
                printed = await timed("execute_code", {"code": "print(data, end='')"})
        # read_output pages (the default budget of 20,000 characters): the cut output kept.
        env["FLOWREPL_MCP_MAX_CHARS"] = "20000"
        params = StdioServerParameters(command=flowrepl, args=["mcp"], env=env, cwd=work)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                await s.call_tool("execute_code", {"code": "print(open('one.txt').read(), end='')"})
                t = time.perf_counter()
                offset, pages = 0, 0
                while offset is not None:
                    r = await s.call_tool("read_output", {"execution_count": 1, "stream": "stdout",
                                                          "offset": offset})
                    offset = r.structured_content["next_offset"]
                    pages += 1
                paged = time.perf_counter() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"MCP, 1 MB of text, median of {calls} (ms):")
    print(f"  download_file {down * 1e3:.2f}  cell printing it {printed * 1e3:.2f}  "
          f"read_output in {pages} pages {paged * 1e3:.2f}")
    ratio = down / printed
    print(f"  target: download_file <= 1.2x the printed cell: {ratio:.2f}x "
          f"[{'PASS' if ratio <= 1.2 else 'FAIL'}]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    flowrepl = os.path.abspath(opts.flowrepl)
    if os.path.exists(NGINX) and shutil.which("curl"):
        http(flowrepl, 1 << 30, 1 if opts.quick else 3)
    else:
        print("HTTP: nginx or curl missing; skipped", file=sys.stderr)
    anyio.run(mcp_download, flowrepl, 5 if opts.quick else 20)


if __name__ == "__main__":
    main()
