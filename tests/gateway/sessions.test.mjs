// Sessions that never strand a client, against the real stack with the official SDK client:
// a session Redis lost is recreated on the spot; a deleted one stays a tombstone (404);
// another team's session is 404; a team over its session limit (the e2e stack allows 40)
// evicts its least recently used sessions instead of refusing new clients.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { connect, call, post, bearer, env, until } from '../e2e/lib.mjs';

const redis = (...args) =>
  execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const init = {
  jsonrpc: '2.0', id: 1, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
};
const clients = [];
after(async () => { for (const c of clients) await c.close(); });

test('a session Redis no longer has is recreated for the same team: the SDK client goes on', async () => {
  const client = await connect(env.SF_KEY_ALPHA, 'lost-session');
  clients.push(client);
  const sid = client.transport.sessionId;
  assert.match(sid, /^mcp_/);
  assert.equal((await call(client, 'sandbox_list')).isError, false);
  // Lose it in Redis (expiry, eviction, a flushed store) and make every gateway forget
  // what it cached, as a restarted or different gateway would.
  assert.equal(redis('DEL', `sf:mcpsess:{${sid}}`), '1');
  redis('PUBLISH', 'sf:gw:events', `sess:${sid}`);
  // (the event reaches the gateway by Pub/Sub, maybe after the next request: until then
  // its cache still answers; every call goes on either way)
  await until('the session is recreated in Redis', async () => {
    const r = await call(client, 'sandbox_list');
    assert.equal(r.isError, false, r.text);
    assert.ok(Array.isArray(r.structured.sandboxes));
    return redis('HGET', `sf:mcpsess:{${sid}}`, 'recreated') === '1';
  });
  assert.equal(redis('HGET', `sf:mcpsess:{${sid}}`, 'team'), 'alpha');
  assert.equal(redis('HGET', `sf:mcpsess:{${sid}}`, 'recreated'), '1');
  // an id this gateway never saw is taken up the same way
  const fresh = await post({ jsonrpc: '2.0', id: 2, method: 'ping' },
    { ...bearer(env.SF_KEY_ALPHA), 'Mcp-Session-Id': 'mcp_neverseenbeforexyz' });
  assert.equal(fresh.status, 200, fresh.text);
});

test('a deleted session is a tombstone: 404, even after it left the gateway caches', async () => {
  const a = await post(init, bearer(env.SF_KEY_ALPHA));
  const sid = a.headers.get('mcp-session-id');
  const del = await fetch(env.SF_URL, { method: 'DELETE', headers: { ...bearer(env.SF_KEY_ALPHA), 'Mcp-Session-Id': sid } });
  assert.equal(del.status, 204);
  for (let i = 0; i < 2; i++) {
    const r = await post({ jsonrpc: '2.0', id: 2, method: 'ping' },
      { ...bearer(env.SF_KEY_ALPHA), 'Mcp-Session-Id': sid });
    assert.equal(r.status, 404);
    assert.equal(r.json.error.code, -32001);
    redis('PUBLISH', 'sf:gw:events', `sess:${sid}`);
  }
});

test('another team\'s session id gets 404', async () => {
  const a = await post(init, bearer(env.SF_KEY_ALPHA));
  const sid = a.headers.get('mcp-session-id');
  const r = await post({ jsonrpc: '2.0', id: 2, method: 'ping' },
    { ...bearer(env.SF_KEY_BETA), 'Mcp-Session-Id': sid });
  assert.equal(r.status, 404);
});

test('1,100 sessions without DELETE: the oldest are evicted, new clients still connect', async () => {
  const cli = `${env.SF_BUILD}/cli/sandfleet`;
  const opts = { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } };
  const key = execFileSync(cli, ['keys', 'create', '--team', 'delta'], opts).toString().trim();
  const sids = [];
  for (let i = 0; i < 1100; i += 50) {
    const batch = await Promise.all(Array.from({ length: 50 }, () => post(init, bearer(key))));
    for (const r of batch) {
      assert.equal(r.status, 200, r.text);
      sids.push(r.headers.get('mcp-session-id'));
    }
  }
  // Within one concurrent batch the gateway's arrival order is not the array's
  // order, so the newest session is one opened alone, after every batch.
  const newest = await post(init, bearer(key));
  assert.equal(newest.status, 200, newest.text);
  assert.equal(redis('ZCARD', 'sf:team:{delta}:sessions'), '40');
  assert.equal(redis('EXISTS', `sf:mcpsess:{${sids[0]}}`), '0');
  assert.equal(redis('EXISTS', `sf:mcpsess:{${newest.headers.get('mcp-session-id')}}`), '1');
  const client = await connect(key, 'after-eviction');
  clients.push(client);
  assert.equal((await call(client, 'sandbox_list')).isError, false);
  // other teams are not touched
  assert.equal((await post(init, bearer(env.SF_KEY_BETA))).status, 200);
});
