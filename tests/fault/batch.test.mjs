// `sandfleet batch run` on the fleet (three workers, two schedulers): 1,000 exec jobs
// straight onto the job queue, each appending its id to a ledger in one of six sandboxes
// spread over the three hosts; the CLI is killed -9 half-way and run again: it finishes
// with 1,000 results, skips what was done, and every job's side effect happened exactly
// once (the ledgers are read back through the batch path too). Bad lines get an error
// result and never stop a batch; a key made by `sandfleet keys create` signs jobs, and
// once revoked its jobs are refused.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fleetEnv, until, redis } from './load.mjs';

const state = process.env.SF_FLEET_STATE;
if (!state) throw new Error('SF_FLEET_STATE is not set: run this through ctest (ops/test)');
const env = fleetEnv(state);
const cli = `${env.SF_BUILD}/cli/sandfleet`;
const dir = mkdtempSync(join(tmpdir(), 'sf-batch-'));
const N = 1000;
const baseEnv = {
  ...process.env, SF_KAFKA_BROKERS: env.SF_KAFKA_BROKERS, SF_REDIS_URL: env.SF_REDIS_URL,
  SF_AUTH_SECRET_FILE: `${state}/auth.key`, SANDFLEET_API_KEY: env.SF_KEY, SF_HOME: dir,
};

