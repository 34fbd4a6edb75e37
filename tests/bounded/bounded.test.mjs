// Bounded state (issue #5): names and metadata bounded with the field named, sandbox_list
// paginated (and never over the Kafka message limit), Redis memory bounded under
// create/kill churn, and a Redis at its maxmemory answered "the platform is full" while
// kills, reads and heartbeats go on.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect, call, post, bearer, env, until } from '../e2e/lib.mjs';

const redis = (...args) =>
  execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const usedMemory = () => Number(/used_memory:(\d+)/.exec(redis('info', 'memory'))[1]);
const cli = (...args) => execFileSync(`${env.SF_BUILD}/cli/sandfleet`, args,
  { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } })
  .toString().trim();

// A team of its own, with the operator's per-team limits (sandfleet teams limits).
async function team(name, limits = []) {
  if (limits.length) cli('teams', 'limits', name, ...limits);
  return connect(cli('keys', 'create', '--team', name), name);
}

// Polls until fn() is true (then true) or 20 s passed (then false).

// Runs fn(i) for i < n, at most `width` at a time.
async function pool(n, width, fn) {
  const out = new Array(n);
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < n) { const i = next++; out[i] = await fn(i); }
  }));
  return out;
}

// The largest metadata the schema allows: 32 keys of 64 bytes with values of 192 bytes
// (8 KiB of keys and values in all; each value alone may take 512 bytes).
const maxMetadata = (tag, value = 192) => Object.fromEntries(Array.from({ length: 32 }, (_, k) =>
  [`${tag}-${String(k).padStart(2, '0')}`.padEnd(64, 'k'), 'v'.repeat(value)]));

const alpha = await connect(env.SF_KEY_ALPHA, 'alpha');
after(() => alpha.close());

test('oversized names and metadata are refused, naming the field; the largest allowed pass', async () => {
  const refused = async (args, re) => {
    const r = await call(alpha, 'sandbox_create', args);
    assert.equal(r.isError, true, JSON.stringify(args).slice(0, 80));
    assert.match(r.text, re);
  };
  await refused({ name: 'n'.repeat(129) }, /^Argument 'name' must be at most 128 characters long\.$/);
  await refused({ name: '\u65e5'.repeat(43) }, // 43 characters, 129 bytes
    /^Argument 'name' must be at most 128 bytes long in UTF-8 \(got 129\)\.$/);
  const md = maxMetadata('m');
  await refused({ metadata: { ...md, extra: 'x' } },
    /^Argument 'metadata' must have at most 32 entries \(got 33\)\.$/);
  await refused({ metadata: { ['k'.repeat(65)]: 'v' } },
    /^Key 'k{64}' in argument 'metadata' must be at most 64 characters long\.$/); // quoted up to 64
  await refused({ metadata: { ['\u00e9'.repeat(33)]: 'v' } }, // 33 characters, 66 bytes
    /^Key '\u00e9{32}' in argument 'metadata' must be at most 64 bytes long in UTF-8 \(got 66\)\.$/);
  await refused({ metadata: { k: 'v'.repeat(513) } },
    /^Argument 'metadata\.k' must be at most 512 characters long\.$/);
  await refused({ metadata: { k: '\u00e9'.repeat(257) } },
    /^Argument 'metadata\.k' must be at most 512 bytes long in UTF-8 \(got 514\)\.$/);
  await refused({ metadata: maxMetadata('m', 193) }, // every key and value at its own limit
    /^Argument 'metadata' must take at most 8192 bytes of keys and values in all \(got 8224\); shorten or drop some\.$/);
  const list = async (args, re) => {
    const r = await call(alpha, 'sandbox_list', args);
    assert.equal(r.isError, true);
    assert.match(r.text, re);
  };
  await list({ limit: 201 }, /^Argument 'limit' must be at most 200\.$/);
  await list({ limit: 0 }, /^Argument 'limit' must be at least 1\.$/);
  await list({ cursor: 'garbage' }, /^Argument 'cursor' is not a cursor sandbox_list gave; pass the next_cursor/);

  const ok = await call(alpha, 'sandbox_create', { name: '\u65e5'.repeat(42), metadata: md });
  assert.equal(ok.isError, false, ok.text);
  const info = await call(alpha, 'sandbox_info', { sandbox_id: ok.structured.id });
  assert.deepEqual(info.structured.metadata, md);
  assert.equal(info.structured.name, '\u65e5'.repeat(42));
  // The largest record the schemas allow stays under 16 KiB in Redis (SAMPLES 0: every
  // field counted, not 5 sampled and extrapolated).
  const stored = Number(redis('memory', 'usage', `sf:sb:{${ok.structured.id}}`, 'samples', '0'));
  assert.ok(stored < 16 * 1024, `record of ${stored} bytes`);
  await call(alpha, 'sandbox_kill', { sandbox_id: ok.structured.id });
});

