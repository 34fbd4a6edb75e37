// Tenancy: one team's key cannot reach another team's sandbox; bad keys get 401.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { connect, call, post, bearer, env } from './lib.mjs';

const alpha = await connect(env.SF_KEY_ALPHA, 'alpha');
const beta = await connect(env.SF_KEY_BETA, 'beta');
let id;
before(async () => { id = (await call(alpha, 'sandbox_create', { name: 'alpha-only' })).structured.id; });
after(async () => {
  await call(alpha, 'sandbox_kill', { sandbox_id: id });
  await alpha.close();
  await beta.close();
});

const notFound = /No sandbox with id '.*' exists for your team/;

test('team B cannot exec in, inspect or kill team A\'s sandbox', async () => {
  const ex = await call(beta, 'sandbox_exec', { sandbox_id: id, command: 'echo pwned' });
  assert.equal(ex.isError, true);
  assert.match(ex.text, notFound);
  const info = await call(beta, 'sandbox_info', { sandbox_id: id });
  assert.equal(info.isError, true);
  assert.match(info.text, notFound);
  const kill = await call(beta, 'sandbox_kill', { sandbox_id: id });
  assert.equal(kill.isError, true);
  assert.match(kill.text, notFound);
  // The answer for a foreign id is the same as for an id that never existed.
  const ghost = await call(beta, 'sandbox_info', { sandbox_id: 'sb_doesnotexist' });
  assert.equal(ghost.text.replace('sb_doesnotexist', 'X'), info.text.replace(id, 'X'));
  // And A's sandbox is untouched.
  const still = await call(alpha, 'sandbox_exec', { sandbox_id: id, command: 'echo still here' });
  assert.equal(still.structured.stdout, 'still here\n');
});

test('team B does not see team A\'s sandbox in sandbox_list', async () => {
  const list = await call(beta, 'sandbox_list', {});
  assert.equal(list.isError, false);
  assert.ok(!list.structured.sandboxes.some((s) => s.id === id));
  const mine = await call(alpha, 'sandbox_list', {});
  assert.ok(mine.structured.sandboxes.some((s) => s.id === id));
});

const init = { jsonrpc: '2.0', id: 1, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } };

test('no key, a malformed key, an unknown key -> 401 with WWW-Authenticate', async () => {
  for (const h of [{}, bearer('nope'), bearer('sf_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'), { Authorization: 'Basic abc' }]) {
    const r = await post(init, h);
    assert.equal(r.status, 401, JSON.stringify(h));
    assert.match(r.headers.get('www-authenticate') ?? '', /^Bearer /);
    assert.match(r.json.error_description, /API key/); // the sentence a person reads (RFC 6750 code in .error)
  }
});

test('a revoked key -> 401', async () => {
  const cli = `${env.SF_BUILD}/cli/sandfleet`;
  const opts = { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } };
  const key = execFileSync(cli, ['keys', 'create', '--team', 'gamma'], opts).toString().trim();
  assert.equal((await post(init, bearer(key))).status, 200);
  const list = execFileSync(cli, ['keys', 'list', '--team', 'gamma'], opts).toString();
  const keyId = list.split('\n')[1].split(/\s+/)[0];
  assert.match(keyId, /^key_/);
  execFileSync(cli, ['keys', 'revoke', keyId], opts);
  const r = await post(init, bearer(key));
  assert.equal(r.status, 401);
});

test('a session id of another team is not accepted', async () => {
  const a = await post(init, bearer(env.SF_KEY_ALPHA));
  const sid = a.headers.get('mcp-session-id');
  assert.ok(sid);
  const r = await post({ jsonrpc: '2.0', id: 2, method: 'ping' },
    { ...bearer(env.SF_KEY_BETA), 'Mcp-Session-Id': sid });
  assert.equal(r.status, 404);
});
// Sessions over a team's limit evict the least recently used one: tests/gateway/sessions.test.mjs.
