// Client ID metadata documents fetched for real, without a packet leaving the machine: this
// suite runs in a network namespace of its own (ctest starts it under `unshare -n`), where
// a public address (203.0.114.10, an ordinary global unicast address, on the namespace's
// loopback device) serves the documents over HTTPS with a certificate made here, trusted by
// the gateway through oauth_cimd_ca_file. A gateway and a Redis of its own run in the same
// namespace. Checks: a good document signs in end to end (page, form, code, tokens with the
// URL as client_id, `sandfleet tokens list`); a document too large, too slow, redirected,
// not JSON, naming another client_id, or asking for a client secret is refused with a
// sentence; the wrong certificate is refused; a document is fetched once for the sign-ins
// that follow (oauth_cimd_cache_s); one slow host (a second address, 203.0.114.11, serves
// the other) cannot hold every fetch slot. (The embedded Kafka broker runs here too: the
// gateway starts only with one.)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import https from 'node:https';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createHash, randomBytes } from 'node:crypto';
import { waitFor } from './bridge.mjs';
import { daemons } from './daemons.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const build = process.env.SF_BUILD;
if (!build) throw new Error('SF_BUILD is not set: run this through ctest (ops/test)');
const ADDR = '203.0.114.10';
const ORIGIN = `https://${ADDR}`;
const ADDR2 = '203.0.114.11';
const ORIGIN2 = `https://${ADDR2}`;
const hits = {};
const REDIRECT = 'http://127.0.0.1:9/callback';
const GW_PORT = 18080;
const REDIS_PORT = 16379;
const base = `http://127.0.0.1:${GW_PORT}`;
const dir = mkdtempSync(resolve(tmpdir(), 'sf-cimd-'));
const d = daemons(build);
let server, server2;
let slowHeld = [];

const sh = (cmd, args) => execFileSync(cmd, args, { encoding: 'utf8' });
const doc = (path, extra = {}) => JSON.stringify({ client_id: `${ORIGIN}${path}`, client_name: 'Netns app',
  redirect_uris: [REDIRECT], ...extra });
const pages = {
  '/good.json': () => [200, doc('/good.json')],
  '/big.json': () => [200, doc('/big.json', { padding: 'x'.repeat(6000) })],
  '/redirect.json': () => [302, '', { Location: '/good.json' }],
  '/notjson.json': () => [200, 'hello'],
  '/other-id.json': () => [200, doc('/good.json')],
  '/secret.json': () => [200, doc('/secret.json', { token_endpoint_auth_method: 'client_secret_basic' })],
  '/missing.json': () => [404, 'no'],
  '/cert.json': () => [200, doc('/cert.json')],
  '/counted.json': () => [200, doc('/counted.json')],
};

before(async () => {
  // the namespace: only its own loopback, holding the "public" address too
  assert.doesNotMatch(sh('ip', ['-o', 'link']), /eth|veth|ens|enp/, 'run this in a fresh network namespace');
  sh('ip', ['link', 'set', 'lo', 'up']);
  sh('ip', ['addr', 'add', `${ADDR}/32`, 'dev', 'lo']);
  sh('ip', ['addr', 'add', `${ADDR2}/32`, 'dev', 'lo']);
  sh('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-days', '2', '-subj', '/CN=cimd', '-addext', `subjectAltName=IP:${ADDR},IP:${ADDR2}`,
    '-keyout', `${dir}/key.pem`, '-out', `${dir}/cert.pem`]);
  sh('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-days', '2', '-subj', '/CN=other', '-addext', `subjectAltName=IP:${ADDR}`,
    '-keyout', `${dir}/other-key.pem`, '-out', `${dir}/other.pem`]);
  server = https.createServer({ key: readFileSync(`${dir}/key.pem`), cert: readFileSync(`${dir}/cert.pem`) },
    (req, res) => {
      hits[req.url] = (hits[req.url] ?? 0) + 1;
      if (req.url.startsWith('/slow')) { slowHeld.push(res); return; } // never answered
      const page = pages[req.url];
      const [status, body, headers] = page ? page() : [404, ''];
      res.writeHead(status, { 'Content-Type': 'application/json', ...headers }).end(body);
    });
  await new Promise((ok) => server.listen(443, ADDR, ok));
  server2 = https.createServer({ key: readFileSync(`${dir}/key.pem`), cert: readFileSync(`${dir}/cert.pem`) },
    (req, res) => res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify({
      client_id: `${ORIGIN2}${req.url}`, client_name: 'Second host', redirect_uris: [REDIRECT] })));
  await new Promise((ok) => server2.listen(443, ADDR2, ok));

  const brokers = await d.storeAndBroker(dir, REDIS_PORT);
  const common = { SF_REDIS_URL: `redis://127.0.0.1:${REDIS_PORT}`, SF_AUTH_SECRET_FILE: `${dir}/auth.key` };
  const gw = d.start('gateway', resolve(build, 'gateway/sandfleet-gateway'), [], { ...common,
    SF_PORT: String(GW_PORT), SF_KAFKA_BROKERS: brokers, SF_SCHEMAS_DIR: resolve(root, 'schemas/tools'),
    SF_OAUTH_CIMD_CA_FILE: `${dir}/cert.pem`, SF_OAUTH_CIMD_TIMEOUT_MS: '1500', SF_THREADS: '1',
    SF_LOG_LEVEL: 'info' });
  await d.gatewayReady(gw, base);
  process.env.SF_REDIS_URL = common.SF_REDIS_URL;
  process.env.SF_AUTH_SECRET_FILE = common.SF_AUTH_SECRET_FILE;
  process.env.SF_HOME = dir; // the CLI: this namespace's Redis, not an ops/run stack's
});

