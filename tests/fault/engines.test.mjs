// The production engines under faults (issue 25): the fleet of tests/fault/fleet on
// Apache Kafka (3 brokers, replication 3, min.insync.replicas 2) and a Redis Cluster
// (3 masters, 3 replicas), both from ops/dev-cluster (SF_FLEET_ENGINES=1). A broker and
// then a Redis master are killed -9 under load and NOT restarted until the calls flow
// again: the cluster itself must carry on. After each: every call got exactly one answer,
// no side effect ran twice, no "ok" lacks its side effect, and the longest stretch without
// a successful call is under the goal (Kafka 10 s, Redis 5 s).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fleetEnv, mcall, startLoad, until, redis } from './load.mjs';

const state = process.env.SF_FLEET_STATE;
if (!state) throw new Error('SF_FLEET_STATE is not set: run this through ctest (ops/test)');
const env = fleetEnv(state);
if (env.SF_ENGINES !== '1') throw new Error('the fleet is not on the production engines (SF_FLEET_ENGINES=1)');
const urls = [env.SF_URL, env.SF_URL2];
const key = env.SF_KEY;
const fleet = (...args) => execFileSync(new URL('./fleet', import.meta.url).pathname,
  [args[0], state, env.SF_BUILD, ...args.slice(1)], { stdio: 'inherit' });
const EXEC_TIMEOUT = 8000;
const probeKafka = new URL('../../ops/dev-cluster.d/kafka_probe.py', import.meta.url).pathname;

const load = [];
after(async () => {
  for (const { sb } of load) await mcall(urls[0], key, 'sandbox_kill', { sandbox_id: sb });
});

// The topics as ops/RUNBOOK.md says (TopicCommand --describe, from the cached jars): the
// shared ones created by ops/dev-cluster with their partitions, replication 3 and
// min.insync.replicas 2; each worker's sf.host.<host> and each gateway's sf.reply.<id>
// created by its reader, the reply topics with retention.ms 1 h; and auto-creation off: a
// Metadata request for a stray topic (v1: one that would create it) creates nothing.
const kafkaLibs = `${process.env.SF_KAFKA_CACHE ?? '/var/cache/sandfleet/kafka'}/4.1.1/libs`;
const topicCommand = (...args) => execFileSync('java', ['-Xmx128m', '-XX:TieredStopAtLevel=1', '-XX:+UseSerialGC',
  '-cp', `${kafkaLibs}/*`, 'org.apache.kafka.tools.TopicCommand', '--bootstrap-server', env.SF_KAFKA_BROKERS, ...args],
{ stdio: ['ignore', 'pipe', 'ignore'] }).toString();

test('topics: ours created explicitly (auto-creation off), replication 3, min.insync.replicas 2, replies kept 1 h', () => {
  const stray = `sf.stray.${process.pid}`;
  assert.throws(() => execFileSync(probeKafka, [env.SF_KAFKA_BROKERS.split(',')[0], '3', stray], { stdio: 'ignore' }),
    'a stray topic has a leader: auto-creation is on');
  const topics = {};
  for (const m of topicCommand('--describe').matchAll(/^Topic: (\S+)\tTopicId: \S+\tPartitionCount: (\d+)\tReplicationFactor: (\d+)\tConfigs: (.*)$/gm))
    topics[m[1]] = { parts: Number(m[2]), rf: Number(m[3]), configs: Object.fromEntries(m[4].split(',').filter(Boolean).map((c) => c.split('='))) };
  assert.equal(topics[stray], undefined, 'the stray topic was created: auto-creation is on');
  for (const [t, parts] of [['sf.jobs', 4], ['sf.events', 4], ['sf.dead', 1]])
    assert.equal(topics[t]?.parts, parts, `${t}: ${JSON.stringify(topics[t])}`);
  for (const h of [1, 2, 3]) assert.ok(topics[`sf.host.fleet-${h}`], `sf.host.fleet-${h} was not created by its worker`);
  const replies = Object.keys(topics).filter((t) => t.startsWith('sf.reply.'));
  assert.ok(replies.length >= 2, `the gateways' reply topics: ${replies}`);
  for (const [t, d] of Object.entries(topics)) {
    assert.equal(d.rf, 3, `${t}: replication ${d.rf}`);
    if (t.startsWith('__')) continue;
    assert.equal(d.configs['min.insync.replicas'], '2', `${t}: ${JSON.stringify(d.configs)}`);
    if (t.startsWith('sf.reply.')) assert.equal(d.configs['retention.ms'], '3600000', `${t}: ${JSON.stringify(d.configs)}`);
  }
  console.log(`# ${Object.keys(topics).length} topics, none auto-created: ${Object.keys(topics).sort().join(' ')}`);
});