test('sandbox_list pages over 201 sandboxes: every id exactly once, cursor round trip, limit bounds', async () => {
  const bulk = await team('bulk', ['--sandboxes', '250', '--host-share', '100', '--fleet-share', '100']);
  const create = (n, metadata) => pool(n, 8, async (i) => {
    const r = await call(bulk, 'sandbox_create', { name: `p${i}`, metadata: metadata(i) });
    assert.equal(r.isError, false, r.text);
    return r.structured.id;
  });
  const ids = await create(201, (i) => ({ suite: 'paging', parity: String(i % 2) }));
  const all = async (args) => {
    const pages = [];
    let cursor;
    do {
      const r = await call(bulk, 'sandbox_list', { ...args, ...(cursor ? { cursor } : {}) });
      assert.equal(r.isError, false, r.text);
      pages.push(r.structured);
      assert.equal(r.structured.count, r.structured.sandboxes.length);
      cursor = r.structured.next_cursor;
    } while (cursor && pages.length < 100);
    return pages;
  };
  const exactlyOnce = (pages, want) => {
    const seen = pages.flatMap((p) => p.sandboxes.map((s) => s.id));
    assert.equal(seen.length, want.length, 'no id twice');
    assert.deepEqual([...seen].sort(), [...want].sort());
    const created = pages.flatMap((p) => p.sandboxes.map((s) => s.created_at));
    assert.deepEqual(created, [...created].sort(), 'oldest first');
  };

  // Default limit 50: 50, 50, 50, 50, 1.
  const byDefault = await all({});
  assert.deepEqual(byDefault.map((p) => p.count), [50, 50, 50, 50, 1]);
  assert.equal(byDefault[4].next_cursor, undefined);
  exactlyOnce(byDefault, ids);
  // The cursor is a position: the same page comes back for it.
  const again = await call(bulk, 'sandbox_list', { cursor: byDefault[0].next_cursor });
  assert.deepEqual(again.structured.sandboxes.map((s) => s.id), byDefault[1].sandboxes.map((s) => s.id));
  const most = await all({ limit: 200 });
  assert.deepEqual(most.map((p) => p.count), [200, 1]);
  exactlyOnce(most, ids);
  // Small pages, with a metadata filter.
  const odd = await all({ limit: 7, metadata: { parity: '1' } });
  assert.ok(odd.slice(0, -1).every((p) => p.count === 7));
  exactlyOnce(odd, ids.filter((_, i) => i % 2 === 1));
  // With 100 of maximal metadata (~9 KiB each in a reply, ~900 KiB together) among them, a
  // page ends before the 1 MiB message limit, and none is lost (150 go first: the host holds
  // ~216 sandboxes).
  await pool(150, 8, (i) => call(bulk, 'sandbox_kill', { sandbox_id: ids[i] }));
  const rest = ids.slice(150);
  const big = await create(100, () => maxMetadata('big'));
  const heavy = await all({ limit: 200 });
  assert.ok(heavy.length >= 2 && heavy[0].count < 151, `pages cut by size: ${heavy.map((p) => p.count)}`);
  assert.ok(heavy.every((p) => JSON.stringify(p).length < 800 * 1024));
  exactlyOnce(heavy, [...rest, ...big]);

  const every = [...rest, ...big];
  await pool(every.length, 8, async (i) => {
    const r = await call(bulk, 'sandbox_kill', { sandbox_id: every[i] });
    assert.equal(r.isError, false, r.text);
  });
  // A kill answers once its record says 'killing': the list right after the last answer
  // is empty already (no polling: a caller must be able to rely on that).
  const left = (await call(bulk, 'sandbox_list', {})).structured;
  assert.deepEqual(left, { sandboxes: [], count: 0 },
    `still listed after every kill: ${left.sandboxes.map((s) => `${s.id} ${s.status}`)}`);
  await bulk.close();
});

