// The official MCP conformance suite's client sends no Authorization header, and `flowrepl
// serve` answers 401 without one. This proxy forwards every request to the server with the
// token added, streaming both ways, and keeps the client's Host and Origin headers as they
// were (the DNS-rebinding scenario sends foreign ones on purpose).
//
// Usage: node auth-proxy.mjs PORT UPSTREAM_URL TOKEN   (prints "ready PORT" once listening)
import http from "node:http";

const [port, upstream, token] = process.argv.slice(2);
const target = new URL(upstream);

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${token}` };
  const forward = http.request(
    { host: target.hostname, port: target.port, method: req.method, path: req.url, headers },
    (up) => {
      res.writeHead(up.statusCode ?? 502, up.headers);
      up.pipe(res);
    },
  );
  forward.on("error", (e) => {
    if (!res.headersSent) res.writeHead(502);
    res.end(String(e));
  });
  res.on("close", () => forward.destroy());
  req.pipe(forward);
});
server.listen(Number(port), "127.0.0.1", () => {
  console.log(`ready ${server.address().port}`);
});