test('six sandboxes over three workers, on Apache Kafka and Redis Cluster', async () => {
  const ids = await Promise.all(Array.from({ length: 9 }, async (_, i) => {
    const r = await mcall(urls[i % 2], key, 'sandbox_create', { name: `eng-${i}` });
    assert.equal(r.ok, true, `create ${i}: ${r.text ?? r.neterr}`);
    return r.structured.id;
  }));
  const byHost = {};
  for (const id of ids) (byHost[redis(env, 'HGET', `sf:sb:{${id}}`, 'host')] ??= []).push(id);
  for (const l of Object.values(byHost)) load.push(...l.slice(0, 2).map((sb) => ({ sb })));
  for (const id of ids.filter((i) => !load.some((l) => l.sb === i)))
    assert.equal((await mcall(urls[0], key, 'sandbox_kill', { sandbox_id: id })).ok, true);
  assert.ok(load.length >= 4, `the creates went to too few hosts: ${JSON.stringify(byHost)}`);
});

async function ledgers() {
  const seen = new Map();
  for (const { sb } of load) {
    const r = await mcall(urls[0], key, 'sandbox_exec', { sandbox_id: sb, command: 'cat /tmp/ledger 2>/dev/null; true' });
    assert.equal(r.ok, true, `the ledger of ${sb}: ${r.text ?? r.neterr}`);
    for (const id of r.structured.stdout.split('\n').filter(Boolean)) seen.set(id, (seen.get(id) ?? 0) + 1);
  }
  return seen;
}

// kill -9 NAME under load, no restart until calls flow; the checks above; then NAME again.
async function engineFault(name, goalMs, { after: afterKill } = {}) {
  const l = startLoad(urls, key, load.map((x) => x.sb), { prefix: `${name}-`, timeoutMs: EXEC_TIMEOUT });
  const oks = () => l.calls.filter((c) => c.r?.ok).length;
  assert.ok(await until(() => oks() >= 2 * load.length, 30000, 50) >= 0, 'the load does not flow before the kill');
  const t0 = Date.now();
  fleet('kill', name);
  // calls flow again (through both gateways, on every load sandbox) without the node
  const flowing = await until(async () => {
    for (const [i, { sb }] of load.entries()) {
      const r = await mcall(urls[i % 2], key, 'sandbox_exec', { sandbox_id: sb, command: 'true' },
        { timeoutMs: 15000 });
      if (!r.ok) return false;
    }
    return true;
  }, 30000, 100);
  const more = oks() + 2 * load.length; // and the load itself goes on
  assert.ok(await until(() => oks() >= more, 30000, 50) >= 0, `the load does not flow again after ${name} was killed`);
  const calls = await l.stop();
  const seen = await ledgers();
  // the longest time without an ok answer, from the kill on
  const okAt = calls.filter((c) => c.r?.ok).map((c) => c.t + c.r.ms).filter((t) => t >= t0).sort((a, b) => a - b);
  let gap = okAt.length ? okAt[0] - t0 : Infinity;
  for (let i = 1; i < okAt.length; i++) gap = Math.max(gap, okAt[i] - okAt[i - 1]);
  for (const c of calls) {
    assert.ok(c.r && !c.r.neterr, `call ${c.id} got no answer (${c.r?.neterr})`);
    assert.ok((seen.get(c.id) ?? 0) <= 1, `call ${c.id} ran ${seen.get(c.id)} times`);
    if (c.r.ok) assert.equal(seen.get(c.id), 1, `call ${c.id} said ok but never ran`);
  }
  for (const [id, n] of seen) assert.equal(n, 1, `side effect ${id} happened ${n} times`);
  const ok = calls.filter((c) => c.r.ok).length;
  console.log(`# ${name} killed: ${calls.length} calls, ${ok} ok, every load sandbox answering ` +
    `${flowing} ms after the kill, longest stretch without an ok answer ${gap} ms`);
  assert.ok(flowing >= 0, `calls do not flow 30 s after ${name} was killed`);
  assert.ok(gap < goalMs, `${gap} ms without an ok answer after ${name} was killed (goal ${goalMs} ms)`);
  if (afterKill) await afterKill();
  fleet('start', name);
}

