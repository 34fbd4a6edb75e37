// OAuth sign-in without internet (issue 27 item 3): clients that name themselves by a client
// ID metadata document URL (Claude Code, Codex) sign in through the operator's documents
// (oauth_cimd_dir: the shipped gateway/cimd, copied here beside one of the test's own)
// instead of a fetch. The suite runs in a network namespace of its own (ctest starts it
// under `unshare -n`: only a loopback device, no route, no DNS server), with its own Redis,
// broker and gateway; headless Chromium (playwright-core, Debian's chromium) drives the
// sign-in page as a person would, back to the client's loopback callback on the port it
// chose (RFC 8252), and the code trades for tokens. The requests carry what those clients
// send (their client_id URLs, loopback /callback redirect URIs on an ephemeral port, PKCE
// S256; Codex's per-callback client_id .../codex/<id>/client.json). The real CLIs sign in
// too: Codex 0.171.0 (`codex mcp login`) and Claude Code 2.1.332 (`claude mcp login`, in a
// terminal that `script` gives it), pinned in package.json and installed by ops/test's
// `npm ci` (SF_CODEX_BIN / SF_CLAUDE_BIN override them); a missing one fails its test,
// saying how to install it.
// Also: a URL with no document in the folder still tries the network and says it could
// not be fetched; a folder document with a redirect URI off loopback stops the gateway at
// start with a sentence, unless oauth_cimd_dir_any_redirect is set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import http from 'node:http';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createHash, randomBytes } from 'node:crypto';
import { launchChromium } from './browser.mjs';
import { waitFor } from './bridge.mjs';
import { daemons } from './daemons.mjs';
import { clientBin } from './clients.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const build = process.env.SF_BUILD;
if (!build) throw new Error('SF_BUILD is not set: run this through ctest (ops/test)');
const GW_PORT = 18081;
const REDIS_PORT = 16380;
const base = `http://127.0.0.1:${GW_PORT}`;
const dir = mkdtempSync(resolve(tmpdir(), 'sf-cimd-offline-'));
const docs = `${dir}/cimd`;
const OWN = 'https://tools.example.test/oauth/app.json'; // the operator's own entry
const d = daemons(build);
const callbacks = [];
let browser, site, port;

const sh = (cmd, args) => execFileSync(cmd, args, { encoding: 'utf8' });
const common = { SF_REDIS_URL: `redis://127.0.0.1:${REDIS_PORT}`, SF_AUTH_SECRET_FILE: `${dir}/auth.key` };

before(async () => {
  assert.doesNotMatch(sh('ip', ['-o', 'link']), /eth|veth|ens|enp/, 'run this in a fresh network namespace');
  sh('ip', ['link', 'set', 'lo', 'up']);
  mkdirSync(docs);
  for (const f of ['claude-code.json', 'codex.json', 'codex-callback.json'])
    copyFileSync(resolve(root, 'gateway/cimd', f), `${docs}/${f}`);
  writeFileSync(`${docs}/own.json`, JSON.stringify({ client_id: OWN, client_name: 'Operator app',
    redirect_uris: ['http://127.0.0.1/cb'] }));
  // the clients' loopback callback: a port of their own choosing
  site = http.createServer((req, res) => {
    const u = new URL(req.url, 'http://x');
    callbacks.push({ path: u.pathname, params: u.searchParams });
    res.writeHead(200, { 'Content-Type': 'text/html' }).end('<h1>Back at the client</h1>');
  });
  await new Promise((ok) => site.listen(0, '127.0.0.1', ok));
  port = site.address().port;

  const brokers = await d.storeAndBroker(dir, REDIS_PORT);
  const gw = d.start('gateway', resolve(build, 'gateway/sandfleet-gateway'), [], { ...common,
    SF_PORT: String(GW_PORT), SF_KAFKA_BROKERS: brokers,
    SF_SCHEMAS_DIR: resolve(root, 'schemas/tools'), SF_OAUTH_CIMD_DIR: docs,
    SF_OAUTH_CIMD_TIMEOUT_MS: '3000', SF_THREADS: '2', SF_LOG_LEVEL: 'info' });
  await d.gatewayReady(gw, base);
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  site?.close();
  await d.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

const newKey = (team) => execFileSync(resolve(build, 'cli/sandfleet'), ['keys', 'create', '--team', team],
  { encoding: 'utf8', env: { ...process.env, ...common, SF_HOME: dir } }).trim();
const pkce = () => {
  const verifier = randomBytes(32).toString('base64url');
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') };
};
const authUrl = (clientId, redirect, challenge, state) => `${base}/oauth/authorize?${new URLSearchParams({
  response_type: 'code', client_id: clientId, redirect_uri: redirect, code_challenge: challenge,
  code_challenge_method: 'S256', state, resource: `${base}/mcp` })}`;

// A person signs in on the page in Chromium; the client gets its code and trades it.
async function signIn(clientId, host, shown, path = '/callback') {
  const redirect = `http://${host}:${port}${path}`;
  const { verifier, challenge } = pkce();
  const state = randomBytes(8).toString('hex');
  const context = await browser.newContext();
  const page = await context.newPage();
  const res = await page.goto(authUrl(clientId, redirect, challenge, state));
  assert.equal(res.status(), 200, await page.textContent('body'));
  assert.equal(await page.title(), 'Sign in to sandfleet');
  assert.match(await page.textContent('body'), new RegExp(`${shown} asks to use your team's sandboxes`));
  await page.fill('input[name="api_key"]', newKey('offline'));
  await Promise.all([page.waitForURL(`${redirect}**`), page.click('button[value="approve"]')]);
  assert.equal(await page.textContent('h1'), 'Back at the client');
  await context.close();
  const back = callbacks.find((c) => c.params.get('state') === state);
  assert.ok(back, 'the browser came back to the client');
  const t = await fetch(`${base}/oauth/token`, { method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', code: back.params.get('code'),
      client_id: clientId, redirect_uri: redirect, code_verifier: verifier, resource: `${base}/mcp` }) });
  const tok = await t.json();
  assert.equal(t.status, 200, JSON.stringify(tok));
  assert.match(tok.access_token, /^sf_at_/);
  // the token works at the MCP endpoint
  const init = await fetch(`${base}/mcp`, { method: 'POST', headers: { Authorization: `Bearer ${tok.access_token}`,
    'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
  body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18',
    capabilities: {}, clientInfo: { name: 'offline', version: '1' } } }) });
  assert.equal(init.status, 200, await init.text());
}

