"""Network by name (issue 36), measured in one run on loopback, with targets.

Two sandboxed kernels on the same venv: one with the host's network (`--sandbox-net`, the
direct path) and one with only the egress proxy (`--sandbox-net=allow:...`). The servers are
tests/egress/server.py's, on 127.0.0.1, reached as `localhost`. Each figure is timed inside
the cell (perf_counter), the two kernels interleaved.

1. A 100 MB download (urllib, plain HTTP: the proxy forwards it; HTTPS: through a CONNECT
   tunnel), MB/s, 9 rounds, the ratio of each round's pair. Target: through the proxy >=
   0.7x direct. On 2 cores the proxy is a third busy process beside the server and the cell.
2. A new connection and a small request on it (http.client, 300 rounds; plain HTTP through
   the proxy in absolute form, and a CONNECT tunnel carrying plain HTTP), ms p50. Target:
   the proxy adds <= 1 ms p50.

Usage: bench/egress_bench.py --flowrepl target/release/flowrepl [--quick]
Runs under target/mcp-venv's python (cryptography, for the servers' certificate).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, "target", "mcp-venv", "bin", "python")


class Kernel:
    def __init__(self, flowrepl, args, cwd):
        self.p = subprocess.Popen([flowrepl] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, cwd=cwd)
        self.n = 0
        self.ready = json.loads(self.p.stdout.readline())["params"]

    def eval(self, code):
        self.n += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.n, "method": "execute_code",
                           "params": {"code": code}})
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()
        r = json.loads(self.p.stdout.readline())["result"]
        assert r["success"], r
        return json.loads(r["result"].strip("'"))

    def close(self):
        self.p.stdin.close()
        self.p.wait(30)


DOWNLOAD = """
import json, ssl, time, urllib.request
ctx = ssl.create_default_context(cafile='cert.pem')
t = time.perf_counter()
with urllib.request.urlopen({url!r}, context=ctx, timeout=60) as r:
    n = 0
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        n += len(b)
assert n == {n}, n
json.dumps(n / (time.perf_counter() - t) / 1e6)
"""

CONNECTIONS = """
import http.client, json, os, statistics, time, urllib.parse
proxy = os.environ.get('HTTP_PROXY')
times = []
for _ in range({rounds}):
    t = time.perf_counter()
    if proxy and {tunnel}:
        p = urllib.parse.urlsplit(proxy)
        c = http.client.HTTPConnection(p.hostname, p.port, timeout=10)
        c.set_tunnel('localhost', {port})
        c.request('GET', '/hello')
    elif proxy:
        p = urllib.parse.urlsplit(proxy)
        c = http.client.HTTPConnection(p.hostname, p.port, timeout=10)
        c.request('GET', 'http://localhost:{port}/hello')
    else:
        c = http.client.HTTPConnection('localhost', {port}, timeout=10)
        c.request('GET', '/hello')
    c.getresponse().read()
    c.close()
    times.append((time.perf_counter() - t) * 1e3)
json.dumps(statistics.median(times))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    a.flowrepl = os.path.abspath(a.flowrepl)
    rounds, conns = (3, 100) if a.quick else (9, 300)
    with tempfile.TemporaryDirectory() as work:
        cert = os.path.join(work, "cert.pem")
        server = subprocess.Popen([VENV_PY, os.path.join(ROOT, "tests/egress/server.py"), cert],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ports = json.loads(server.stdout.readline())
        http, tls = ports["http"], ports["tls"]
        kernels = {}
        for name, net in [("direct", "--sandbox-net"),
                          ("proxy", f"--sandbox-net=allow:localhost:{http},localhost:{tls}")]:
            ws = os.path.join(work, name)
            os.makedirs(ws)
            with open(cert, "rb") as f, open(os.path.join(ws, "cert.pem"), "wb") as g:
                g.write(f.read())
            kernels[name] = Kernel(a.flowrepl, ["--sandbox", "--workspace", ws, "--python", VENV_PY,
                                                "--log-dir", os.path.join(work, name + "-logs"), net],
                                   work)
            assert kernels[name].ready["sandbox"]["network"] == ("host" if name == "direct" else "allow")
        n = 100_000_000
        print("network by name: egress proxy against the host's network, both sandboxed, loopback")
        for what, url in [("HTTP", f"http://localhost:{http}/bytes?n={n}"),
                          ("HTTPS (CONNECT)", f"https://localhost:{tls}/bytes?n={n}")]:
            speeds = {"direct": [], "proxy": []}
            for _ in range(rounds):
                for name, k in kernels.items():
                    speeds[name].append(k.eval(DOWNLOAD.format(url=url, n=n)))
            # Each round's pair taken together: the machine's speed drifts between rounds.
            ratio = statistics.median(p / d for d, p in zip(speeds["direct"], speeds["proxy"], strict=True))
            d, p = statistics.median(speeds["direct"]), statistics.median(speeds["proxy"])
            print(f"  100 MB download, {what:16} direct {d:8.0f} MB/s, proxy {p:8.0f} MB/s p50: "
                  f"{ratio:.2f}x p50 of {rounds} rounds (target >= 0.70x)")
        for what, tunnel in [("plain HTTP", "False"), ("CONNECT tunnel", "True")]:
            lat = {"direct": [], "proxy": []}
            for _ in range(2):
                for name, k in kernels.items():
                    lat[name].append(k.eval(CONNECTIONS.format(rounds=conns // 2, port=http,
                                                               tunnel=tunnel)))
            d, p = statistics.median(lat["direct"]), statistics.median(lat["proxy"])
            print(f"  new connection + GET, {what:14} direct {d:.3f} ms, proxy {p:.3f} ms p50: "
                  f"+{p - d:.3f} ms (target <= +1 ms)")
        for k in kernels.values():
            k.close()
        server.stdin.close()
        server.wait(10)


if __name__ == "__main__":
    main()
