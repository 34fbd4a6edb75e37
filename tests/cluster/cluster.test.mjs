// The same code on Redis Cluster (issue #9, the store): this stack's Redis is a one-node
// cluster owning every slot (tests/integration/stack, profile cluster), so Redis refuses
// any command or script whose keys span hash slots. First that it really does (a
// cross-slot EVAL, a script reaching an undeclared key of another slot, a multi-key DEL),
// then the platform's spine through MCP, each step on the cluster: a session, a secret
// bound, create, exec, list (with a metadata filter), info, update, pause and resume,
// files by claim check, template list, kill; a team template built, used, refused and
// deleted, a snapshot taken, listed, used and deleted; the reaper of a dead host; last, no
// daemon logged a refusal of Redis's.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { randomBytes, createHash } from 'node:crypto';
import { connect, call, sh, env, until, cli } from '../e2e/lib.mjs';

const redis = (...args) => {
  const r = spawnSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args], { encoding: 'utf8' });
  return (r.stdout + r.stderr).trim();
};
const tag = randomBytes(4).toString('hex');
const client = await connect(env.SF_KEY_ALPHA, 'cluster');
after(() => client.close());

test('the Redis is a cluster that refuses keys of two slots', () => {
  assert.match(redis('CLUSTER', 'INFO'), /cluster_state:ok/);
  assert.match(redis('CLUSTER', 'INFO'), /cluster_slots_assigned:16384/);
  // {a} and {b} hash to different slots
  assert.notEqual(redis('CLUSTER', 'KEYSLOT', 'x{a}'), redis('CLUSTER', 'KEYSLOT', 'x{b}'));
  assert.match(redis('EVAL', "return redis.call('GET', KEYS[1])", '2', 'x{a}', 'x{b}'), /CROSSSLOT/);
  assert.match(redis('EVAL', "#!lua\nredis.call('GET', KEYS[1]) return redis.call('GET', 'x{b}')",
    '1', 'x{a}'), /do not hash to the same slot/);
  assert.match(redis('DEL', 'x{a}', 'x{b}'), /CROSSSLOT/);
  assert.equal(redis('DEL', 'x{a}', 'y{a}'), '0', 'one slot is fine');
});

test('the spine on the cluster: session, secret, create, exec, list, info, update, pause, files, kill', async () => {
  // a session: the MCP client's, in the team's sessions
  assert.ok(Number(redis('ZCARD', 'sf:team:{alpha}:sessions')) >= 1, 'the session is recorded');
  // a secret, bound to the sandbox at create
  const secret = `CL_${tag}`;
  cli(['secrets', 'create', '--team', 'alpha', '--name', secret, '--allowed-host', 'api.example.test'],
    `value-${tag}`);
  const c = await call(client, 'sandbox_create', {
    name: `cluster-${tag}`, metadata: { suite: 'cluster', tag }, allow_out: ['api.example.test'],
    secrets: { API_KEY: secret },
  });
  assert.equal(c.isError, false, c.text);
  const id = c.structured.id;
  try {
    const r = await sh(client, id, 'echo hi; echo err >&2; exit 3');
    assert.deepEqual([r.stdout, r.stderr, r.exit_code], ['hi\n', 'err\n', 3]);
    assert.match((await sh(client, id, 'echo $API_KEY')).stdout, /^sfph_/, 'a placeholder, never the value');

    const l = await call(client, 'sandbox_list', { metadata: { tag } });
    assert.deepEqual(l.structured.sandboxes.map((s) => s.id), [id]);
    assert.equal((await call(client, 'sandbox_list', { metadata: { tag: 'none' } })).structured.count, 0);
    const i = await call(client, 'sandbox_info', { sandbox_id: id });
    assert.equal(i.structured.status, 'active');
    assert.deepEqual(i.structured.secrets, { API_KEY: secret });

    const u = await call(client, 'sandbox_update', { sandbox_id: id, metadata: { suite: 'cluster', tag, v: '2' },
      timeout_seconds: 600 });
    assert.equal(u.isError, false, u.text);
    assert.notEqual(redis('ZSCORE', `sf:host:{${env.SF_HOST_ID}}:timers`, `t:${id}`), '', 'its timer');
    assert.equal((await call(client, 'sandbox_info', { sandbox_id: id })).structured.metadata.v, '2');

    assert.equal((await call(client, 'sandbox_pause', { sandbox_id: id })).structured.status, 'paused');
    assert.equal(redis('HGET', `sf:sb:{${id}}`, 'state'), 'paused');
    assert.deepEqual((await call(client, 'sandbox_resume', { sandbox_id: id })).structured, { id, status: 'active' });

    // 1 MiB each way: over the claim-check threshold, so both travel through Redis
    const data = randomBytes(1024 * 1024);
    const w = await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/tmp/big.bin',
      content: data.toString('base64'), encoding: 'base64' });
    assert.equal(w.isError, false, w.text);
    const sha = (b) => createHash('sha256').update(b).digest('hex');
    assert.equal((await sh(client, id, 'sha256sum /tmp/big.bin')).stdout.split(' ')[0], sha(data));
    const back = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/tmp/big.bin', encoding: 'base64' });
    assert.equal(sha(Buffer.from(back.structured.content, 'base64')), sha(data));

    const t = await call(client, 'sandbox_template_list', {});
    assert.ok(t.structured.templates.some((x) => x.name === 'base'));
  } finally {
    const k = await call(client, 'sandbox_kill', { sandbox_id: id });
    assert.equal(k.structured.status, 'killed');
    cli(['secrets', 'delete', '--team', 'alpha', '--name', secret]);
  }
  await until('the kill to land in the record', () => redis('HGET', `sf:sb:{${id}}`, 'state') === 'killed');
  assert.match((await call(client, 'sandbox_exec', { sandbox_id: id, command: 'true' })).text, /was killed/);
  await until('the host to give its reservation back',
    () => redis('HEXISTS', `sf:host:{${env.SF_HOST_ID}}:res`, id) === '0');
  assert.equal(redis('HEXISTS', 'sf:team:{alpha}:res', id), '0');
  assert.equal((await call(client, 'sandbox_list', { metadata: { tag } })).structured.count, 0);
});