test('nothing to fetch from here: an unknown client ID URL cannot be fetched', async () => {
  const { challenge } = pkce();
  const r = await fetch(authUrl('https://unknown.example.test/client.json', `http://127.0.0.1:${port}/callback`,
    challenge, 's'), { redirect: 'manual' });
  assert.equal(r.status, 400);
  assert.match(await r.text(), /could not be fetched|did not arrive/);
});

test('Claude Code signs in offline through the shipped document (localhost, any port)', async () => {
  await signIn('https://claude.ai/oauth/claude-code-client-metadata', 'localhost', 'Claude Code \\(claude\\.ai\\)');
});

test('Codex signs in offline through the shipped document (127.0.0.1, any port)', async () => {
  await signIn('https://chatgpt.com/oauth/codex/client.json', '127.0.0.1', 'Codex \\(chatgpt\\.com\\)');
});

test("Codex's per-callback client ID signs in offline through the shipped template", async () => {
  const id = randomBytes(9).toString('base64url');
  await signIn(`https://chatgpt.com/oauth/codex/${id}/client.json`, '127.0.0.1', 'Codex \\(chatgpt\\.com\\)',
    `/callback/${id}`);
  // another callback id's path is not this client's; an id that is not one segment is no match
  const { challenge } = pkce();
  const other = await fetch(authUrl(`https://chatgpt.com/oauth/codex/${id}/client.json`,
    `http://127.0.0.1:${port}/callback/other`, challenge, 's'), { redirect: 'manual' });
  assert.equal(other.status, 400);
  assert.match(await other.text(), /did not register/);
  const deep = await fetch(authUrl('https://chatgpt.com/oauth/codex/a/b/client.json',
    `http://127.0.0.1:${port}/callback/a/b`, challenge, 's'), { redirect: 'manual' });
  assert.equal(deep.status, 400);
  assert.match(await deep.text(), /could not be fetched|did not arrive/);
});

// A person approves the sign-in link the CLI printed; the browser goes back to the CLI.
async function approve(link, shown, team) {
  const context = await browser.newContext();
  const page = await context.newPage();
  assert.equal((await page.goto(link)).status(), 200, await page.textContent('body'));
  assert.match(await page.textContent('body'), new RegExp(`${shown} asks to use your team's sandboxes`));
  await page.fill('input[name="api_key"]', newKey(team));
  await Promise.all([page.waitForURL(/^http:\/\/(127\.0\.0\.1|localhost):\d+\/callback/),
    page.click('button[value="approve"]')]);
  await context.close();
}

