// Fair share (issue #5): a team creating in a loop stops at its share of the hosts, with
// an error that says what to do, while another team still creates; what placement
// reserved is released when sandboxes end.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { connect, call, env } from '../e2e/lib.mjs';

const redis = (...args) =>
  execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const cli = (...args) => execFileSync(`${env.SF_BUILD}/cli/sandfleet`, args,
  { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } })
  .toString().trim();
const host = (field) => Number(redis('hget', `sf:host:{${env.SF_HOST_ID}}`, field) || 0);
// what placement holds reserved on the host: one field per sandbox (schemas/redis-keys.md)
const reserved = () => Number(redis('hlen', `sf:host:{${env.SF_HOST_ID}}:res`) || 0);

const beta = await connect(env.SF_KEY_BETA, 'beta');
after(() => beta.close());

test('team A creating in a loop stops at its share; team B can still create', async () => {
  // The operator gives team greedy a large quota but a 3% share of the fleet (the e2e
  // stack's one host), so the share, not the quota, stops it.
  const shown = cli('teams', 'limits', 'greedy', '--sandboxes', '1000', '--fleet-share', '3', '--host-share', '3');
  assert.match(shown, /^team greedy\nlimits: sandboxes=1000 host_share_pct=3 fleet_share_pct=3\nholds: 0 sandboxes/);
  const greedy = await connect(cli('keys', 'create', '--team', 'greedy'), 'greedy');
  const share = Math.floor(host('capacity') * 3 / 100);
  assert.ok(share >= 2, `capacity ${host('capacity')} gives a share of ${share}`);
  const reservedBefore = reserved();

  const ids = [];
  let refusal;
  for (let i = 0; i < share + 5 && !refusal; i++) {
    const r = await call(greedy, 'sandbox_create', { name: `g${i}` });
    if (r.isError) refusal = r.text;
    else ids.push(r.structured.id);
  }
  assert.equal(ids.length, share, `stopped at its share: ${refusal}`);
  assert.equal(refusal, `Your team is using its fair share of the platform (at most ${share} sandboxes `
    + 'across all hosts, shared with other teams). Kill sandboxes you no longer need '
    + '(sandbox_list, then sandbox_kill), then retry.');
  assert.equal(reserved(), reservedBefore + share, 'each placement reserved on the host');
  assert.match(cli('teams', 'show', 'greedy'),
    new RegExp(`holds: ${share} sandboxes, ${share * 64} MiB, ${(share * 0.1).toFixed(1)} vCPUs\n  on ${env.SF_HOST_ID}: ${share} sandboxes`));

  // Another team is not affected.
  const b = await call(beta, 'sandbox_create', { name: 'still-room' });
  assert.equal(b.isError, false, b.text);

  // Killing one gives the place back.
  await call(greedy, 'sandbox_kill', { sandbox_id: ids.pop() });
  const again = await call(greedy, 'sandbox_create', { name: 'again' });
  assert.equal(again.isError, false, again.text);
  ids.push(again.structured.id);

  // Every reservation is released: the team's when the kill is answered, the host's when
  // the teardown ended.
  for (const id of ids) await call(greedy, 'sandbox_kill', { sandbox_id: id });
  await call(beta, 'sandbox_kill', { sandbox_id: b.structured.id });
  assert.equal(redis('exists', 'sf:team:{greedy}:res'), '0', 'nothing left reserved for the team');
  cli('teams', 'limits', 'greedy', '--sandboxes', 'default', '--fleet-share', 'default', '--host-share', 'default');
  assert.match(cli('teams', 'show', 'greedy'), /limits: sandboxes=default host_share_pct=default fleet_share_pct=default/);
  const until = Date.now() + 20000;
  while (reserved() !== reservedBefore && Date.now() < until)
    await new Promise((r) => setTimeout(r, 100));
  assert.equal(reserved(), reservedBefore, 'the host\'s reservations released');
  await greedy.close();
});
