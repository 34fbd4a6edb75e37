// mcp-stdio against an MCP server that streams: the official SDK's own Streamable HTTP
// server (sdkserver.mjs), a real MCP server used here because the sandfleet gateway answers
// with plain JSON until its streaming lands. It checks what the bridge must relay when a
// gateway streams: progress notifications as they arrive, a stream closed mid-call and
// resumed with Last-Event-ID, cancellation, messages the server sends unasked (GET stream),
// a session the server forgot, large messages, and that the key goes along as a bearer token.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { env } from './lib.mjs';
import { bridge, finish, sandfleetBin, waitFor } from './bridge.mjs';
import { KEY, seen, sessions, startSdkServer, stopSdkServer } from './sdkserver.mjs';

const bin = sandfleetBin(env.SF_BUILD);
let url;
before(async () => { url = await startSdkServer(); });
after(stopSdkServer);

// Every message the bridge relays to the client, in order. (The SDK client runs
// notification handlers a microtask late, so a progress notification that arrives in the
// same read as the result reaches no onprogress handler: count what the bridge sent.)
function record(b) {
  const msgs = [];
  const inner = b.transport.onmessage;
  b.transport.onmessage = (m) => { msgs.push(m); inner(m); };
  return msgs;
}
const progressOf = (msgs) => msgs.filter((m) => m.method === 'notifications/progress')
  .map((m) => m.params.progress);

test('progress notifications are relayed as they arrive, before the result', async () => {
  const b = bridge(bin, url, KEY);
  await b.client.connect(b.transport);
  const msgs = record(b);
  const got = [];
  const call = b.client.callTool({ name: 'count', arguments: { n: 3 } }, undefined,
    { onprogress: (p) => got.push(p) });
  // The server holds the call after its first notification: it must be here already.
  await waitFor('the first progress notification', () => got.length === 1 && seen.gate);
  assert.deepEqual(got[0], { progress: 1, total: 3, message: 'step 1' });
  seen.gate();
  const r = await call;
  assert.equal(r.content[0].text, 'counted to 3');
  assert.deepEqual(progressOf(msgs), [1, 2, 3]);
  assert.ok('result' in msgs.at(-1), 'the result comes last');
  assert.ok(seen.auth.has(`Bearer ${KEY}`), 'the key went along as a bearer token');
  await finish(b);
});

test('a stream the server closes mid-call is resumed with Last-Event-ID', async () => {
  const b = bridge(bin, url, KEY);
  await b.client.connect(b.transport);
  const msgs = record(b);
  const resumes = seen.resumes;
  const r = await b.client.callTool({ name: 'poll', arguments: {} }, undefined,
    { onprogress: () => {} });
  assert.equal(r.content[0].text, 'polled');
  assert.deepEqual(progressOf(msgs), [1, 2]);
  assert.ok(seen.resumes > resumes, 'the bridge resumed with a GET and Last-Event-ID');
  await waitFor('the resumption on stderr', () => /resuming the answer stream of tools\/call/.test(b.stderr));
  await finish(b);
});

test('a cancelled call is cancelled on the server, and the bridge goes on', async () => {
  const b = bridge(bin, url, KEY);
  await b.client.connect(b.transport);
  const ac = new AbortController();
  const call = b.client.callTool({ name: 'slow', arguments: { tag: 'one' } }, undefined,
    { signal: ac.signal });
  await waitFor('the call to reach the server', () => /-> tools\/call/.test(b.stderr));
  ac.abort('the test cancels it');
  await assert.rejects(call);
  await waitFor('the server to see the cancellation', () => seen.cancelled.includes('one'));
  const r = await b.client.callTool({ name: 'big', arguments: { n: 10 } });
  assert.equal(r.content[0].text, 'x'.repeat(10));
  await finish(b);
});

test('messages the server sends unasked arrive over the GET stream', async () => {
  const b = bridge(bin, url, KEY);
  const logs = [];
  b.client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => { logs.push(n.params.data); });
  const gets = seen.gets;
  await b.client.connect(b.transport);
  await waitFor('the GET stream', () => seen.gets > gets);
  const sid = [...sessions.keys()].at(-1);
  await waitFor('the stream to be registered', async () => {
    await sessions.get(sid).server.sendLoggingMessage({ level: 'info', data: 'hello, unasked' });
    return logs.length > 0;
  });
  assert.equal(logs[0], 'hello, unasked');
  await finish(b);
});

test('a session the server forgot is re-opened and the call retried', async () => {
  const b = bridge(bin, url, KEY);
  await b.client.connect(b.transport);
  const inits = seen.initializes;
  for (const [id, s] of sessions) { sessions.delete(id); await s.server.close(); }
  const r = await b.client.callTool({ name: 'big', arguments: { n: 3 } });
  assert.equal(r.content[0].text, 'xxx');
  assert.equal(seen.initializes, inits + 1, 'one new initialize');
  await waitFor('the note on stderr', () => /lost the session; a new one is open/.test(b.stderr));
  await finish(b);
});

test('a 3 MiB answer arrives whole', async () => {
  const b = bridge(bin, url, KEY);
  await b.client.connect(b.transport);
  const r = await b.client.callTool({ name: 'big', arguments: { n: 3 << 20 } });
  assert.equal(r.content[0].text.length, 3 << 20);
  await finish(b);
});

test("a wrong key: the server's sentence reaches the client", async () => {
  const b = bridge(bin, url, 'sf_live_wrongwrongwrongwrongwrongwrongwron');
  await assert.rejects(b.client.connect(b.transport), /refused the API key \(HTTP 401\): The test key is wrong\./);
  await finish(b);
});

test('bad lines from the client are answered and the next message goes through', async () => {
  const p = spawn(bin, ['mcp-stdio', url], { env: { PATH: process.env.PATH, SANDFLEET_API_KEY: KEY,
    SF_HOME: '/nonexistent', ASAN_OPTIONS: process.env.ASAN_OPTIONS ?? '' } });
  let out = '', err = '';
  p.stdout.on('data', (d) => { out += d; });
  p.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((r) => p.on('close', r)); // exited, and stdout/stderr read to the end
  p.stdin.write('this is not json\n\n   \n');
  p.stdin.write(`${JSON.stringify({ jsonrpc: '2.0', id: 'i', method: 'initialize', params: {
    protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })}\r\n`);
  p.stdin.end(JSON.stringify({ jsonrpc: '2.0', id: 'p', method: 'ping' })); // no final newline
  assert.equal(await exited, 0);
  const lines = out.trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(lines.length, 3, out);
  assert.equal(lines[0].error.code, -32700);
  assert.match(lines[0].error.message, /not JSON/);
  assert.equal(lines[1].id, 'i');
  assert.ok(lines[1].result.serverInfo);
  assert.deepEqual(lines[2], { jsonrpc: '2.0', id: 'p', result: {} });
  assert.match(err, /Parse error/);
});