test('templates and snapshots on the cluster: build, use, snapshot, list, a refused and a done delete', async () => {
  const name = `cl-${tag}`;
  const t = await call(client, 'sandbox_template_create', { name, from: 'base', run_steps: [`echo ${tag} > /version`] });
  assert.equal(t.isError, false, t.text);
  const row = await until('the template to be built', async () => {
    const l = await call(client, 'sandbox_template_list', { name_prefix: name });
    const x = l.structured?.templates?.find((y) => y.name === name);
    return x && x.status !== 'building' && x;
  }, 120000, 300);
  assert.equal(row.status, 'ready', JSON.stringify(row));
  const kill = async (id) => assert.equal((await call(client, 'sandbox_kill', { sandbox_id: id })).isError, false);
  const c = await call(client, 'sandbox_create', { from_template: name });
  assert.equal(c.isError, false, c.text);
  const id = c.structured.id;
  let sid;
  try {
    assert.equal((await sh(client, id, 'cat /version')).stdout, `${tag}\n`);
    await sh(client, id, 'echo kept > /root/kept.txt');
    const s = await call(client, 'sandbox_snapshot', { sandbox_id: id, name });
    assert.equal(s.isError, false, s.text);
    sid = s.structured.snapshot_id;
    const listed = (await call(client, 'sandbox_snapshot_list', {})).structured.snapshots.find((x) => x.name === name);
    assert.deepEqual([listed?.snapshot_id, listed?.status], [sid, 'ready']);
    const inuse = await call(client, 'sandbox_template_delete', { name });
    assert.equal(inuse.isError, true);
    assert.match(inuse.text, /is used by 1 live sandbox/);
    const from = await call(client, 'sandbox_create', { from_snapshot: sid });
    assert.equal(from.isError, false, from.text);
    try {
      assert.equal((await sh(client, from.structured.id, 'cat /root/kept.txt /version')).stdout, `kept\n${tag}\n`);
    } finally {
      await kill(from.structured.id);
    }
  } finally {
    await kill(id);
  }
  const d = await call(client, 'sandbox_snapshot_delete', { snapshot: sid });
  assert.deepEqual(d.structured, { snapshot_id: sid, name, status: 'deleted' });
  assert.equal((await call(client, 'sandbox_snapshot_list', {})).structured.snapshots.some((x) => x.name === name), false);
  assert.equal(redis('EXISTS', `sf:team:{alpha}:snap:${name}`), '0');
  const td = await call(client, 'sandbox_template_delete', { name });
  assert.equal(td.isError, false, td.text);
  assert.equal(td.structured.status, 'deleted');
  assert.deepEqual((await call(client, 'sandbox_template_list', { name_prefix: name })).structured.templates, []);
});

test('the reaper on the cluster: a silent host is removed and its sandbox lost', async () => {
  const ghost = `sb_clghost${tag}`;
  redis('HSET', `sf:sb:{${ghost}}`, 'id', ghost, 'team', 'alpha', 'host', `ghost-${tag}`, 'state',
    'running', 'created', String(Date.now()));
  redis('SADD', 'sf:team:{alpha}:sandboxes', ghost);
  redis('SADD', `sf:host:{ghost-${tag}}:sandboxes`, ghost);
  redis('ZADD', 'sf:hosts', String(Date.now() - 3600e3), `ghost-${tag}`);
  await until('the reaper (every host_ttl_ms)', async () =>
    (await call(client, 'sandbox_info', { sandbox_id: ghost })).structured?.status === 'lost', 30000);
  assert.equal(redis('ZSCORE', 'sf:hosts', `ghost-${tag}`), '');
  assert.equal(redis('SISMEMBER', 'sf:team:{alpha}:sandboxes', ghost), '0');
});

test('no daemon met a cross-slot refusal (or any script error) from Redis', () => {
  const dir = `${env.SF_STATE}/logs`;
  for (const f of readdirSync(dir).filter((n) => n !== 'redis.log')) {
    const bad = readFileSync(`${dir}/${f}`, 'utf8').split('\n')
      .filter((l) => /CROSSSLOT|same slot|non local key|script failed|redis write failed|read failed|NOSCRIPT/i.test(l));
    assert.deepEqual(bad, [], `${f}: Redis refused what the daemon sent`);
  }
});
