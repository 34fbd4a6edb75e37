// Sandbox snapshots through MCP, on both drivers (the qemu stack runs this file too):
// sandbox_snapshot of a sandbox with a file and a background counter; a sandbox created
// from the snapshot has the file (both drivers) and the counter going on (qemu: memory and
// processes come with it; a jail keeps files only, and says so); the original goes on; a
// paused sandbox stays paused; the team's count limit (3 in the e2e stack) and a taken name
// say what to do; another team can neither see nor use the snapshot (these two on the jail
// stack only: nothing of them depends on the driver); a delete frees its place and its
// files on the host.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env, driver, until } from './lib.mjs';

let alpha, beta;
const made = [];

before(async () => {
  alpha = await connect(env.SF_KEY_ALPHA);
  beta = await connect(env.SF_KEY_BETA);
});
after(async () => {
  for (const id of made) await call(alpha, 'sandbox_kill', { sandbox_id: id });
  for (const s of (await call(alpha, 'sandbox_snapshot_list', {})).structured?.snapshots ?? [])
    await call(alpha, 'sandbox_snapshot_delete', { snapshot: s.name });
  await alpha?.close();
  await beta?.close();
});

const create = async (args = {}) => {
  const r = await call(alpha, 'sandbox_create', args);
  assert.equal(r.isError, false, r.text);
  made.push(r.structured.id);
  return r.structured.id;
};
const kill = async (id) => {
  const r = await call(alpha, 'sandbox_kill', { sandbox_id: id });
  assert.equal(r.isError, false, r.text);
  made.splice(made.indexOf(id), 1);
};
const snapshot = async (sandbox_id, name) => {
  const r = await call(alpha, 'sandbox_snapshot', { sandbox_id, ...(name ? { name } : {}) });
  assert.equal(r.isError, false, r.text);
  return r.structured;
};
const del = async (snapshot) => {
  const r = await call(alpha, 'sandbox_snapshot_delete', { snapshot });
  assert.equal(r.isError, false, r.text);
  return r.structured;
};
const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
// each count is written beside the file and renamed over it, so /tmp/n is never seen empty
// (a snapshot taken between a truncate and its write restored an empty file once)
const counter = 'setsid sh -c \'i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done\' >/dev/null 2>&1 &';
const count = async (id) => Number((await sh(alpha, id, 'cat /tmp/n')).stdout);
// the snapshot's files on the worker's host (the e2e stack's state_dir)
const files = (snapshotId) => `${env.SF_STATE}/worker/snapshots/${snapshotId}`;

