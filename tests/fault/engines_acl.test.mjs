// Kafka ACLs, as ops/RUNBOOK.md ("Kafka ACLs") advises (issue 25). Two runs of this file:
//
// SF_ACL_OPEN=1 (engines.acl_open, on the engines label's cluster: no SASL, no authorizer,
// the layout before the ACLs): the three attacks below SUCCEED there, so the ACLs are what
// stops them in the other run.
//
// Otherwise (engines.acl): the fleet of tests/fault/fleet with SF_FLEET_ACL=1 on
// ops/dev-cluster --acl (SASL/PLAIN, StandardAuthorizer, nothing allowed without an ACL):
// every daemon is its own Kafka user with exactly its role's ACLs (ops/dev-cluster grant).
// The spine works (create, exec, kill through both gateways; a batch as its producer's
// user), and each attack fails with Kafka's authorization error: the gateway's user writes
// to sf.host.<host>; a worker's user reads another host's sf.host.<host>; a batch
// producer's user reads another producer's reply topic. The CLI says which setting to
// check when an ACL is missing.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fleetEnv, mcall } from './load.mjs';

const state = process.env.SF_FLEET_STATE;
if (!state) throw new Error('SF_FLEET_STATE is not set: run this through ctest (ops/test)');
const env = fleetEnv(state);
if (env.SF_ENGINES !== '1') throw new Error('the fleet is not on the production engines (SF_FLEET_ENGINES=1)');
const open = process.env.SF_ACL_OPEN === '1';
if (!open && !env.SF_KAFKA_SASL_DIR) throw new Error('the fleet runs without Kafka ACLs (SF_FLEET_ACL=1)');
const cli = `${env.SF_BUILD}/cli/sandfleet`;
const dir = mkdtempSync(join(tmpdir(), 'sf-acl-'));
after(() => rmSync(dir, { recursive: true, force: true }));

