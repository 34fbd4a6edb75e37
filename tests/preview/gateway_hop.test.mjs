// The gateway half of preview URLs (issue 22) on the real stack's gateway and Redis, with
// a STAND-IN for the worker's ingress (a test-only server speaking the hop protocol of
// docs/internals/preview.md, which checks every hop line's MAC, then relays to a Node
// HTTP server playing the sandbox's app). The records the worker would write are written
// here. The suites in tests/e2e/preview_*.test.mjs run the same against real sandboxes.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { env, until } from '../e2e/lib.mjs';
import { gwPort, hopMac, hostKey, makeToken, previewHost, request } from './lib.mjs';

const HOST = 'pvstandin-host';
const key = hostKey(HOST);
const redis = (...args) => {
  const r = spawnSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trim();
};
const rid = () => `sb_pvt${Math.random().toString(36).slice(2, 10)}`;

// ---- the sandbox's app ----
const seen = [];
const app = http.createServer((req, res) => {
  let n = 0;
  req.on('data', (c) => { n += c.length; });
  req.on('end', () => {
    seen.push({ url: req.url, headers: req.headers, bytes: n });
    const u = new URL(req.url, 'http://x');
    if (u.pathname === '/big') {
      const total = Number(u.searchParams.get('n'));
      const chunk = Buffer.alloc(1 << 16, 97);
      res.writeHead(200, { 'Content-Length': total });
      let left = total;
      const pump = () => {
        while (left > 0) {
          const c = left >= chunk.length ? chunk : chunk.subarray(0, left);
          left -= c.length;
          if (!res.write(c)) return res.once('drain', pump);
        }
        res.end();
      };
      return pump();
    }
    res.setHeader('Content-Type', 'application/json');
    res.end(JSON.stringify({ path: req.url, headers: req.headers, bytes: n }));
  });
});
const headSeen = new Map(); // path -> resolve: the app has the request's head
app.on('request', (req) => headSeen.get(req.url)?.());
app.on('upgrade', (req, sock, head) => { // a raw echo after 101 (WebSocket framing not needed)
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n');
  if (head.length) sock.write(head);
  sock.pipe(sock);
});

// ---- the stand-in ingress ----
const hops = [];
const verdicts = new Map(); // sandbox id -> 'ok' | 'ERR <status> <sentence>'
const ingress = net.createServer((s) => {
  let buf = Buffer.alloc(0);
  const onData = (d) => {
    buf = Buffer.concat([buf, d]);
    const i = buf.indexOf(10);
    if (i < 0) { if (buf.length > 512) s.destroy(); return; }
    s.off('data', onData);
    const line = buf.subarray(0, i).toString();
    const rest = buf.subarray(i + 1);
    const [magic, id, port, epoch, iat, nonce, mac] = line.split(' ');
    const ok = magic === 'SFHOP1' && /^[0-9a-f]{16}$/.test(nonce) &&
      Math.abs(Date.now() - Number(iat)) < 30000 && mac === hopMac(key, id, port, epoch, iat, nonce);
    hops.push({ line, id, port: Number(port), epoch, ok });
    if (!ok) { s.end('SFHOP1 ERR 403 The hop was refused.\n'); return; }
    const v = verdicts.get(id) ?? 'ok';
    if (v !== 'ok') { s.end(`SFHOP1 ${v}\n`); return; }
    const up = net.connect(app.address().port, '127.0.0.1', () => {
      s.setNoDelay(true); // as the real ingress's sockets (TCP_NODELAY both ways)
      up.setNoDelay(true);
      s.write('SFHOP1 OK\n');
      if (rest.length) up.write(rest);
      s.pipe(up);
      up.pipe(s);
    });
    up.on('error', () => s.destroy());
    s.on('error', () => up.destroy());
  };
  s.on('data', onData);
});

const publish = (id, port, access, epoch = '1765090000123001', state = 'running', team = 'alpha') =>
  redis('HSET', `sf:sb:{${id}}`, 'id', id, 'host', HOST, 'team', team, 'state', state,
    `pv:${port}`, `${access} ${epoch}`);