test('kill -9 of one Kafka broker under load: every call answered once, flowing within 10 s', async () => {
  // the first broker of SF_KAFKA_BROKERS: every client's first bootstrap address too
  await engineFault('kafka-1', 10000);
  const first = env.SF_KAFKA_BROKERS.split(',')[0];
  const back = await until(() => {
    try { execFileSync(probeKafka, [first, '3', 'sf.jobs']); return true; } catch { return false; }
  }, 120000, 500);
  assert.ok(back >= 0, 'the restarted broker did not rejoin');
});

// The dev cluster's node (redis-N) that is the master of a sandbox's record now.
function masterOf(sb) {
  const nodes = redis(env, 'CLUSTER', 'NODES').split('\n').map((l) => l.split(' '));
  const masters = nodes.filter((n) => n[2].includes('master') && !n[2].includes('fail') && n.length > 8);
  const slot = Number(redis(env, 'CLUSTER', 'KEYSLOT', `sf:sb:{${sb}}`));
  const m = masters.find((n) => n.slice(8).some((r) => {
    const [a, b] = r.split('-').map(Number);
    return slot >= a && slot <= (b ?? a);
  }));
  const port = m[1].split('@')[0].split(':')[1];
  for (let i = 1; i <= 6; i++)
    if (readFileSync(`${state}/engines/redis-${i}.cmd`, 'utf8').includes(`--port ${port} `)) return `redis-${i}`;
  throw new Error(`no node of the dev cluster listens on ${m[1]}`);
}

// The master that holds the most of the load's sandbox records.
function busiestMaster() {
  const count = new Map();
  for (const { sb } of load) count.set(masterOf(sb), (count.get(masterOf(sb)) ?? 0) + 1);
  return [...count.entries()].sort((a, b) => b[1] - a[1])[0][0];
}

