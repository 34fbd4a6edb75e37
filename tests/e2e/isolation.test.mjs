// Isolation inside one sandbox, and between two.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env, driver } from './lib.mjs';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { networkInterfaces } from 'node:os';

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

test('the network reaches nothing but the egress proxy (a VM: only its link into its own namespace)', async () => {
  const r = await sh(client, id, 'cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d " "');
  const routes = await sh(client, id, 'tail -n +2 /proc/net/route | cut -f1,2,3');
  if (driver === 'qemu') {
    // eth0 (169.254.78.2) and a default route via 169.254.78.1, tap0 in the sandbox's own
    // network namespace: where the egress proxy listens, with no link to the host.
    assert.equal(r.stdout.trim(), 'lo\neth0');
    assert.match(routes.stdout, /^eth0\t00000000\t014EFEA9$/m, 'default route via 169.254.78.1');
  } else {
    // sf0/sf1: a veth pair with both ends inside the sandbox's namespace, carrying the
    // default route to nftables, which hands every connection to the egress proxy.
    assert.deepEqual(r.stdout.trim().split('\n').sort(), ['lo', 'sf0', 'sf1']);
    assert.match(routes.stdout, /^sf0\t00000000\t00000000$/m, 'default route into sf0');
    assert.doesNotMatch(routes.stdout.trim(), /^(?!sf0\t)/m, 'every route stays on sf0');
  }
  // A server on every address of this host is not reachable from the sandbox: a
  // connection is taken by the egress proxy (which refuses the destination), never by it.
  let reached = 0;
  const server = createServer((sock) => { reached++; sock.end('BANNER-FROM-THE-HOST\n'); });
  await new Promise((res) => server.listen(0, '0.0.0.0', res));
  const port = server.address().port;
  const hostIps = Object.values(networkInterfaces()).flat()
    .filter((a) => a.family === 'IPv4' && !a.internal).map((a) => a.address);
  try {
    for (const ip of hostIps) {
      const c = await sh(client, id, `printf 'hello\\n' | nc -w 2 ${ip} ${port}; echo " rc=$?"`,
        { timeout_ms: 10000 });
      assert.doesNotMatch(c.stdout, /BANNER-FROM-THE-HOST/, `${ip}:${port} must not be reachable`);
      assert.match(c.stdout, / rc=\d+\n$/, 'nc ran');
    }
    assert.equal(reached, 0);
  } finally {
    server.close();
  }
});

test('a fork bomb is contained by the pids limit and the sandbox survives', async () => {
  // The loop ends by itself (forks past the limit fail at once); the timeout is only a
  // backstop, wide enough for a software-emulated VM on a loaded host.
  const r = await call(client, 'sandbox_exec', {
    sandbox_id: id,
    command: 'i=0; while [ $i -lt 1000 ]; do sleep 60 >/dev/null 2>&1 & i=$((i+1)); done; echo spawned',
    timeout_ms: 240000,
  }, { timeout: 300000 });
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
  // /proc and /sys are the kernel's views (a VM's are large and slow to walk under TCG)
  const r = await sh(client, other, 'cat /root/mine 2>&1; '
    + 'find / \\( -path /proc -o -path /sys \\) -prune -o -name mine -print 2>/dev/null');
  assert.doesNotMatch(r.stdout, /secret-of-one/);
});