test('the real Claude Code signs in offline (claude mcp login in a terminal, Chromium for the person)', async () => {
    const claudeBin = clientBin('SF_CLAUDE_BIN', 'claude');
    const home = `${dir}/claude-home`;
    mkdirSync(home);
    const env = { ...process.env, HOME: home };
    const add = spawnSync(claudeBin, ['mcp', 'add', '--transport', 'http', '--scope', 'user', 'sandfleet',
      `${base}/mcp`], { env, encoding: 'utf8', timeout: 60000 });
    assert.equal(add.status, 0, add.stderr + add.stdout);
    // `claude mcp login` wants a terminal: script(1) gives it one; stdin stays open
    const p = spawn('script', ['-qfec', `'${claudeBin}' mcp login sandfleet --no-browser`, '/dev/null'],
      { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { out += d; });
    const exited = new Promise((r) => p.on('exit', r));
    try {
      const link = await waitFor('claude to print the sign-in address',
        () => out.match(/http:\/\/127\.0\.0\.1:\d+\/oauth\/authorize[^\s\x07\x1b]+/)?.[0], 60000);
      assert.match(decodeURIComponent(link), /client_id=https:\/\/claude\.ai\/oauth\/claude-code-client-metadata&/);
      assert.match(decodeURIComponent(link), /redirect_uri=http:\/\/localhost:\d+\/callback&/);
      await approve(link, 'Claude Code \\(claude\\.ai\\)', 'claude');
      assert.equal(await exited, 0, out);
      assert.match(out, /Authenticated with "sandfleet"/);
    } finally {
      p.kill();
    }
  });
test('the real Codex CLI signs in offline (codex mcp login, Chromium for the person)', async () => {
    const codexBin = clientBin('SF_CODEX_BIN', 'codex');
    const home = `${dir}/codex-home`;
    mkdirSync(home);
    writeFileSync(`${home}/config.toml`, `[mcp_servers.sandfleet]\nurl = "${base}/mcp"\n`);
    const p = spawn(codexBin, ['mcp', 'login', 'sandfleet', '--no-browser', '--oauth-client-registration', 'cimd'],
      { env: { ...process.env, CODEX_HOME: home }, stdio: ['pipe', 'pipe', 'pipe'] }); // stdin stays open
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { out += d; });
    const exited = new Promise((r) => p.on('exit', r));
    try {
      const link = await waitFor('codex to print the sign-in address',
        () => out.match(/http:\/\/127\.0\.0\.1:\d+\/oauth\/authorize\S+/)?.[0], 30000);
      assert.match(decodeURIComponent(link), /client_id=https:\/\/chatgpt\.com\/oauth\/codex\//);
      await approve(link, 'Codex \\(chatgpt\\.com\\)', 'codex');
      assert.equal(await exited, 0, out);
      assert.match(out, /Successfully logged in to MCP server 'sandfleet'/);
    } finally {
      p.kill();
    }
  });

test("the operator's own document; a redirect it does not list is refused", async () => {
  const { challenge } = pkce();
  const page = await fetch(authUrl(OWN, `http://127.0.0.1:${port}/cb`, challenge, 's'), { redirect: 'manual' });
  assert.equal(page.status, 200);
  assert.match(await page.text(), /Operator app \(tools\.example\.test\)/);
  for (const bad of [`http://127.0.0.1:${port}/callback`, `http://localhost:${port}/cb`, 'https://evil.example/cb']) {
    const r = await fetch(authUrl(OWN, bad, challenge, 's'), { redirect: 'manual' });
    assert.equal(r.status, 400, bad);
    assert.equal(r.headers.get('location'), null, bad);
    assert.match(await r.text(), /did not register/, bad);
  }
});

test('a folder document off loopback stops the gateway at start, unless the operator allows it', async () => {
  const bad = `${dir}/bad`;
  mkdirSync(bad);
  writeFileSync(`${bad}/web.json`, JSON.stringify({ client_id: 'https://web.example.test/c.json',
    redirect_uris: ['https://web.example.test/cb'] }));
  const env = { ...process.env, ...common, SF_PORT: '0', SF_KAFKA_BROKERS: '127.0.0.1:1',
    SF_SCHEMAS_DIR: resolve(root, 'schemas/tools'), SF_OAUTH_CIMD_DIR: bad };
  const r = spawnSync(resolve(build, 'gateway/sandfleet-gateway'), [], { env, encoding: 'utf8', timeout: 20000 });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /web\.json lists the redirect URI https:\/\/web\.example\.test\/cb, which is not on loopback .* oauth_cimd_dir_any_redirect/);
  writeFileSync(`${bad}/web.json`, '{"client_id": 5}');
  const r2 = spawnSync(resolve(build, 'gateway/sandfleet-gateway'), [], { env, encoding: 'utf8', timeout: 20000 });
  assert.equal(r2.status, 2, r2.stderr);
  assert.match(r2.stderr, /web\.json is not a JSON object with a client_id; fix or remove that file/);
  // allowed: the same kind of document loads (the gateway then goes on to start; stopped here)
  writeFileSync(`${bad}/web.json`, JSON.stringify({ client_id: 'https://web.example.test/c.json',
    redirect_uris: ['https://web.example.test/cb'] }));
  const gw = d.start('gateway-any', resolve(build, 'gateway/sandfleet-gateway'), [], { ...env,
    SF_PORT: String(GW_PORT + 1), SF_KAFKA_BROKERS: readFileSync(`${dir}/kafka`, 'utf8').trim(),
    SF_OAUTH_CIMD_DIR_ANY_REDIRECT: '1', SF_THREADS: '1' });
  await d.gatewayReady(gw, `http://127.0.0.1:${GW_PORT + 1}`);
});
