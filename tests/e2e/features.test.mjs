// What an agent relies on beyond the basics: env_vars, lifetimes, odd output, bad cwd,
// concurrency inside one sandbox, and quota errors.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env, driver } from './lib.mjs';

const client = await connect(env.SF_KEY_ALPHA);
after(() => client.close());

test('env_vars from sandbox_create reach every command; exec env overrides them', async () => {
  const id = (await call(client, 'sandbox_create', { env_vars: { STAGE: 'test', COLOR: 'blue' } })).structured.id;
  assert.equal((await sh(client, id, 'echo $STAGE-$COLOR')).stdout, 'test-blue\n');
  assert.equal((await sh(client, id, 'echo $STAGE-$COLOR', { env: { COLOR: 'red' } })).stdout, 'test-red\n');
  await call(client, 'sandbox_kill', { sandbox_id: id });
});

test('timeout_seconds ends the sandbox by itself', async () => {
  // A microVM's first command takes longer than a jail's (TCG here): give it room.
  const life = driver === 'qemu' ? 5 : 1;
  const id = (await call(client, 'sandbox_create', { timeout_seconds: life })).structured.id;
  assert.equal((await sh(client, id, 'echo alive')).stdout, 'alive\n');
  // It goes by itself: calls succeed until then, and say so after.
  const deadline = Date.now() + life * 1000 + 15000;
  let r;
  do {
    await new Promise((res) => setTimeout(res, 200));
    r = await call(client, 'sandbox_exec', { sandbox_id: id, command: 'true' });
  } while (!r.isError && Date.now() < deadline);
  assert.equal(r.isError, true);
  assert.match(r.text, /was killed/);
});

test('binary output comes back as valid text, and a missing cwd is explained', async () => {
  const id = (await call(client, 'sandbox_create', {})).structured.id;
  const bin = await sh(client, id, "printf 'ok\\377\\376\\000end'");
  assert.equal(bin.stdout, 'ok\ufffd\ufffd\ufffdend');
  assert.equal(bin.stdout_bytes, 8);
  const cwd = await call(client, 'sandbox_exec', { sandbox_id: id, command: 'pwd', cwd: '/nope/deeper' });
  assert.equal(cwd.isError, true);
  assert.match(cwd.text, /\/nope\/deeper/);
  // A long one too: it is answered as it fails, not at its 10-minute deadline (the client
  // gives up long before that).
  const long = await call(client, 'sandbox_exec',
    { sandbox_id: id, command: 'pwd', cwd: '/' + 'x'.repeat(3000), timeout_ms: 600000 }, { timeout: 90000 });
  assert.equal(long.isError, true);
  assert.match(long.text, /working directory/);
  await call(client, 'sandbox_kill', { sandbox_id: id });
});

test('commands in one sandbox run concurrently', async () => {
  // Each command leaves its marker, then waits (up to 40 s) until it sees all four: only
  // commands that run at the same time can all say "4" (run one after another, the first
  // would give up seeing only its own). How fast they overlap: tests/bench/spine.mjs.
  const id = (await call(client, 'sandbox_create', {})).structured.id;
  const cmd = (i) => `mkdir -p /tmp/conc && touch /tmp/conc/${i}; n=0; `
    + 'while [ "$(ls /tmp/conc | wc -l)" -lt 4 ] && [ $n -lt 400 ]; do sleep 0.1; n=$((n+1)); done; '
    + `echo ${i} saw $(ls /tmp/conc | wc -l)`;
  const runs = await Promise.all([1, 2, 3, 4].map((i) => sh(client, id, cmd(i))));
  assert.deepEqual(runs.map((r) => r.stdout), ['1 saw 4\n', '2 saw 4\n', '3 saw 4\n', '4 saw 4\n']);
  await call(client, 'sandbox_kill', { sandbox_id: id });
});

test('files written in one call are there in the next, and exit codes of signals', async () => {
  const id = (await call(client, 'sandbox_create', {})).structured.id;
  await sh(client, id, 'mkdir -p /app && echo "print(1)" > /app/x.txt');
  assert.equal((await sh(client, id, 'cat /app/x.txt')).stdout, 'print(1)\n');
  assert.equal((await sh(client, id, 'kill -9 $$')).exit_code, 137);
  await call(client, 'sandbox_kill', { sandbox_id: id });
});

test('the team quota is enforced with an actionable error (the e2e stack allows 8)', async () => {
  const beta = await connect(env.SF_KEY_BETA, 'beta');
  const ids = [];
  for (let i = 0; i < 8; i++) {
    const r = await call(beta, 'sandbox_create', { name: `q${i}` });
    assert.equal(r.isError, false, r.text);
    ids.push(r.structured.id);
  }
  const over = await call(beta, 'sandbox_create', {});
  assert.equal(over.isError, true);
  assert.equal(over.text, 'Sandbox quota reached: your team may have 8 sandboxes. Kill sandboxes '
    + 'you no longer need (sandbox_list, then sandbox_kill), then retry, or ask the operator for a '
    + 'higher limit.');
  await call(beta, 'sandbox_kill', { sandbox_id: ids.pop() });
  const again = await call(beta, 'sandbox_create', {});
  assert.equal(again.isError, false, again.text);
  ids.push(again.structured.id);
  for (const id of ids) await call(beta, 'sandbox_kill', { sandbox_id: id });
  await beta.close();
});

test('one team cannot hold more than its share of calls in flight (the e2e stack allows 16)', async () => {
  const beta = await connect(env.SF_KEY_BETA, 'beta');
  const id = (await call(beta, 'sandbox_create', {})).structured.id;
  const flood = Promise.all(Array.from({ length: 20 }, () =>
    call(beta, 'sandbox_exec', { sandbox_id: id, command: 'sleep 1' })));
  await new Promise((r) => setTimeout(r, 200));
  const other = await call(client, 'sandbox_list', {}); // team alpha, while beta is at its limit
  assert.equal(other.isError, false, other.text);
  const runs = await flood;
  const refused = runs.filter((r) => r.isError);
  assert.equal(refused.length, 4, runs.map((r) => r.text).join('\n'));
  assert.match(refused[0].text, /Your team has 16 calls in flight/);
  // Beta can go on once its calls finished.
  assert.equal((await sh(beta, id, 'echo again')).stdout, 'again\n');
  await call(beta, 'sandbox_kill', { sandbox_id: id });
  await beta.close();
});
