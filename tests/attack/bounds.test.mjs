// Bounds on what an unauthenticated client may write (dynamic client registration: a
// per-address rate and a cap, unused registrations kept a day; sign-in pages), strict OAuth
// redirect URIs (never a redirect to an unverified one), and revocation that ends a grant's
// access tokens at once. On the attack stack (tests/attack/CMakeLists.txt), whose gateway
// runs oauth_register_per_min=10 and oauth_clients_max=40 (tests/integration/stack).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { env, url, post, connect, call, sh } from '../e2e/lib.mjs';

const base = new URL(url);
const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const PER_MIN = 10, CLIENTS_MAX = 40, GUARD_MIB = 4; // the attack stack's settings
const REDIRECT = 'http://127.0.0.1:9/callback';

// One request from a chosen loopback source address (fetch cannot pick it).
function request(method, path, { body, headers = {}, from = '127.0.0.1' } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, path, method, localAddress: from,
      headers: { ...(body ? { 'Content-Length': Buffer.byteLength(body) } : {}), ...headers } },
    (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        let json = null;
        try { json = JSON.parse(text); } catch { /* a page */ }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}
const register = (meta, from) => request('POST', '/oauth/register', { from,
  body: JSON.stringify(meta), headers: { 'Content-Type': 'application/json' } });
const usedMemory = () => Number(redis('INFO', 'memory').match(/used_memory:(\d+)/)[1]);
const clientKeys = () => redis('--scan', '--pattern', 'sf:oauth:client:*')
  .split('\n').filter(Boolean).length;

// Signs in through the real form (the page's cookie and CSRF field) and trades the code.
async function signIn(clientId) {
  const verifier = randomBytes(32).toString('base64url');
  const challenge = createHash('sha256').update(verifier).digest('base64url');
  const q = new URLSearchParams({ response_type: 'code', client_id: clientId, redirect_uri: REDIRECT,
    code_challenge: challenge, code_challenge_method: 'S256', state: 'st', resource: url });
  const page = await fetch(`${base.origin}/oauth/authorize?${q}`, { redirect: 'manual' });
  const html = await page.text();
  assert.equal(page.status, 200, html);
  const cookie = page.headers.get('set-cookie').split(';')[0];
  const csrf = html.match(/name="csrf" value="([^"]+)"/)[1];
  const done = await fetch(`${base.origin}/oauth/authorize`, { method: 'POST', redirect: 'manual',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded', Cookie: cookie },
    body: new URLSearchParams({ csrf, api_key: env.SF_KEY_ALPHA, decision: 'approve' }) });
  assert.equal(done.status, 302, await done.text());
  const code = new URL(done.headers.get('location')).searchParams.get('code');
  return token({ grant_type: 'authorization_code', code, client_id: clientId, redirect_uri: REDIRECT,
    code_verifier: verifier, resource: url });
}
async function token(o) {
  const r = await fetch(`${base.origin}/oauth/token`, { method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' }, body: new URLSearchParams(o) });
  return { status: r.status, json: await r.json() };
}
const listWith = (bearer) => post({ jsonrpc: '2.0', id: 1, method: 'tools/call',
  params: { name: 'sandbox_list', arguments: {} } }, { Authorization: `Bearer ${bearer}` });

// Runs first: later tests use up the registrations.
test('oauth: a registration nobody used expires in a day; one signed in with keeps 90 days', async () => {
  const r = await register({ client_name: 'bounds', redirect_uris: [REDIRECT] }, '127.0.0.9');
  assert.equal(r.status, 201, r.text);
  const id = r.json.client_id;
  const ttl = Number(redis('TTL', `sf:oauth:client:{${id}}`));
  assert.ok(ttl > 86000 && ttl <= 86400, `an unused registration lives a day, not 90 days (TTL ${ttl})`);

  const t1 = await signIn(id);
  assert.equal(t1.status, 200, JSON.stringify(t1.json));
  const used = Number(redis('TTL', `sf:oauth:client:{${id}}`));
  assert.ok(used > 89 * 86400, `a used registration keeps the long life (TTL ${used})`);
});

test('oauth: revoking a grant ends every access token it issued at once, the rotated ones too', async () => {
  const r = await register({ client_name: 'bounds', redirect_uris: [REDIRECT] }, '127.0.0.7');
  assert.equal(r.status, 201, r.text);
  const id = r.json.client_id;
  const t1 = await signIn(id);
  assert.equal(t1.status, 200, JSON.stringify(t1.json));
  assert.equal((await listWith(t1.json.access_token)).status, 200);

  // a refresh rotates both tokens; the first access token still works until the grant ends
  const t2 = await token({ grant_type: 'refresh_token', refresh_token: t1.json.refresh_token, client_id: id });
  assert.equal(t2.status, 200, JSON.stringify(t2.json));
  assert.equal((await listWith(t1.json.access_token)).status, 200);
  assert.equal((await fetch(`${base.origin}/oauth/revoke`, { method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ token: t2.json.refresh_token }) })).status, 200);
  for (const at of [t1.json.access_token, t2.json.access_token]) {
    const dead = await listWith(at);
    assert.equal(dead.status, 401, 'every access token of a revoked grant is refused at once');
    assert.match(dead.json.error_description, /unknown or was revoked/);
  }
});