test('a sandbox from a snapshot has its files, and on a microVM its running processes', async () => {
  const id = await create({ name: 'snap-source' });
  await sh(alpha, id, 'echo hello-snapshot > /root/kept.txt');
  await sh(alpha, id, counter);
  await until('the counter to count', async () => (await count(id)) > 3);

  const s = await snapshot(id, 'snap-one');
  assert.equal(s.name, 'snap-one');
  assert.match(s.snapshot_id, /^snp_/);
  assert.equal(s.sandbox_id, id);
  assert.equal(s.driver, driver);
  assert.ok(s.size > 0, `size ${s.size}`);
  assert.ok(existsSync(files(s.snapshot_id)), 'its files are on the host');

  // the original goes on where it was: running, its counter counting, its file there
  const atSnap = await count(id);
  await until('the original counter to go on', async () => (await count(id)) > atSnap);
  assert.equal((await sh(alpha, id, 'cat /root/kept.txt')).stdout, 'hello-snapshot\n');

  const listed = (await call(alpha, 'sandbox_snapshot_list', {})).structured.snapshots
    .find((x) => x.name === 'snap-one');
  assert.deepEqual({ ...listed, created: typeof listed.created }, {
    name: 'snap-one', snapshot_id: s.snapshot_id, size: s.size, status: 'ready', sandbox_id: id,
    template: 'base', driver, created: 'number' });

  // by name
  const c1 = await create({ from_snapshot: 'snap-one' });
  assert.equal((await sh(alpha, c1, 'cat /root/kept.txt')).stdout, 'hello-snapshot\n');
  assert.equal((await sh(alpha, c1, 'hostname')).stdout.trim(), c1, 'its own name');
  const restored = await count(c1);
  assert.ok(restored >= 3, `the counter's file came along (${restored})`);
  const ps = (await sh(alpha, c1, 'ps -o args 2>/dev/null || ps')).stdout;
  if (driver === 'qemu') {
    // memory and processes came with it: the counter goes on counting
    assert.match(ps, /while true/);
    await until('the restored counter to go on', async () => (await count(c1)) > restored);
  } else {
    // a jail's snapshot keeps files only: no counter runs
    assert.doesNotMatch(ps, /while true/);
  }
  // the copy is its own
  await sh(alpha, c1, 'echo changed > /root/kept.txt');
  assert.equal((await sh(alpha, id, 'cat /root/kept.txt')).stdout, 'hello-snapshot\n');

  // by id; then the snapshot goes, and its files with it (the worker sweeps)
  const c2 = await create({ from_snapshot: s.snapshot_id });
  assert.equal((await sh(alpha, c2, 'cat /root/kept.txt')).stdout, 'hello-snapshot\n');
  for (const x of [c1, c2, id]) await kill(x);
  assert.deepEqual(await del('snap-one'), { snapshot_id: s.snapshot_id, name: 'snap-one', status: 'deleted' });
  const gone = await call(alpha, 'sandbox_create', { from_snapshot: 'snap-one' });
  assert.equal(gone.isError, true);
  assert.match(gone.text, /No snapshot named 'snap-one' exists for your team/);
  await until('its files to leave the host', async () => !existsSync(files(s.snapshot_id)), 10000);
});

test('a paused sandbox stays paused across its snapshot', async () => {
  const id = await create({ name: 'snap-paused' });
  await sh(alpha, id, 'echo paused-file > /root/p.txt');
  assert.equal((await call(alpha, 'sandbox_pause', { sandbox_id: id })).isError, false);
  const s = await snapshot(id); // the name defaults to its id
  assert.equal(s.name, s.snapshot_id);
  assert.equal((await call(alpha, 'sandbox_info', { sandbox_id: id })).structured.status, 'paused');
  const c = await create({ from_snapshot: s.name });
  assert.equal((await sh(alpha, c, 'cat /root/p.txt')).stdout, 'paused-file\n');
  assert.equal((await sh(alpha, id, 'cat /root/p.txt')).stdout, 'paused-file\n'); // resumes it
  for (const x of [c, id]) await kill(x);
  await del(s.snapshot_id);
});

// The limits and the teams are the scheduler's and Redis's, whatever the driver: checked on
// the jail stack only (a qemu snapshot costs ~60 MiB and a second of TCG).
const jailOnly = { skip: driver !== 'jail' && 'driver-independent (checked on the jail stack)' };

test('the team\'s snapshot limit and a taken name say what to do; a delete frees a place', jailOnly, async () => {
  const id = await create({ name: 'snap-limits' });
  const taken = [];
  for (const n of ['lim-a', 'lim-b', 'lim-c']) taken.push(await snapshot(id, n));
  const dup = await call(alpha, 'sandbox_snapshot', { sandbox_id: id, name: 'lim-a' });
  assert.equal(dup.isError, true);
  assert.match(dup.text, /already; choose another name, or delete that one with sandbox_snapshot_delete/);
  const over = await call(alpha, 'sandbox_snapshot', { sandbox_id: id, name: 'lim-d' });
  assert.equal(over.isError, true);
  assert.match(over.text, /Your team holds 3 snapshots, its limit; delete one with sandbox_snapshot_delete/);
  await del('lim-b');
  const again = await snapshot(id, 'lim-d');
  assert.equal(again.name, 'lim-d');
  await kill(id);
  for (const n of ['lim-a', 'lim-c', 'lim-d']) await del(n);
  assert.deepEqual((await call(alpha, 'sandbox_snapshot_list', {})).structured.snapshots, []);
});

