// OAuth 2.1 end to end with the official SDK client's OAuth support: discovery from a 401,
// dynamic registration, authorization with PKCE through the real sign-in form (submitted as
// a browser would: the page's cookie and hidden CSRF field), token exchange, tool calls,
// refresh (rotation), revocation -> 401; and the attacks: a wrong redirect_uri, a missing or
// wrong PKCE verifier, a reused code, a token for another resource, a token of a revoked
// team key, a form post without its CSRF token. Also the 401s a person can read.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import { createHash, randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { env, url, post } from './lib.mjs';
import { sandfleetBin } from './bridge.mjs';

const base = new URL(url).origin;
const REDIRECT = 'http://127.0.0.1:9/callback'; // never reached: the test reads the redirect
const cli = (args, input) => execFileSync(sandfleetBin(env.SF_BUILD), args, { encoding: 'utf8', input,
  env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } });
const newKey = (team) => cli(['keys', 'create', '--team', team]).trim();

class Provider { // an OAuthClientProvider that keeps everything in memory
  constructor() { this.authUrl = null; }
  get redirectUrl() { return REDIRECT; }
  get clientMetadata() {
    return { client_name: 'sandfleet e2e <b>client</b>', redirect_uris: [REDIRECT],
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'],
      token_endpoint_auth_method: 'none' };
  }
  clientInformation() { return this.client; }
  saveClientInformation(c) { this.client = c; }
  tokens() { return this.saved; }
  saveTokens(t) { this.saved = t; }
  redirectToAuthorization(u) { this.authUrl = u; }
  saveCodeVerifier(v) { this.verifier = v; }
  codeVerifier() { return this.verifier; }
}

// The browser's part: open the page (it sets the CSRF cookie), post the form, read the
// redirect. Returns { status, location, page }.
async function signIn(authUrl, apiKey, { decision = 'approve', dropCookie = false } = {}) {
  const page = await fetch(authUrl, { redirect: 'manual' });
  const html = await page.text();
  if (page.status !== 200) return { status: page.status, page: html, location: page.headers.get('location') };
  assert.equal(page.headers.get('x-frame-options'), 'DENY');
  assert.match(page.headers.get('content-security-policy'), /frame-ancestors 'none'/);
  const cookie = page.headers.get('set-cookie').split(';')[0];
  const csrf = html.match(/name="csrf" value="([^"]+)"/)[1];
  const res = await fetch(new URL('/oauth/authorize', base), { method: 'POST', redirect: 'manual',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded', ...(dropCookie ? {} : { Cookie: cookie }) },
    body: new URLSearchParams({ csrf, api_key: apiKey, decision }) });
  return { status: res.status, location: res.headers.get('location'), page: await res.text() };
}

async function connectWithOAuth(apiKey) {
  const provider = new Provider();
  const first = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  await assert.rejects(new Client({ name: 'oauth-e2e', version: '1' }).connect(first),
    UnauthorizedError, 'no token yet: the SDK starts the OAuth flow');
  assert.ok(provider.client?.client_id, 'registered dynamically');
  const auth = new URL(provider.authUrl);
  assert.equal(auth.searchParams.get('code_challenge_method'), 'S256');
  assert.equal(auth.searchParams.get('resource'), url);
  const done = await signIn(auth, apiKey);
  assert.equal(done.status, 302, done.page);
  const back = new URL(done.location);
  assert.equal(back.origin + back.pathname, REDIRECT);
  assert.equal(back.searchParams.get('iss'), base);
  await first.finishAuth(back.searchParams.get('code'));
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  const client = new Client({ name: 'oauth-e2e', version: '1' });
  await client.connect(transport);
  return { client, provider };
}

const form = (o) => ({ method: 'POST', headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
  body: new URLSearchParams(o) });
const token = async (o) => {
  const r = await fetch(`${base}/oauth/token`, form(o));
  return { status: r.status, json: await r.json() };
};
const listWith = (bearer, headers = {}) => post({ jsonrpc: '2.0', id: 1, method: 'tools/call',
  params: { name: 'sandbox_list', arguments: {} } }, { Authorization: `Bearer ${bearer}`, ...headers });