before(async () => {
  await new Promise((r) => app.listen(0, '127.0.0.1', r));
  await new Promise((r) => ingress.listen(0, '127.0.0.1', r));
  redis('HSET', `sf:host:{${HOST}}`, 'ingress', `127.0.0.1:${ingress.address().port}`);
});
after(async () => {
  redis('DEL', `sf:host:{${HOST}}`);
  app.close();
  ingress.close();
});

const get = (id, port, opts = {}) =>
  request(gwPort, { ...opts, headers: { Host: previewHost(id, port), ...(opts.headers ?? {}) } });

test('a public port: the page comes from the sandbox, with X-Forwarded-* and a signed hop', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  const r = await get(id, 8000, { path: '/hello?x=1' });
  assert.equal(r.status, 200, r.body.toString());
  const j = JSON.parse(r.body);
  assert.equal(j.path, '/hello?x=1');
  assert.equal(j.headers['x-forwarded-for'], '127.0.0.1');
  assert.equal(j.headers['x-forwarded-proto'], 'http');
  assert.equal(j.headers['x-forwarded-host'], previewHost(id, 8000));
  const h = hops.find((x) => x.id === id);
  assert.ok(h && h.ok && h.port === 8000 && h.epoch === '1765090000123001', JSON.stringify(h));
});

test("a preview host never reaches the gateway's own routes (/mcp, /metrics, OAuth)", async () => {
  const id = rid();
  publish(id, 8000, 'public');
  for (const path of ['/mcp', '/metrics', '/.well-known/oauth-authorization-server', '/oauth/authorize']) {
    const r = await get(id, 8000, { path });
    assert.equal(r.status, 200);
    assert.equal(JSON.parse(r.body).path, path, 'the sandbox got it, not the gateway');
  }
  // a name under the preview domain that is not a preview: a page, never the gateway's routes
  const r = await request(gwPort, { path: '/mcp', headers: { Host: `preview.localhost:${gwPort}` } });
  assert.equal(r.status, 404);
  assert.match(r.headers['content-type'], /text\/html/);
  assert.equal(r.headers['set-cookie'], undefined);
});

