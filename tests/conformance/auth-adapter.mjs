// The conformance suite's client sends no credentials. This adapter (a test harness part,
// not a fake: the real gateway answers every request) listens on 127.0.0.1, adds the
// team's `Authorization: Bearer` header, and streams requests and answers (SSE included)
// through unchanged, Host and Origin too (the DNS-rebinding scenario depends on them).
// Usage: node auth-adapter.mjs TARGET_URL KEY PORT_FILE
import http from 'node:http';
import fs from 'node:fs';

const [target, key, portFile] = process.argv.slice(2);
const t = new URL(target);
const agent = new http.Agent({ keepAlive: true });

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${key}` };
  const up = http.request({ host: t.hostname, port: t.port, method: req.method, path: req.url,
                            headers, agent }, (ur) => {
    res.writeHead(ur.statusCode, ur.headers);
    ur.pipe(res);
  });
  up.on('error', (e) => { if (!res.headersSent) res.writeHead(502); res.end(String(e)); });
  req.pipe(up);
  res.on('close', () => up.destroy()); // a client that leaves closes the gateway stream too
});
server.listen(0, '127.0.0.1', () => fs.writeFileSync(portFile, String(server.address().port)));
