"""A package index for the tests, on 127.0.0.1 only: builds tiny wheels and sdists into a
folder laid out as a PEP 503 simple repository and serves it, counting requests.

Usage: index.py FOLDER MARKER     builds the packages (below) into FOLDER, serves it, prints
                                  the port on stdout's first line and the secret server's port
                                  (below) on the second, then serves until killed.
       GET /_requests             how many requests the index answered (this one not counted).
       GET /_secret_hits          how many connections the secret server took.
       GET /slowpkg/...           answered after 60 s: an install that must time out.

Beside the index, a **secret server** on another port of 127.0.0.1 (a host service that is not
the index) answers every request with SECRET: what a build must not reach.

Packages built (all pure Python, no dependency on anything outside this file):
- tinypkg 1.0 and 2.0: `tinypkg.Thing(v)`, `tinypkg.VERSION`; 2.0 depends on `tinydep`.
- tinydep 1.0.
- needsold 1.0: depends on `tinypkg<2` (with `tinypkg==2.0` requested: a conflict).
- dotpth 1.0: a wheel with a `.pth` file: a Python that starts with (or takes in) the folder
  runs it, and it writes MARKER-pth (outside) and `pth-ran` in its working folder. Only the
  task's Python may run it, never the installer.
- evilsdist 1.0: an sdist only; its build backend (in the archive, PEP 517 `backend-path`)
  writes the file MARKER (an absolute path outside everything the installer should write)
  when it runs, then builds a wheel. Installing it runs its code: the test of `--no-build`
  and of the confined build.
- netsdist 1.0: an sdist only; its build backend asks the secret server for its answer (with
  urllib, which takes HTTP_PROXY when set, and with a bare socket), then fails with what it
  got in its error: the test of a build's network.
"""

import base64
import hashlib
import http.server
import io
import os
import sys
import tarfile
import threading
import time
import zipfile