test('refusals: unknown or killed sandbox, unpublished port, each with a page and no hop', async () => {
  const before = hops.length;
  let r = await get('sb_nosuchsandbox', 8000);
  assert.equal(r.status, 404);
  assert.match(r.body.toString(), /No such sandbox/);
  const killed = rid();
  publish(killed, 8000, 'public', '1', 'killed');
  r = await get(killed, 8000);
  assert.equal(r.status, 404);
  assert.match(r.body.toString(), /No such sandbox/);
  const id = rid();
  publish(id, 8000, 'public');
  r = await get(id, 8001);
  assert.equal(r.status, 404);
  assert.match(r.body.toString(), /Port 8001 of sandbox .* is not published.*sandbox_preview_url/s);
  redis('HSET', `sf:sb:{${id}}`, 'pv:8002', 'closed 0');
  r = await get(id, 8002);
  assert.equal(r.status, 404);
  assert.equal(hops.length, before, 'nothing was forwarded');
  assert.doesNotMatch(r.body.toString(), /<script|https?:\/\//, 'no script or external resource');
});

test('the ingress says why: its ERR line becomes the page; an unreachable ingress is a 502', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  verdicts.set(id, `ERR 502 Nothing in sandbox ${id} listens on port 8000 yet; start the server with sandbox_exec.`);
  let r = await get(id, 8000);
  assert.equal(r.status, 502);
  assert.match(r.body.toString(), /listens on port 8000 yet/);
  // a host whose ingress is gone
  const gone = net.createServer();
  await new Promise((res) => gone.listen(0, '127.0.0.1', res));
  const port = gone.address().port;
  await new Promise((res) => gone.close(res));
  redis('HSET', 'sf:host:{pvgone-host}', 'ingress', `127.0.0.1:${port}`);
  const id2 = rid();
  publish(id2, 8000, 'public');
  redis('HSET', `sf:sb:{${id2}}`, 'host', 'pvgone-host');
  r = await get(id2, 8000);
  assert.equal(r.status, 502);
  assert.match(r.body.toString(), /could not reach the sandbox&#39;s host/);
  redis('DEL', 'sf:host:{pvgone-host}');
});

test('private: refused without a link; the link becomes a host-only cookie and a 302; refused when expired, tampered, for another port, or republished', async () => {
  const id = rid();
  const epoch = '1765090000999001';
  publish(id, 8000, 'private', epoch);
  publish(id, 8001, 'private', epoch);
  const exp = Math.floor(Date.now() / 1000) + 600;
  const tok = makeToken(key, id, 8000, epoch, exp);
  const before = hops.length;

  let r = await get(id, 8000);
  assert.equal(r.status, 403);
  assert.match(r.body.toString(), /private.*sf_token/s);

  r = await get(id, 8000, { path: `/app?a=1&sf_token=${tok}&b=2` });
  assert.equal(r.status, 302);
  assert.equal(r.headers.location, '/app?a=1&b=2');
  const cookie = r.headers['set-cookie'][0];
  assert.match(cookie, new RegExp(`^sf_preview=${tok.replace(/\./g, '\\.')}; Path=/; HttpOnly; SameSite=Lax; Max-Age=\\d+`));
  assert.doesNotMatch(cookie, /Domain=/i, 'host-only');
  const age = Number(/Max-Age=(\d+)/.exec(cookie)[1]);
  assert.ok(age > 590 && age <= 600, cookie);
  assert.equal(hops.length, before, 'the exchange does not reach the sandbox');

  r = await get(id, 8000, { path: '/app', headers: { Cookie: `theme=dark; sf_preview=${tok}; lang=en` } });
  assert.equal(r.status, 200, r.body.toString());
  const j = JSON.parse(r.body);
  assert.equal(j.headers.cookie, 'theme=dark; lang=en', 'the sandbox never sees the link');

  const refused = async (t, why) => {
    const res = await get(id, 8000, { headers: { Cookie: `sf_preview=${t}` } });
    assert.equal(res.status, 403, t);
    assert.match(res.body.toString(), why);
    const q = await get(id, 8000, { path: `/?sf_token=${t}` });
    assert.equal(q.status, 403, t);
    assert.match(q.body.toString(), why);
    assert.equal(q.headers['set-cookie'], undefined);
  };
  await refused(makeToken(key, id, 8000, epoch, Math.floor(Date.now() / 1000) - 1), /expired/);
  const flip = tok.slice(0, -1) + (tok.endsWith('0') ? '1' : '0');
  await refused(flip, /altered/);
  await refused(tok.replace(`.${exp}.`, `.${exp + 100000}.`), /altered/);
  await refused(makeToken(key, id, 8001, epoch, exp), /another port/);
  await refused(makeToken(hostKey('another-host'), id, 8000, epoch, exp), /altered/);
  await refused('garbage', /altered/);
  // the port published again: the old link stops
  publish(id, 8000, 'private', '1765090001000001');
  await refused(tok, /published again/);
});

test('the header form: X-Sandfleet-Preview on a request to the gateway, its token in a header', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  let r = await request(gwPort, { path: '/via-header', headers: { 'X-Sandfleet-Preview': `8000-${id.replace('_', '-')}` } });
  assert.equal(r.status, 200);
  assert.equal(JSON.parse(r.body).path, '/via-header');
  assert.equal(JSON.parse(r.body).headers['x-sandfleet-preview'], undefined);
  const p = rid();
  publish(p, 8000, 'private', '7');
  const tok = makeToken(key, p, 8000, '7', Math.floor(Date.now() / 1000) + 60);
  r = await request(gwPort, { headers: { 'X-Sandfleet-Preview': `8000-${p.replace('_', '-')}` } });
  assert.equal(r.status, 403);
  r = await request(gwPort, { headers: { 'X-Sandfleet-Preview': `8000-${p.replace('_', '-')}`,
    'X-Sandfleet-Preview-Token': tok } });
  assert.equal(r.status, 200);
  assert.equal(JSON.parse(r.body).headers['x-sandfleet-preview-token'], undefined);
});

