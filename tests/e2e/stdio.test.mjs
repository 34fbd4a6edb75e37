// `sandfleet mcp-stdio` against the real stack, driven by the official SDK's stdio client
// transport (how Claude Desktop and other stdio-only clients start it): the same tools as
// over HTTP, create / exec / kill, exec with progress (relayed as it arrives), cancellation, and
// readable errors for a wrong key, a missing key and a stopped gateway (one this suite
// starts, stops and starts again on the same port).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { env, url, connect } from './lib.mjs';
import { bridge, finish, sandfleetBin, waitFor, alive } from './bridge.mjs';

const bin = sandfleetBin(env.SF_BUILD);
const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const http = await connect(env.SF_KEY_ALPHA);
after(() => http.close());

const call = async (client, name, args, opts = {}) => {
  const r = await client.callTool({ name, arguments: args }, undefined, { timeout: 120000, ...opts });
  return { r, s: r.structuredContent, text: (r.content ?? []).map((c) => c.text).join('') };
};

test('the same tools as over HTTP; create, exec, kill', async () => {
  const b = bridge(bin, url, env.SF_KEY_ALPHA);
  await b.client.connect(b.transport);
  assert.deepEqual((await b.client.listTools()).tools, (await http.listTools()).tools);

  const created = await call(b.client, 'sandbox_create', { name: 'stdio', metadata: { suite: 'stdio' } });
  assert.equal(created.r.isError, false, created.text);
  const id = created.s.id;
  assert.match(id, /^sb_[a-z0-9]+$/);

  const ex = await call(b.client, 'sandbox_exec',
    { sandbox_id: id, command: 'for i in 1 2 3; do echo line$i; sleep 0.1; done; echo oops >&2; exit 3' });
  assert.equal(ex.s.stdout, 'line1\nline2\nline3\n');
  assert.equal(ex.s.stderr, 'oops\n');
  assert.equal(ex.s.exit_code, 3);

  const killed = await call(b.client, 'sandbox_kill', { sandbox_id: id });
  assert.equal(killed.r.isError, false, killed.text);
  assert.equal(killed.s.status, 'killed');
  const later = await call(b.client, 'sandbox_exec', { sandbox_id: id, command: 'true' });
  assert.equal(later.r.isError, true);
  assert.match(later.text, /was killed/);
  await finish(b);
});

test('a cancelled call is forwarded to the gateway and dropped; the bridge goes on', async () => {
  const b = bridge(bin, url, env.SF_KEY_ALPHA);
  await b.client.connect(b.transport);
  const { s } = await call(b.client, 'sandbox_create', { name: 'stdio-cancel' });
  const msgs = [];
  const inner = b.transport.onmessage;
  b.transport.onmessage = (m) => { msgs.push(m); inner(m); };
  const ac = new AbortController();
  const long = call(b.client, 'sandbox_exec', { sandbox_id: s.id, command: 'sleep 30' },
    { signal: ac.signal });
  await waitFor('the call to reach the gateway', () => /-> tools\/call/.test(b.stderr));
  ac.abort('the test cancels it');
  await assert.rejects(long);
  await waitFor('the cancellation to be forwarded',
    () => /notifications\/cancelled: HTTP\/1.1 202/.test(b.stderr));
  // The gateway ends the cancelled call's exchange (202 or the stream's end), or the bridge
  // drops it after its grace period; either way the client gets no answer for it.
  await waitFor('the cancelled exchange to end', () => {
    const after = b.stderr.slice(b.stderr.indexOf('-> notifications/cancelled'));
    return /tools\/call: HTTP|dropping the cancelled tools\/call/.test(after);
  });
  const list = await call(b.client, 'sandbox_list', {});
  assert.ok(list.s.sandboxes.some((x) => x.id === s.id));
  assert.ok(!msgs.some((m) => m.id !== undefined && 'result' in m && m.result?.structuredContent?.exit_code !== undefined),
    'no answer was relayed for the cancelled exec');
  await call(b.client, 'sandbox_kill', { sandbox_id: s.id });
  await finish(b);
});

test('a wrong key and a missing key: the client shows a sentence that names the problem', async () => {
  const wrong = bridge(bin, url, 'sf_live_' + 'x'.repeat(32));
  await assert.rejects(wrong.client.connect(wrong.transport), /refused the API key \(HTTP 401\)/);
  await waitFor('the sentence on stderr', () => /refused the API key \(HTTP 401\): .*API key/.test(wrong.stderr));
  await finish(wrong);

  const none = bridge(bin, url, undefined);
  await assert.rejects(none.client.connect(none.transport), /SANDFLEET_API_KEY is not set/);
  await waitFor('the sentence on stderr', () => /SANDFLEET_API_KEY is not set/.test(none.stderr));
  await finish(none);
});