after(async () => {
  for (const r of slowHeld) r.destroy();
  server?.close();
  server2?.close();
  await d.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

const cli = (args) => sh(resolve(build, 'cli/sandfleet'), args);
const verifier = randomBytes(32).toString('base64url');
const challenge = createHash('sha256').update(verifier).digest('base64url');
const authorize = async (clientId) => {
  const r = await fetch(`${base}/oauth/authorize?${new URLSearchParams({ response_type: 'code',
    client_id: clientId, redirect_uri: REDIRECT, code_challenge: challenge, code_challenge_method: 'S256',
    state: 's', resource: `${base}/mcp` })}`, { redirect: 'manual' });
  return { status: r.status, headers: r.headers, text: await r.text() };
};

test('a client ID metadata document on a public address: the page, the form, tokens', async () => {
  const clientId = `${ORIGIN}/good.json`;
  const page = await authorize(clientId);
  assert.equal(page.status, 200, page.text);
  assert.match(page.text, /Netns app \(203\.0\.114\.10\)<\/span> asks to use your team/);
  const key = cli(['keys', 'create', '--team', 'cimd']).trim();
  const csrf = page.text.match(/name="csrf" value="([^"]+)"/)[1];
  const cookie = page.headers.get('set-cookie').split(';')[0];
  const done = await fetch(`${base}/oauth/authorize`, { method: 'POST', redirect: 'manual',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded', Cookie: cookie },
    body: new URLSearchParams({ csrf, api_key: key, decision: 'approve' }) });
  assert.equal(done.status, 302, await done.text());
  const code = new URL(done.headers.get('location')).searchParams.get('code');
  const tok = await fetch(`${base}/oauth/token`, { method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', code, client_id: clientId,
      redirect_uri: REDIRECT, code_verifier: verifier }) });
  const t = await tok.json();
  assert.equal(tok.status, 200, JSON.stringify(t));
  assert.match(t.access_token, /^sf_at_/);
  assert.match(cli(['tokens', 'list', '--team', 'cimd']), /cimd .* Netns app \(203\.0\.114\.10\)/);
  // the refresh token is bound to that client_id too
  const other = await fetch(`${base}/oauth/token`, { method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'refresh_token', refresh_token: t.refresh_token,
      client_id: `${ORIGIN}/secret.json` }) });
  assert.equal((await other.json()).error, 'invalid_grant');
});

test('bad documents are refused with a sentence, never a redirect', async () => {
  const cases = {
    '/big.json': /larger than 5120 bytes/,
    '/slow.json': /did not arrive within 1500 ms/,
    '/redirect.json': /answered HTTP 302 \(redirects are not followed\)/,
    '/notjson.json': /not valid JSON/,
    '/other-id.json': /must hold &quot;client_id&quot; equal to its own address/,
    '/secret.json': /only public clients/,
    '/missing.json': /answered HTTP 404/,
  };
  for (const [path, why] of Object.entries(cases)) {
    const r = await authorize(`${ORIGIN}${path}`);
    assert.equal(r.status, 400, path);
    assert.equal(r.headers.get('location'), null, path);
    assert.match(r.text, why, path);
  }
});

test('a certificate the gateway does not trust is refused', async () => {
  server.setSecureContext({ key: readFileSync(`${dir}/other-key.pem`), cert: readFileSync(`${dir}/other.pem`) });
  try {
    const r = await authorize(`${ORIGIN}/cert.json`); // not fetched before: nothing kept
    assert.equal(r.status, 400);
    assert.match(r.text, /could not be fetched: .*(certificate|SSL)/i);
  } finally {
    server.setSecureContext({ key: readFileSync(`${dir}/key.pem`), cert: readFileSync(`${dir}/cert.pem`) });
  }
});

test('a document is fetched once for the sign-ins that follow (oauth_cimd_cache_s)', async () => {
  for (let i = 0; i < 3; i++) {
    const page = await authorize(`${ORIGIN}/counted.json`);
    assert.equal(page.status, 200, page.text);
  }
  assert.equal(hits['/counted.json'], 1, 'three sign-ins, one fetch');
});

test('one slow host cannot hold every fetch slot', async () => {
  const held = slowHeld.length;
  const slow = Array.from({ length: 10 }, (_, i) => authorize(`${ORIGIN}/slow-${i}.json`));
  await waitFor('the slow host to hold fetches', () => slowHeld.length > held);
  const other = await authorize(`${ORIGIN2}/second.json`);
  assert.equal(other.status, 200, `another host's document is fetched while one host is slow: ${other.text}`);
  assert.match(other.text, /Second host \(203\.0\.114\.11\)/);
  const answers = await Promise.all(slow);
  for (const a of answers) assert.equal(a.status, 400);
  assert.ok(answers.some((a) => /already fetching client metadata documents from that host/.test(a.text)),
    'fetches beyond the per-host slots are refused with a sentence');
  assert.ok(slowHeld.length - held <= 2, `at most 2 fetches from one host at once (${slowHeld.length - held})`);
});
