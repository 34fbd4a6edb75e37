// Isolation inside one sandbox, and between two.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env, driver } from './lib.mjs';
import { readFileSync } from 'node:fs';

const client = await connect(env.SF_KEY_ALPHA);
let id, other;
before(async () => {
  id = (await call(client, 'sandbox_create', { name: 'iso' })).structured.id;
  other = (await call(client, 'sandbox_create', { name: 'iso-2' })).structured.id;
});
after(async () => {
  await call(client, 'sandbox_kill', { sandbox_id: id });
  await call(client, 'sandbox_kill', { sandbox_id: other });
  await client.close();
});

test('ps shows only the sandbox\'s own processes', async () => {
  const r = await sh(client, id, 'ps -o pid,args');
  // A microVM has its own kernel: its threads ([kthreadd], ...) are the guest's.
  const lines = r.stdout.trim().split('\n').slice(1).filter((l) => !/^\s*\d+\s+\[.*\]$/.test(l));
  assert.ok(lines.length <= 4, `few processes: ${r.stdout}`);
  assert.match(lines[0], /^\s*1\s+.*sandfleet-agent/, 'pid 1 is the agent');
  assert.doesNotMatch(r.stdout, /sandfleet-worker|redis-server|sandfleet-gateway/);
});

test('the host\'s files are not visible', async () => {
  const hostName = readFileSync('/etc/hostname', 'utf8').trim();
  const r = await sh(client, id, 'ls /; cat /etc/hostname; ls /work /root/.ssh 2>&1; cat /etc/passwd');
  assert.doesNotMatch(r.stdout, /sandfleet-e2e|node_modules/);
  assert.ok(!r.stdout.split('\n').includes(hostName) || hostName === 'sandbox', 'hostname is the sandbox\'s');
  assert.match(r.stdout, /No such file or directory/);
  const mounts = await sh(client, id, 'cat /proc/mounts');
  assert.doesNotMatch(mounts.stdout, /\/work|\/var\/lib\/sandfleet/, 'no host paths in the mount table');
});

test('writing /bin fails, writing /tmp works', async () => {
  const bin = await sh(client, id, 'touch /bin/evil && echo WROTE');
  assert.notEqual(bin.exit_code, 0);
  assert.doesNotMatch(bin.stdout, /WROTE/);
  const tmp = await sh(client, id, 'echo data > /tmp/f && cat /tmp/f');
  assert.equal(tmp.stdout, 'data\n');
});

test('the network has only lo (a VM: lo and its NIC, with no route anywhere)', async () => {
  const r = await sh(client, id, 'cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d " "');
  assert.equal(r.stdout.trim(), driver === 'qemu' ? 'lo\neth0' : 'lo');
  const routes = await sh(client, id, 'tail -n +2 /proc/net/route');
  assert.equal(routes.stdout, '', 'no route');
});

test('a fork bomb is contained by the pids limit and the sandbox survives', async () => {
  const r = await call(client, 'sandbox_exec', {
    sandbox_id: id,
    command: 'i=0; while [ $i -lt 1000 ]; do sleep 60 >/dev/null 2>&1 & i=$((i+1)); done; echo spawned',
    timeout_ms: 8000,
  }, { timeout: 60000 });
  const s = r.structured;
  assert.ok(s, r.text);
  assert.match(s.stderr, /can't fork|Resource temporarily unavailable/i,
    `forks beyond the limit fail: ${JSON.stringify(s).slice(0, 300)}`);
  const count = await sh(client, id, 'ps -o pid | wc -l');
  assert.ok(Number(count.stdout.trim()) <= 300, `process count bounded: ${count.stdout}`);
  await sh(client, id, 'kill -9 -1 2>/dev/null; true');
  const alive = await sh(client, id, 'echo alive');
  assert.equal(alive.stdout, 'alive\n');
});

test('two sandboxes do not see each other\'s files', async () => {
  await sh(client, id, 'echo secret-of-one > /root/mine');
  const r = await sh(client, other, 'cat /root/mine 2>&1; find / -name mine 2>/dev/null | grep -v ^/proc');
  assert.doesNotMatch(r.stdout, /secret-of-one/);
});
