// Template builds are sandboxes (issue 19, item 2): a team's build runs on its own disk (a
// loop image of its `from` + disk_mib), reserved on the host and in the team's share while
// it runs; a build that writes past its disk_mib fails naming disk_mib and the host's free
// space does not drop by more than about disk_mib; a shape no host can give is refused at
// once. On the attack stack (tests/attack/CMakeLists.txt).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, writeFileSync, existsSync, statfsSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, env, until } from '../e2e/lib.mjs';

const HOST = env.SF_HOST_ID;
const STATE = `${env.SF_STATE}/worker`;
const workerPid = Number(readFileSync(`${env.SF_STATE}/pids/worker`, 'utf8'));
const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const MiB = 1 << 20;
const freeBytes = () => { const s = statfsSync(STATE); return s.bavail * s.bsize; };
// The worker's own view of its files (the sandboxes' disks are mounted in its namespace).
const inWorker = (p) => `/proc/${workerPid}/root${p}`;
const uniq = Date.now().toString(36);

// This stack's teardowns stop themselves half-way (teardown_stop): a build's sandbox is
// torn down before the build ends, so the stopped ones go on.
function contTeardowns() {
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const m = readFileSync(`/proc/${d}/stat`, 'utf8').match(/^\d+ \((.*)\) (\S) (\d+)/);
      if (m && m[1] === 'sf-teardown' && m[2] === 'T' && Number(m[3]) === workerPid)
        process.kill(Number(d), 'SIGCONT');
    } catch { /* gone meanwhile */ }
  }
}
async function settled(name, every = 50) {
  return until(`${name} settled`, async () => {
    contTeardowns();
    const x = await listed(name);
    return x && x.status !== 'building' && x;
  }, 300000, every);
}

const alpha = await connect(env.SF_KEY_ALPHA, 'builder');
after(async () => { await alpha.close(); });

async function listed(name) {
  const l = await call(alpha, 'sandbox_template_list', { name_prefix: name });
  assert.equal(l.isError, false, l.text);
  return l.structured.templates.find((x) => x.name === name);
}

test('a build that writes 3x its disk_mib fails naming disk_mib; the host loses no more than its disk', async () => {
  const name = `fill-${uniq}`, disk = 192;
  const free0 = freeBytes();
  const r = await call(alpha, 'sandbox_template_create', {
    name, from: 'base', disk_mib: disk, memory_mib: 128,
    // step 1 waits for the test (a file it puts on the build's disk), step 2 writes 576 MiB
    run_steps: ['until [ -e /go ]; do sleep 0.1; done', `dd if=/dev/zero of=/big bs=1M count=${3 * disk}`],
  });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.structured.status, 'building');

  // the build is a sandbox: its root is the upper directory of a loop disk of its own
  const sbs = inWorker(`${STATE}/sandboxes`);
  const tb = await until('the build sandbox on its own disk', () => (existsSync(sbs) ? readdirSync(sbs) : [])
    .find((d) => d.startsWith('tb_') && existsSync(`${sbs}/${d}/fs/upper/bin`)), 120000, 50);
  assert.ok(readdirSync('/sys/block').some((b) => {
    try { return readFileSync(`/sys/block/${b}/loop/backing_file`, 'utf8').includes(tb); } catch { return false; }
  }), 'its disk is a loop device');
  // ...reserved like a sandbox: on the host (placement counts it) and in the team's share
  const hres = redis('HGETALL', `sf:host:{${HOST}}:res`).split('\n');
  const hk = hres.findIndex((k) => k.startsWith('tb:') && k.endsWith(`:${name}`));
  assert.ok(hk >= 0, `the host's reservations: ${hres.join(' ')}`);
  assert.match(hres[hk + 1], /^128 \d+$/);
  const team = hres[hk].slice(3, -name.length - 1);
  assert.match(redis('HGET', `sf:team:{${team}}:res`, `tb:${name}@${HOST}`), new RegExp(`^${HOST} 128 \\d+ ${disk}$`));

  writeFileSync(`${sbs}/${tb}/fs/upper/go`, '');
  let least = free0;
  const t = await until(`${name} settled`, async () => {
    least = Math.min(least, freeBytes());
    contTeardowns();
    const x = await listed(name);
    return x && x.status !== 'building' && x;
  }, 300000, 20);
  least = Math.min(least, freeBytes());
  assert.equal(t.status, 'failed', JSON.stringify(t));
  assert.equal(t.failed_step, 2);
  assert.match(t.error, new RegExp(`wrote more than its disk_mib \\(${disk} MiB\\); raise disk_mib or write less`));
  // its disk is sparse and bounded: the host lost at most about disk_mib meanwhile
  // (+64 MiB for the file system and whatever else this box wrote)
  assert.ok(free0 - least <= (disk + 64) * MiB, `free space fell by ${Math.round((free0 - least) / MiB)} MiB`);
  // released: no reservation, no disk, no template files on the host
  await until('the reservations released', () => redis('HEXISTS', `sf:host:{${HOST}}:res`, hres[hk]) === '0' &&
    redis('HEXISTS', `sf:team:{${team}}:res`, `tb:${name}@${HOST}`) === '0', 30000, 50);
  await until('the build sandbox gone', () => { contTeardowns(); return !existsSync(`${sbs}/${tb}`); }, 60000, 50);
  assert.ok(!existsSync(`${STATE}/templates/team/${team}/${name}/rootfs`), 'no template tree');
  const l = await listed(name);
  assert.equal(l.status, 'failed');
});

test('a template of a shape larger than any host is refused at once, saying so', async () => {
  const mem = Number(redis('HGET', `sf:host:{${HOST}}`, 'mem_mib'));
  const vcpu = Number(redis('HGET', `sf:host:{${HOST}}`, 'vcpu_milli'));
  assert.ok(mem > 0 && mem < 65536, `this host offers ${mem} MiB`);
  const name = `huge-${uniq}`;
  const r = await call(alpha, 'sandbox_template_create', { name, from: 'base', memory_mib: 65536, run_steps: ['true'] });
  assert.equal(r.isError, true, r.text);
  assert.match(r.text, new RegExp(`No host can build a template of memory_mib 65536.*largest a host offers is ${mem} MiB`));
  assert.equal(await listed(name), undefined, 'no record');
  assert.equal(redis('HEXISTS', `sf:host:{${HOST}}:res`, `tb:x:${name}`), '0');
  if (vcpu < 8000) {
    const c = await call(alpha, 'sandbox_template_create', { name, from: 'base', vcpu: 8, run_steps: ['true'] });
    assert.equal(c.isError, true, c.text);
    assert.match(c.text, /No host can build a template of .*vcpu 8.*ask for a smaller shape/);
  }
  // a shape that fits is still built
  const ok = await call(alpha, 'sandbox_template_create', { name, from: 'base', memory_mib: 128, disk_mib: 128, run_steps: ['echo hi > /hi'] });
  assert.equal(ok.isError, false, ok.text);
  const t = await settled(name);
  assert.equal(t.status, 'ready', JSON.stringify(t));
  const del = await call(alpha, 'sandbox_template_delete', { name });
  assert.equal(del.isError, false, del.text);
});
