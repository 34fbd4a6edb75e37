// The tenant-safety attack suite: a tenant (team alpha) attacks its host through MCP,
// with the official SDK client, on a stack of its own (tests/attack/CMakeLists.txt: small
// default shapes, teardowns that stop themselves half-way until SIGCONT). Every case
// also checks that another team (beta) is unaffected meanwhile. It asserts causes (quota
// errors, cgroup counters, what is left on the host), not timings: those are in
// tests/bench/noisy.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, existsSync, statSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env, until } from '../e2e/lib.mjs';

const HOST = env.SF_HOST_ID;
const STATE = `${env.SF_STATE}/worker`;
const workerPid = Number(readFileSync(`${env.SF_STATE}/pids/worker`, 'utf8'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const cg = (ctrl, id, file) => `/sys/fs/cgroup/${ctrl}/sandfleet/${HOST}/${id}${file ? '/' + file : ''}`;
const num = (path) => Number(readFileSync(path, 'utf8').trim());
const stat = (path) => Object.fromEntries(readFileSync(path, 'utf8').trim().split('\n')
  .map((l) => l.split(' ')).map(([k, v]) => [k, Number(v)]));
const V1 = existsSync('/sys/fs/cgroup/memory/memory.limit_in_bytes');

// A long command: up to 10 minutes for the command and the MCP call.
async function long(client, id, command) {
  // A long call streams (progress beats), so no HTTP header timeout cuts it on a slow box;
  // it waits for the command (detach_after_ms 0: no still_running answer after 50 s).
  const r = await call(client, 'sandbox_exec', { sandbox_id: id, command, timeout_ms: 600000,
    detach_after_ms: 0 },
    { timeout: 620000, onprogress: () => {} });
  assert.ok(r.structured, r.text);
  return r.structured;
}


// The worker's teardown children (`sf-teardown`), with their state letter.
function teardowns() {
  const out = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const m = readFileSync(`/proc/${d}/stat`, 'utf8').match(/^\d+ \((.*)\) (\S) (\d+)/);
      if (m && m[1] === 'sf-teardown' && Number(m[3]) === workerPid)
        out.push({ pid: Number(d), state: m[2] });
    } catch { /* gone meanwhile */ }
  }
  return out;
}

const state = (id) => redis('HGET', `sf:sb:{${id}}`, 'state');

// Kills a sandbox: answered at once; its teardown stops itself half-way (this stack's
// teardown_stop); `meanwhile` runs then; SIGCONT; the record ends `killed`.
async function kill(client, id, meanwhile) {
  const before = new Set(teardowns().map((t) => t.pid));
  const r = await call(client, 'sandbox_kill', { sandbox_id: id });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.structured.status, 'killed');
  const child = await until('the stopped teardown',
    () => teardowns().find((t) => t.state === 'T' && !before.has(t.pid)), 120000, 50);
  assert.equal(state(id), 'killing');
  if (meanwhile) await meanwhile();
  process.kill(child.pid, 'SIGCONT');
  await until(`${id} killed`, () => state(id) === 'killed', 120000, 50);
}

// Nothing of a sandbox is left on the host: directory, disk image, loop device, mounts
// (in the worker's mount namespace), cgroups.
async function nothingLeft(id) {
  assert.ok(!existsSync(`${STATE}/sandboxes/${id}`), 'its directory is gone');
  await until('its loop device released', () => !readdirSync('/sys/block').some((b) => {
    try { return readFileSync(`/sys/block/${b}/loop/backing_file`, 'utf8').includes(id); } catch { return false; }
  }), 60000, 50);
  assert.doesNotMatch(readFileSync(`/proc/${workerPid}/mountinfo`, 'utf8'), new RegExp(id), 'no mount left');
  for (const c of V1 ? ['memory', 'pids', 'cpu', 'cpuacct', 'freezer'] : [''])
    assert.ok(!existsSync(V1 ? cg(c, id) : `/sys/fs/cgroup/sandfleet/${HOST}/${id}`), `no ${c} cgroup left`);
}

const alpha = await connect(env.SF_KEY_ALPHA, 'attacker');
const beta = await connect(env.SF_KEY_BETA, 'bystander');
let bystander;

