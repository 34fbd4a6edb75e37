// Streaming and cancellation end to end (agent -> worker -> reply topic -> gateway), with
// the official SDK client: an exec's output arrives as notifications/progress while it
// runs (causally: the command waits for a file the test creates only once `ready` was
// streamed), and a cancelled exec, or one whose client hangs up, has its process killed
// in the sandbox and gets no result.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { connect, call, sh, env, bearer, url, until } from './lib.mjs';

const client = await connect(env.SF_KEY_ALPHA, 'stream');
const helper = await connect(env.SF_KEY_ALPHA, 'stream-helper');
let id;
before(async () => { id = (await call(client, 'sandbox_create', { name: 'stream' })).structured.id; });
after(async () => {
  await call(helper, 'sandbox_kill', { sandbox_id: id });
  await client.close();
  await helper.close();
});

const workerLog = () => readFileSync(`${env.SF_STATE}/logs/worker.log`, 'utf8');

test('output streams while the command runs: `ready` arrives before the command can end', async () => {
  const events = [];
  let sawReady;
  const ready = new Promise((r) => { sawReady = r; });
  const pending = client.callTool(
    { name: 'sandbox_exec', arguments: { sandbox_id: id,
      command: 'echo ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo finished >&2' } },
    undefined, {
      timeout: 60000, resetTimeoutOnProgress: true,
      onprogress: (p) => { events.push(p.message); if (/ready/.test(p.message ?? '')) sawReady(); },
    });
  let done = false;
  pending.then(() => { done = true; }, () => { done = true; });
  await ready;
  assert.equal(done, false, 'the command still waits for its file');
  assert.equal((await sh(helper, id, 'touch /tmp/go')).exit_code, 0);
  const result = await pending;
  assert.equal(result.isError, false);
  assert.equal(result.structuredContent.stdout, 'ready\n');
  assert.equal(result.structuredContent.stderr, 'finished\n');
  assert.ok(events.includes('ready\n'), `the chunk itself is a notification: ${JSON.stringify(events)}`);
});

// Starts `sleep 600` that records its pid; returns the pending call once it runs.
function sleeper(tag) {
  const cmd = `echo $$ > /tmp/${tag}; exec sleep 600`;
  return { cmd, pid: async () => (await sh(helper, id, `cat /tmp/${tag} 2>/dev/null`)).stdout.trim() };
}
const alive = async (pid) => (await sh(helper, id, `[ -e /proc/${pid} ] && echo alive || echo gone`)).stdout.trim() === 'alive';

test('notifications/cancelled kills the command in the sandbox; no result arrives', async () => {
  const s = sleeper('c1');
  const ac = new AbortController();
  let got = false;
  const pending = client.callTool({ name: 'sandbox_exec', arguments: { sandbox_id: id, command: s.cmd } },
    undefined, { signal: ac.signal, timeout: 60000, onprogress: () => {} });
  pending.then(() => { got = true; }, () => {});
  const pid = await until('the sleeper to start', s.pid);
  assert.ok(await alive(pid));
  ac.abort('the test cancels');
  await assert.rejects(pending);
  await until('the sleeper to be killed', async () => !(await alive(pid)));
  await until('the worker to answer the cancelled job', async () => /msg="exec cancelled"/.test(workerLog()));
  assert.equal(got, false, 'no result for a cancelled call');
});

test('a client that closes its connection mid-call kills the command', async () => {
  const s = sleeper('c2');
  const ac = new AbortController();
  const res = await fetch(url, {
    method: 'POST', signal: ac.signal,
    headers: { ...bearer(env.SF_KEY_ALPHA), 'Content-Type': 'application/json',
               Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call',
      params: { name: 'sandbox_exec', arguments: { sandbox_id: id, command: s.cmd },
                _meta: { progressToken: 'hangup' } } }),
  });
  assert.equal(res.status, 200);
  const pid = await until('the sleeper to start', s.pid);
  assert.ok(await alive(pid));
  ac.abort();
  await until('the sleeper to be killed', async () => !(await alive(pid)));
});