test('keep-alive: later requests on the connection are rewritten too; one naming another preview closes it', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const one = (path, host = previewHost(id, 8000)) => new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: gwPort, path, agent, headers: { Host: host, 'X-Forwarded-For': '6.6.6.6' } }, (res) => {
      let b = '';
      res.on('data', (c) => { b += c; });
      res.on('end', () => resolve({ status: res.statusCode, b, sock: res.socket }));
    }).on('error', reject);
  });
  const a = await one('/one');
  const b = await one('/two?sf_token=zzz');
  assert.equal(a.sock, b.sock, 'the same connection');
  assert.equal(JSON.parse(b.b).path, '/two');
  assert.equal(JSON.parse(b.b).headers['x-forwarded-for'], '127.0.0.1', "the client's own X-Forwarded-For is replaced");
  const other = rid();
  publish(other, 8000, 'public');
  await assert.rejects(one('/three', previewHost(other, 8000)), /socket hang up|ECONNRESET/);
  agent.destroy();
});

const N = 50 << 20;
test('50 MB down, streamed', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  const r = await get(id, 8000, { path: `/big?n=${N}` });
  assert.equal(r.status, 200);
  assert.equal(r.body.length, N);
});

test('50 MB up, chunked (re-chunked on the way), streamed', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  const up = await new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: gwPort, method: 'POST', path: '/up', agent: false,
      headers: { Host: previewHost(id, 8000), 'Transfer-Encoding': 'chunked' } }, (res) => {
      let b = '';
      res.on('data', (c) => { b += c; });
      res.on('end', () => resolve(JSON.parse(b)));
    });
    req.on('error', reject);
    const chunk = Buffer.alloc(1 << 20, 98);
    let i = 0;
    const pump = () => {
      while (i < 50) { i++; if (!req.write(chunk)) return req.once('drain', pump); }
      req.end();
    };
    pump();
  });
  assert.equal(up.bytes, N);
});

test('an Upgrade (WebSocket) passes bytes both ways after the 101', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  const echoed = await new Promise((resolve, reject) => {
    const s = net.connect(gwPort, '127.0.0.1', () => {
      s.write(`GET /ws HTTP/1.1\r\nHost: ${previewHost(id, 8000)}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n`);
    });
    let b = '';
    s.on('data', (d) => {
      b += d;
      if (b.includes('\r\n\r\n') && !b.includes('ping-pong')) s.write('ping-pong');
      if (b.includes('ping-pong')) { s.destroy(); resolve(b); }
    });
    s.on('error', reject);
  });
  assert.match(echoed, /^HTTP\/1.1 101/);
});

test('a body that comes after its head is not held back (the hop has no Nagle: it waited for the delayed ACK of the head, 40 ms)', async () => {
  const id = rid();
  publish(id, 8000, 'public');
  const s = net.connect(gwPort, '127.0.0.1');
  await new Promise((resolve, reject) => { s.once('connect', resolve); s.once('error', reject); });
  s.setNoDelay(true);
  let buf = Buffer.alloc(0);
  let wake = null;
  s.on('data', (d) => { buf = Buffer.concat([buf, d]); wake?.(); });
  const answer = async () => { // the next whole answer on the connection
    for (;;) {
      const end = buf.indexOf('\r\n\r\n');
      const len = end < 0 ? -1 : Number(/content-length: (\d+)/i.exec(buf.subarray(0, end).toString())?.[1]);
      if (end >= 0 && buf.length >= end + 4 + len) {
        const body = buf.subarray(end + 4, end + 4 + len).toString();
        buf = buf.subarray(end + 4 + len);
        return JSON.parse(body);
      }
      await new Promise((resolve) => { wake = resolve; });
    }
  };
  const head = (path) => `POST ${path} HTTP/1.1\r\nHost: ${previewHost(id, 8000)}\r\nContent-Length: 5\r\n\r\n`;
  for (let i = 0; i < 20; i++) { // keep-alive traffic first (delayed ACKs need it)
    s.write(head(`/warm${i}`) + 'hello');
    assert.equal((await answer()).bytes, 5);
  }
  const ms = [];
  for (let i = 0; i < 7; i++) {
    const path = `/late${i}`;
    const got = new Promise((resolve) => headSeen.set(path, resolve));
    s.write(head(path));
    await got; // the head went through; now the body, as a browser's later packet
    const t = performance.now();
    s.write('hello');
    const a = await answer();
    ms.push(performance.now() - t);
    assert.equal(a.path, path);
    assert.equal(a.bytes, 5);
  }
  s.destroy();
  ms.sort((x, y) => x - y);
  assert.ok(ms[3] < 20, `the body's answer took ${ms[3].toFixed(1)} ms (median of 7: ${ms.map((x) => x.toFixed(1)).join(' ')})`);
});