// Team beta, on the same host: its calls keep working.
async function betaFine() {
  const r = await sh(beta, bystander, 'echo fine');
  assert.equal(r.stdout, 'fine\n', JSON.stringify(r));
}

const create = async (client, name) => {
  const r = await call(client, 'sandbox_create', { name });
  assert.equal(r.isError, false, r.text);
  return r.structured.id;
};

before(async () => { bystander = await create(beta, 'bystander'); });
after(async () => {
  await kill(beta, bystander);
  await alpha.close();
  await beta.close();
});

test('killing a sandbox of 100k directories and 400k files stalls nothing and leaves nothing', async () => {
  const id = await create(alpha, 'tree');
  const built = await long(alpha, id, 'mkdir /root/t && cd /root/t && seq 100000 | xargs mkdir && ' +
    "seq 100000 | sed 's|.*|&/a &/b &/c &/d|' | xargs touch && ls | wc -l && ls 100000 | wc -l && " +
    "df -i / | tail -1 | awk '{print $3}'");
  const [dirs, perDir, inodes] = built.stdout.trim().split('\n').map(Number);
  assert.equal(dirs, 100000, built.stderr);
  assert.equal(perDir, 4);
  assert.ok(inodes >= 500000, `inodes in use: ${inodes}`);
  // its inode quota: more files fail inside, nothing on the host fills up
  const more = await long(alpha, id, 'mkdir /root/more && cd /root/more && seq 40000 | xargs touch; echo rc=$?');
  assert.match(more.stderr, /No space left on device/);
  assert.match(more.stdout, /rc=1/);
  await betaFine();
  const beat0 = Number(redis('HGET', `sf:host:{${HOST}}`, 'ts'));
  await kill(alpha, id, async () => {
    // the teardown is stopped half-way: the host goes on
    for (let i = 0; i < 3; i++) await betaFine();
    await until('two more heartbeats while the teardown is stopped',
      () => Number(redis('HGET', `sf:host:{${HOST}}`, 'ts')) > beat0 + 1500, 30000, 50);
    const other = await create(alpha, 'meanwhile');
    assert.equal((await sh(alpha, other, 'echo ok')).stdout, 'ok\n');
    await kill(alpha, other);
  });
  await nothingLeft(id);
  await betaFine();
});

test('100 busy loops: throttled, within the quota; the other team keeps working', async () => {
  const id = await create(alpha, 'burner');
  await sh(alpha, id, 'i=0; while [ $i -lt 100 ]; do (while :; do :; done) >/dev/null 2>&1 & i=$((i+1)); done; echo started');
  const quota = V1 ? num(cg('cpu', id, 'cpu.cfs_quota_us')) / num(cg('cpu', id, 'cpu.cfs_period_us')) : null;
  const read = () => V1
    ? { t: process.hrtime.bigint(), use: BigInt(readFileSync(cg('cpuacct', id, 'cpuacct.usage'), 'utf8').trim()),
        thr: stat(cg('cpu', id, 'cpu.stat')).nr_throttled }
    : { t: process.hrtime.bigint(), use: BigInt(stat(`/sys/fs/cgroup/sandfleet/${HOST}/${id}/cpu.stat`).usage_usec) * 1000n,
        thr: stat(`/sys/fs/cgroup/sandfleet/${HOST}/${id}/cpu.stat`).nr_throttled };
  // Throttling needs the loops to want more than the quota while they can get it: on a
  // loaded test box that can take a while, so wait for it (the quota holds meanwhile).
  const s0 = read();
  let s1 = s0;
  for (let i = 0; i < 5; i++) await betaFine();
  await until('A to be throttled', async () => {
    await sleep(1000);
    s1 = read();
    const used = Number(s1.use - s0.use) / Number(s1.t - s0.t);
    // CFS enforces the quota per 100 ms period: one period of slack over the window
    assert.ok(used <= (quota ?? 0.5) * 1.1 + 0.05, `used ${used.toFixed(3)} CPUs, quota ${quota}`);
    return s1.thr > s0.thr;
  }, 90000, 50);
  await betaFine();
  await kill(alpha, id, betaFine);
  await nothingLeft(id);
});