test('oauth: redirect URIs must be https or loopback http with a plain host', async () => {
  for (const bad of ['http:evil.example/cb', 'http://localhost:80@evil.example/cb',
    'http://127.0.0.1:80@evil.example/cb', 'https://user@good.example/cb', 'https:evil.example/cb',
    'http://localhost.evil.example/cb', 'http://127.0.0.1.evil.example/cb', 'https://good.example:x/cb',
    'com.example.app:/cb', 'javascript:alert(1)', 'https://good.example\\@evil.example/cb', 'https:///cb']) {
    const r = await register({ redirect_uris: [bad] }, '127.0.0.8');
    assert.equal(r.status, 400, `${bad} is refused`);
    assert.equal(r.json.error, 'invalid_client_metadata');
  }
  for (const good of ['https://app.example/cb', 'https://app.example:8443/cb?x=1',
    'http://127.0.0.1:33333/callback', 'http://localhost/cb', 'http://[::1]:8080/cb']) {
    const r = await register({ redirect_uris: [good] }, '127.0.0.8');
    assert.equal(r.status, 201, `${good}: ${r.text}`);
  }
});

test('oauth: /oauth/authorize never redirects to an unverified URI, even one registered before the rules', async () => {
  // registrations kept from before the strict rules (written as the gateway wrote them)
  for (const [i, bad] of ['http://localhost:80@evil.example/cb', 'http:evil.example/cb',
    'http://127.0.0.1:80@evil.example/cb'].entries()) {
    const id = `sfc_boundsold${i}${randomBytes(4).toString('hex')}`;
    redis('SET', `sf:oauth:client:{${id}}`, JSON.stringify({ client_id: id, client_name: 'old',
      redirect_uris: [bad], grant_types: ['authorization_code'], response_types: ['code'],
      token_endpoint_auth_method: 'none' }), 'EX', '600');
    for (const extra of [{ response_type: 'token' }, { code_challenge_method: 'plain' },
      { resource: 'https://other.example/mcp' }, {}]) {
      const q = new URLSearchParams({ response_type: 'code', client_id: id, redirect_uri: bad,
        code_challenge: 'x'.repeat(43), code_challenge_method: 'S256', ...extra });
      const r = await request('GET', `/oauth/authorize?${q}`);
      assert.equal(r.status, 400, `${bad} ${JSON.stringify(extra)}: ${r.status} ${r.headers.location}`);
      assert.equal(r.headers.location, undefined, 'no redirect');
      assert.match(r.text, /register again with a correct redirect URI/);
    }
  }
});

