// Preview URLs over HTTP/2 (issue 22: "HTTP/1.1 and h2 from the browser"), on the real stack:
// a 'debian' sandbox runs python3 -m http.server and tests/preview/app.py; real HTTP/2
// clients reach them through the gateway (gateway/http/http2.c relays each stream as one
// HTTP/1.1 request to the preview layer) and the worker's real ingress: curl with
// --http2-prior-knowledge (h2c), Node's http2 client (h2c and TLS with ALPN h2: many
// streams on one connection (20 at once), 50 MB each way, a stream that reads nothing beside others),
// and headless Chromium over TLS (h2, with a WebSocket and SSE on the same page).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http2 from 'node:http2';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { call, connect, createWhenBuilt, env, sh, until } from '../e2e/lib.mjs';
import { launchChromium } from '../e2e/browser.mjs';
import { gwPort } from './lib.mjs';

const here = dirname(fileURLToPath(import.meta.url));
let alpha, id, browser;
const tls = !!env.SF_TLS_CERT_FILE;

async function previewUrl(port, extra = {}) {
  const r = await call(alpha, 'sandbox_preview_url', { sandbox_id: id, port, ...extra });
  assert.equal(r.isError, false, r.text);
  return r.structured;
}

// An HTTP/2 session to the gateway: h2c by prior knowledge, or TLS (ALPN h2) naming host.
function session(host, secure = false) {
  const s = secure
    ? http2.connect(`https://127.0.0.1:${gwPort}`, { servername: host.split(':')[0], rejectUnauthorized: false })
    : http2.connect(`http://127.0.0.1:${gwPort}`);
  s.on('error', () => {});
  return s;
}

// One request on session s; resolves { status, headers, body }.
function h2req(s, authority, path, { method = 'GET', headers = {}, body } = {}) {
  return new Promise((res, rej) => {
    const r = s.request({ ':method': method, ':path': path, ':authority': authority, ...headers },
      { endStream: body === undefined });
    const chunks = [];
    let head;
    r.on('response', (h) => { head = h; });
    r.on('data', (c) => chunks.push(c));
    r.on('end', () => res({ status: head?.[':status'], headers: head, body: Buffer.concat(chunks) }));
    r.on('error', rej);
    if (body !== undefined) {
      // in pieces, as a browser's upload comes (each write waits for the stream's window)
      (async () => {
        for (let o = 0; o < body.length; o += 1 << 20)
          if (!r.write(body.subarray(o, o + (1 << 20)))) await new Promise((w) => r.once('drain', w));
        r.end();
      })().catch(rej);
    }
  });
}

before(async () => {
  alpha = await connect(env.SF_KEY_ALPHA);
  const c = await createWhenBuilt(alpha, { name: 'preview-h2', from_template: 'debian' });
  assert.equal(c.isError, false, c.text);
  id = c.structured.id;
  const w = await call(alpha, 'sandbox_files_write', { sandbox_id: id, path: '/tmp/app.py',
    content: readFileSync(resolve(here, 'app.py'), 'utf8') });
  assert.equal(w.isError, false, w.text);
  for (const command of [
    'mkdir -p /tmp/www && cd /tmp/www && echo "<h1>Hello over h2</h1>" > index.html && head -c 52428800 /dev/urandom > big.bin && exec python3 -m http.server 8000',
    'exec python3 -u /tmp/app.py 8001',
  ]) {
    const r = await call(alpha, 'sandbox_exec', { sandbox_id: id, background: true, command });
    assert.equal(r.isError, false, r.text);
  }
  await until('the servers to answer inside the sandbox', async () =>
    (await sh(alpha, id, 'for p in 8000 8001; do curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:$p/; done')).stdout === '200200', 60000, 300);
  await until('big.bin to be whole', async () =>
    (await sh(alpha, id, 'stat -c %s /tmp/www/big.bin')).stdout.trim() === '52428800', 60000, 300);
});

after(async () => {
  await browser?.close();
  if (id) await call(alpha, 'sandbox_kill', { sandbox_id: id }).catch(() => {});
  await alpha?.close();
});