test('writing past the disk quota fails inside; the image never grows past it', async () => {
  const id = await create(alpha, 'filler');
  const r = await long(alpha, id, 'dd if=/dev/zero of=/root/fill bs=1M count=1200 2>&1; echo rc=$?');
  assert.match(r.stdout, /No space left on device/);
  assert.match(r.stdout, /rc=1/);
  const img = statSync(`${STATE}/sandboxes/${id}/disk.img`);
  const quota = Number(redis('HGET', `sf:sb:{${id}}`, 'disk_mib')) * 1024 * 1024;
  assert.equal(img.size, quota);
  assert.ok(img.blocks * 512 <= quota, `allocated ${img.blocks * 512} <= ${quota}`);
  await betaFine();
  await kill(alpha, id);
  await nothingLeft(id);
});

test('/dev/shm and TCP buffers are held by the memory limit; the agent survives an OOM', async () => {
  const id = await create(alpha, 'hog');
  const box = V1 ? cg('memory', id, 'box') : `/sys/fs/cgroup/sandfleet/${HOST}/${id}/box`;
  const boxLimit = num(`${box}/${V1 ? 'memory.limit_in_bytes' : 'memory.max'}`);
  // /dev/shm: pages that outlive their writers, charged to the box
  const shm = await sh(alpha, id, 'dd if=/dev/zero of=/dev/shm/fill bs=1M count=1000 2>&1; echo rc=$?');
  assert.match(shm.stdout, /No space left on device/);
  if (V1) assert.ok(num(`${box}/memory.max_usage_in_bytes`) <= boxLimit);
  await sh(alpha, id, 'rm /dev/shm/fill');
  await betaFine();
  // TCP: readers that stop reading pin the buffers of 16 connections. The writers start once
  // all 16 listen (0A = LISTEN in /proc/net/tcp6: busybox nc listens on ::); the readers read
  // for a second (so TCP autotuning grows the buffers: load, not a wait), then stop. Only
  // ports 7001-7016 count: the egress proxy listens in the sandbox's namespace too.
  const listening = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | " +
    "awk '$2 ~ /:1B(5[9A-F]|6[0-8])$/ && $4 == \"0A\"' | wc -l";
  await sh(alpha, id, 'for p in $(seq 7001 7016); do sleep 1000 | nc -l -p $p >/dev/null 2>&1 & ' +
    'echo $! >> /tmp/readers; done; ' +
    `i=0; while [ $(${listening}) -lt 16 ]; do ` +
    'i=$((i+1)); [ $i -lt 600 ] || exit 9; sleep 0.05; done; ' +
    'for p in $(seq 7001 7016); do (yes | nc 127.0.0.1 $p >/dev/null 2>&1 &); done; ' +
    'sleep 1; kill -STOP $(cat /tmp/readers); echo pinned');
  if (V1) { // v1 charges TCP buffers apart from memory, to a limit of their own
    const tcpLimit = num(`${box}/memory.kmem.tcp.limit_in_bytes`);
    // the stopped readers leave the writers' bytes queued until the limit holds them
    const peak = await until('the queued TCP buffers to reach the limit', () => {
      const p = num(`${box}/memory.kmem.tcp.max_usage_in_bytes`);
      return p >= tcpLimit * 0.9 ? p : 0;
    }, 30000, 50);
    assert.equal(tcpLimit, num(`${cg('memory', id)}/memory.kmem.tcp.limit_in_bytes`));
    // 16 stalled connections would pin far more; the limit is what held them (TCP
    // force-charges a few pages past it under pressure rather than fail)
    assert.ok(peak >= tcpLimit * 0.9, `the buffers reached the limit: ${peak} of ${tcpLimit}`);
    assert.ok(peak <= tcpLimit * 1.05, `and stayed at it: ${peak} of ${tcpLimit}`);
  }
  await betaFine();
  await sh(alpha, id, 'kill -9 -1 2>/dev/null; true');
  // an OOM kills the offending process, never the agent, and the result says so
  const oom = await sh(alpha, id, "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo survived");
  assert.equal(oom.oom_killed, true, JSON.stringify(oom).slice(0, 300));
  assert.doesNotMatch(oom.stdout, /survived/);
  const alive = await sh(alpha, id, 'cat /proc/1/cmdline; echo');
  assert.match(alive.stdout, /^\/sbin\/sandfleet-agent/);
  await betaFine();
  await kill(alpha, id);
  await nothingLeft(id);
});

