// `sandfleet templates build|list|delete|logs` against the real stack: build as the key's
// team with a progress line per step until ready (exit 0) or failed (exit 1, the step's
// output); list shows only the key's team's templates; delete removes the key's team's own;
// logs is the operator's view of the build log.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { env, driver } from './lib.mjs';

const uniq = Date.now().toString(36);
function cli(args, key = env.SF_KEY_ALPHA) {
  const e = { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SANDFLEET_URL: env.SF_URL };
  if (key) e.SANDFLEET_API_KEY = key; else delete e.SANDFLEET_API_KEY;
  return spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['templates', ...args], { encoding: 'utf8', env: e, timeout: 300000 });
}
const jail = { skip: driver !== 'jail' && 'jail hosts build templates' };

test('templates build: progress per step, then ready; logs and list show it', jail, () => {
  const name = `cli-${uniq}`;
  const r = cli(['build', name, '--from', 'base', '--memory_mib', '128',
    '--step', 'sleep 2; echo hello-cli > /built.txt', '--step', 'cat /built.txt']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, `${name} ready\n`);
  assert.match(r.stderr, new RegExp(`building template '${name}' from 'base'`));
  assert.match(r.stderr, /\[-{20}\] step 1\/2 /, 'a progress line while step 1 runs');

  const logs = cli(['logs', name, '--team', 'alpha'], null);
  assert.equal(logs.status, 0, logs.stderr);
  assert.match(logs.stdout, /^== build sandbox started\n== step 1\/2: sleep 2; echo hello-cli > \/built.txt\n-- exit 0\n== step 2\/2: cat \/built.txt\nhello-cli\n-- exit 0\n== taking the built root filesystem\n== ready\n$/);
  const other = cli(['logs', name, '--team', 'beta'], null);
  assert.equal(other.status, 1);
  assert.match(other.stderr, /has no build log/);

  const l = cli(['list', '--prefix', 'cli-']);
  assert.equal(l.status, 0, l.stderr);
  assert.match(l.stdout, new RegExp(`^${name} +ready +base +\\d+ +128 `, 'm'));
  const lb = cli(['list'], env.SF_KEY_BETA);
  assert.equal(lb.status, 0, lb.stderr);
  assert.doesNotMatch(lb.stdout, new RegExp(name));
  assert.match(lb.stdout, /^debian +/m);

  // delete: not another team's, then the key's team's own, once
  const db = cli(['delete', name], env.SF_KEY_BETA);
  assert.equal(db.status, 1);
  assert.match(db.stderr, new RegExp(`Template '${name}' does not exist`));
  const d = cli(['delete', name]);
  assert.equal(d.status, 0, d.stderr);
  assert.equal(d.stdout, `${name} deleted\n`);
  assert.doesNotMatch(cli(['list', '--prefix', 'cli-']).stdout, new RegExp(name));
  const d2 = cli(['delete', name]);
  assert.equal(d2.status, 1);
  assert.match(d2.stderr, /does not exist/);
});

test('templates build: a failing step exits 1 with the step and its output', jail, () => {
  const r = cli(['build', `clibad-${uniq}`, '--from', 'base', '--step', 'echo nope >&2; exit 7']);
  assert.equal(r.status, 1);
  assert.match(r.stdout, /failed: Step 1 \(echo nope >&2; exit 7\) exited with 7; its output ends: nope/);
});

test('templates: bad usage and a missing key are explained', () => {
  const u = cli(['build', 'x']);
  assert.equal(u.status, 2);
  assert.match(u.stderr, /usage: sandfleet templates build NAME --from TEMPLATE/);
  const k = cli(['list'], null);
  assert.equal(k.status, 1);
  assert.match(k.stderr, /SANDFLEET_API_KEY is not set/);
  const dup = cli(['build', 'debian', '--from', 'base']);
  assert.equal(dup.status, 1);
  assert.match(dup.stderr, /built-in template's name/);
});
