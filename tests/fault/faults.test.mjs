// The fleet under faults (issue 9): three workers, two schedulers, two gateways on one
// box (tests/fault/fleet), load with a side-effect ledger, and each process killed -9
// mid-load, then restarted. After each: every call got exactly one answer, no side effect
// ran twice, no "ok" lacks its side effect, no call waited out its deadline when its
// outcome was known, and calls flow again (polled, 30 s deadline).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fleetEnv, mcall, startLoad, until, redis, sleep } from './load.mjs';

const state = process.env.SF_FLEET_STATE;
if (!state) throw new Error('SF_FLEET_STATE is not set: run this through ctest (ops/test)');
const env = fleetEnv(state);
const urls = [env.SF_URL, env.SF_URL2];
const key = env.SF_KEY;
const fleet = (...args) => execFileSync(new URL('./fleet', import.meta.url).pathname,
  [args[0], state, env.SF_BUILD, ...args.slice(1)], { stdio: 'inherit' });
const EXEC_TIMEOUT = 5000; // + the stack's 3 s margin: the gateway's deadline is 8 s
const DEADLINE = EXEC_TIMEOUT + 3000;

const created = [];
after(async () => {
  for (const id of created) await mcall(urls[0], key, 'sandbox_kill', { sandbox_id: id });
});

let load = []; // sandboxes the load runs in: two per host

test('30 creates through two gateways spread over three workers', async () => {
  const ids = await Promise.all(Array.from({ length: 30 }, async (_, i) => {
    const r = await mcall(urls[i % 2], key, 'sandbox_create', { name: `spread-${i}` });
    assert.equal(r.ok, true, `create ${i}: ${r.text ?? r.neterr}`);
    return r.structured.id;
  }));
  created.push(...ids);
  const byHost = {};
  for (const id of ids) (byHost[redis(env, 'HGET', `sf:sb:{${id}}`, 'host')] ??= []).push(id);
  assert.deepEqual(Object.keys(byHost).sort(), ['fleet-1', 'fleet-2', 'fleet-3']);
  for (const [h, l] of Object.entries(byHost)) assert.ok(l.length >= 8, `${h} got only ${l.length} of 30`);
  for (const [h, l] of Object.entries(byHost)) load.push(...l.slice(0, 2).map((sb) => ({ sb, h })));
  // the other 24 go, so the load's sandboxes are the fleet's only ones
  const rest = ids.filter((id) => !load.some((l) => l.sb === id));
  await Promise.all(rest.map(async (id) => {
    const r = await mcall(urls[0], key, 'sandbox_kill', { sandbox_id: id });
    assert.equal(r.ok, true, r.text);
  }));
  created.splice(0, created.length, ...load.map((l) => l.sb));
});

// Calls flow through both gateways again; ms it took, or -1 after 30 s.
async function flowing() {
  return until(async () => {
    for (const u of urls) {
      const r = await mcall(u, key, 'sandbox_exec', { sandbox_id: load[0].sb, command: 'true' },
        { timeoutMs: 10000 });
      if (!r.ok) return false;
    }
    return true;
  }, 30000, 200);
}

async function ledgers() {
  const seen = new Map();
  for (const { sb } of load) {
    const r = await mcall(urls[0], key, 'sandbox_exec', { sandbox_id: sb, command: 'cat /tmp/ledger 2>/dev/null; true' });
    if (!r.ok) continue; // a sandbox lost with its host: its ledger went with it
    for (const id of r.structured.stdout.split('\n').filter(Boolean)) seen.set(id, (seen.get(id) ?? 0) + 1);
    seen.set(`sb:${sb}`, 1);
  }
  return seen;
}

// One fault under load: kill -9 NAME, start it again, check the answers and the ledger.
async function fault(name, { netOk = () => false, mayWait = false } = {}) {
  const l = startLoad(urls, key, load.map((x) => x.sb), { prefix: `${name}-`, timeoutMs: EXEC_TIMEOUT });
  await sleep(1000);
  fleet('kill', name);
  await sleep(1000);
  fleet('start', name);
  const recover = await flowing();
  assert.ok(recover >= 0, `calls do not flow 30 s after ${name} restarted`);
  await sleep(500);
  const calls = await l.stop();
  const seen = await ledgers();
  const ok = calls.filter((c) => c.r.ok).length;
  for (const c of calls) {
    assert.ok(c.r, `call ${c.id} got no answer`);
    if (c.r.neterr) {
      assert.ok(netOk(c), `call ${c.id} through ${c.url} broke (${c.r.neterr})`);
      continue;
    }
    if (!mayWait) assert.ok(c.r.ms < DEADLINE - 500, `call ${c.id} waited ${c.r.ms} ms: "${c.r.text}"`);
    assert.ok((seen.get(c.id) ?? 0) <= 1, `call ${c.id} ran ${seen.get(c.id)} times`);
    if (c.r.ok && seen.has(`sb:${c.sb}`)) assert.equal(seen.get(c.id), 1, `call ${c.id} said ok but never ran`);
  }
  for (const [id, n] of seen) assert.equal(n, 1, `side effect ${id} happened ${n} times`);
  assert.ok(ok > 10, `only ${ok} of ${calls.length} calls succeeded around the ${name} fault`);
  console.log(`# ${name}: ${calls.length} calls, ${ok} ok, flowing again ${recover} ms after the restart`);
}

test('kill -9 of a scheduler under load', () => fault('scheduler'));

test('kill -9 of a gateway under load', () => fault('gateway-2', { netOk: (c) => c.url === urls[1] }));

test('kill -9 of Redis (append-only file) under load', async () => {
  await fault('redis');
  // its state came back from the append-only file: the load's sandboxes are all there
  for (const { sb } of load) assert.equal(redis(env, 'HGET', `sf:sb:{${sb}}`, 'state'), 'running');
});

test('kill -9 of the broker under load', () => fault('kafka', { mayWait: true }));

test('with the broker gone, SIGTERM ends every daemon within 10 s', async () => {
  fleet('kill', 'kafka');
  const names = ['scheduler', 'scheduler-2', 'worker-fleet-1', 'worker-fleet-2', 'worker-fleet-3',
    'gateway', 'gateway-2'];
  const pids = names.map((n) => Number(readFileSync(`${state}/pids/${n}`, 'utf8')));
  const t0 = Date.now();
  for (const p of pids) process.kill(p, 'SIGTERM');
  const alive = () => pids.filter((p) => { try { process.kill(p, 0); return true; } catch { return false; } });
  const took = await until(() => alive().length === 0, 10000, 50);
  assert.ok(took >= 0, `still running 10 s after SIGTERM: ${alive().map((p) => names[pids.indexOf(p)])}`);
  console.log(`# every daemon ended ${Date.now() - t0} ms after SIGTERM with the broker gone`);
  created.length = 0; // their sandboxes went with the workers
});
