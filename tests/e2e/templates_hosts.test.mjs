// Team templates on several hosts, through MCP with the SDK client: with a second worker
// host in the stack (`stack add-worker`: its own state folder and uid range), a template is
// built on both (sandbox_template_list says on how many it is ready), the sandboxes of one
// template land on both, and its delete removes the files from both; a third host that
// joins once a template is ready gets it built too.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync, spawn } from 'node:child_process';
import { connect, call, sh, env, driver, until } from './lib.mjs';

const jail = { skip: driver !== 'jail' && 'jail hosts build templates' };
const stack = `${import.meta.dirname}/../integration/stack`;
const second = 'e2e-host-2';
const redis = (...a) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...a]).toString().trim();
const uniq = Date.now().toString(36);
let client;
const made = [];

// a team of its own: no sandbox of another suite's sways the spread
const team = `tplhosts${uniq}`;
before(async () => {
  if (driver !== 'jail') return;
  execFileSync(stack, ['add-worker', env.SF_STATE, env.SF_BUILD, second], { stdio: 'inherit' });
  const key = execFileSync(`${env.SF_BUILD}/cli/sandfleet`, ['keys', 'create', '--team', team],
    { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } })
    .toString().trim();
  client = await connect(key, team);
});
after(async () => {
  if (driver !== 'jail') return;
  for (const id of made) await call(client, 'sandbox_kill', { sandbox_id: id });
  await client.close();
  execFileSync(stack, ['stop-worker', env.SF_STATE, env.SF_BUILD, second], { stdio: 'inherit' });
});

const listed = async (name) => (await call(client, 'sandbox_template_list', { name_prefix: name }))
  .structured.templates.find((t) => t.name === name);

test('a team template is built on every jail host; its sandboxes land on both; delete frees both', jail, async () => {
  const name = `multi-${uniq}`;
  const r = await call(client, 'sandbox_template_create', {
    name, from: 'base', memory_mib: 128, run_steps: ['echo built > /built && chmod 600 /built'],
    start_cmd: 'exec httpd -f -p 127.0.0.1:8080 -h /', ready_cmd: 'wget -q -Y off -O /dev/null http://127.0.0.1:8080/built',
  });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.structured.hosts, 2, 'handed to both hosts');
  const t = await until('ready on both hosts', async () => {
    const x = await listed(name);
    assert.notEqual(x.status, 'failed', JSON.stringify(x));
    return x.hosts_ready === 2 && x;
  }, 120000);
  assert.equal(t.status, 'ready');
  assert.equal(t.hosts, 2);
  const dirs = [`${env.SF_STATE}/worker`, `${env.SF_STATE}/worker-${second}`]
    .map((d) => `${d}/templates/team/${team}/${name}`);
  for (const d of dirs) {
    assert.ok(existsSync(`${d}/rootfs/built`), d);
    assert.deepEqual(JSON.parse(readFileSync(`${d}/service.json`, 'utf8')).ready_cmd,
      'wget -q -Y off -O /dev/null http://127.0.0.1:8080/built');
  }
  // the build log is the lead host's alone: one copy of each step
  const log = redis('GET', `sf:team:{${team}}:tpl:${name}:log`);
  assert.equal(log.match(/== step 1\/1/g).length, 1, log);

  // placement spreads the team over the hosts that hold the template
  const hosts = new Set();
  for (let i = 0; i < 4; i++) {
    const c = await call(client, 'sandbox_create', { from_template: name });
    assert.equal(c.isError, false, c.text);
    made.push(c.structured.id);
    hosts.add(redis('HGET', `sf:sb:{${c.structured.id}}`, 'host'));
    const o = await sh(client, c.structured.id, 'wget -q -Y off -O - http://127.0.0.1:8080/built');
    assert.equal(o.stdout, 'built\n', o.stderr);
  }
  assert.deepEqual([...hosts].sort(), [env.SF_HOST_ID, second].sort());

  // a template built from it is built where it is ready: both hosts again
  const child = `${name}-2`;
  const cr = await call(client, 'sandbox_template_create', { name: child, from: name, run_steps: ['cat /built'] });
  assert.equal(cr.isError, false, cr.text);
  assert.equal(cr.structured.hosts, 2);
  await until('the child ready on both', async () => (await listed(child)).hosts_ready === 2, 120000);

  for (const id of made.splice(0)) await call(client, 'sandbox_kill', { sandbox_id: id });
  for (const n of [name, child]) {
    const d = await call(client, 'sandbox_template_delete', { name: n });
    assert.equal(d.isError, false, d.text);
    assert.equal(d.structured.hosts, 2);
  }
  await until('the files gone from both hosts', async () => dirs.every((d) => !existsSync(d)), 20000);
});