test('the limits of a full host fit its memory', async () => {
  const h = Object.fromEntries(redis('HGETALL', `sf:host:{${HOST}}`).split('\n')
    .reduce((a, v, i, all) => (i % 2 ? a : [...a, [v, all[i + 1]]]), []));
  const memTotal = Number(readFileSync('/proc/meminfo', 'utf8').match(/MemTotal:\s+(\d+)/)[1]) * 1024;
  const shape = 256 * 1024 * 1024; // this stack's default memory_mib
  assert.ok(Number(h.capacity) * shape <= Number(h.mem_mib) * 1024 * 1024, JSON.stringify(h));
  if (V1) {
    const parent = `/sys/fs/cgroup/memory/sandfleet/${HOST}`;
    const cap = num(`${parent}/memory.limit_in_bytes`) + num(`${parent}/memory.kmem.tcp.limit_in_bytes`);
    assert.ok(cap <= memTotal, `the worker's cap ${cap} fits the host's ${memTotal}`);
    let sum = 0;
    for (const d of readdirSync(parent, { withFileTypes: true }))
      if (d.isDirectory())
        sum += num(`${parent}/${d.name}/memory.limit_in_bytes`) + num(`${parent}/${d.name}/memory.kmem.tcp.limit_in_bytes`);
    assert.ok(sum <= cap, `the sandboxes' limits ${sum} fit the cap ${cap}`);
    assert.equal(num(`${parent}/memory.limit_in_bytes`), Number(h.mem_mib) * 1024 * 1024);
  }
});

test('/proc shows the sandbox (memory limit, CPUs, its disk); no host path in its mount table', async () => {
  const id = await create(alpha, 'view');
  const r = await sh(alpha, id, "awk '/^MemTotal:/ {print $2}' /proc/meminfo; grep -c ^processor /proc/cpuinfo; " +
    "df -k / | tail -1 | awk '{print $2}'; cat /proc/self/mountinfo");
  const [mem, cpus, disk, ...mounts] = r.stdout.trim().split('\n');
  assert.equal(Number(mem), 256 * 1024, 'MemTotal is the sandbox\'s 256 MiB');
  assert.equal(Number(cpus), 1, 'one CPU for 500 mcpu');
  // its own 1 GiB disk (ext4 keeps some of it for its inode tables)
  assert.ok(Number(disk) > 800 * 1024 && Number(disk) <= 1024 * 1024, `its own 1 GiB disk: ${disk} KiB`);
  const table = mounts.join('\n');
  for (const host of [env.SF_STATE, env.SF_BUILD, '/work/', '/tmp/'])
    assert.ok(!table.includes(host), `no host path (${host}) in:\n${table}`);
  await betaFine();
  await kill(alpha, id);
});

test('AF_VSOCK, AF_PACKET and AF_XDP sockets fail; AF_INET works', { skip: !process.env.SF_PROBE }, async () => {
  const id = await create(alpha, 'sockets');
  const b64 = readFileSync(process.env.SF_PROBE).toString('base64');
  const r = await sh(alpha, id, `echo ${b64} | base64 -d > /root/probe && chmod +x /root/probe && ` +
    '/root/probe 40 1 0; /root/probe 17 3 0; /root/probe 44 3 0; /root/probe 40 1 0 int80; /root/probe 2 1 0');
  assert.equal(r.stdout, 'errno 97\nerrno 97\nerrno 97\nerrno 97\nok\n', r.stderr);
  await betaFine();
  await kill(alpha, id);
});

test('a 150 KiB command runs', async () => {
  const id = await create(alpha, 'long');
  const r = await sh(alpha, id, `echo ${'x'.repeat(150 * 1024)} | wc -c`);
  assert.equal(r.exit_code, 0, r.stderr);
  assert.equal(r.stdout, `${150 * 1024 + 1}\n`);
  await betaFine();
  await kill(alpha, id);
});