// The MCP endpoint under another name (Host), as a proxy in front would present it: fetch
// does not let a caller set Host, node:http does.
function viaHost(host, bearer) {
  const u = new URL(url);
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call',
    params: { name: 'sandbox_list', arguments: {} } });
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST',
      headers: { Host: host, Authorization: `Bearer ${bearer}`, 'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream', 'Content-Length': Buffer.byteLength(body) } },
    (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, json: JSON.parse(text || 'null') }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

test('a missing key and a wrong key: 401s whose description names the problem, surfaced by the SDK', async () => {
  const missing = await post({ jsonrpc: '2.0', id: 1, method: 'ping' });
  assert.equal(missing.status, 401);
  assert.equal(missing.headers.get('www-authenticate'),
    `Bearer resource_metadata="${base}/.well-known/oauth-protected-resource/mcp"`);
  assert.match(missing.json.error_description, /Authentication required/);
  const wrong = await post({ jsonrpc: '2.0', id: 1, method: 'ping' }, { Authorization: 'Bearer sf_live_' + 'x'.repeat(32) });
  assert.equal(wrong.status, 401);
  assert.match(wrong.headers.get('www-authenticate'),
    /^Bearer error="invalid_token", error_description="The API key is not valid[^"]*", resource_metadata="/);
  assert.match(wrong.json.error_description, /The API key is not valid/);
  const t = new StreamableHTTPClientTransport(new URL(url),
    { requestInit: { headers: { Authorization: 'Bearer sf_live_' + 'y'.repeat(32) } } });
  await assert.rejects(new Client({ name: 'x', version: '1' }).connect(t), /The API key is not valid/);
  const none = new StreamableHTTPClientTransport(new URL(url));
  await assert.rejects(new Client({ name: 'x', version: '1' }).connect(none), /Authentication required: send a sandfleet API key/);
});

test('metadata: protected resource (RFC 9728) and authorization server (RFC 8414)', async () => {
  const prm = await (await fetch(`${base}/.well-known/oauth-protected-resource/mcp`)).json();
  assert.deepEqual(prm.authorization_servers, [base]);
  assert.equal(prm.resource, url);
  const as = await (await fetch(`${base}/.well-known/oauth-authorization-server`)).json();
  assert.equal(as.issuer, base);
  assert.deepEqual(as.code_challenge_methods_supported, ['S256']);
  assert.deepEqual(as.token_endpoint_auth_methods_supported, ['none']);
});

test('the SDK signs in with OAuth, calls tools, refreshes (rotating), and revocation ends it', async () => {
  const { client, provider } = await connectWithOAuth(env.SF_KEY_ALPHA);
  const created = await client.callTool({ name: 'sandbox_create', arguments: { name: 'oauth' } });
  const id = created.structuredContent.id;
  const ex = await client.callTool({ name: 'sandbox_exec', arguments: { sandbox_id: id, command: 'echo hi' } });
  assert.equal(ex.structuredContent.stdout, 'hi\n');
  await client.callTool({ name: 'sandbox_kill', arguments: { sandbox_id: id } });
  await client.close();

  const { access_token: at1, refresh_token: rt1 } = provider.saved;
  assert.match(at1, /^sf_at_/);
  const r1 = await token({ grant_type: 'refresh_token', refresh_token: rt1, client_id: provider.client.client_id });
  assert.equal(r1.status, 200, JSON.stringify(r1.json));
  assert.notEqual(r1.json.refresh_token, rt1, 'the refresh token rotates');
  assert.equal((await listWith(r1.json.access_token)).status, 200);
  // the old refresh token again: a stolen copy, so the whole grant ends
  const again = await token({ grant_type: 'refresh_token', refresh_token: rt1, client_id: provider.client.client_id });
  assert.equal(again.status, 400);
  assert.equal(again.json.error, 'invalid_grant');
  const dead = await listWith(r1.json.access_token);
  assert.equal(dead.status, 401, 'a rotated refresh token reused revokes the grant');
  assert.match(dead.json.error_description, /unknown or was revoked/);

  // explicit revocation (RFC 7009)
  const { provider: p2 } = await connectWithOAuth(env.SF_KEY_ALPHA);
  assert.equal((await listWith(p2.saved.access_token)).status, 200);
  assert.equal((await fetch(`${base}/oauth/revoke`, form({ token: p2.saved.access_token }))).status, 200);
  const revoked = await listWith(p2.saved.access_token);
  assert.equal(revoked.status, 401);
  assert.match(revoked.headers.get('www-authenticate'), /error="invalid_token", error_description="The access token is unknown or was revoked/);
});

// A registered client and a PKCE pair, for the attacks.
async function registered() {
  const r = await fetch(`${base}/oauth/register`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_name: 'attacks', redirect_uris: [REDIRECT] }) });
  assert.equal(r.status, 201);
  const verifier = randomBytes(32).toString('base64url');
  const challenge = createHash('sha256').update(verifier).digest('base64url');
  const client = await r.json();
  const authUrl = (extra = {}) => `${base}/oauth/authorize?${new URLSearchParams({ response_type: 'code',
    client_id: client.client_id, redirect_uri: REDIRECT, code_challenge: challenge,
    code_challenge_method: 'S256', state: 'st', resource: url, ...extra })}`;
  return { client, verifier, authUrl };
}

