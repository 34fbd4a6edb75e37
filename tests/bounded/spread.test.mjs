// Placement over two worker hosts (issue #5): a team's sandboxes are spread over the hosts
// (the one holding fewest of the team's goes first); when the team holds its share of
// every host that has room, the error says so and what to do; other teams still create.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { connect, call, env } from '../e2e/lib.mjs';

const stack = new URL('../integration/stack', import.meta.url).pathname;
const redis = (...args) =>
  execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const cli = (...args) => execFileSync(`${env.SF_BUILD}/cli/sandfleet`, args,
  { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } })
  .toString().trim();
const second = 'bulk-host-2';
const hostOf = (id) => redis('hget', `sf:sb:{${id}}`, 'host');

before(() => execFileSync(stack, ['add-worker', env.SF_STATE, env.SF_BUILD, second], { stdio: 'inherit' }));
after(() => execFileSync(stack, ['stop-worker', env.SF_STATE, env.SF_BUILD, second], { stdio: 'inherit' }));

test('a team is spread over the hosts and stops at its share of each', async () => {
  // 3 % of each host, the fleet share left whole: the per-host share decides.
  cli('teams', 'limits', 'spread', '--sandboxes', '100', '--host-share', '3', '--fleet-share', '100');
  const spread = await connect(cli('keys', 'create', '--team', 'spread'), 'spread');
  const beta = await connect(env.SF_KEY_BETA, 'beta');
  const hosts = [env.SF_HOST_ID, second];
  // What 3 % of a host allows: its sandboxes, memory (64 MiB each) and CPU (100 milli each).
  const per = Math.min(...hosts.map((h) => {
    const [cap, mem, vcpu] = ['capacity', 'mem_mib', 'vcpu_milli'].map((f) => Number(redis('hget', `sf:host:{${h}}`, f)));
    return Math.min(Math.floor(cap * 3 / 100), Math.floor(mem * 0.03 / 64), Math.floor(vcpu * 0.03 / 100));
  }));
  assert.ok(per >= 2, `each host takes ${per} of the team's sandboxes`);

  const ids = [];
  const count = () => Object.fromEntries(hosts.map((h) => [h, ids.filter((id) => hostOf(id) === h).length]));
  let refusal;
  for (let i = 0; i < 2 * per + 3 && !refusal; i++) {
    const r = await call(spread, 'sandbox_create', { name: `s${i}` });
    if (r.isError) { refusal = r.text; break; }
    ids.push(r.structured.id);
    const c = count();
    assert.ok(Math.abs(c[hosts[0]] - c[hosts[1]]) <= 1, `spread after ${ids.length}: ${JSON.stringify(c)}`);
  }
  assert.deepEqual(count(), { [hosts[0]]: per, [hosts[1]]: per });
  assert.equal(refusal, 'Your team is using its fair share (3%) of every worker host that has room. '
    + 'Kill sandboxes you no longer need (sandbox_list, then sandbox_kill), then retry, or retry when '
    + 'more hosts join.');
  const b = await call(beta, 'sandbox_create', { name: 'elsewhere' });
  assert.equal(b.isError, false, b.text);
  for (const id of [...ids, b.structured.id])
    await call(id === b.structured.id ? beta : spread, 'sandbox_kill', { sandbox_id: id });
  await spread.close();
  await beta.close();
});
