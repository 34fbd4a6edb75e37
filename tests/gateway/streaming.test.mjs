// Progress and cancellation up to the worker boundary, with the official SDK client:
// a call with a progressToken is answered over SSE with notifications/progress (at least
// every SF_PROGRESS_INTERVAL_MS, 500 ms on the e2e stack) and then its result; a call the
// client cancels, or whose connection the client closes, gets nothing more, and an
// sf.cancel envelope naming its job reaches Kafka (read back with kafka_find).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { connect, call, env, bearer, url } from '../e2e/lib.mjs';

const run = promisify(execFile);
const client = await connect(env.SF_KEY_ALPHA, 'streaming');
let id;
before(async () => { id = (await call(client, 'sandbox_create', { name: 'streaming' })).structured.id; });
after(async () => {
  await call(client, 'sandbox_kill', { sandbox_id: id });
  await client.close();
});

// Finds the sf.cancel envelope naming jobId on sf.jobs (kafka_find), or throws.
async function cancelSeen(jobId) {
  const { stdout } = await run(process.env.SF_KAFKA_FIND,
    [env.SF_KAFKA_BROKERS, 'sf.jobs', 'sf.cancel', 'job', jobId, '15000']);
  return stdout;
}

function jobOf(sandbox, since) {
  // the newest cancelled call of this sandbox logged after line `since`
  return import('node:fs').then(({ readFileSync }) => {
    const lines = readFileSync(`${env.SF_STATE}/logs/gateway.log`, 'utf8').split('\n').slice(since);
    const hit = lines.reverse().find((l) => l.includes('msg="call cancelled"') && l.includes(`sandbox=${sandbox}`));
    return hit && hit.match(/ job=(\S+)/)[1];
  });
}

const logLength = () => import('node:fs').then(({ readFileSync }) =>
  readFileSync(`${env.SF_STATE}/logs/gateway.log`, 'utf8').split('\n').length);

test('progress: notifications while the call runs, then the result (capped output included)', async () => {
  const seen = [];
  const result = await client.callTool(
    { name: 'sandbox_exec', arguments: { sandbox_id: id, command: 'sleep 2; echo done' } },
    undefined, { onprogress: (p) => seen.push(p), resetTimeoutOnProgress: true, timeout: 60000 });
  assert.equal(result.isError, false);
  assert.equal(result.structuredContent.stdout, 'done\n');
  assert.ok(seen.length >= 3, `expected a heartbeat at least every 500 ms, got ${seen.length}`);
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].progress > seen[i - 1].progress);
  assert.ok(seen.some((p) => /sandbox_exec still running/.test(p.message)), 'heartbeats while it runs');
  // the worker streams the command's output too (worker side of issue 6 item 5)
  assert.ok(seen.some((p) => p.message === 'done\n'), 'the output chunk as a notification');
});

test('notifications/cancelled: no answer for the call, and sf.cancel reaches Kafka', async () => {
  const since = await logLength();
  const ac = new AbortController();
  let progressed;
  const first = new Promise((r) => { progressed = r; });
  const pending = client.callTool(
    { name: 'sandbox_exec', arguments: { sandbox_id: id, command: 'sleep 600' } },
    undefined, { onprogress: () => progressed(), signal: ac.signal, timeout: 60000 });
  await first;
  ac.abort('the test cancels');
  await assert.rejects(pending);
  let job;
  for (let i = 0; i < 100 && !job; i++) {
    job = await jobOf(id, since - 1);
    if (!job) await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(job, 'the gateway logged the cancellation');
  assert.match(await cancelSeen(job), new RegExp(`team=alpha sandbox=${id} reply=sf\\.reply\\.`));
  // the session goes on
  assert.equal((await call(client, 'sandbox_list')).isError, false);
});

test('a client that closes its connection mid-call cancels the job (sf.cancel on Kafka)', async () => {
  const since = await logLength();
  const ac = new AbortController();
  const res = await fetch(url, {
    method: 'POST', signal: ac.signal,
    headers: { ...bearer(env.SF_KEY_ALPHA), 'Content-Type': 'application/json',
               Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/call',
      params: { name: 'sandbox_exec', arguments: { sandbox_id: id, command: 'sleep 600' },
                _meta: { progressToken: 'close-test' } } }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /text\/event-stream/);
  // the call is running once its first progress event is here; then hang up
  const reader = res.body.getReader();
  const { value } = await reader.read();
  assert.match(new TextDecoder().decode(value), /notifications\/(progress|message)/);
  ac.abort();
  let job;
  for (let i = 0; i < 100 && !job; i++) {
    job = await jobOf(id, since - 1);
    if (!job) await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(job, 'the gateway logged the cancellation');
  assert.ok(await cancelSeen(job));
});
