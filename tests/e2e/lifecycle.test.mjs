// A sandbox's lifecycle through the pipeline: pause stops its processes and exec resumes
// them where they were; timeout_seconds, auto_delete_seconds and the idle auto-pause fire
// (short values; the worker runs here with a 2 s idle pause and a 100 ms timer tick), also
// while the scheduler and the gateway restart; sandbox_update changes them; sandbox_info shows when each
// fires. The timers live in Redis (sf:host:{h}:timers).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env, until } from './lib.mjs';

const stack = (...args) => execFileSync(`${import.meta.dirname}/../integration/stack`,
  [...args, env.SF_STATE, env.SF_BUILD], { stdio: 'inherit', env: { ...process.env, ...extraEnv } });
const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
let extraEnv = {};
let client;

const info = async (id) => (await call(client, 'sandbox_info', { sandbox_id: id })).structured;
const status = async (id) => {
  const r = await call(client, 'sandbox_info', { sandbox_id: id });
  return r.isError ? r.text : r.structured.status;
};

before(async () => {
  // This suite's worker: idle pause after 2 s, timers read every 100 ms.
  extraEnv = { SF_IDLE_PAUSE_MS: '2000', SF_TIMER_TICK_MS: '100' };
  stack('restart-worker');
  client = await connect(env.SF_KEY_ALPHA);
});
after(async () => {
  // (a restart keeps sandboxes: this suite's go, those its timers did not end already)
  for (const id of made) await call(client, 'sandbox_kill', { sandbox_id: id }).catch(() => {});
  await client?.close();
  extraEnv = {};
  stack('restart-worker'); // the usual settings for the suites after this one
});

const made = [];
const create = async (args = {}) => {
  const r = await call(client, 'sandbox_create', args);
  assert.equal(r.isError, false, r.text);
  made.push(r.structured.id);
  return r.structured.id;
};

test('pause stops a background counter; exec resumes it and it goes on from where it was', async () => {
  const id = await create({ name: 'pause' });
  await sh(client, id, 'setsid sh -c \'i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.02; done\' >/dev/null 2>&1 &');
  const n = async () => Number((await sh(client, id, 'cat /tmp/n')).stdout);
  await until('the counter to count', async () => (await n()) > 5);

  const atPause = await n();
  const p = await call(client, 'sandbox_pause', { sandbox_id: id });
  assert.equal(p.isError, false, p.text);
  assert.deepEqual(p.structured, { id, status: 'paused' });
  const i = await info(id);
  assert.equal(i.status, 'paused');
  assert.match(i.paused_at, /^\d{4}-\d\d-\d\dT/);
  assert.equal(i.timers.idle_pause_at, undefined, 'no idle timer while paused');
  // Two seconds paused (at up to 50 counts a second it would have gone ~100 further); the
  // next exec resumes it, and the count is about where the pause left it.
  const t0 = Number(redis('TIME').split('\n')[0]);
  await until('two seconds to pass', async () => Number(redis('TIME').split('\n')[0]) >= t0 + 2, 5000);
  assert.equal(await status(id), 'paused', 'still paused: info does not resume');
  const atResume = await n(); // auto-resume
  assert.equal(await status(id), 'active');
  assert.ok(atResume - atPause < 25, `counted ${atResume - atPause} while paused`);
  const after = await until('the counter to go on', async () => { const v = await n(); return v > atResume + 5 && v; });
  assert.ok(after > atResume);
  // explicit resume of a running sandbox is a no-op
  assert.deepEqual((await call(client, 'sandbox_resume', { sandbox_id: id })).structured, { id, status: 'active' });
  // file tools resume too
  await call(client, 'sandbox_pause', { sandbox_id: id });
  const r = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/tmp/n' });
  assert.equal(r.isError, false, r.text);
  assert.equal(await status(id), 'active');
  await call(client, 'sandbox_kill', { sandbox_id: id });
});

test('the counter really stops while paused', async () => {
  const id = await create({ name: 'frozen' });
  await sh(client, id, 'setsid sh -c \'i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.02; done\' >/dev/null 2>&1 &');
  await until('the counter to count', async () => Number((await sh(client, id, 'cat /tmp/n')).stdout) > 5);
  await call(client, 'sandbox_pause', { sandbox_id: id });
  // The sandbox's processes, seen from the host: all in the frozen cgroup, none running.
  const pids = execFileSync('sh', ['-c', `grep -l ${id} /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3`]).toString().split('\n').filter(Boolean);
  assert.ok(pids.length > 0);
  const snap = () => pids.map((p) => { try { return execFileSync('cat', [`/proc/${p}/stat`]).toString().split(' ')[13]; } catch { return 'gone'; } }).join();
  const a = snap();
  const t0 = Number(redis('TIME').split('\n')[0]);
  await until('a second to pass', async () => Number(redis('TIME').split('\n')[0]) >= t0 + 2, 5000);
  assert.equal(snap(), a, 'no CPU time used while paused');
  await call(client, 'sandbox_kill', { sandbox_id: id });
});

// The gateway restarts (kill -9, same port): the suite's client opens a new session (its
// first try may meet a pooled connection to the gateway that died: fetch's pool is shared).
const restartGateway = async () => {
  stack('restart-gateway');
  await client.close().catch(() => {});
  client = await until('a session with the new gateway',
    () => connect(env.SF_KEY_ALPHA).catch(() => null), 10000);
};