test('curl --http2-prior-knowledge: the page over h2c', async () => {
  const u = new URL((await previewUrl(8000)).url);
  const args = ['-s', '--http2-prior-knowledge', '--resolve', `${u.hostname}:${gwPort}:127.0.0.1`,
    '-w', '\n%{http_version} %{http_code} %{num_connects}\n'];
  // (one request per curl: curl 7.88's h2c reuse fails on any server, /healthz too)
  const one = spawnSync('curl', [...args, u.href], { encoding: 'utf8' });
  assert.equal(one.status, 0, one.stderr);
  assert.match(one.stdout, /<h1>Hello over h2<\/h1>\n\n2 200 1\n$/);
});

test('Node http2 (h2c): pages, a HEAD, the sandbox\'s own 404, and a gateway page on one stream while the connection serves on', async () => {
  const host = new URL((await previewUrl(8000)).url).host;
  const s = session(host);
  try {
    const r = await h2req(s, host, '/');
    assert.equal(r.status, 200);
    assert.equal(r.body.toString(), '<h1>Hello over h2</h1>\n');
    assert.equal(r.headers.connection, undefined, 'no hop-by-hop field on h2');
    const h = await h2req(s, host, '/', { method: 'HEAD' });
    assert.equal(h.status, 200);
    assert.equal(h.body.length, 0);
    const nf = await h2req(s, host, '/nothing-here');
    assert.equal(nf.status, 404); // python's own 404, relayed
    for (const path of ['/metrics', '/mcp', '/healthz']) { // never the gateway's own routes
      const g = await h2req(s, host, path);
      assert.equal(g.status, 404, path);
      assert.match(g.body.toString(), /Error response/, `${path}: python's page, not the gateway's`);
    }
    // a port not published: the gateway's page, on this stream only
    const other = host.replace(/^8000-/, '8009-');
    const np = await h2req(s, other, '/');
    assert.equal(np.status, 404);
    assert.match(np.body.toString(), /not published/);
    const again = await h2req(s, host, '/');
    assert.equal(again.status, 200, 'the connection serves on after a refused stream');
  } finally {
    s.close();
  }
});

test('private over h2: refused without the link; the link gives a cookie and a 302; the cookie opens it', async () => {
  const p = await previewUrl(8001, {});
  assert.equal(p.access, 'public');
  const u = await call(alpha, 'sandbox_update', { sandbox_id: id, preview_access: 'private' });
  assert.equal(u.isError, false, u.text);
  const q = await previewUrl(8002, { expires_in_seconds: 600 });
  assert.equal(q.access, 'private');
  await call(alpha, 'sandbox_exec', { sandbox_id: id, background: true,
    command: 'mkdir -p /tmp/p2 && cd /tmp/p2 && echo "<h1>private over h2</h1>" > index.html && exec python3 -m http.server 8002 --bind 127.0.0.1' });
  await until('8002 to answer', async () =>
    (await sh(alpha, id, 'curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8002/')).stdout === '200', 30000, 300);
  const link = new URL(q.url);
  const s = session(link.host);
  try {
    const no = await h2req(s, link.host, '/');
    assert.equal(no.status, 403);
    assert.match(no.body.toString(), /private/);
    const ex = await h2req(s, link.host, link.pathname + link.search);
    assert.equal(ex.status, 302);
    assert.equal(ex.headers.location, '/');
    const cookie = ex.headers['set-cookie'][0];
    assert.match(cookie, /^sf_preview=v1\.[^;]+; Path=\/; HttpOnly; SameSite=Lax; Max-Age=\d+$/);
    // the browser's cookie beside others, as h2 sends them: separate cookie fields
    const ok = await h2req(s, link.host, '/', { headers: { cookie: ['a=1', cookie.split(';')[0], 'b=2'] } });
    assert.equal(ok.status, 200);
    assert.equal(ok.body.toString(), '<h1>private over h2</h1>\n');
  } finally {
    s.close();
  }
  const back = await call(alpha, 'sandbox_update', { sandbox_id: id, preview_access: 'public' });
  assert.equal(back.isError, false, back.text);
});