test('placement says why when no host holding the template can take a sandbox', jail, async () => {
  const name = `gone-${uniq}`;
  const r = await call(client, 'sandbox_template_create', { name, from: 'base' });
  assert.equal(r.isError, false, r.text);
  await until('ready on both hosts', async () => (await listed(name)).hosts_ready === 2, 120000);
  // as if both hosts had lost it (a host that failed the build, or left): ready nowhere
  for (const h of [env.SF_HOST_ID, second]) redis('HSET', `sf:team:{${team}}:tpl:${name}`, `at:${h}`, 'failed');
  const c = await call(client, 'sandbox_create', { from_template: name });
  assert.equal(c.isError, true);
  assert.match(c.text, new RegExp(`No host that holds template '${name}' has room or is responding .*retry in a few seconds, or build it again`));
  assert.equal((await call(client, 'sandbox_template_delete', { name })).isError, false);
});

// A failed template is on the lists of the hosts that tried it, so a host that joins lacks
// it: the scheduler's offer of it is refused (it is not ready), and is made again only after
// a growing gap, not on every pass (each pass reads each live host's list: SMEMBERS).
test('a host that joins after a template is ready gets it built there; a failed one is not offered every pass', jail, async () => {
  const name = `late-${uniq}`;
  const bad = `bad-${uniq}`;
  const third = 'e2e-host-3';
  const r = await call(client, 'sandbox_template_create', { name, from: 'base', run_steps: ['echo late > /late'] });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.structured.hosts, 2);
  const b = await call(client, 'sandbox_template_create', { name: bad, from: 'base', run_steps: ['exit 1'] });
  assert.equal(b.isError, false, b.text);
  await until('ready on both hosts', async () => (await listed(name)).hosts_ready === 2, 120000);
  await until('the bad one failed', async () => (await listed(bad)).status === 'failed', 120000);
  // what the scheduler asks Redis from now on
  const mon = spawn('redis-cli', ['-u', env.SF_REDIS_URL, 'monitor'], { stdio: ['ignore', 'pipe', 'ignore'] });
  let seen = '';
  mon.stdout.on('data', (d) => { seen += d.toString(); });
  const count = (re) => (seen.match(re) ?? []).length;
  const passes = () => count(new RegExp(`"SMEMBERS" "sf:host:\\{${third}\\}:tpls"`, 'g'));
  const offers = () => count(new RegExp(`"HGET" "sf:team:\\{${team}\\}:tpl:${bad}" "from"`, 'g'));
  execFileSync(stack, ['add-worker', env.SF_STATE, env.SF_BUILD, third], { stdio: 'inherit' });
  try {
    const t = await until('built on the host that joined', async () => {
      const x = await listed(name);
      assert.notEqual(redis('HGET', `sf:team:{${team}}:tpl:${name}`, `at:${third}`), 'failed');
      return x.hosts_ready === 3 && x;
    }, 120000, 250);
    assert.deepEqual([t.status, t.hosts], ['ready', 3]);
    assert.equal(readFileSync(`${env.SF_STATE}/worker-${third}/templates/team/${team}/${name}/rootfs/late`, 'utf8'), 'late\n');
    assert.equal(redis('SISMEMBER', `sf:host:{${third}}:tpls`, `${team} ${name}`), '1', 'the host lists it');
    // four passes with the new host live: the failed template was offered to it at most twice
    // (passes 1 and 3; every pass before), and never handed over
    await until('four join passes', async () => passes() >= 4, 60000, 250);
    assert.ok(offers() >= 1 && offers() <= 2, `the failed template was offered ${offers()} times in ${passes()} passes`);
    assert.equal(redis('HGET', `sf:team:{${team}}:tpl:${bad}`, `at:${third}`), '');
    assert.equal((await listed(bad)).status, 'failed');
  } finally {
    mon.kill();
    execFileSync(stack, ['stop-worker', env.SF_STATE, env.SF_BUILD, third], { stdio: 'inherit' });
  }
  for (const n of [name, bad]) assert.equal((await call(client, 'sandbox_template_delete', { name: n })).isError, false);
});