const lines = (f) => (existsSync(f) ? readFileSync(f, 'utf8').split('\n').filter((l) => l) : []);
const results = (f) => lines(f).map((l) => JSON.parse(l));
const jsonl = (f, rows) => writeFileSync(f, rows.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n') + '\n');
// A batch to its end: { status, stderr }.
function batch(name, rows, { key = env.SF_KEY, args = [], extraEnv = {} } = {}) {
  const jobs = join(dir, `${name}.jsonl`);
  const out = join(dir, `${name}.out.jsonl`);
  if (rows) jsonl(jobs, rows);
  const r = spawnSync(cli, ['batch', 'run', jobs, '--out', out, ...args],
    { env: { ...baseEnv, SANDFLEET_API_KEY: key, ...extraEnv }, encoding: 'utf8', timeout: 240000 });
  return { status: r.status, stderr: r.stderr, out };
}

let sandboxes = [];
after(() => {
  if (sandboxes.length)
    batch('cleanup', sandboxes.map((sb, i) => ({ id: `k${i}`, tool: 'sandbox_kill', arguments: { sandbox_id: sb } })));
  rmSync(dir, { recursive: true, force: true });
});

test('creates through the batch path spread over three hosts; bad lines get error results', () => {
  const rows = Array.from({ length: 6 }, (_, i) => ({ id: `c${i}`, tool: 'sandbox_create', arguments: { name: `batch-${i}` } }));
  rows.splice(3, 0, 'not json', { id: 'nt', arguments: {} }, '');
  const r = batch('create', rows);
  assert.equal(r.status, 0, r.stderr);
  const res = results(r.out);
  assert.equal(res.length, 8, r.stderr); // 6 creates, 2 bad lines (the blank one is no job)
  const bad = res.find((x) => x.id === 'line-4');
  assert.equal(bad?.error?.code, 'invalid_argument', JSON.stringify(res));
  assert.equal(bad.line, 4);
  assert.equal(res.find((x) => x.id === 'nt')?.error?.code, 'invalid_argument');
  sandboxes = res.filter((x) => x.id.startsWith('c')).map((x) => {
    assert.ok(x.result?.id, `create ${x.id}: ${JSON.stringify(x)}`);
    return x.result.id;
  });
  assert.equal(sandboxes.length, 6);
  // the envelope says team "batch": the sandboxes are the key's team's
  for (const sb of sandboxes) assert.equal(redis(env, 'HGET', `sf:sb:{${sb}}`, 'team'), 'fleet');
  const hosts = new Set(sandboxes.map((sb) => redis(env, 'HGET', `sf:sb:{${sb}}`, 'host')));
  assert.deepEqual([...hosts].sort(), ['fleet-1', 'fleet-2', 'fleet-3']);
});

test(`${N} jobs, kill -9 half-way, run again: ${N} results, every side effect once`, async () => {
  assert.equal(sandboxes.length, 6, 'the creates ran');
  const jobs = join(dir, 'main.jsonl');
  const out = join(dir, 'main.out.jsonl');
  jsonl(jobs, Array.from({ length: N }, (_, i) => ({
    id: `e${i}`, tool: 'sandbox_exec',
    arguments: { sandbox_id: sandboxes[i % 6], command: `echo e${i} >> /tmp/batch-ledger` },
  })));
  const child = spawn(cli, ['batch', 'run', jobs, '--out', out, '--concurrency', '32'],
    { env: baseEnv, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr1 = '';
  child.stderr.on('data', (d) => { stderr1 += d; });
  const exited = new Promise((r) => child.on('exit', r));
  await until(() => lines(out).length >= N / 2 || child.exitCode !== null, 120000, 50);
  child.kill('SIGKILL');
  await exited;
  const first = lines(out).length;
  assert.ok(first >= N / 2 && first < N, `killed with ${first} results (${stderr1})`);

  const r = batch('main', null, { args: ['--concurrency', '32'] });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /resuming/);
  assert.match(r.stderr, new RegExp(`batch: \\d+/${N} done`)); // plain progress lines (no tty)
  const m = r.stderr.match(/batch: (\d+) results \((\d+) this run, (\d+) earlier\)/);
  assert.ok(m, r.stderr);
  assert.equal(Number(m[1]), N);
  assert.ok(Number(m[3]) >= first - 1, `kept ${m[3]} of the first run's ${first}`); // a cut last line is dropped
  const res = results(out);
  assert.equal(res.length, N);
  const ids = new Set(res.map((x) => x.id));
  assert.equal(ids.size, N, 'one result per job');
  for (const x of res) assert.equal(x.result?.exit_code, 0, JSON.stringify(x));

  // the ledgers, read back through the batch path: each job ran exactly once
  const rd = batch('ledger', sandboxes.map((sb, i) => ({ id: `l${i}`, tool: 'sandbox_exec', arguments: { sandbox_id: sb, command: 'cat /tmp/batch-ledger' } })));
  assert.equal(rd.status, 0, rd.stderr);
  const counts = new Map();
  for (const x of results(rd.out)) {
    assert.equal(x.result?.exit_code, 0, JSON.stringify(x));
    for (const id of x.result.stdout.split('\n').filter((l) => l)) counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  const twice = [...counts].filter(([, n]) => n !== 1);
  assert.deepEqual(twice, [], 'no job ran twice');
  assert.equal(counts.size, N, 'every job ran');
});

test('a result of 256 KiB or more (a claim check) is fetched into its line; with Redis out of reach it is listed under "claims"', () => {
  const sb = sandboxes[0];
  const mk = batch('bigmk', [{ id: 'm', tool: 'sandbox_exec', arguments: { sandbox_id: sb,
    command: "head -c 300000 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /root/big.txt; sha256sum < /root/big.txt" } }]);
  assert.equal(mk.status, 0, mk.stderr);
  const want = results(mk.out)[0].result.stdout.split(' ')[0];
  const read = [{ id: 'r', tool: 'sandbox_files_read', arguments: { sandbox_id: sb, path: '/root/big.txt' } }];
  const rd = batch('bigrd', read);
  assert.equal(rd.status, 0, rd.stderr);
  const [x] = results(rd.out);
  assert.equal(x.claims, undefined, JSON.stringify(x).slice(0, 300));
  assert.equal(x.result.content.length, 600000);
  assert.equal(createHash('sha256').update(x.result.content).digest('hex'), want);
  const far = batch('bigfar', read, { extraEnv: { SF_REDIS_URL: 'redis://127.0.0.1:1' } });
  assert.equal(far.status, 0, far.stderr);
  const [y] = results(far.out);
  assert.deepEqual(y.claims, ['content'], JSON.stringify(y).slice(0, 300));
  assert.match(far.stderr, /results over 256 KiB stay in the platform's Redis .*Redis is unreachable/);
});

test('a key from `sandfleet keys create` signs jobs; revoked, its jobs are refused', () => {
  const made = spawnSync(cli, ['keys', 'create', '--team', 'fleet', '--name', 'batch-test'], { env: baseEnv, encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  const key = made.stdout.trim();
  const kid = made.stderr.match(/created (key_[0-9a-f]+)/)?.[1];
  assert.ok(kid, made.stderr);
  const list = [{ id: 'l', tool: 'sandbox_list', arguments: {} }];
  const ok = batch('newkey', list, { key });
  assert.equal(ok.status, 0, ok.stderr);
  assert.ok(Array.isArray(results(ok.out)[0]?.result?.sandboxes), JSON.stringify(results(ok.out)));
  execFileSync(cli, ['keys', 'revoke', kid], { env: baseEnv });
  const no = batch('revoked', list, { key });
  assert.equal(no.status, 0, no.stderr); // an error is a result, not a failed batch
  const e = results(no.out)[0]?.error;
  assert.equal(e?.code, 'unauthenticated', JSON.stringify(results(no.out)));
  assert.match(e.message, /unknown or revoked/);
  const bad = batch('badkey', list, { key: 'not-a-key' });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /not a sandfleet API key/);
});

test('SF_KAFKA_FETCH_WAIT_MS is read through the daemons\' config table: out of its bounds, the batch stops before it starts', () => {
  const list = [{ id: 'l', tool: 'sandbox_list', arguments: {} }];
  const bad = batch('fetchwait-bad', list, { extraEnv: { SF_KAFKA_FETCH_WAIT_MS: '0' } });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /'kafka_fetch_wait_ms' from \$SF_KAFKA_FETCH_WAIT_MS must be an integer from 1 to 10000/);
  assert.equal(existsSync(bad.out), false, 'nothing is written');
  const ok = batch('fetchwait-ok', list, { extraEnv: { SF_KAFKA_FETCH_WAIT_MS: '100' } });
  assert.equal(ok.status, 0, ok.stderr);
  assert.ok(Array.isArray(results(ok.out)[0]?.result?.sandboxes), JSON.stringify(results(ok.out)));
});