// The gateways' subscribers (SF_CH_GATEWAY) on each live node of the dev cluster.
const nodePort = (name) => readFileSync(`${state}/engines/${name}.cmd`, 'utf8').match(/--port (\d+) /)[1];
function subscribers() {
  const by = {};
  for (let i = 1; i <= 6; i++) {
    try {
      const out = execFileSync('redis-cli', ['-p', nodePort(`redis-${i}`), 'PUBSUB', 'NUMSUB', 'sf:gw:events'],
        { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim().split('\n');
      by[`redis-${i}`] = Number(out[1]);
    } catch { /* down */ }
  }
  return by;
}
const isMaster = (name) => /role:master/.test(execFileSync('redis-cli', ['-p', nodePort(name), 'INFO', 'replication']).toString());

// A key of team fleet, used through both gateways (each caches it for 10 s), then revoked:
// both refuse it again well before their caches would forget it, so the revocation reached
// them over Pub/Sub.
async function revocationReachesGateways() {
  const cli = { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: `${state}/auth.key` };
  const made = spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['keys', 'create', '--team', 'fleet', '--name', 'pubsub'], { env: cli });
  assert.equal(made.status, 0, `keys create: ${made.stderr}`);
  const k = made.stdout.toString().trim();
  const id = made.stderr.toString().match(/created (key_[0-9a-f]+)/)[1];
  for (const u of urls) {
    const r = await mcall(u, k, 'sandbox_list', {});
    assert.equal(r.ok, true, `the new key through ${u}: ${r.text ?? r.neterr}`);
  }
  const t0 = Date.now();
  const rev = spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['keys', 'revoke', id], { env: cli });
  assert.equal(rev.status, 0, `keys revoke: ${rev.stderr}`);
  for (const u of urls) {
    const refused = await until(async () => { const r = await mcall(u, k, 'sandbox_list', {}); return !r.ok && !r.neterr; }, 3000, 50);
    assert.ok(refused >= 0, `${u} still takes a key revoked ${Date.now() - t0} ms ago: its subscription did not survive`);
  }
  console.log(`# a key revoked after the failover: both gateways refuse it within ${Date.now() - t0} ms (Pub/Sub)`);
}

test('kill -9 of a Redis Cluster master under load: its replica takes over, flowing within 5 s; no record lost; Pub/Sub survives', async () => {
  // the master the gateways subscribe on if they do on a master (then the kill also cuts
  // their subscription), else the one with most of the load's records
  const subs = subscribers();
  const subMaster = Object.keys(subs).find((n) => subs[n] > 0 && isMaster(n));
  const victim = subMaster ?? busiestMaster();
  // the load must have a record there (its calls then wait for the failover): sandboxes are
  // created until one lands there (a third of the slots each), the others killed again
  for (let i = 0; i < 15 && !load.some(({ sb }) => masterOf(sb) === victim); i++) {
    const r = await mcall(urls[i % 2], key, 'sandbox_create', { name: `eng-v${i}` });
    assert.equal(r.ok, true, `create: ${r.text ?? r.neterr}`);
    if (masterOf(r.structured.id) === victim) load.push({ sb: r.structured.id });
    else assert.equal((await mcall(urls[0], key, 'sandbox_kill', { sandbox_id: r.structured.id })).ok, true);
  }
  assert.ok(load.some(({ sb }) => masterOf(sb) === victim), `no load sandbox has its record on ${victim}`);
  const subsBefore = Object.values(subs).reduce((a, b) => a + b, 0);
  assert.ok(subsBefore >= 2, `the gateways are not subscribed: ${JSON.stringify(subs)}`);
  console.log(`# subscribers per node ${JSON.stringify(subs)}; killing ${victim}${subMaster ? ' (the gateways subscribe there)' : ''}, ` +
    `the master of ${load.filter(({ sb }) => masterOf(sb) === victim).length} of the load's ${load.length} records`);
  await engineFault(victim, 5000, {
    async after() {
      // every sandbox a client was told exists is still there (records written with WAIT)
      for (const { sb } of load) assert.equal(redis(env, 'HGET', `sf:sb:{${sb}}`, 'state'), 'running');
      // the gateways subscribe again on a live node (as many as before), and a revocation reaches them
      const again = await until(() => Object.values(subscribers()).reduce((a, b) => a + b, 0) >= subsBefore, 5000, 50);
      assert.ok(again >= 0, `the gateways are not subscribed again: ${JSON.stringify(subscribers())}`);
      await revocationReachesGateways();
    },
  });
  // the old master comes back as a replica: the cluster is whole again
  const whole = await until(() => /cluster_state:ok/.test(redis(env, 'CLUSTER', 'INFO')) &&
    redis(env, 'CLUSTER', 'NODES').split('\n').every((l) => !/fail/.test(l.split(' ')[2] ?? '')), 60000, 200);
  assert.ok(whole >= 0, 'the cluster is not whole again after the old master restarted');
});