test('1,000 create/kill cycles with maximal metadata leave Redis memory bounded', async () => {
  const churn = await team('churn', ['--sandboxes', '16']); // 8 at a time, and their kills
  const t0 = Date.now();
  const before = usedMemory();
  await pool(1000, 8, async (i) => {
    const r = await call(churn, 'sandbox_create', { name: `c${i}`.padEnd(128, 'n'), metadata: maxMetadata(`c${i}`) });
    assert.equal(r.isError, false, r.text);
    const k = await call(churn, 'sandbox_kill', { sandbox_id: r.structured.id });
    assert.equal(k.isError, false, k.text);
  });
  const after = usedMemory();
  const kept = Number(redis('zcard', 'sf:team:{churn}:retired'));
  console.log(`1000 cycles in ${Date.now() - t0} ms; used_memory ${before} -> ${after} (+${after - before} bytes); tombstones kept: ${kept}`);
  // Unbounded, 1,000 killed records of ~10 KiB would hold ~10 MB for an hour.
  assert.ok(kept <= 100, `at most 100 tombstones per team (${kept})`);
  assert.ok(after - before < 3 * 1024 * 1024, `grew ${after - before} bytes`);
  const sample = redis('zrange', 'sf:team:{churn}:retired', '-1', '-1');
  assert.equal(redis('hget', `sf:sb:{${sample}}`, 'metadata'), '', 'tombstones keep no metadata');
  assert.equal(redis('hget', `sf:sb:{${sample}}`, 'state'), 'killed');
  await churn.close();
});

test('a Redis at its maxmemory: "the platform is full", and kills, reads, heartbeats go on', async () => {
  const full = 'The platform is full (its state store reached its memory limit); kill sandboxes you '
    + 'no longer need and retry, or ask the operator to raise the Redis maxmemory.';
  const s1 = (await call(alpha, 'sandbox_create', { name: 'before-full' })).structured.id;
  const limit = redis('config', 'get', 'maxmemory').split('\n')[1];
  try {
    redis('config', 'set', 'maxmemory', String(usedMemory() + 4 * 1024 * 1024));
    const attempt = (...args) => {
      try { return redis(...args); } catch (err) { return String(err.stdout ?? err.message); }
    };
    let n = 0; // fill it with 100 kB values until Redis refuses one
    while (n < 400 && !/^OOM/.test(attempt('set', `filler:${n}`, 'x'.repeat(100000)))) n++;
    assert.ok(n < 400, 'Redis is at its maxmemory');
    // Memory moves as clients come and go and buffers shrink: hold it well over the line.
    redis('config', 'set', 'maxmemory', String(Math.floor(usedMemory() * 0.75)));
    const beat = Number(redis('zscore', 'sf:hosts', env.SF_HOST_ID));

    const c = await call(alpha, 'sandbox_create', { name: 'no-room' });
    assert.equal(c.isError, true);
    assert.equal(c.text, full);
    const e = await call(alpha, 'sandbox_exec', { sandbox_id: s1, command: 'true' });
    assert.equal(e.isError, true);
    assert.equal(e.text, full);
    const init = await post({ jsonrpc: '2.0', id: 1, method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } },
    bearer(env.SF_KEY_ALPHA));
    assert.equal(init.status, 507);
    assert.equal(init.json.error.message, full);
    // A session's log level that cannot be kept is refused, not dropped in silence.
    await assert.rejects(alpha.setLoggingLevel('debug'), /platform is full/);
    // Reads work, and a kill works and lands in the record (it frees room).
    const list = await call(alpha, 'sandbox_list', {});
    assert.ok(list.structured.sandboxes.some((s) => s.id === s1));
    const k = await call(alpha, 'sandbox_kill', { sandbox_id: s1 });
    assert.equal(k.isError, false, k.text);
    // The kill is answered at once; its teardown follows, then the record says killed.
    const status = () => call(alpha, 'sandbox_info', { sandbox_id: s1 }).then((r) => r.structured.status);
    await until('killed while full', async () => (await status()) === 'killed', 20000);
    // The worker's heartbeat still lands: its host does not look dead.
    await until('heartbeat while full', () => Number(redis('zscore', 'sf:hosts', env.SF_HOST_ID)) > beat, 20000);
  } finally {
    const keys = redis('--scan', '--pattern', 'filler*').split('\n').filter(Boolean);
    if (keys.length) redis('del', ...keys);
    redis('config', 'set', 'maxmemory', limit);
  }
  // Room again: creates work, and every daemon is still up.
  const again = await call(alpha, 'sandbox_create', { name: 'after-full' });
  assert.equal(again.isError, false, again.text);
  await call(alpha, 'sandbox_kill', { sandbox_id: again.structured.id });
  for (const d of ['gateway', 'scheduler', 'worker', 'redis', 'kafka'])
    process.kill(Number(readFileSync(`${env.SF_STATE}/pids/${d}`, 'utf8')), 0);
});