const codeOf = (loc) => new URL(loc).searchParams.get('code');

test('attacks are refused: redirect_uri, PKCE, code reuse, resource, revoked key, CSRF', async () => {
  const { client, verifier, authUrl } = await registered();
  const cid = client.client_id;

  // a redirect_uri it did not register: an error page, never a redirect
  const evil = await fetch(authUrl({ redirect_uri: 'https://evil.example/cb' }), { redirect: 'manual' });
  assert.equal(evil.status, 400);
  assert.equal(evil.headers.get('location'), null);
  assert.match(await evil.text(), /did not register/);
  assert.equal((await fetch(`${base}/oauth/register`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ redirect_uris: ['http://evil.example/cb'] }) })).status, 400, 'plain http off loopback');

  // no PKCE: refused before any sign-in
  const nopkce = await fetch(authUrl({ code_challenge: '' }), { redirect: 'manual' });
  assert.equal(nopkce.status, 302);
  assert.equal(new URL(nopkce.headers.get('location')).searchParams.get('error'), 'invalid_request');

  // a wrong (or missing) verifier
  let s = await signIn(authUrl(), env.SF_KEY_ALPHA);
  assert.equal((await token({ grant_type: 'authorization_code', code: codeOf(s.location), client_id: cid,
    redirect_uri: REDIRECT, code_verifier: randomBytes(32).toString('base64url') })).json.error, 'invalid_grant');
  s = await signIn(authUrl(), env.SF_KEY_ALPHA);
  assert.equal((await token({ grant_type: 'authorization_code', code: codeOf(s.location), client_id: cid,
    redirect_uri: REDIRECT })).json.error, 'invalid_grant');

  // a wrong redirect_uri at the token endpoint, then a reused code (which also ends the first grant)
  s = await signIn(authUrl(), env.SF_KEY_ALPHA);
  const code = codeOf(s.location);
  const good = await token({ grant_type: 'authorization_code', code, client_id: cid, redirect_uri: REDIRECT,
    code_verifier: verifier, resource: url });
  assert.equal(good.status, 200, JSON.stringify(good.json));
  assert.equal((await listWith(good.json.access_token)).status, 200);
  const reuse = await token({ grant_type: 'authorization_code', code, client_id: cid, redirect_uri: REDIRECT,
    code_verifier: verifier });
  assert.equal(reuse.json.error, 'invalid_grant');
  assert.equal((await listWith(good.json.access_token)).status, 401, 'the reused code revoked its grant');

  // a token for another resource: asked for, refused; presented elsewhere, refused
  const other = await fetch(authUrl({ resource: 'https://other.example/mcp' }), { redirect: 'manual' });
  assert.equal(new URL(other.headers.get('location')).searchParams.get('error'), 'invalid_target');
  s = await signIn(authUrl(), env.SF_KEY_ALPHA);
  const t2 = await token({ grant_type: 'authorization_code', code: codeOf(s.location), client_id: cid,
    redirect_uri: REDIRECT, code_verifier: verifier });
  const elsewhere = await viaHost(`localhost:${new URL(url).port}`, t2.json.access_token);
  assert.equal(elsewhere.status, 401);
  assert.match(elsewhere.json.error_description, /issued for another resource/);

  // a token of a team key that is then revoked
  const key = newKey('oauthrevoke');
  s = await signIn(authUrl(), key);
  const t3 = await token({ grant_type: 'authorization_code', code: codeOf(s.location), client_id: cid,
    redirect_uri: REDIRECT, code_verifier: verifier });
  assert.equal((await listWith(t3.json.access_token)).status, 200);
  const keyId = cli(['keys', 'list', '--team', 'oauthrevoke']).split('\n')[1].split(/\s+/)[0];
  cli(['keys', 'revoke', keyId]);
  const gone = await listWith(t3.json.access_token);
  assert.equal(gone.status, 401);
  assert.match(gone.json.error_description, /API key this token was granted with has been revoked/);
  assert.equal((await token({ grant_type: 'refresh_token', refresh_token: t3.json.refresh_token,
    client_id: cid })).json.error, 'invalid_grant');

  // a post without the page's cookie (another site's form): refused
  const csrf = await signIn(authUrl(), env.SF_KEY_ALPHA, { dropCookie: true });
  assert.equal(csrf.status, 403);
  assert.match(csrf.page, /did not come from the sign-in page/);

  // a wrong API key shows the form again with a sentence; deny goes back with access_denied
  const bad = await signIn(authUrl(), 'sf_live_' + 'z'.repeat(32));
  assert.equal(bad.status, 400);
  assert.match(bad.page, /That API key is not valid/);
  const denied = await signIn(authUrl(), '', { decision: 'deny' });
  assert.equal(new URL(denied.location).searchParams.get('error'), 'access_denied');
  assert.equal(new URL(denied.location).searchParams.get('state'), 'st');
});

