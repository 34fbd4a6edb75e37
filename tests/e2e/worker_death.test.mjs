// A worker that dies mid-call: the call still gets exactly one, actionable answer, and the
// restarted worker takes the sandbox back (issue 26; restart.test.mjs has the full case).
// (The stack gives sandbox_exec 3 s beyond its timeout_ms; see tests/integration/stack.)
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env } from './lib.mjs';

const client = await connect(env.SF_KEY_ALPHA);
after(() => client.close());

test('worker killed during an exec', async () => {
  const id = (await call(client, 'sandbox_create', { name: 'doomed' })).structured.id;
  assert.equal((await sh(client, id, 'echo up')).stdout, 'up\n');

  const started = Date.now();
  const pending = call(client, 'sandbox_exec', { sandbox_id: id, command: 'sleep 30', timeout_ms: 2000 });
  await new Promise((r) => setTimeout(r, 500));
  process.kill(Number(readFileSync(`${env.SF_STATE}/pids/worker`, 'utf8')), 'SIGKILL');

  const r = await pending;
  const waited = Date.now() - started;
  assert.equal(r.isError, true);
  assert.match(r.text, /got no answer in time.*sandbox_info/);
  assert.ok(waited >= 4500 && waited < 15000, `answered at the deadline (${waited} ms)`);

  // A new worker on the same host: the sandbox goes on (its command ran on meanwhile:
  // nobody was told its end) and is listed.
  execFileSync(new URL('../integration/stack', import.meta.url).pathname,
    ['restart-worker', env.SF_STATE, env.SF_BUILD], { stdio: 'inherit' });
  const kept = await sh(client, id, 'pgrep -f "sleep 30" >/dev/null && echo still-sleeping; echo kept');
  assert.match(kept.stdout, /kept/);
  const info = await call(client, 'sandbox_info', { sandbox_id: id });
  assert.equal(info.structured.status, 'active');
  const list = await call(client, 'sandbox_list', {});
  assert.ok(list.structured.sandboxes.some((s) => s.id === id), 'a kept sandbox is listed');
  await call(client, 'sandbox_kill', { sandbox_id: id });

  // And it serves new work.
  const fresh = (await call(client, 'sandbox_create', {})).structured.id;
  assert.equal((await sh(client, fresh, 'echo fine')).stdout, 'fine\n');
  await call(client, 'sandbox_kill', { sandbox_id: fresh });
});

test('a host that stopped heartbeating is removed and its sandboxes are lost', async () => {
  const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
  const ghost = 'sb_ghostofahost';
  redis('HSET', `sf:sb:{${ghost}}`, 'id', ghost, 'team', 'alpha', 'host', 'ghost-host', 'state', 'running',
    'created', String(Date.now()), 'last_active', String(Date.now()));
  redis('SADD', 'sf:team:{alpha}:sandboxes', ghost);
  redis('SADD', 'sf:host:{ghost-host}:sandboxes', ghost);
  // The host last: a reaper run between these writes must not see it without its sandbox.
  redis('ZADD', 'sf:hosts', String(Date.now() - 3600e3), 'ghost-host');
  // The scheduler's reaper runs every host_ttl_ms (5 s).
  let status;
  for (let i = 0; i < 40 && status !== 'lost'; i++) {
    await new Promise((r) => setTimeout(r, 250));
    status = (await call(client, 'sandbox_info', { sandbox_id: ghost })).structured?.status;
  }
  assert.equal(status, 'lost');
  assert.equal(redis('ZSCORE', 'sf:hosts', 'ghost-host'), '');
  const list = await call(client, 'sandbox_list', {});
  assert.ok(!list.structured.sandboxes.some((s) => s.id === ghost));
  const ex = await call(client, 'sandbox_exec', { sandbox_id: ghost, command: 'true' });
  assert.match(ex.text, /lost with its host/);
});

test('a worker whose sandbox the platform gave up kills it', async () => {
  const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
  const id = (await call(client, 'sandbox_create', {})).structured.id;
  await sh(client, id, 'echo up');
  assert.ok(existsSync(`${env.SF_STATE}/worker/sandboxes/${id}`), 'the sandbox has its folder');
  // What the reaper does to a host it thought dead while the worker was stalled:
  redis('SREM', 'sf:host:{e2e-host}:sandboxes', id);
  redis('HSET', `sf:sb:{${id}}`, 'state', 'lost');
  let gone = false;
  for (let i = 0; i < 40 && !gone; i++) {
    await new Promise((r) => setTimeout(r, 100));
    gone = !existsSync(`${env.SF_STATE}/worker/sandboxes/${id}`) &&
      !existsSync(`/sys/fs/cgroup/pids/sandfleet/${id}`) && !existsSync(`/sys/fs/cgroup/sandfleet/${id}`);
  }
  assert.ok(gone, 'the worker removed the sandbox within a few heartbeats');
});