// A worker that drains (SIGTERM) while it builds: it leaves sf:hosts cleanly, so the reaper
// never sees it go, and its part of the build must end with it: failed on that host with
// the reason, never `building` for ever. The same for one killed -9 and back before the
// reaper would notice: it fails its part at its start. Each build's step waits for a file
// the test puts into that host's build tree (the build sandbox's root: the upper directory
// of its own disk, mounted in its worker's mount namespace; one build at a time here).
const [mine, theirs] = [['worker', 'worker'], [`worker-${second}`, `worker-${second}`]];
const tree = ([dir, pid]) => {
  let p;
  try { p = Number(readFileSync(`${env.SF_STATE}/pids/${pid}`, 'utf8')); } catch { return null; }
  const d = `/proc/${p}/root${env.SF_STATE}/${dir}/sandboxes`;
  const t = existsSync(d) ? readdirSync(d).find((f) => f.startsWith('tb_') && existsSync(`${d}/${f}/fs/upper/bin`)) : null;
  return t && `${d}/${t}/fs/upper`;
};
async function buildOnBoth(name) {
  const r = await call(client, 'sandbox_template_create', {
    name, from: 'base',
    run_steps: ['touch /started; while :; do [ -e /fail ] && exit 3; [ -e /release ] && exit 0; sleep 0.1; done'],
  });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.structured.hosts, 2);
  await until('the step running on both hosts', async () =>
    [mine, theirs].every((d) => tree(d) && existsSync(`${tree(d)}/started`)), 120000);
}

test('a worker killed mid-build and started again fails its part of the build', jail, async () => {
  const name = `crash-${uniq}`;
  const key = `sf:team:{${team}}:tpl:${name}`;
  await buildOnBoth(name);
  const pids = `${env.SF_STATE}/pids/worker-${second}`;
  process.kill(Number(readFileSync(pids, 'utf8')), 'SIGKILL');
  rmSync(pids, { force: true });
  rmSync(`${pids}.start`, { force: true });
  assert.equal(redis('HGET', key, `at:${second}`), 'building', 'nothing ended it with the worker');
  execFileSync(stack, ['add-worker', env.SF_STATE, env.SF_BUILD, second], { stdio: 'inherit' });
  await until('its part failed', async () => redis('HGET', key, `at:${second}`) === 'failed', 20000);
  assert.match(redis('HGET', key, `err:${second}`),
    new RegExp(`^Host ${second} restarted while it built this template; a failed template can be built again under its name\\.$`));
  writeFileSync(`${tree(mine)}/release`, '');
  const t = await until('ready on the other host', async () => {
    const x = await listed(name);
    return x.status === 'ready' && x;
  }, 60000);
  assert.deepEqual([t.hosts, t.hosts_ready], [2, 1]);
  assert.equal((await call(client, 'sandbox_template_delete', { name })).isError, false);
});

test('a worker stopped mid-build fails its part of the build with the reason', jail, async () => {
  const name = `drain-${uniq}`;
  const key = `sf:team:{${team}}:tpl:${name}`;
  await buildOnBoth(name);

  execFileSync(stack, ['stop-worker', env.SF_STATE, env.SF_BUILD, second], { stdio: 'inherit' });
  try {
    await until('its part failed', async () => redis('HGET', key, `at:${second}`) === 'failed', 20000);
    assert.match(redis('HGET', key, `err:${second}`),
      new RegExp(`^Host ${second} was stopped while it built this template; a failed template can be built again under its name\\.$`));
    assert.equal((await listed(name)).status, 'building', 'the other host still builds it');
    // the other host's build fails too: the template has failed, and says why
    writeFileSync(`${tree(mine)}/fail`, '');
    const t = await until('failed everywhere', async () => {
      const x = await listed(name);
      return x.status === 'failed' && x;
    }, 60000);
    assert.match(t.error, /was stopped while it built this template|exited with 3/, JSON.stringify(t));
    assert.equal(t.hosts_ready, 0);
  } finally {
    execFileSync(stack, ['add-worker', env.SF_STATE, env.SF_BUILD, second], { stdio: 'inherit' });
  }
  assert.equal((await call(client, 'sandbox_template_delete', { name })).isError, false);
});
