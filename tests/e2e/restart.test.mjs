// A worker restart keeps its host's sandboxes (issue 26, docs/internals/restart.md): kill -9
// of the worker under load from several clients, and a SIGTERM upgrade onto another worker
// binary. Before the fault each case writes a ledger, starts a background process, sets a
// timer, publishes a preview URL and binds a secret; a second sandbox's processes are killed
// while no worker runs. After it: the same sandbox answers, the ledger is intact, the process
// still runs (and ran meanwhile), the preview URL and the secret (through the egress proxy,
// to the stack's fake upstream) still work, the timer fires, every call of the load got one
// answer and none ran twice, and the sandbox that died is retired `lost` with the reason
// in the worker's log. Both cases run on both drivers (the qemu stack runs this file as
// e2e.qemu.restart, with its VM-only cases below).
import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { connect, call, sh, env, driver, until, cli } from './lib.mjs';

const jailOnly = { skip: driver !== 'jail' ? 'the jail stack (the qemu label has its own case)' : false };
const tag = randomBytes(4).toString('hex');
const SECRET = `RS_${tag}`;
const VALUE = `real-restart-value-${randomBytes(12).toString('hex')}`;
const LOADERS = 3; // (each sandbox reserves 512 MiB of the shared stack host's disk)
const gwPort = Number(new URL(env.SF_URL).port);

const stack = (cmd) => execFileSync(new URL('../integration/stack', import.meta.url).pathname,
  [cmd, env.SF_STATE, env.SF_BUILD], { stdio: 'inherit' });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const workerPid = () => Number(readFileSync(`${env.SF_STATE}/pids/worker`, 'utf8'));
const alive = (pid) => { try { process.kill(pid, 0); return true; } catch { return false; } };
const workerLog = () => readFileSync(`${env.SF_STATE}/logs/worker.log`, 'utf8');
const upstream = (uri) => readFileSync(env.SF_UPSTREAM_LOG, 'utf8').trim().split('\n').filter(Boolean)
  .map((l) => JSON.parse(l)).filter((e) => e.uri === uri);

// GET / of a published port through the gateway, with the preview host name.
function preview(id, port) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: gwPort, path: '/', agent: false,
      headers: { Host: `${port}-${id.replace('_', '-')}.${env.SF_PREVIEW_DOMAIN}` } }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