// Client ID metadata documents: a client_id that is a URL. No packet may leave this machine
// in a test, so only refusals are exercised here: every address below is loopback, private
// or reserved, or the URL is refused before any lookup. A listener on loopback proves the
// refusal comes before the connection (it must see none). Real fetches: cimd_netns.mjs, in
// a network namespace of its own.
test('client ID metadata documents: only https, only public addresses, refused before connecting', async () => {
  const as = await (await fetch(`${base}/.well-known/oauth-authorization-server`)).json();
  assert.equal(as.client_id_metadata_document_supported, true);
  let connections = 0;
  const trap = net.createServer((s) => { connections++; s.destroy(); });
  await new Promise((ok) => trap.listen(0, '127.0.0.1', ok));
  const port = trap.address().port;
  const verifier = randomBytes(32).toString('base64url');
  const challenge = createHash('sha256').update(verifier).digest('base64url');
  const authorize = async (clientId) => {
    const r = await fetch(`${base}/oauth/authorize?${new URLSearchParams({ response_type: 'code',
      client_id: clientId, redirect_uri: REDIRECT, code_challenge: challenge,
      code_challenge_method: 'S256', resource: url })}`, { redirect: 'manual' });
    return { status: r.status, location: r.headers.get('location'), text: await r.text() };
  };
  try {
    const notPublic = [`https://127.0.0.1:${port}/client.json`, `https://localhost:${port}/client.json`,
      `https://[::ffff:127.0.0.1]:${port}/client.json`, `https://[::1]:${port}/client.json`,
      'https://10.1.2.3/client.json', 'https://172.16.0.1/c', 'https://192.168.1.1/c',
      'https://169.254.169.254/latest/meta-data', 'https://100.64.0.1/c', 'https://0.0.0.0/c',
      'https://[fd00::1]/c', 'https://[fe80::1]/c', 'https://224.0.0.1/c', 'https://2130706433/c'];
    for (const id of notPublic) {
      const r = await authorize(id);
      assert.equal(r.status, 400, id);
      assert.equal(r.location, null, `${id}: never a redirect`);
      assert.match(r.text, /loopback, private or reserved address; documents are fetched only from public addresses/, id);
    }
    const malformed = {
      [`http://127.0.0.1:${port}/client.json`]: /must use https/,
      'https://127.0.0.1': /must have a path/,
      'https://127.0.0.1/': /must have a path/,
      'https://user:pw@127.0.0.1/c': /user name or password/,
      'https://127.0.0.1/a/../c': /\. or \.\. path segments/,
      [`https://127.0.0.1/${'a'.repeat(2100)}`]: /too long/,
    };
    for (const [id, why] of Object.entries(malformed)) {
      const r = await authorize(id);
      assert.equal(r.status, 400, id);
      assert.match(r.text, why, id);
    }
    assert.equal(connections, 0, 'no connection was ever opened to a non-public address');
  } finally {
    trap.close();
  }
});
