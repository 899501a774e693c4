"""Servers on 127.0.0.1 for the egress tests and benchmark: two plain HTTP servers and an
HTTPS one (a self-signed certificate for `localhost` and 127.0.0.1, made with cryptography),
each on a port of the system's choice.

Usage: server.py CERT_OUT     writes the certificate (PEM) to CERT_OUT, then prints one JSON
                              line {"http": P1, "other": P2, "tls": P3, "keep": P4} and
                              serves until stdin closes.

Paths: /hello (says which server), /bytes?n=N (N bytes, streamed in 1 MiB chunks), /slow (64
KiB every 20 ms, without end: a download only an interrupt stops), /echo (POST: the body's
length).

"keep" is a lax HTTP/1.1 server that records what it received: it reads requests one after
the other on a connection (framed by Content-Length or chunked, a request without either has
no body), answers each with `seen N`, and keeps the connection open whatever `Connection`
says, until the client closes. Each request is a JSON line in CERT_OUT.seen: method, target,
host, body. A proxy that lets a second request through on one connection shows there.
"""
import datetime
import http.server
import ipaddress
import json
import socketserver
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CHUNK = b"x" * (1 << 20)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, body, status=200):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/hello":
            host = self.headers.get("Host", "")
            self.send(f"hello from {self.server.name} (Host: {host})".encode())
        elif url.path == "/bytes":
            n = int(urllib.parse.parse_qs(url.query)["n"][0])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            while n > 0:
                part = CHUNK[: min(n, len(CHUNK))]
                self.wfile.write(part)
                n -= len(part)
        elif url.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(CHUNK[: 64 << 10])
                    self.wfile.flush()
                    time.sleep(0.02)
            except OSError:
                pass
        else:
            self.send(b"not found", 404)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        got = 0
        while got < n:
            part = self.rfile.read(min(n - got, 1 << 20))
            if not part:
                break
            got += len(part)
        self.send(str(got).encode())


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, name, context=None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.name = name
        if context is not None:
            # The handshake in the handler thread, not in accept: a client that never sends
            # a ClientHello must not hold the other connections up.
            self.socket = context.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )


class Keep(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, seen):
        self.seen = seen
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), KeepHandler)


class KeepHandler(socketserver.StreamRequestHandler):
    def line(self):
        return self.rfile.readline(65536)

    def handle(self):
        n = 0
        while True:
            first = self.line()
            if not first:
                return
            if first in (b"\r\n", b"\n"):
                continue
            parts = first.decode("latin-1").split()
            headers = {}
            while True:
                h = self.line()
                if not h or h in (b"\r\n", b"\n"):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = b""
            if "chunked" in headers.get("transfer-encoding", "").lower():
                while True:
                    size = int(self.line().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.line() not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    body += self.rfile.read(size)
                    self.line()
            elif "content-length" in headers:
                body = self.rfile.read(int(headers["content-length"]))
            n += 1
            with self.server.lock, open(self.server.seen, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "method": parts[0] if parts else "",
                            "target": parts[1] if len(parts) > 1 else "",
                            "host": headers.get("host", ""),
                            "body": body.decode("latin-1"),
                        }
                    )
                    + "\n"
                )
            answer = f"seen {n}".encode()
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
            self.wfile.flush()


def certificate():
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert_pem, key_pem


def main():
    cert_pem, key_pem = certificate()
    with open(sys.argv[1], "wb") as f:
        f.write(cert_pem)
    with tempfile.NamedTemporaryFile() as cf, tempfile.NamedTemporaryFile() as kf:
        cf.write(cert_pem)
        kf.write(key_pem)
        cf.flush()
        kf.flush()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cf.name, kf.name)
    servers = {
        "http": Server("http"),
        "other": Server("other"),
        "tls": Server("tls", context),
        "keep": Keep(sys.argv[1] + ".seen"),
    }
    for s in servers.values():
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(json.dumps({k: s.server_address[1] for k, s in servers.items()}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