// A team of its own (the team quota is 8 and other suites use alpha meanwhile).
const TEAM = `restart-${tag}`;
let alpha, KEY;
const made = [];
before(async () => {
  KEY = execFileSync(`${env.SF_BUILD}/cli/sandfleet`, ['keys', 'create', '--team', TEAM],
    { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE },
      stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim();
  alpha = await connect(KEY);
  cli(['secrets', 'create', '--team', TEAM, '--name', SECRET, '--allowed-host', 'api.example.test',
    '--any-header', '--allow-http'], VALUE);
});
// (the team may hold 8: each case gives its sandboxes back)
async function killMade() {
  for (const id of made.splice(0)) await call(alpha, 'sandbox_kill', { sandbox_id: id }).catch(() => {});
}
afterEach(killMade);
after(async () => {
  await killMade();
  await alpha?.close();
});

async function create(args = {}) {
  const r = await call(alpha, 'sandbox_create', { name: `restart-${tag}`, ...args });
  assert.equal(r.isError, false, r.text);
  made.push(r.structured.id);
  return r.structured.id;
}

// A sandbox with what a restart must keep: a bound secret that works, a ledger, a
// background counter, a server on a published preview port.
async function seed(name) {
  const id = await create({ allow_out: ['api.example.test'], secrets: { API_KEY: SECRET }, timeout_seconds: 600 });
  const get = await sh(alpha, id, `timeout 10 wget -q -O - --header "X-Api-Key: $API_KEY" http://api.example.test/rs-before-${name}-${tag}`);
  assert.match(get.stdout, /^ok/, `the secret works before the fault: ${JSON.stringify(get)}`);
  const w = await sh(alpha, id, 'seq 1 5000 | sed "s/^/ledger line /" > /root/ledger && sha256sum /root/ledger');
  const sum = w.stdout.split(' ')[0];
  await sh(alpha, id, 'nohup sh -c \'echo $$ > /tmp/bgpid; i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done\' >/dev/null 2>&1 &');
  const text = `kept-${name}-${tag}`;
  const s = await sh(alpha, id, `mkdir -p /tmp/www && echo ${text} > /tmp/www/index.html && ` +
    'busybox httpd -p 127.0.0.1:8000 -h /tmp/www && ' +
    'for i in $(seq 50); do busybox wget -Y off -qO- http://127.0.0.1:8000/ 2>/dev/null && break; sleep 0.1; done');
  assert.equal(s.stdout, `${text}\n`);
  const pv = await call(alpha, 'sandbox_preview_url', { sandbox_id: id, port: 8000 });
  assert.equal(pv.isError, false, pv.text);
  assert.equal((await preview(id, 8000)).body, `${text}\n`, 'the preview works before the fault');
  const bgpid = (await sh(alpha, id, 'cat /tmp/bgpid')).stdout.trim();
  return { id, sum, text, bgpid };
}

// Everything a sandbox holds that a restart must keep, and two more sandboxes: one with a
// timer, one that dies while no worker runs.
async function prepare(name) {
  const { id, sum, text, bgpid } = await seed(name);
  // a sandbox whose lifetime ends a few seconds after the fault: its timer must still fire
  const timed = await create({ timeout_seconds: 600 });
  const u = await call(alpha, 'sandbox_update', { sandbox_id: timed, timeout_seconds: 9 });
  assert.equal(u.isError, false, u.text);
  // a sandbox whose processes die while no worker runs
  const victim = await create({});
  await sh(alpha, victim, 'echo doomed');
  return { id, sum, text, bgpid, timed, victim };
}

// LOADERS clients, each on its own sandbox, each call appending its id to a ledger there.
async function startLoad() {
  const clients = await Promise.all(Array.from({ length: LOADERS }, (_, i) => connect(KEY, `load-${i}`)));
  const boxes = await Promise.all(clients.map(async () => create({})));
  const calls = [];
  let running = true;
  let seq = 0;
  const loops = clients.map(async (c, i) => {
    while (running) {
      const id = `c${i}-${seq++}`;
      const rec = { id, sb: boxes[i], t: Date.now() };
      calls.push(rec);
      try {
        rec.r = await call(c, 'sandbox_exec', { sandbox_id: boxes[i], command: `echo ${id} >> /tmp/ledger`, timeout_ms: 5000 });
      } catch (e) {
        rec.err = String(e);
      }
      rec.end = Date.now();
      if (rec.r?.isError) await sleep(100);
    }
  });
  return {
    boxes,
    async stop() {
      running = false;
      await Promise.all(loops);
      await Promise.all(clients.map((c) => c.close()));
      return calls;
    },
  };
}

async function checkLoad(calls, boxes, t0) {
  const seen = new Map();
  for (const sb of boxes) {
    const r = await sh(alpha, sb, 'cat /tmp/ledger');
    for (const id of r.stdout.split('\n').filter(Boolean)) seen.set(id, (seen.get(id) ?? 0) + 1);
  }
  for (const [id, n] of seen) assert.equal(n, 1, `call ${id} ran ${n} times`);
  let inflight = 0;
  for (const c of calls) {
    assert.ok(c.r && !c.err, `call ${c.id} got no answer: ${c.err}`);
    if (!c.r.isError) assert.equal(seen.get(c.id), 1, `call ${c.id} said ok but did not run`);
    else assert.match(c.r.text, /outcome is unknown|got no answer in time|stopped while this ran|shutting down|unreachable|not responding|retry/,
      `call ${c.id}: ${c.r.text}`);
    if (c.t < t0 && c.end > t0) inflight++;
  }
  // after the restart each loader's own sandbox still serves it (nobody had to create another)
  for (const sb of boxes) {
    const after = calls.filter((c) => c.sb === sb && c.t > t0 && !c.r.isError);
    assert.ok(after.length > 0, `no call on ${sb} succeeded after the restart`);
  }
  return inflight;
}

// The background counter (its loop rewrites /tmp/n: a read may meet it empty, then again).
async function counter(id) {
  return until('a counter value', async () => {
    const t = (await sh(alpha, id, 'cat /tmp/n')).stdout.trim();
    return /^\d+$/.test(t) ? Number(t) : 0;
  }, 5000, 20);
}

async function checkKept(p, name, bgBefore) {
  const r = await sh(alpha, p.id, 'sha256sum /root/ledger; kill -0 $(cat /tmp/bgpid) && echo bg-alive');
  assert.equal(r.stdout.split(' ')[0], p.sum, 'the ledger is intact');
  assert.match(r.stdout, /bg-alive/, 'the background process still runs');
  assert.equal((await sh(alpha, p.id, 'cat /tmp/bgpid')).stdout.trim(), p.bgpid, 'the same process');
  const n = await counter(p.id);
  assert.ok(n > bgBefore, `the background counter went on (${bgBefore} -> ${n})`);
  assert.equal((await preview(p.id, 8000)).body, `${p.text}\n`, 'the preview URL still works');
  const uri = `/rs-after-${name}-${tag}`;
  const get = await sh(alpha, p.id, `timeout 10 wget -q -O - --header "X-Api-Key: $API_KEY" http://api.example.test${uri}`);
  assert.match(get.stdout, /^ok/, `egress: ${JSON.stringify(get)}`);
  assert.equal(upstream(uri)[0]?.headers['X-Api-Key'], VALUE, 'the bound secret is swapped in');
  const info = await call(alpha, 'sandbox_info', { sandbox_id: p.id });
  assert.equal(info.structured.status, 'active');
  // the victim: retired as lost, and the log says why
  const v = await call(alpha, 'sandbox_info', { sandbox_id: p.victim });
  assert.equal(v.structured.status, 'lost', JSON.stringify(v.structured));
  assert.match(workerLog(), new RegExp(`sandbox lost across the worker restart" sandbox=${p.victim} why="Its (processes|VM) died`));
  const ex = await call(alpha, 'sandbox_exec', { sandbox_id: p.victim, command: 'true' });
  assert.match(ex.text, /lost|no longer running/);
  // the timer set before the fault fires after it
  await until(`the lifetime of ${p.timed} to end it`, async () =>
    (await call(alpha, 'sandbox_info', { sandbox_id: p.timed })).structured?.status === 'killed', 30000, 250);
}

// Kills the victim's processes (its init: the pid the driver recorded) while no worker runs.
function killVictim(victim) {
  const h = readFileSync(`${env.SF_STATE}/worker/adopt/${victim}/handle`, 'utf8').split(' ');
  process.kill(Number(h[1]), 'SIGKILL');
}

async function restartCase(name, fault) {
  const p = await prepare(name);
  const load = await startLoad();
  await sleep(1500);
  const bgBefore = await counter(p.id);
  const t0 = Date.now();
  await fault(p);
  const back = Date.now();
  // the first call answered on a kept sandbox after the worker is back
  await until('a kept sandbox to answer', async () => !(await call(alpha, 'sandbox_exec',
    { sandbox_id: p.id, command: 'true' })).isError, 15000, 50);
  console.log(`# ${name}: first call on a kept sandbox answered ${Date.now() - back} ms after the new worker was up`);
  await sleep(1500);
  const calls = await load.stop();
  const inflight = await checkLoad(calls, load.boxes, t0);
  console.log(`# ${name}: ${calls.length} calls, ${calls.filter((c) => !c.r?.isError).length} ok, ${inflight} in flight at the fault`);
  await checkKept(p, name, bgBefore);
}

// (both drivers: a VM's handle names its QEMU where a jail's names its init)
test('kill -9 of the worker under load: every sandbox goes on', () =>
  restartCase('kill', async (p) => {
    process.kill(workerPid(), 'SIGKILL');
    await until('the worker to die', () => !alive(workerPid()), 5000, 20);
    if (driver === 'jail') {
      // with no worker, the jail itself holds its uid range: no other sandbox can take it
      const uid = readFileSync(`${env.SF_STATE}/worker/adopt/${p.id}/handle`, 'utf8').split(' ')[3];
      const r = spawnSync('flock', ['-n', `/run/sandfleet/uid-slots/${uid}.lock`, 'true']);
      assert.equal(r.status, 1, 'the uid range of a sandbox whose worker died is free');
    }
    killVictim(p.victim);
    stack('restart-worker');
  }));

test('SIGTERM upgrade onto another worker binary: every sandbox goes on', () =>
  restartCase('upgrade', async (p) => {
    const pid = workerPid();
    process.kill(pid, 'SIGTERM');
    await until('the worker to stop', () => !alive(pid), 20000, 20);
    assert.match(workerLog(), /sandboxes left running for the next worker/);
    killVictim(p.victim);
    stack('upgrade-worker');
    assert.match(readFileSync(`/proc/${workerPid()}/cmdline`, 'utf8'), /upgrade-\d+\/sandfleet-worker/);
  }));

// kill -9 of the worker; then a's handle names this test's node process with its true
// start time and b's a start time that does not match (a reused pid); a new worker must
// adopt neither (both lost) and leave this process alone.
async function forgeHandles(a, b) {
  const dir = `${env.SF_STATE}/worker/adopt`;
  const ha = readFileSync(`${dir}/${a}/handle`, 'utf8').split(' ');
  const hb = readFileSync(`${dir}/${b}/handle`, 'utf8').split(' ');
  process.kill(workerPid(), 'SIGKILL');
  await until('the worker to die', () => !alive(workerPid()), 5000, 20);
  ha[1] = String(process.pid);
  ha[2] = readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ')[19];
  hb[2] = String(Number(hb[2]) + 1);
  execFileSync('sh', ['-c', `printf '%s' "$1" > "$2"; printf '%s' "$3" > "$4"`, 'sh',
    ha.join(' '), `${dir}/${a}/handle`, hb.join(' '), `${dir}/${b}/handle`]);
  stack('restart-worker');
  assert.ok(alive(process.pid));
  for (const id of [a, b]) {
    const i = await call(alpha, 'sandbox_info', { sandbox_id: id });
    assert.equal(i.structured.status, 'lost', `${id}: ${JSON.stringify(i.structured)}`);
  }
}

test('a forged or stale handle is never adopted', jailOnly, async () => {
  // (the handles are root's, in a root-only folder no sandbox sees: only the host could
  // write them; still, a handle naming a living process that is not the sandbox's init
  // (this test's node, with its true start time) or a reused pid (a start time that does
  // not match) makes the worker adopt nothing and signal nothing but the sandbox's cgroup)
  const a = await create({});
  const b = await create({});
  await forgeHandles(a, b);
  assert.match(workerLog(), new RegExp(`sandbox=${a} why="The process its handle names is not this sandbox's init`));
  assert.match(workerLog(), new RegExp(`sandbox=${b} why="Its processes died`));
});

test('kill -9 of the secret-proxy under egress load: every sandbox reaches out again within 5 s', jailOnly, async () => {
  const N = 4;
  const ids = await Promise.all(Array.from({ length: N }, () => create({ allow_out: ['api.example.test'] })));
  // each sandbox fetches from the fake upstream 10 times a second, transparently (its only
  // way out is the proxy's listener in its namespace), a line per fetch that worked
  await Promise.all(ids.map((id, i) => sh(alpha, id, 'nohup sh -c \'while :; do ' +
    `timeout 3 wget -Y off -q -O /dev/null http://api.example.test/rs-eg-${tag}-${i} && echo ok >> /tmp/eg-ok; ` +
    'sleep 0.1; done\' >/dev/null 2>&1 &')));
  const oks = async (id) => Number((await sh(alpha, id, 'cat /tmp/eg-ok 2>/dev/null | wc -l')).stdout.trim());
  for (const id of ids) await until(`egress from ${id}`, async () => (await oks(id)) > 0, 15000, 100);
  stack('stop-proxy');
  await sleep(1000); // down under load: their fetches fail meanwhile
  const before = await Promise.all(ids.map(oks));
  const started = Date.now();
  stack('start-proxy');
  // each sandbox polled every 100 ms until a fetch worked again: ms from the new proxy's start
  const back = await Promise.all(ids.map(async (id, i) => {
    await until(`egress from ${id} after the proxy restart`, async () => (await oks(id)) > before[i], 30000, 100);
    return Date.now() - started;
  }));
  console.log('# proxy kill -9: ms from the new proxy\'s start to each sandbox\'s next working fetch: ' +
    `${back.join(' ')} (max ${Math.max(...back)})`);
  for (const [i, ms] of back.entries()) assert.ok(ms <= 5000, `sandbox ${ids[i]} reached out again only after ${ms} ms`);
});

test('the secret-proxy restarted while no worker ran: the kept sandbox is registered again, its placeholder kept', jailOnly, async () => {
  const id = await create({ allow_out: ['api.example.test'], secrets: { API_KEY: SECRET } });
  const ph = (await sh(alpha, id, 'echo $API_KEY')).stdout.trim();
  process.kill(workerPid(), 'SIGKILL');
  await until('the worker to die', () => !alive(workerPid()), 5000, 20);
  stack('stop-proxy');
  stack('start-proxy'); // a new instance: it knows no sandbox
  stack('restart-worker');
  assert.equal((await sh(alpha, id, 'echo $API_KEY')).stdout.trim(), ph, 'the same placeholder');
  const uri = `/rs-proxy-while-down-${tag}`;
  await until('egress through the new proxy', async () => /^ok/.test((await sh(alpha, id,
    `timeout 5 wget -q -O - --header "X-Api-Key: $API_KEY" http://api.example.test${uri}`)).stdout), 10000, 200);
  assert.equal(upstream(uri)[0]?.headers['X-Api-Key'], VALUE, 'the bound secret is swapped in');
  assert.match(workerLog(), new RegExp(`registered again with the restarted egress proxy" sandbox=${id}`));
});

// ---- the qemu stack (e2e.qemu.restart): microVMs under TCG, so few of them ----

const qemuOnly = { skip: driver !== 'qemu' ? 'the qemu stack (e2e.qemu.restart)' : false };
const vmHandle = (id) => readFileSync(`${env.SF_STATE}/worker/adopt/${id}/handle`, 'utf8').split(' ');

// A VM with a ledger, a background counter, a published preview port and a bound secret.
async function prepareVm(name) {
  const { id, sum, text, bgpid } = await seed(`vm-${name}`);
  const qemu = Number(vmHandle(id)[1]);
  assert.ok(alive(qemu), 'the handle names the running QEMU');
  return { id, sum, text, bgpid, qemu, bgBefore: await counter(id) };
}

// Its egress registration is kept: the bound secret still goes out through the proxy.
async function egressKept(p, name) {
  const uri = `/rs-vm-after-${name.replace(/[^a-z0-9]+/gi, '-')}-${tag}`;
  const get = await sh(alpha, p.id, `timeout 10 wget -q -O - --header "X-Api-Key: $API_KEY" http://api.example.test${uri}`);
  assert.match(get.stdout, /^ok/, `egress: ${JSON.stringify(get)}`);
  assert.equal(upstream(uri)[0]?.headers['X-Api-Key'], VALUE, 'the bound secret is swapped in');
}

async function checkVmKept(p, name) {
  const back = Date.now();
  await until('the kept VM to answer', async () => !(await call(alpha, 'sandbox_exec',
    { sandbox_id: p.id, command: 'true' })).isError, 30000, 50);
  console.log(`# qemu ${name}: first call on the kept VM answered ${Date.now() - back} ms after the new worker was up`);
  const r = await sh(alpha, p.id, 'sha256sum /root/ledger; kill -0 $(cat /tmp/bgpid) && echo bg-alive');
  assert.equal(r.stdout.split(' ')[0], p.sum, 'the ledger is intact');
  assert.match(r.stdout, /bg-alive/, 'the background process still runs');
  assert.equal((await sh(alpha, p.id, 'cat /tmp/bgpid')).stdout.trim(), p.bgpid, 'the same process');
  const n = await counter(p.id);
  assert.ok(n > p.bgBefore, `the background counter went on (${p.bgBefore} -> ${n})`);
  assert.equal((await preview(p.id, 8000)).body, `${p.text}\n`, 'the preview URL still works');
  assert.equal(Number(vmHandle(p.id)[1]), p.qemu, 'the same QEMU process');
  await egressKept(p, name);
  const info = await call(alpha, 'sandbox_info', { sandbox_id: p.id });
  assert.equal(info.structured.status, 'active');
  assert.match(workerLog(), new RegExp(`sandbox taken back from the previous worker run" sandbox=${p.id} pid=${p.qemu}`));
}

test('qemu: kill -9 of the worker keeps a running VM; one whose QEMU died meanwhile is lost', qemuOnly, async () => {
  const p = await prepareVm('kill');
  const victim = await create({});
  await sh(alpha, victim, 'echo doomed');
  const vq = Number(vmHandle(victim)[1]);
  process.kill(workerPid(), 'SIGKILL');
  await until('the worker to die', () => !alive(workerPid()), 5000, 20);
  assert.ok(alive(p.qemu), 'QEMU outlives its worker');
  process.kill(vq, 'SIGKILL');
  stack('restart-worker');
  await checkVmKept(p, 'kill -9');
  const v = await call(alpha, 'sandbox_info', { sandbox_id: victim });
  assert.equal(v.structured.status, 'lost', JSON.stringify(v.structured));
  assert.match(workerLog(), new RegExp(`sandbox lost across the worker restart" sandbox=${victim} why="Its VM died while no worker ran`));
  // a call on the kept VM after the restart works as before: pause and resume too
  assert.equal((await call(alpha, 'sandbox_pause', { sandbox_id: p.id })).isError, false);
  assert.equal((await sh(alpha, p.id, 'echo after-resume')).stdout, 'after-resume\n');
});

test('qemu: SIGTERM keeps the VM (paused ones too) for the next worker', qemuOnly, async () => {
  const p = await prepareVm('term');
  const pid = workerPid();
  process.kill(pid, 'SIGTERM');
  await until('the worker to stop', () => !alive(pid), 20000, 20);
  assert.match(workerLog(), /sandboxes left running for the next worker/);
  assert.ok(alive(p.qemu), 'QEMU runs on after the stop');
  stack('restart-worker');
  await checkVmKept(p, 'SIGTERM');
  // paused when its worker dies: taken back paused, and it resumes on the next call
  assert.equal((await call(alpha, 'sandbox_pause', { sandbox_id: p.id })).isError, false);
  process.kill(workerPid(), 'SIGKILL');
  await until('the worker to die', () => !alive(workerPid()), 5000, 20);
  stack('restart-worker');
  await until('the paused VM to be taken back', () =>
    new RegExp(`sandbox kept across the worker restart" sandbox=${p.id} team=\\S+ paused=1`).test(workerLog()), 30000, 100);
  const r = await sh(alpha, p.id, 'sha256sum /root/ledger');
  assert.equal(r.stdout.split(' ')[0], p.sum, 'the ledger is intact after the resume');
  // a kill of a VM taken back leaves nothing: its QEMU ends, its folder and handle go
  assert.equal((await call(alpha, 'sandbox_kill', { sandbox_id: p.id })).isError, false);
  const end = new RegExp(`(sandbox torn down|cannot remove the sandbox's files)" sandbox=${p.id}`);
  await until('the kept VM\'s teardown', () => end.test(workerLog()), 20000, 50);
  assert.match(workerLog(), new RegExp(`sandbox torn down" sandbox=${p.id}`));
  // (not the worker's child any more: its new parent reaps it, a moment later)
  await until('its QEMU to end', () => !alive(p.qemu), 10000, 20);
  assert.ok(!existsSync(`${env.SF_STATE}/worker/adopt/${p.id}`), 'its handle went');
});

test('qemu: a forged or stale handle is never adopted, and its QEMU is not left running', qemuOnly, async () => {
  const a = await create({});
  const b = await create({});
  const qa = Number(vmHandle(a)[1]);
  const qb = Number(vmHandle(b)[1]);
  await forgeHandles(a, b);
  assert.match(workerLog(), new RegExp(`sandbox=${a} why="The process its handle names is not this sandbox's QEMU`));
  assert.match(workerLog(), new RegExp(`sandbox=${b} why="Its VM died while no worker ran`));
  // not taken back: the new worker's clean-up ended both QEMUs (their cgroups went)
  await until('the QEMUs nobody took back to end', () => !alive(qa) && !alive(qb), 10000, 50);
});

test('qemu: a VM saved to disk is kept too (its network namespace held), and loads on the next call', qemuOnly, async () => {
  // a worker that saves a VM paused for 1 s to disk
  process.env.SF_VM_SAVE_AFTER_MS = '1000';
  try {
    stack('restart-worker');
  } finally {
    delete process.env.SF_VM_SAVE_AFTER_MS;
  }
  const p = await prepareVm('saved');
  assert.equal((await call(alpha, 'sandbox_pause', { sandbox_id: p.id })).isError, false);
  await until('the paused VM to go to disk', () =>
    new RegExp(`sandbox saved to disk" sandbox=${p.id}`).test(workerLog()), 60000, 100);
  const h = vmHandle(p.id);
  assert.equal(h.at(-1).trim(), 'saved');
  const holder = Number(h[1]);
  assert.ok(!alive(p.qemu), 'its QEMU quit');
  assert.ok(alive(holder), 'a holder keeps its network namespace');
  process.kill(workerPid(), 'SIGKILL');
  await until('the worker to die', () => !alive(workerPid()), 5000, 20);
  stack('restart-worker');
  assert.match(workerLog(), new RegExp(`sandbox taken back from the previous worker run" sandbox=${p.id} pid=${holder} dir=\\S+ status=saved`));
  // the next call loads it: the same processes, files and preview port
  const r = await sh(alpha, p.id, 'sha256sum /root/ledger; kill -0 $(cat /tmp/bgpid) && echo bg-alive');
  assert.equal(r.stdout.split(' ')[0], p.sum, 'the ledger is intact');
  assert.match(r.stdout, /bg-alive/, 'the background process still runs');
  assert.equal((await sh(alpha, p.id, 'cat /tmp/bgpid')).stdout.trim(), p.bgpid, 'the same process');
  assert.ok((await counter(p.id)) > p.bgBefore, 'the background counter went on');
  assert.equal((await preview(p.id, 8000)).body, `${p.text}\n`, 'the preview URL still works');
  await egressKept(p, 'saved');
  const h2 = vmHandle(p.id);
  assert.equal(h2.at(-1).trim(), 'run');
  assert.ok(alive(Number(h2[1])) && Number(h2[1]) !== holder, 'a new QEMU runs it');
  await until('the holder to end', () => !alive(holder), 5000, 20);
});

test('qemu: sandfleet hosts drain ends the VMs a stop would keep', qemuOnly, async () => {
  const id = await create({});
  const q = Number(vmHandle(id)[1]);
  cli(['hosts', 'drain', env.SF_HOST_ID, '--wait']);
  await until('the drained VM\'s QEMU to end', () => !alive(q), 10000, 20);
  const i = await call(alpha, 'sandbox_info', { sandbox_id: id });
  assert.equal(i.structured.status, 'killed', JSON.stringify(i.structured));
  assert.ok(!existsSync(`${env.SF_STATE}/worker/adopt/${id}`), 'its handle went');
  stack('restart-worker'); // (its next start clears the drain: the stack serves again)
  const b = await create({});
  assert.equal((await sh(alpha, b, 'echo served')).stdout, 'served\n');
});
