// Preview URLs end to end (issue 22): a 'debian' sandbox on the real stack runs
// `python3 -m http.server 8000` and a stdlib app (tests/preview/app.py: a WebSocket echo and
// an SSE stream); sandbox_preview_url gives the URL; headless Chromium opens it through the
// gateway and the worker's ingress (no stand-in anywhere). Screenshots go to
// build/test-artifacts/. Also: a second gateway of the fleet, private links, a paused
// sandbox woken, refusals that reach nothing, 50 MB down and up, a slow reader beside
// others, and TLS (the stack serves TLS on the same port: h2 and HTTP/1.1). HTTP/2 itself:
// tests/preview/h2.test.mjs.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, statSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { call, connect, createWhenBuilt, env, sh, until } from '../e2e/lib.mjs';
import { launchChromium } from '../e2e/browser.mjs';
import { gwPort, request } from './lib.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../..');
const artifacts = resolve(env.SF_BUILD, 'test-artifacts');
let alpha, beta, browser, id;

const hostOf = (u) => new URL(u).host;
const pathOf = (u) => { const x = new URL(u); return x.pathname + x.search; };
const via = (u, opts = {}) => request(gwPort, { path: pathOf(u), ...opts,
  headers: { Host: hostOf(u), ...(opts.headers ?? {}) } });

async function previewUrl(port, extra = {}) {
  const r = await call(alpha, 'sandbox_preview_url', { sandbox_id: id, port, ...extra });
  assert.equal(r.isError, false, r.text);
  return r.structured;
}

async function shot(page, name) {
  mkdirSync(artifacts, { recursive: true });
  const f = resolve(artifacts, `preview-${name}.png`);
  await page.screenshot({ path: f, fullPage: true });
  assert.ok(statSync(f).size > 1000, 'a screenshot of the page');
  return f;
}

before(async () => {
  alpha = await connect(env.SF_KEY_ALPHA);
  beta = await connect(env.SF_KEY_BETA);
  const c = await createWhenBuilt(alpha, { name: 'preview-browser', from_template: 'debian' });
  assert.equal(c.isError, false, c.text);
  id = c.structured.id;
  const w = await call(alpha, 'sandbox_files_write', { sandbox_id: id, path: '/tmp/app.py',
    content: readFileSync(resolve(here, 'app.py'), 'utf8') });
  assert.equal(w.isError, false, w.text);
  for (const command of [
    'mkdir -p /tmp/www && cd /tmp/www && echo "<h1>Hello from the sandbox preview</h1>" > index.html && exec python3 -m http.server 8000',
    'exec python3 -u /tmp/app.py 8001',
    'mkdir -p /tmp/priv && cd /tmp/priv && echo "<h1>The private page</h1>" > index.html && exec python3 -m http.server 8003 --bind 127.0.0.1',
  ]) {
    const r = await call(alpha, 'sandbox_exec', { sandbox_id: id, background: true, command });
    assert.equal(r.isError, false, r.text);
  }
  await until('the servers to answer inside the sandbox', async () =>
    (await sh(alpha, id, 'for p in 8000 8001 8003; do curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:$p/; done')).stdout === '200200200', 60000, 300);
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  if (id) await call(alpha, 'sandbox_kill', { sandbox_id: id }).catch(() => {});
  await alpha?.close();
  await beta?.close();
});

test('python3 -m http.server in the sandbox: Chromium opens the preview URL and shows the page', async () => {
  const p = await previewUrl(8000);
  assert.equal(p.url, `http://8000-${id.replace('_', '-')}.preview.localhost:${gwPort}/`);
  const page = await (await browser.newContext()).newPage();
  const res = await page.goto(p.url);
  assert.equal(res.status(), 200);
  assert.equal(await page.textContent('h1'), 'Hello from the sandbox preview');
  console.log(`screenshot: ${await shot(page, 'http-server')}`);
  await page.context().close();
});