test('the access log never shows a link; /metrics counts the team', async () => {
  const id = rid();
  publish(id, 8000, 'private', '5');
  const tok = makeToken(key, id, 8000, '5', Math.floor(Date.now() / 1000) + 60);
  await get(id, 8000, { path: `/secret-path?sf_token=${tok}` });
  await get(id, 8000, { path: `/secret-path?x=${tok}`, headers: { Cookie: `sf_preview=${tok}` } });
  const log = `${env.SF_STATE}/logs/gateway.log`;
  await until('the access line', () => /preview_access .*path=\/secret-path/.test(readFileSync(log, 'utf8')));
  assert.ok(!readFileSync(log, 'utf8').includes(tok.split('.').pop()), 'the token is in the log');
  const m = await (await fetch(`http://127.0.0.1:${gwPort}/metrics`)).text();
  assert.match(m, /sandfleet_gateway_preview_requests_total\{team="alpha"\} [1-9]/);
  assert.match(m, /sandfleet_gateway_preview_bytes_down_total\{team="alpha"\} [1-9]/);
});

test("a team's caps: connections past preview_max_conns_team get a 429 page; preview_rate_team paces its bytes", async () => {
  const { spawn } = await import('node:child_process');
  const { resolve } = await import('node:path');
  const port = await new Promise((r) => { const s = net.createServer(); s.listen(0, '127.0.0.1', () => { const q = s.address().port; s.close(() => r(q)); }); });
  const g = spawn(resolve(env.SF_BUILD, 'gateway/sandfleet-gateway'), [], {
    env: { ...process.env, SF_PORT: String(port), SF_REDIS_URL: env.SF_REDIS_URL,
      SF_KAFKA_BROKERS: env.SF_KAFKA_BROKERS, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE,
      SF_SCHEMAS_DIR: resolve(env.SF_BUILD, '..', 'schemas/tools'), SF_LOG_LEVEL: 'warn',
      SF_THREADS: '2', SF_PREVIEW_MAX_CONNS_TEAM: '2', SF_PREVIEW_RATE_TEAM: String(2 << 20) },
    stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  g.stderr.on('data', (d) => { log += d; });
  const done = new Promise((r) => g.on('exit', r));
  try {
    await until('the gateway', async () => {
      try { return (await fetch(`http://127.0.0.1:${port}/healthz`)).ok; } catch { return false; }
    }, 30000);
    const id = rid();
    publish(id, 8000, 'public');
    const host = `8000-${id.replace('_', '-')}.preview.localhost:${port}`;
    // two connections held open (an Upgrade each), on whichever threads: the third is refused
    const held = [];
    for (let i = 0; i < 2; i++) {
      const s = net.connect(port, '127.0.0.1');
      await new Promise((r, j) => { s.on('error', j); s.on('connect', r); });
      s.write(`GET /ws HTTP/1.1\r\nHost: ${host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n`);
      await new Promise((r) => s.once('data', r));
      held.push(s);
    }
    let r = await request(port, { headers: { Host: host } });
    assert.equal(r.status, 429);
    assert.match(r.body.toString(), /preview_max_conns_team/);
    assert.equal(r.headers['retry-after'], '1');
    held.forEach((s) => s.destroy());
    await until('a connection slot again', async () => (await request(port, { headers: { Host: host } })).status === 200);
    // 6 MiB at 2 MiB/s (a quarter second's burst): about 2.75 s, never under 2
    const t0 = Date.now();
    r = await request(port, { path: `/big?n=${6 << 20}`, headers: { Host: host } });
    assert.equal(r.body.length, 6 << 20);
    const took = Date.now() - t0;
    assert.ok(took >= 2000, `6 MiB took ${took} ms at 2 MiB/s`);
  } finally {
    g.kill('SIGTERM');
    await done;
  }
  assert.doesNotMatch(log, /AddressSanitizer|LeakSanitizer|runtime error:/, log);
});