for (const secure of tls ? [false, true] : [false]) {
  test(`50 MB down and up over ${secure ? 'h2 (TLS, ALPN)' : 'h2c'}, streamed; chunked up when no length is sent`, async () => {
    const host = new URL((await previewUrl(8000)).url).host;
    const app = new URL((await previewUrl(8001)).url).host;
    const want = (await sh(alpha, id, 'sha256sum /tmp/www/big.bin')).stdout.split(' ')[0];
    const s = session(host, secure);
    try {
      if (secure) {
        await new Promise((r) => (s.alpnProtocol ? r() : s.once('connect', r)));
        assert.equal(s.alpnProtocol, 'h2');
      }
      const d = await h2req(s, host, '/big.bin');
      assert.equal(d.status, 200);
      assert.equal(d.body.length, 50 << 20);
      assert.equal(createHash('sha256').update(d.body).digest('hex'), want);
      const body = randomBytes(50 << 20);
      const sum = createHash('sha256').update(body).digest('hex');
      const s2 = session(app, secure);
      try {
        const up = await h2req(s2, app, '/upload', { method: 'POST', body,
          headers: { 'content-length': String(body.length) } });
        assert.equal(up.status, 200, up.body.toString());
        assert.deepEqual(JSON.parse(up.body), { bytes: body.length, sha256: sum });
        const ch = await h2req(s2, app, '/upload', { method: 'POST', body: body.subarray(0, 8 << 20) });
        assert.equal(ch.status, 200, ch.body.toString());
        assert.deepEqual(JSON.parse(ch.body), { bytes: 8 << 20,
          sha256: createHash('sha256').update(body.subarray(0, 8 << 20)).digest('hex') });
      } finally {
        s2.close();
      }
    } finally {
      s.close();
    }
  });
}

test('a stream that reads nothing stalls no other stream of its connection, and the gateway holds a bounded amount for it', async () => {
  const host = new URL((await previewUrl(8000)).url).host;
  const gwPid = readFileSync(`${env.SF_STATE}/pids/gateway`, 'utf8').trim();
  const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${gwPid}/status`, 'utf8'))[1]);
  const down = async () => Number(/sandfleet_gateway_preview_bytes_down_total\{team="alpha"\} (\d+)/
    .exec(await (await fetch(`http://127.0.0.1:${gwPort}/metrics`)).text())?.[1] ?? 0);
  const s = session(host);
  try {
    const rss0 = rss(), down0 = await down();
    const slow = s.request({ ':path': '/big.bin', ':authority': host });
    slow.on('error', () => {});
    slow.pause(); // its window fills: the gateway must stop reading the sandbox for it
    await until('the stalled download to have moved over 1 MiB', async () => (await down()) - down0 > (1 << 20));
    const t0 = Date.now();
    const all = await Promise.all(Array.from({ length: 20 }, () => h2req(s, host, '/')));
    assert.ok(all.every((r) => r.status === 200 && /Hello over h2/.test(r.body)), 'the other streams');
    assert.ok(Date.now() - t0 < 10000, `20 pages beside a stalled stream took ${Date.now() - t0} ms`);
    const moved = (await down()) - down0;
    assert.ok(moved < 12 << 20, `${moved} bytes moved for a stream that reads nothing (bounded)`);
    assert.ok(rss() - rss0 < 24 * 1024, `the gateway grew by ${rss() - rss0} KiB`);
    slow.close(http2.constants.NGHTTP2_CANCEL);
  } finally {
    s.close();
  }
});

test('Chromium over TLS speaks h2 to a preview host: the page, a WebSocket and SSE', { skip: !tls && 'no TLS in this stack' }, async () => {
  browser = await launchChromium();
  const u = new URL((await previewUrl(8001)).url);
  u.protocol = 'https:';
  const ctx = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await ctx.newPage();
  const res = await page.goto(u.href);
  assert.equal(res.status(), 200);
  assert.equal(await page.evaluate(() => performance.getEntriesByType('navigation')[0].nextHopProtocol), 'h2');
  await page.waitForFunction(() => document.getElementById('ws').textContent === 'echo: hello over websocket',
    null, { timeout: 20000 });
  await page.waitForFunction(() => /event 3/.test(document.getElementById('sse').textContent), null, { timeout: 20000 });
  await ctx.close();
});