test('the same URL through a second gateway of the fleet', async () => {
  const port = await new Promise((r) => { const s = net.createServer(); s.listen(0, '127.0.0.1', () => { const q = s.address().port; s.close(() => r(q)); }); });
  const g = spawn(resolve(env.SF_BUILD, 'gateway/sandfleet-gateway'), [], {
    env: { ...process.env, SF_PORT: String(port), SF_REDIS_URL: env.SF_REDIS_URL,
      SF_KAFKA_BROKERS: env.SF_KAFKA_BROKERS, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE,
      SF_SCHEMAS_DIR: resolve(root, 'schemas/tools'), SF_LOG_LEVEL: 'warn', SF_THREADS: '1',
      SF_PREVIEW_DOMAIN: `preview.localhost:${port}` },
    stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  g.stderr.on('data', (d) => { log += d; });
  const done = new Promise((r) => g.on('exit', r));
  try {
    await until('the second gateway', async () => {
      try { return (await fetch(`http://127.0.0.1:${port}/healthz`)).ok; } catch { return false; }
    }, 30000);
    const u = (await previewUrl(8000)).url.replace(`:${gwPort}/`, `:${port}/`);
    const page = await (await browser.newContext()).newPage();
    const res = await page.goto(u);
    assert.equal(res.status(), 200);
    assert.equal(await page.textContent('h1'), 'Hello from the sandbox preview');
    await shot(page, 'second-gateway');
    await page.context().close();
  } finally {
    g.kill('SIGTERM');
    await done;
  }
  assert.doesNotMatch(log, /AddressSanitizer|LeakSanitizer|runtime error:/, log);
});

test('WebSocket echo and an SSE stream of 3 events 1 s apart, in the browser', async () => {
  const p = await previewUrl(8001);
  const page = await (await browser.newContext()).newPage();
  assert.equal((await page.goto(p.url)).status(), 200);
  await page.waitForFunction(() => document.getElementById('ws').textContent === 'echo: hello over websocket',
    null, { timeout: 20000 });
  await page.waitForFunction(() => /event 3/.test(document.getElementById('sse').textContent), null, { timeout: 20000 });
  const sse = await page.textContent('#sse');
  const times = [...sse.matchAll(/event (\d)@(\d+)/g)].map((m) => [Number(m[1]), Number(m[2])]);
  assert.deepEqual(times.map((t) => t[0]), [1, 2, 3], sse);
  assert.ok(times[2][1] - times[0][1] >= 1500, `the events arrived as they were sent, not at the end: ${sse}`);
  await shot(page, 'ws-sse');
  await page.context().close();
});

test('private: refused without the link, the link opens it (cookie, clean URL), refused once expired, tampered, or for another port; a later link outlives the first; preview_close stops them at once', async () => {
  const u = await call(alpha, 'sandbox_update', { sandbox_id: id, preview_access: 'private' });
  assert.equal(u.isError, false, u.text);
  const p = await previewUrl(8003, { expires_in_seconds: 4 });
  assert.equal(p.access, 'private');
  const link = new URL(p.url);
  const token = link.searchParams.get('sf_token');
  assert.ok(token, p.url);
  const clean = `${link.origin}/`;
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  let res = await page.goto(clean);
  assert.equal(res.status(), 403);
  assert.match(await page.textContent('body'), /private/);
  res = await page.goto(p.url);
  assert.equal(res.status(), 200);
  assert.equal(page.url(), clean, 'the token left the address bar');
  assert.equal(await page.textContent('h1'), 'The private page');
  const cookies = await ctx.cookies();
  assert.equal(cookies.length, 1);
  assert.equal(cookies[0].name, 'sf_preview');
  assert.equal(cookies[0].httpOnly, true);
  assert.equal(cookies[0].domain, link.hostname, 'host-only');
  await shot(page, 'private');
  // asked again: a new link, and the first stays valid (both exchange) until it expires
  const p2 = await previewUrl(8003, { expires_in_seconds: 600 });
  assert.notEqual(p2.url, p.url);
  for (const l of [p.url, p2.url]) assert.equal((await via(l)).status, 302, l);
  // another port's token, and a tampered one
  const other = await previewUrl(8004, { expires_in_seconds: 600 });
  const otherTok = new URL(other.url).searchParams.get('sf_token');
  for (const [t, why] of [[otherTok, /another port/], [token.slice(0, -2) + (token.endsWith('00') ? '11' : '00'), /altered/]]) {
    const r = await via(`${clean}?sf_token=${t}`);
    assert.equal(r.status, 403);
    assert.match(r.body.toString(), why);
  }
  // expired: the same link later
  await until('the link to expire', () => Date.now() > Date.parse(p.expires_at) + 1000, 10000, 200);
  const r = await via(p.url);
  assert.equal(r.status, 403);
  assert.match(r.body.toString(), /expired/);
  const page2 = await (await browser.newContext()).newPage();
  assert.equal((await page2.goto(p.url)).status(), 403);
  await page2.context().close();
  assert.equal((await via(p2.url)).status, 302, 'the later link outlives the first');
  // preview_close: its links stop at once, the cookie of an open tab too
  const cl = await call(alpha, 'sandbox_update', { sandbox_id: id, preview_close: [8003] });
  assert.equal(cl.isError, false, cl.text);
  const gone = await via(p2.url);
  assert.equal(gone.status, 404);
  assert.match(gone.body.toString(), /not published/);
  res = await page.goto(clean);
  assert.equal(res.status(), 404, 'the cookie of a closed port opens nothing');
  await ctx.close();
});

test('a paused sandbox is woken by a request and serves its page', async () => {
  const u = (await previewUrl(8000)).url;
  const p = await call(alpha, 'sandbox_pause', { sandbox_id: id });
  assert.equal(p.isError, false, p.text);
  assert.equal((await call(alpha, 'sandbox_info', { sandbox_id: id })).structured.status, 'paused');
  const page = await (await browser.newContext()).newPage();
  const res = await page.goto(u);
  assert.equal(res.status(), 200);
  assert.equal(await page.textContent('h1'), 'Hello from the sandbox preview');
  assert.equal((await call(alpha, 'sandbox_info', { sandbox_id: id })).structured.status, 'active');
  await page.context().close();
});

test("refused, reaching nothing: an unpublished port, a port on the host itself, another team's sandbox", async () => {
  // a server on the host's loopback: its port published in the sandbox reaches the sandbox's
  // loopback (where nothing listens), never the host
  let reached = 0;
  const hostSrv = net.createServer((s) => { reached++; s.destroy(); });
  await new Promise((r) => hostSrv.listen(0, '127.0.0.1', r));
  const hp = hostSrv.address().port;
  try {
    let r = await via(`http://8009-${id.replace('_', '-')}.preview.localhost:${gwPort}/`);
    assert.equal(r.status, 404);
    assert.match(r.body.toString(), /not published/);
    // (the sandbox's default became private above: this port is published public)
    const up = await call(alpha, 'sandbox_update', { sandbox_id: id, preview_access: 'public' });
    assert.equal(up.isError, false, up.text);
    const pub = await previewUrl(hp);
    assert.equal(pub.access, 'public');
    r = await via(pub.url);
    assert.equal(r.status, 502);
    assert.match(r.body.toString(), /listens on port/);
    assert.equal(reached, 0, "the host's server was never reached");
  } finally {
    hostSrv.close();
  }
  const b = await call(beta, 'sandbox_preview_url', { sandbox_id: id, port: 8000 });
  assert.equal(b.isError, true, 'another team cannot publish a port of this sandbox');
});

test('50 MB down (python3 -m http.server) and up through the URL, streamed', async () => {
  await sh(alpha, id, 'head -c 52428800 /dev/urandom > /tmp/www/big.bin');
  const want = (await sh(alpha, id, 'sha256sum /tmp/www/big.bin')).stdout.split(' ')[0];
  const u = (await previewUrl(8000)).url;
  const d = await via(`${u}big.bin`);
  assert.equal(d.status, 200);
  assert.equal(d.body.length, 50 << 20);
  assert.equal(createHash('sha256').update(d.body).digest('hex'), want);
  const body = randomBytes(50 << 20);
  const a = (await previewUrl(8001)).url;
  const up = await via(`${a}upload`, { method: 'POST', body, headers: { 'Content-Length': body.length } });
  assert.equal(up.status, 200, up.body.toString());
  assert.deepEqual(JSON.parse(up.body), { bytes: body.length, sha256: createHash('sha256').update(body).digest('hex') });
});

test('a slow reader does not stall others, and the gateway buffers a bounded amount for it', async () => {
  const u = (await previewUrl(8000)).url;
  const gwPid = readFileSync(`${env.SF_STATE}/pids/gateway`, 'utf8').trim();
  const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${gwPid}/status`, 'utf8'))[1]);
  const down = async () => Number(/sandfleet_gateway_preview_bytes_down_total\{team="alpha"\} (\d+)/
    .exec(await (await fetch(`http://127.0.0.1:${gwPort}/metrics`)).text())?.[1] ?? 0);
  const rss0 = rss(), down0 = await down();
  const slow = net.connect(gwPort, '127.0.0.1');
  await new Promise((r) => slow.on('connect', r));
  slow.pause(); // reads nothing
  slow.write(`GET /big.bin HTTP/1.1\r\nHost: ${hostOf(u)}\r\n\r\n`);
  // the download runs until the socket buffers and the gateway's bound are full
  await until('the stalled download to have moved over 1 MiB', async () => (await down()) - down0 > (1 << 20));
  const t0 = Date.now();
  const all = await Promise.all(Array.from({ length: 20 }, () => via(u)));
  assert.ok(all.every((r) => r.status === 200 && /Hello from the sandbox preview/.test(r.body)));
  assert.ok(Date.now() - t0 < 10000, `20 pages beside a stalled download took ${Date.now() - t0} ms`);
  assert.ok(rss() - rss0 < 24 * 1024, `the gateway grew by ${rss() - rss0} KiB for a reader that reads nothing`);
  slow.destroy();
});

test('silence is not a timeout: an answer after 8 s, a WebSocket idle for 8 s, a download paused for 8 s', async () => {
  const a = (await previewUrl(8001)).url;
  const u = (await previewUrl(8000)).url;
  await sh(alpha, id, 'head -c 16777216 /dev/urandom > /tmp/www/pause.bin');
  const slow = via(`${a}sleep/8`);
  const page = await browser.newPage();
  await page.goto(a);
  const echoed = page.evaluate(() => new Promise((res) => {
    const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws');
    ws.onopen = () => ws.send('wait 8');
    ws.onmessage = (e) => { res(e.data); ws.close(); };
    ws.onclose = (e) => res(`closed ${e.code}`);
  }));
  // the download: 1 MiB read, then nothing read for 8 s (every buffer on the way fills and
  // the sandbox's server blocks), then the rest
  const paused = new Promise((res, rej) => {
    const s = net.connect(gwPort, '127.0.0.1');
    let got = 0, head = null, stopped = false;
    const chunks = [];
    s.on('data', (c) => {
      chunks.push(c);
      got += c.length;
      if (!stopped && got > (1 << 20)) {
        stopped = true;
        s.pause();
        setTimeout(() => s.resume(), 8000);
      }
    });
    s.on('end', () => res(Buffer.concat(chunks)));
    s.on('error', rej);
    s.write(`GET /pause.bin HTTP/1.1\r\nHost: ${hostOf(u)}\r\nConnection: close\r\n\r\n`);
  });
  const r = await slow;
  assert.equal(r.status, 200, r.body.toString());
  assert.equal(r.body.toString(), 'slept 8');
  assert.equal(await echoed, 'waited 8');
  await page.close();
  const d = await paused;
  const split = d.indexOf('\r\n\r\n');
  assert.match(d.subarray(0, split).toString(), /^HTTP\/1\.[01] 200/);
  assert.equal(d.length - split - 4, 16 << 20, 'the whole file after the pause');
});

test('TLS on the same port: a preview host is served over h2 (ALPN) and HTTP/1.1', { skip: !env.SF_TLS_CERT_FILE && 'no TLS in this stack' }, async () => {
  const u = (await previewUrl(8000)).url;
  const h = new URL(u).hostname;
  const r = spawnSync('curl', ['-sk', '--http2', '--resolve', `${h}:${gwPort}:127.0.0.1`,
    '-w', '\n%{http_version} %{http_code}', `https://${h}:${gwPort}/`], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /Hello from the sandbox preview/);
  assert.match(r.stdout, /\n2 200$/, 'h2 (relayed per stream: gateway/http/http2.c)');
  const h1 = spawnSync('curl', ['-sk', '--http1.1', '--resolve', `${h}:${gwPort}:127.0.0.1`,
    '-w', '\n%{http_version} %{http_code}', `https://${h}:${gwPort}/`], { encoding: 'utf8' });
  assert.equal(h1.status, 0, h1.stderr);
  assert.match(h1.stdout, /Hello from the sandbox preview[^]*\n1(\.[01])? 200$/, 'HTTP/1.x (python answers 1.0)');
  const g = spawnSync('curl', ['-sk', '--http2', '-o', '/dev/null', '-w', '%{http_version}',
    `https://127.0.0.1:${gwPort}/healthz`], { encoding: 'utf8' });
  assert.equal(g.stdout, '2', 'the gateway itself still speaks h2');
});

test('killed: the URL gets the "no such sandbox" page', async () => {
  const u = (await previewUrl(8000)).url;
  assert.equal((await call(alpha, 'sandbox_kill', { sandbox_id: id })).isError, false);
  const page = await (await browser.newContext()).newPage();
  const res = await page.goto(u);
  assert.equal(res.status(), 404);
  assert.match(await page.textContent('body'), /No such sandbox/);
  await page.context().close();
  id = null;
});