REQUESTS = 0
SECRET_HITS = 0
LOCK = threading.Lock()
SECRET = "flowrepl-secret-answer"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel(folder, name, version, files, requires=()):
    """Writes `name-version-py3-none-any.whl` with `files` ({path: text})."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = dict(files)
    entries[f"{dist}/METADATA"] = meta
    entries[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: flowrepl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries[f"{dist}/top_level.txt"] = "".join(
        sorted({p.split("/")[0].removesuffix(".py") + "\n" for p in files if not p.endswith(".pth")})
    )
    lines = [record_line(p, t.encode()) for p, t in entries.items()]
    lines.append(f"{dist}/RECORD,,")
    entries[f"{dist}/RECORD"] = "\n".join(lines) + "\n"
    path = os.path.join(folder, name, f"{name}-{version}-py3-none-any.whl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for p, t in entries.items():
            z.writestr(p, t)


BACKEND = '''
import os, zipfile, base64, hashlib
marker = MARKER
def _mark():
    try:
        with open(marker, "w") as f:
            f.write("the build backend of evilsdist ran here")
    except OSError as e:
        print("evilsdist: the marker was not written:", e)
def get_requires_for_build_wheel(config_settings=None):
    _mark()
    return []
def prepare_metadata_for_build_wheel(d, config_settings=None):
    _mark()
    dist = os.path.join(d, "evilsdist-1.0.dist-info")
    os.makedirs(dist)
    with open(os.path.join(dist, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: evilsdist\\nVersion: 1.0\\n")
    return "evilsdist-1.0.dist-info"
def build_wheel(d, config_settings=None, metadata_directory=None):
    _mark()
    name = "evilsdist-1.0-py3-none-any.whl"
    files = {"evilsdist/__init__.py": "BUILT = True\\n",
             "evilsdist-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: evilsdist\\nVersion: 1.0\\n",
             "evilsdist-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: evil\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    rec = []
    for p, t in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
        rec.append(f"{p},sha256={h},{len(t)}")
    rec.append("evilsdist-1.0.dist-info/RECORD,,")
    files["evilsdist-1.0.dist-info/RECORD"] = "\\n".join(rec) + "\\n"
    with zipfile.ZipFile(os.path.join(d, name), "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return name
'''


NET_BACKEND = '''
def _probe():
    said = []
    try:
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:PORT/", timeout=10) as r:
            said.append("urllib got: " + r.read().decode())
    except Exception as e:
        said.append("urllib failed: %r" % e)
    try:
        import socket
        with socket.create_connection(("127.0.0.1", PORT), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n")
            said.append("socket got: " + s.recv(4096).decode(errors="replace"))
    except Exception as e:
        said.append("socket failed: %r" % e)
    raise RuntimeError("netsdist asked the secret server: " + " | ".join(said))
def get_requires_for_build_wheel(config_settings=None):
    _probe()
def prepare_metadata_for_build_wheel(d, config_settings=None):
    _probe()
def build_wheel(d, config_settings=None, metadata_directory=None):
    _probe()
'''


def sdist(folder, name, backend):
    files = {
        f"{name}-1.0/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{name}-1.0/pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
            f'[project]\nname = "{name}"\nversion = "1.0"\n'
        ),
        f"{name}-1.0/backend.py": backend,
    }
    path = os.path.join(folder, name, f"{name}-1.0.tar.gz")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w:gz") as t:
        for p, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(p)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def build(folder, marker, secret_port):
    thing = "VERSION = {v!r}\n\nclass Thing:\n    def __init__(self, v):\n        self.v = v\n"
    wheel(folder, "tinypkg", "1.0", {"tinypkg/__init__.py": thing.format(v="1.0")})
    wheel(folder, "tinypkg", "2.0", {"tinypkg/__init__.py": thing.format(v="2.0")}, ["tinydep"])
    wheel(folder, "tinydep", "1.0", {"tinydep.py": "DEP = 1\n"})
    wheel(folder, "needsold", "1.0", {"needsold/__init__.py": ""}, ["tinypkg<2"])
    hook = (
        "import os\n"
        "for p in (MARKER, 'pth-ran'):\n"
        "    try:\n"
        "        open(p, 'a').write(str(os.getpid()) + '\\n')\n"
        "    except OSError:\n"
        "        pass\n"
    ).replace("MARKER", repr(marker + "-pth"))
    wheel(folder, "dotpth", "1.0", {"dotpth_hook.py": hook, "dotpth.pth": "import dotpth_hook\n"})
    sdist(folder, "evilsdist", BACKEND.replace("MARKER", repr(marker), 1))
    sdist(folder, "netsdist", NET_BACKEND.replace("PORT", str(secret_port)))
    for name in sorted(os.listdir(folder)):
        files = sorted(os.listdir(os.path.join(folder, name)))
        links = "".join(f'<a href="{f}">{f}</a>\n' for f in files if f != "index.html")
        with open(os.path.join(folder, name, "index.html"), "w") as f:
            f.write(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    names = sorted(n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n)))
    links = "".join(f'<a href="{n}/">{n}</a>\n' for n in names)
    with open(os.path.join(folder, "index.html"), "w") as f:
        f.write(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        global REQUESTS
        if self.path in ("/_requests", "/_secret_hits"):
            with LOCK:
                body = str(REQUESTS if self.path == "/_requests" else SECRET_HITS).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        with LOCK:
            REQUESTS += 1
        if self.path.startswith("/slowpkg"):
            time.sleep(60)
        super().do_GET()

    def log_message(self, *args):
        pass


class Secret(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global SECRET_HITS
        with LOCK:
            SECRET_HITS += 1
        body = SECRET.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    folder = os.path.abspath(sys.argv[1])
    os.makedirs(folder, exist_ok=True)
    secret = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Secret)
    threading.Thread(target=secret.serve_forever, daemon=True).start()
    build(folder, os.path.abspath(sys.argv[2]), secret.server_address[1])
    handler = lambda *a, **k: Handler(*a, directory=folder, **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    print(server.server_address[1], flush=True)
    print(secret.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