test('oauth: a registration flood from one address gets 429 + Retry-After, Redis stays bounded; the total is capped', async () => {
  const before = usedMemory();
  const seen = [];
  for (let i = 0; i < 300; i++) seen.push(await register({ client_name: 'flood', redirect_uris: [REDIRECT] }));
  const ok = seen.filter((r) => r.status === 201).length;
  assert.ok(ok <= PER_MIN, `at most ${PER_MIN} a minute from one address (${ok})`);
  const refused = seen.filter((r) => r.status === 429);
  assert.equal(refused.length + ok, seen.length);
  const ra = Number(refused[0].headers['retry-after']);
  assert.ok(ra >= 1 && ra <= 60, `Retry-After ${refused[0].headers['retry-after']}`);
  assert.match(refused[0].json.error_description, /oauth_register_per_min/);
  const grown = usedMemory() - before;
  assert.ok(grown < 512 * 1024, `300 registrations grew Redis by ${grown} bytes`);

  // many addresses: the total of unused registrations stops at oauth_clients_max
  let full = null;
  for (let a = 10; a < 20 && !full; a++) {
    for (let i = 0; i < PER_MIN && !full; i++) {
      const r = await register({ client_name: 'flood', redirect_uris: [REDIRECT] }, `127.0.0.${a}`);
      if (r.status === 429) full = r;
      else assert.equal(r.status, 201, r.text);
    }
  }
  assert.ok(full, 'the cap refused one');
  assert.match(full.json.error_description, /oauth_clients_max/);
  assert.ok(Number(full.headers['retry-after']) >= 1);
  assert.ok(clientKeys() <= CLIENTS_MAX + 10, `registrations kept: ${clientKeys()}`);
  assert.equal(Number(redis('ZCARD', 'sf:oauth:{reg}:unused')), CLIENTS_MAX);
});

test('guard: a flood of large answers kept for repeats stops at the team budget (guard_team_mib) with a sentence; another team still works', async () => {
  const key = execFileSync(`${env.SF_BUILD}/cli/sandfleet`, ['keys', 'create', '--team', 'guardflood'],
    { env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } })
    .toString().trim();
  const c = await connect(key);
  const sb = (await call(c, 'sandbox_create', { name: 'guardflood' })).structured.id;
  assert.ok(sb);
  // 258,000 bytes: under the claim-check size, so each answer is kept whole in its guard
  assert.equal((await sh(c, sb, "head -c 258000 /dev/zero | tr '\\0' a > /root/big && wc -c < /root/big")).stdout.trim(), '258000');
  let refused = null, ok = 0;
  for (let i = 0; i < 60 && !refused; i++) {
    const r = await call(c, 'sandbox_files_read', { sandbox_id: sb, path: '/root/big' });
    if (r.isError) refused = r;
    else ok++;
  }
  assert.ok(refused, `60 reads of 258 KB (${(60 * 258000 / 1048576).toFixed(1)} MiB) all kept: no budget`);
  assert.match(refused.text, /guard_team_mib, 4 MiB.*retry in a minute/);
  assert.ok(ok >= 12 && ok <= 17, `${ok} answers kept before the budget of ${GUARD_MIB} MiB`);
  const used = Number(redis('GET', 'sf:team:{guardflood}:gkb'));
  assert.ok(used >= (GUARD_MIB << 20) && used < (GUARD_MIB << 20) + 300000, `kept bytes ${used}`);
  // another team is not affected
  const b = await connect(env.SF_KEY_BETA);
  const other = await call(b, 'sandbox_list', {});
  assert.equal(other.isError, false, other.text);
  await b.close();
  // the flooding team can still kill what it holds
  const k = await call(c, 'sandbox_kill', { sandbox_id: sb });
  assert.equal(k.isError, false, k.text);
  await c.close();
});