// The Kafka settings of `user` (a user of ops/dev-cluster --acl; none on the open cluster).
function kafkaEnv(user) {
  const e = { ...process.env, SF_KAFKA_BROKERS: env.SF_KAFKA_BROKERS };
  for (const k of ['SF_KAFKA_SECURITY_PROTOCOL', 'SF_KAFKA_SASL_MECHANISM', 'SF_KAFKA_SASL_USERNAME', 'SF_KAFKA_SASL_PASSWORD_FILE']) delete e[k];
  if (user) {
    Object.assign(e, {
      SF_KAFKA_SECURITY_PROTOCOL: env.SF_KAFKA_SECURITY_PROTOCOL, SF_KAFKA_SASL_MECHANISM: env.SF_KAFKA_SASL_MECHANISM,
      SF_KAFKA_SASL_USERNAME: user, SF_KAFKA_SASL_PASSWORD_FILE: `${env.SF_KAFKA_SASL_DIR}/${user}.password`,
    });
  }
  return e;
}
// One attempt with tests/fault/kafka_try: { status, out }.
function attempt(user, ...args) {
  const r = spawnSync(`${env.SF_BUILD}/tests/kafka_try`, args, { env: kafkaEnv(user), encoding: 'utf8', timeout: 60000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}`.trim() };
}
// `sandfleet batch run` of rows as `user` with `key`: { status, stderr, results }.
function batch(name, rows, key, user) {
  const jobs = join(dir, `${name}.jsonl`), out = join(dir, `${name}.out.jsonl`);
  writeFileSync(jobs, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const r = spawnSync(cli, ['batch', 'run', jobs, '--out', out],
    { env: { ...kafkaEnv(user), SF_REDIS_URL: env.SF_REDIS_URL, SANDFLEET_API_KEY: key, SF_HOME: dir }, encoding: 'utf8', timeout: 120000 });
  const results = existsSync(out) ? readFileSync(out, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : [];
  return { status: r.status, stderr: r.stderr, results };
}
const producerOf = (log) => readFileSync(`${state}/${log}`, 'utf8').match(/\(producer id (\S+) /)?.[1];

// The three attacks, each as { who, args }: on the ACL fleet as the users named; on the open
// cluster the same requests without credentials (there is no user to be).
const attacks = (pidOther) => [
  { what: "the gateway's user writes to sf.host.fleet-1", user: 'gateway-1', args: ['produce', 'sf.host.fleet-1'] },
  { what: "worker fleet-2's user reads sf.host.fleet-1", user: 'worker-fleet-2', args: ['read', 'sf.host.fleet-1', 'sf-worker-fleet-2'] },
  { what: "a batch producer's user reads another producer's reply topic", user: 'batch-a', args: ['read', `sf.reply.${pidOther}`, 'batch_acl'] },
];

if (open) {
  test('without ACLs (the open cluster) each attack succeeds', () => {
    // the engines fleet's producer has a reply topic once it ran a batch (engines.batch did;
    // one job here makes sure)
    const pid = producerOf('key.log');
    assert.ok(pid, 'no producer id in the fleet\'s key.log');
    const b = batch('open', [{ id: 'l1', tool: 'sandbox_list', arguments: {} }], env.SF_KEY, null);
    assert.equal(b.status, 0, b.stderr);
    for (const a of attacks(pid)) {
      const r = attempt(null, ...a.args);
      assert.equal(r.status, 0, `${a.what}: ${r.out}`);
      assert.match(r.out, /^ok /, a.what);
      console.log(`# open cluster: ${a.what}: ${r.out}`);
    }
  });
} else {
  const urls = [env.SF_URL, env.SF_URL2];
  const pidA = env.SF_PRODUCER_A, pidB = env.SF_PRODUCER_B;

  test('each daemon is its own Kafka user; create, exec and kill work through both gateways', async () => {
    const users = {};
    for (const name of ['scheduler', 'scheduler-2', 'worker-fleet-1', 'worker-fleet-2', 'worker-fleet-3', 'gateway', 'gateway-2']) {
      const pid = readFileSync(`${state}/pids/${name}`, 'utf8').trim();
      const e = Object.fromEntries(readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').filter(Boolean).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
      assert.equal(e.SF_KAFKA_SECURITY_PROTOCOL, 'sasl_plaintext', name);
      users[name] = e.SF_KAFKA_SASL_USERNAME;
    }
    assert.deepEqual(users, {
      scheduler: 'scheduler', 'scheduler-2': 'scheduler', 'worker-fleet-1': 'worker-fleet-1', 'worker-fleet-2': 'worker-fleet-2',
      'worker-fleet-3': 'worker-fleet-3', gateway: 'gateway-1', 'gateway-2': 'gateway-2',
    });
    for (const u of urls) {
      const c = await mcall(u, env.SF_KEY, 'sandbox_create', { name: 'acl' });
      assert.ok(c.ok && c.structured?.id, `create via ${u}: ${JSON.stringify(c)}`);
      const x = await mcall(u, env.SF_KEY, 'sandbox_exec', { sandbox_id: c.structured.id, command: 'echo acl-ok' });
      assert.ok(x.ok, `exec: ${JSON.stringify(x)}`);
      assert.match(JSON.stringify(x), /acl-ok/);
      const k = await mcall(u, env.SF_KEY, 'sandbox_kill', { sandbox_id: c.structured.id });
      assert.ok(k.ok, `kill: ${JSON.stringify(k)}`);
    }
  });

  test("a batch runs as its producer's user (batch-b, SF_KEY_B), reading its own reply topic", () => {
    const b = batch('b', [{ id: 'l1', tool: 'sandbox_list', arguments: {} }, { id: 'l2', tool: 'sandbox_list', arguments: {} }], env.SF_KEY_B, 'batch-b');
    assert.equal(b.status, 0, b.stderr);
    assert.equal(b.results.length, 2, b.stderr);
    for (const r of b.results) assert.ok(r.result && !r.error, JSON.stringify(r));
    // (its reply topic now exists: the attack below is refused by an ACL, not for want of it)
    const own = attempt('batch-b', 'read', `sf.reply.${pidB}`, 'batch_acl');
    assert.equal(own.status, 0, own.out);
  });

  test('each attack fails with an authorization error', () => {
    // what the attackers may do themselves, so a refusal below is the ACL's
    for (const [user, args] of [['worker-fleet-1', ['read', 'sf.host.fleet-1', 'sf-worker-fleet-1']], ['gateway-1', ['produce', 'sf.jobs']]]) {
      const r = attempt(user, ...args);
      assert.equal(r.status, 0, `${user} ${args.join(' ')}: ${r.out}`);
    }
    for (const a of attacks(pidB)) {
      const r = attempt(a.user, ...a.args);
      assert.equal(r.status, 1, `${a.what}: ${r.out}`);
      assert.match(r.out, /^TOPIC_AUTHORIZATION_FAILED$/m, `${a.what}: ${r.out}`);
      console.log(`# ACLs: ${a.what}: ${r.out}`);
    }
  });

  test('a missing ACL: the batch CLI says which ACL and setting to check', () => {
    // batch-a with SF_KEY_B: its reply topic is producer B's, which batch-a may not read
    const b = batch('a-as-b', [{ id: 'l1', tool: 'sandbox_list', arguments: {} }], env.SF_KEY_B, 'batch-a');
    assert.equal(b.status, 1, b.stderr);
    assert.match(b.stderr, new RegExp(`reply topic sf\\.reply\\.${pidB}: Kafka's ACLs refuse this client's principal \\(kafka_sasl_username\\) the topic; grant it the ACLs of its role in ops/RUNBOOK\\.md`), b.stderr);
    assert.ok(pidA && pidA !== pidB);
  });
}
