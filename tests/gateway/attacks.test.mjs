// Attacks from a second loopback address (127.0.0.2) while a good client on 127.0.0.1 keeps
// calling through the official SDK: slow headers, trickling large bodies (with no key, and
// with a valid key), a 20 MiB body, request smuggling shapes. Every good call must succeed;
// the attackers get 401, 408, 413, 429 or 400 (HTTP/2 too). The e2e stack sets header and body
// deadlines of 2 s and a body rate of 16 MiB/s, so the 408s come within seconds.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import http2 from 'node:http2';
import { connect, call, env, url } from '../e2e/lib.mjs';

const target = new URL(url);
const port = Number(target.port);
const good = await connect(env.SF_KEY_ALPHA, 'good-client');
after(async () => { await good.close(); });

// Opens a connection from 127.0.0.2, sends `head`, then `trickle` one byte every 100 ms;
// resolves with the status line the server answered (or 'closed' / 'error'). With
// readAfter, nothing is read until that many trickle bytes went out: a busy client that
// reads late (the server's answer must still be there, not lost to a reset).
function attacker(head, trickle = '', { readAfter = 0 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress: '127.0.0.2' });
    let got = '', timer, i = 0, done = false;
    const finish = (v) => { if (!done) { done = true; clearInterval(timer); s.destroy(); resolve(v); } };
    s.on('connect', () => {
      if (readAfter) s.pause();
      if (head) s.write(head);
      if (trickle) timer = setInterval(() => {
        if (i < trickle.length) s.write(trickle[i++]);
        if (i === readAfter) s.resume();
      }, 100);
    });
    s.on('data', (d) => {
      got += d.toString();
      const m = got.match(/^HTTP\/1\.1 (\d{3})/);
      if (m) finish(Number(m[1]));
    });
    s.on('error', () => finish('error'));
    s.on('close', () => finish('closed'));
    setTimeout(() => finish('timeout'), 30000);
  });
}

// The good client calls in a loop while `attack` runs; every call must succeed.
async function whileAttacked(attack) {
  let stop = false, calls = 0;
  const loop = (async () => {
    while (!stop) {
      const r = await call(good, 'sandbox_list');
      assert.equal(r.isError, false, r.text);
      calls++;
    }
  })();
  const results = await attack();
  stop = true;
  await loop;
  assert.ok(calls > 0);
  return results;
}

const tally = (xs) => xs.reduce((m, x) => ((m[x] = (m[x] ?? 0) + 1), m), {});

// Each reads only after its third trickled byte, as a client whose loop is busy would (under
// load some did, and got a reset instead of their 429: the refusal was closed at once).
test('1,030 slow-header connections: 429 past the per-address cap, 408 for the rest', async () => {
  const results = await whileAttacked(() =>
    Promise.all(Array.from({ length: 1030 }, () => attacker('POST /mcp HTTP/1.1\r\nHost: x\r\n',
      'X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', { readAfter: 3 }))));
  const t = tally(results);
  assert.equal(t[429], 1030 - 256, JSON.stringify(t));
  assert.equal(t[408], 256, JSON.stringify(t));
});

test('30 connections declaring 10 MiB bodies and trickling them: 401 without a key, 408 with one', async () => {
  const head = (auth) => `POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Accept: application/json\r\n${auth}Content-Length: 10485760\r\n\r\n`;
  const results = await whileAttacked(() => Promise.all([
    ...Array.from({ length: 30 }, () => attacker(head(''), '{"jsonrpc":"2.0"')),
    ...Array.from({ length: 30 }, () => attacker(head(`Authorization: Bearer ${env.SF_KEY_ALPHA}\r\n`), '{"jsonrpc":"2.0"')),
  ]));
  assert.deepEqual(tally(results.slice(0, 30)), { 401: 30 });
  assert.deepEqual(tally(results.slice(30)), { 408: 30 });
});

test('a 20 MiB body is refused before it is read (413); smuggling shapes get 400', async () => {
  const results = await whileAttacked(() => Promise.all([
    attacker(`POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${env.SF_KEY_ALPHA}\r\nContent-Length: 20971520\r\n\r\n`),
    attacker('POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n'),
    attacker('POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n'),
    attacker('GET /mcp HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n'),
    attacker('GET /mcp HTTP/1.1\nHost: x\n\n'),
  ]));
  assert.deepEqual(results, [413, 400, 400, 400, 400]);
});

test('an HTTP/2 stream whose body never ends gets 408 (total deadline), the connection lives on', async () => {
  const session = http2.connect(`http://127.0.0.1:${port}`, { localAddress: '127.0.0.2' });
  const status = (stream) => new Promise((resolve) => {
    stream.on('response', (h) => resolve(h[':status']));
    stream.on('error', () => resolve('error'));
  });
  const slow = session.request({ ':method': 'POST', ':path': '/mcp', authorization: `Bearer ${env.SF_KEY_ALPHA}`,
    'content-type': 'application/json', accept: 'application/json' });
  slow.write('{"jsonrpc":'); // and never the rest
  const t0 = Date.now();
  const results = await whileAttacked(async () => [await status(slow)]);
  assert.deepEqual(results, [408]);
  assert.ok(Date.now() - t0 < 15000);
  // the same connection still serves a complete request
  const ok = session.request({ ':method': 'POST', ':path': '/mcp', authorization: `Bearer ${env.SF_KEY_ALPHA}`,
    'content-type': 'application/json', accept: 'application/json' });
  ok.end(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }));
  assert.equal(await status(ok), 200);
  session.close();
});

test('HTTP/2: the key is checked from the headers, before any body byte is accepted', async () => {
  const session = http2.connect(`http://127.0.0.1:${port}`, { localAddress: '127.0.0.2' });
  const answer = (stream) => new Promise((resolve) => {
    stream.on('response', (h) => resolve(h));
    stream.on('error', () => resolve({ ':status': 'error' }));
  });
  // 40 streams on one connection, no key or a bad one, whose bodies never end: each is
  // refused (401 with a challenge) while its body is still unsent; before the gateway
  // checked keys ahead of HTTP/2 bodies they waited for them and got 408.
  const bad = Array.from({ length: 40 }, (_, i) => {
    const s = session.request({ ':method': 'POST', ':path': '/mcp', 'content-type': 'application/json',
      accept: 'application/json', ...(i % 2 ? { authorization: 'Bearer sf_not_a_key' } : {}) });
    s.write('{"jsonrpc":"2.0",');
    return s;
  });
  const heads = await whileAttacked(() => Promise.all(bad.map(answer)));
  assert.deepEqual(tally(heads.map((h) => h[':status'])), { 401: 40 });
  for (const h of heads) assert.match(h['www-authenticate'], /^Bearer /);
  // a good key's body is accepted, a large one too (window updates follow the check)
  const ok = session.request({ ':method': 'POST', ':path': '/mcp', authorization: `Bearer ${env.SF_KEY_ALPHA}`,
    'content-type': 'application/json', accept: 'application/json' });
  const pad = 'x'.repeat(300 * 1024);
  ok.end(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping', params: { _meta: { pad } } }));
  const head = await answer(ok);
  assert.equal(head[':status'], 200);
  session.close();
});