async function freePort() {
  const srv = createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

// A gateway of our own beside the stack's (same Redis and Kafka), so it can be stopped.
function startGateway(port, extra = {}) {
  const g = spawn(resolve(env.SF_BUILD, 'gateway/sandfleet-gateway'), [], {
    env: { ...process.env, SF_PORT: String(port), SF_REDIS_URL: env.SF_REDIS_URL,
      SF_KAFKA_BROKERS: env.SF_KAFKA_BROKERS, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE,
      SF_SCHEMAS_DIR: resolve(root, 'schemas/tools'), SF_LOG_LEVEL: 'warn', ...extra },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  g.log = '';
  g.stderr.on('data', (d) => { g.log += d; });
  g.done = new Promise((r) => g.on('exit', r));
  return g;
}

async function gatewayUp(port) {
  await waitFor('the gateway to answer', async () => {
    try { return (await fetch(`http://127.0.0.1:${port}/readyz`)).ok; } catch { return false; }
  }, 30000);
}

async function stopGateway(g) {
  g.kill('SIGTERM');
  await g.done;
  assert.doesNotMatch(g.log, /AddressSanitizer|LeakSanitizer|runtime error:/, g.log);
}

test('exec with progress: the gateway progress notifications arrive through the bridge, then the result', async () => {
  // a gateway of this suite's with a 100 ms heartbeat: a call that asked for progress (a
  // progressToken) is answered as SSE with notifications/progress while it runs
  const port = await freePort();
  const g = startGateway(port, { SF_PROGRESS_INTERVAL_MS: '100' });
  await gatewayUp(port);
  const b = bridge(bin, `http://127.0.0.1:${port}/mcp`, env.SF_KEY_ALPHA);
  await b.client.connect(b.transport);
  const created = await call(b.client, 'sandbox_create', { name: 'stdio-progress' });
  const id = created.s.id;
  const msgs = [];
  const inner = b.transport.onmessage;
  b.transport.onmessage = (m) => { msgs.push(m); inner(m); };
  const got = [];
  const ex = await call(b.client, 'sandbox_exec', { sandbox_id: id, command: 'sleep 1; echo done' },
    { onprogress: (p) => got.push(p) });
  assert.equal(ex.s.stdout, 'done\n');
  const progress = msgs.filter((m) => m.method === 'notifications/progress');
  assert.ok(progress.length >= 2, `progress relayed while the command ran (${progress.length})`);
  assert.ok(progress.some((m) => /sandbox_exec still running/.test(m.params.message)),
    JSON.stringify(progress.map((m) => m.params.message)));
  assert.ok(msgs.indexOf(progress.at(-1)) < msgs.findIndex((m) => m.result), 'progress before the result');
  assert.ok(got.length >= 1, 'the SDK saw them as progress');
  await call(b.client, 'sandbox_kill', { sandbox_id: id });
  await finish(b);
  await stopGateway(g);
});

test('a stopped gateway: a readable error per call, the bridge stays, and goes on when it is back', async (t) => {
  // (a failed assertion leaves no gateway or bridge of this test running)
  const procs = [];
  t.after(() => procs.forEach((p) => { try { p.kill('SIGKILL'); } catch {} }));
  const port = await freePort();
  const gwUrl = `http://127.0.0.1:${port}/mcp`;

  const early = bridge(bin, gwUrl, env.SF_KEY_ALPHA);
  await assert.rejects(early.client.connect(early.transport),
    /Cannot reach the sandfleet gateway at .*; start it \(ops\/run\) or fix the URL/);
  await waitFor('the sentence on stderr', () => /Cannot reach the sandfleet gateway/.test(early.stderr));
  await finish(early);

  let g = startGateway(port);
  procs.push(g);
  await gatewayUp(port);
  const b = bridge(bin, gwUrl, env.SF_KEY_ALPHA);
  await b.client.connect(b.transport);
  procs.push({ kill: () => b.transport.close() });
  assert.equal((await call(b.client, 'sandbox_list', {})).r.isError, false);

  await stopGateway(g);
  await assert.rejects(call(b.client, 'sandbox_list', {}), /Cannot reach the sandfleet gateway/);
  assert.ok(alive(b.transport.pid), 'the bridge is still running');
  await assert.rejects(call(b.client, 'sandbox_list', {}), /Cannot reach the sandfleet gateway/);

  g = startGateway(port);
  procs.push(g);
  await gatewayUp(port);
  const again = await call(b.client, 'sandbox_list', {});
  assert.equal(again.r.isError, false, again.text);
  await finish(b);
  await stopGateway(g);
});

// Does the gateway speak HTTP/2 without TLS (h2c, prior knowledge)?
async function speaksH2c(u) {
  const { connect: h2connect } = await import('node:http2');
  return new Promise((done) => {
    const s = h2connect(new URL(u).origin);
    const end = (v) => { s.destroy(); done(v); };
    s.on('error', () => end(false));
    s.setTimeout(5000, () => end(false));
    const req = s.request({ ':path': '/healthz' });
    req.on('response', (h) => end(h[':status'] === 200));
    req.on('error', () => end(false));
    req.end();
  });
}

test('HTTP/2: h2c with --http2, and over TLS (ALPN) with --cacert, when the gateway serves them', async (t) => {
  const tls = env.SF_TLS_CERT_FILE;
  const cases = [['h2c', url, ['-v', '--http2']]];
  if (tls) cases.push(['TLS', url.replace(/^http:/, 'https:'), ['-v', '--cacert', tls]]);
  else t.diagnostic('the stack serves no TLS: only h2c checked');
  const h2c = await speaksH2c(url);
  for (const [name, u, args] of cases) {
    const b = bridge(bin, u, env.SF_KEY_ALPHA, { args });
    if (name === 'h2c' && !h2c) {
      t.diagnostic('the gateway speaks HTTP/1.1 only without TLS: checking the refusal');
      await assert.rejects(b.client.connect(b.transport),
        /did not answer over HTTP\/2 without TLS .*drop --http2/);
    } else {
      await b.client.connect(b.transport);
      for (let i = 0; i < 3; i++) // several calls: connections reused (TLS) or not (h2c)
        assert.equal((await call(b.client, 'sandbox_list', {})).r.isError, false);
      assert.match(b.stderr, /tools\/call: HTTP\/2 200/, `${name}: the calls went over HTTP/2`);
    }
    await finish(b);
  }
});