test('timeout_seconds kills the sandbox, also across a scheduler and a gateway restart; info shows when', async () => {
  const id = await create({ name: 'timeout', timeout_seconds: 4 });
  const i = await info(id);
  const at = Date.parse(i.timers.timeout_at);
  assert.ok(at > Date.now() && at <= Date.now() + 5000, i.timers.timeout_at);
  stack('restart-scheduler');
  await restartGateway();
  await until('the timeout', async () => /killed/.test(await status(id)), 20000);
  assert.equal(redis('ZSCORE', `sf:host:{${env.SF_HOST_ID}}:timers`, `t:${id}`), '', 'its timers are gone');
});

test('idle sandboxes pause by themselves, also across a scheduler and a gateway restart; a call resumes them', async () => {
  const id = await create({ name: 'idle' });
  const i = await info(id);
  assert.ok(Date.parse(i.timers.idle_pause_at) <= Date.now() + 3000, i.timers.idle_pause_at);
  stack('restart-scheduler');
  await restartGateway();
  await until('the idle pause', async () => (await status(id)) === 'paused');
  assert.equal((await sh(client, id, 'echo back')).stdout, 'back\n');
  assert.equal(await status(id), 'active');
  await call(client, 'sandbox_kill', { sandbox_id: id });
});

test('auto_delete_seconds kills a paused sandbox; sandbox_update changes the timers', async () => {
  const id = await create({ name: 'ad', auto_delete_seconds: 2 });
  await call(client, 'sandbox_pause', { sandbox_id: id });
  const i = await info(id);
  assert.equal(i.auto_delete_seconds, 2);
  assert.ok(Date.parse(i.timers.auto_delete_at) <= Date.now() + 2500, i.timers.auto_delete_at);
  await restartGateway();
  await until('the auto-delete (across a gateway restart)', async () => /killed/.test(await status(id)), 20000);

  // update: metadata replaced, auto-delete off, then a short timeout
  const u = await create({ name: 'upd', auto_delete_seconds: 1, metadata: { a: '1' } });
  const up = await call(client, 'sandbox_update', { sandbox_id: u, metadata: { b: '2' }, auto_delete_seconds: null });
  assert.equal(up.isError, false, up.text);
  assert.deepEqual(up.structured.metadata, { b: '2' });
  assert.equal(up.structured.auto_delete_seconds, undefined);
  await call(client, 'sandbox_pause', { sandbox_id: u });
  assert.equal((await info(u)).timers.auto_delete_at, undefined);
  // one sandbox_update for rules, metadata and timers; a paused sandbox stays paused
  const both = await call(client, 'sandbox_update', { sandbox_id: u, allow_out: ['example.test'], metadata: { c: '3' } });
  assert.equal(both.isError, false, both.text);
  assert.equal(both.structured.status, 'paused');
  assert.deepEqual(both.structured.metadata, { c: '3' });
  assert.deepEqual(both.structured.network.allow_out, ['example.test']);
  const md = await call(client, 'sandbox_update', { sandbox_id: u, metadata: { d: '4' } });
  assert.equal(md.structured.status, 'paused', md.text);
  assert.equal(await status(u), 'paused', 'an update does not resume');
  assert.deepEqual((await info(u)).metadata, { d: '4' });
  const t = await call(client, 'sandbox_update', { sandbox_id: u, timeout_seconds: 1 });
  assert.equal(t.isError, false, t.text);
  await until('the new timeout', async () => /killed/.test(await status(u)), 20000);
  const gone = await call(client, 'sandbox_update', { sandbox_id: u, timeout_seconds: 60 });
  assert.equal(gone.isError, true);
  assert.match(gone.text, /is no longer running \(killed\)|was killed/);
  const beta = await connect(env.SF_KEY_BETA, 'beta');
  const other = await call(beta, 'sandbox_update', { sandbox_id: id, timeout_seconds: 5 });
  assert.match(other.text, /No sandbox with id/);
  await beta.close();
});

test("a restarted worker keeps its sandboxes and their timers; a paused one resumes on its next exec", async () => {
  const id = await create({ name: 'restart', timeout_seconds: 600 });
  const t = redis('ZSCORE', `sf:host:{${env.SF_HOST_ID}}:timers`, `t:${id}`);
  assert.notEqual(t, '');
  const p = await create({ name: 'restart-paused' });
  await sh(client, p, 'setsid sh -c \'i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.02; done\' >/dev/null 2>&1 &');
  await until('the counter to count', async () => Number((await sh(client, p, 'cat /tmp/n')).stdout) > 5);
  assert.equal((await call(client, 'sandbox_pause', { sandbox_id: p })).isError, false);
  stack('restart-worker');
  assert.equal(redis('ZSCORE', `sf:host:{${env.SF_HOST_ID}}:timers`, `t:${id}`), t, 'its lifetime timer is kept');
  assert.equal(await status(id), 'active');
  assert.equal(await status(p), 'paused');
  // (the first exec resumes it; the loop rewrites /tmp/n, so a read may meet it empty)
  const n1 = await until('a counter value', async () => Number((await sh(client, p, 'cat /tmp/n')).stdout) || 0);
  assert.equal(await status(p), 'active');
  await until('the counter to go on', async () => Number((await sh(client, p, 'cat /tmp/n')).stdout) > n1 + 5);
});