// The disk a host offers sandboxes is shared with the snapshots stored on it: a snapshot's
// bytes count in the host's disk (the worker's room check and its heartbeat's
// disk_used_mib) from when it is taken until its files are gone after the delete.
test('a snapshot\'s bytes count in its host\'s disk until its files are removed', jailOnly, async () => {
  const id = await create({ name: 'snap-disk' });
  const host = redis('HGET', `sf:sb:{${id}}`, 'host');
  const used = () => Number(redis('HGET', `sf:host:{${host}}`, 'disk_used_mib') || NaN);
  // 24 MiB that take their room (random: nothing to share or leave sparse)
  const w = await sh(alpha, id, 'head -c 25165824 /dev/urandom > /root/big && sync');
  assert.equal(w.exit_code, 0, w.stderr);
  // the snapshots the tests before deleted are swept (their files gone), and a heartbeat
  // written two periods later says so (the loop publishes, the heartbeat thread writes)
  const dir = `${env.SF_STATE}/worker/snapshots`;
  await until('earlier snapshots swept', async () => !existsSync(dir) || readdirSync(dir).length === 0, 15000);
  const swept = Date.now();
  await until('a heartbeat after the sweep', async () =>
    Number(redis('HGET', `sf:host:{${host}}`, 'ts')) > swept + 2000, 10000);
  const before = used();
  assert.ok(Number.isFinite(before), 'the heartbeat has disk_used_mib');
  assert.ok(Number(redis('HGET', `sf:host:{${host}}`, 'disk_mib')) > 0);
  const s = await snapshot(id, 'disk-a');
  const mib = Math.ceil(s.size / 1048576);
  assert.ok(mib >= 24, `a snapshot of 24 MiB of data holds ${s.size} bytes`);
  await until(`disk_used_mib ${before} + ${mib}`, async () => used() === before + mib, 10000);
  await del(s.snapshot_id);
  await until('the files removed', async () => !existsSync(files(s.snapshot_id)), 15000);
  await until(`disk_used_mib back to ${before}`, async () => used() === before, 10000);
  await kill(id);
});

test('another team can neither see nor use nor delete a snapshot', jailOnly, async () => {
  const id = await create({ name: 'snap-private' });
  const s = await snapshot(id, 'private');
  assert.deepEqual((await call(beta, 'sandbox_snapshot_list', {})).structured.snapshots, []);
  for (const ref of ['private', s.snapshot_id]) {
    const c = await call(beta, 'sandbox_create', { from_snapshot: ref });
    assert.equal(c.isError, true);
    assert.match(c.text, new RegExp(`No snapshot named '${ref}' exists for your team`));
    const d = await call(beta, 'sandbox_snapshot_delete', { snapshot: ref });
    assert.equal(d.isError, true);
    assert.match(d.text, new RegExp(`No snapshot named '${ref}' exists for your team`));
  }
  const other = await call(beta, 'sandbox_snapshot', { sandbox_id: id, name: 'stolen' });
  assert.equal(other.isError, true);
  assert.match(other.text, /No sandbox with id/);
  const both = await call(alpha, 'sandbox_create', { from_snapshot: 'private', from_template: 'base' });
  assert.equal(both.isError, true);
  assert.match(both.text, /Give from_template or from_snapshot, not both/);
  await kill(id);
  await del('private');
});

test('a create from a snapshot whose host is gone says so', jailOnly, async () => {
  const id = await create({ name: 'snap-host' });
  const s = await snapshot(id, 'on-a-host');
  const key = `sf:team:{alpha}:snap:on-a-host`;
  assert.equal(redis('HGET', key, 'host'), env.SF_HOST_ID);
  // its host leaves the fleet (as the reaper leaves a dead host: out of sf:hosts); a
  // snapshot starts only there
  redis('HSET', key, 'host', 'gone-host');
  const r = await call(alpha, 'sandbox_create', { from_snapshot: 'on-a-host' });
  assert.equal(r.isError, true);
  assert.match(r.text, /The host that holds snapshot 'on-a-host' \(gone-host\) is not responding or has no room; a snapshot starts only on its own host/);
  redis('HSET', key, 'host', env.SF_HOST_ID);
  const c = await create({ from_snapshot: s.snapshot_id });
  for (const x of [c, id]) await kill(x);
  await del('on-a-host');
});
