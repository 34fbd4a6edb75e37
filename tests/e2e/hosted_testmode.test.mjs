// Hosted MCP servers' test mode (issue 24): POST /mcp?name=NAME&test_mode=true&repo_url=URL&
// entrypoint=FILE runs an unregistered server straight from a git repository, for a team whose
// operator turned it on (`sandfleet teams limits TEAM --hosted-test-mode on`). The session's
// sandbox clones the repository over HTTPS through its egress proxy and installs its
// requirements.txt there too. Real stack, real servers (the official Python SDK's; a Node
// one), the official TypeScript SDK client; the one fake is the proxy tests' upstream standing
// in for internet hosts: its file server (`sp_upstream --files`) started once more in the
// stack's test internet as an HTTPS git host and package index at
// https://api.example.test:8443/files/, with a certificate the sandboxes trust (signed by
// the stack's egress CA, as a real host's is by a public CA; HTTPS to a host without a bound
// secret is tunnelled, so the sandbox checks the host's own certificate).
import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync, spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, readdirSync, mkdirSync, copyFileSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { env, url, driver, bearer, cli } from './lib.mjs';

const uniq = Date.now().toString(36);
const STATE = process.env.SF_E2E_STATE ?? env.SF_STATE;
const FILES = join(STATE, 'upstream/files');
const UP = 'https://api.example.test:8443/files';
const UPLOG = join(STATE, `upstream/testmode-${uniq}.jsonl`);
const skip = { skip: driver !== 'jail' && 'the e2e test internet (the fake upstream) is set up for jail stacks' };

const PY_SERVER = `
from mcp.server.mcpserver import MCPServer

server = MCPServer("py-testmode")
count = 0

@server.tool()
def bump() -> str:
    """Counts calls in this session."""
    global count
    count += 1
    return str(count)

server.run()
`;

// A Node server without dependencies (stdio, one JSON-RPC message a line).
const NODE_SERVER = `
import { createInterface } from 'node:readline';
let n = 0;
const out = (m) => process.stdout.write(JSON.stringify(m) + '\\n');
createInterface({ input: process.stdin }).on('line', (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  if (m.method === 'initialize')
    out({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: 'node-testmode', version: '1.0.0' } } });
  else if (m.method === 'tools/list')
    out({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'inc', inputSchema: { type: 'object' } }] } });
  else if (m.method === 'tools/call')
    out({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text: String(++n) }] } });
  else out({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no such method' } });
});
`;

// A bare repository at https://api.example.test/files/NAME.git (dumb HTTP) holding files and
// links ({path: content} and {path: {link: target}}).
function repo(name, files) {
  const work = mkdtempSync(join(tmpdir(), 'sf-tm-'));
  for (const [p, c] of Object.entries(files)) {
    mkdirSync(dirname(join(work, p)), { recursive: true });
    if (typeof c === 'string') writeFileSync(join(work, p), c);
    else symlinkSync(c.link, join(work, p));
  }
  const bare = join(FILES, `${name}.git`);
  const g = 'git -c user.name=t -c user.email=t@example.test -c init.defaultBranch=main';
  const r = spawnSync('sh', ['-c', `set -e; cd ${work}; ${g} init -q .; ${g} add -A; ${g} commit -qm server;
    git clone -q --bare . ${bare}; cd ${bare}; git update-server-info`], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return `${UP}/${name}.git`;
}

// The MCP Python SDK's wheels (ops/lib.sh sf_hosted_wheels) served as a find-links page by the
// fake upstream: the test repository's requirements.txt installs from there through egress.
function wheelIndex() {
  const root = join(import.meta.dirname, '../..');
  const r = spawnSync('bash', ['-c', '. ops/lib.sh && sf_hosted_wheels'], { cwd: root, encoding: 'utf8', timeout: 300000 });
  assert.equal(r.status, 0, `sf_hosted_wheels: ${r.stderr}`);
  const src = join(root, '.test-cache/hosted-wheels');
  const dir = join(FILES, `wheels-${uniq}`);
  mkdirSync(dir, { recursive: true });
  const whl = readdirSync(src).filter((f) => f.endsWith('.whl'));
  for (const f of whl) copyFileSync(join(src, f), join(dir, f));
  writeFileSync(join(dir, 'index.html'), `<html><body>${whl.map((f) => `<a href="${f}">${f}</a>`).join('\n')}</body></html>`);
  return `${UP}/wheels-${uniq}/index.html`;
}

// The HTTPS git host: sp_upstream in the stack's upstream namespace on port 8443, its
// certificate for api.example.test signed by the stack's egress CA.
let gitHost;
async function httpsGitHost() {
  const root = join(import.meta.dirname, '../..');
  const dir = mkdtempSync(join(tmpdir(), 'sf-tm-tls-'));
  const r = spawnSync('bash', ['-c', `set -e; . tests/proxy/lib.sh; sp_world_vars "${STATE}/upstream" 198.19
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=api.example.test \
      -keyout ${dir}/git.key -out ${dir}/git.csr 2>/dev/null
    printf 'subjectAltName=DNS:api.example.test\n' >${dir}/git.ext
    openssl x509 -req -in ${dir}/git.csr -CA "${STATE}/egress-ca.pem" -CAkey "${STATE}/egress-ca.key" \
      -CAcreateserial -CAserial ${dir}/ca.srl -days 1 -extfile ${dir}/git.ext -out ${dir}/git.pem 2>/dev/null
    echo $SP_UPNS`], { cwd: root, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const ns = r.stdout.trim().split('\n').pop();
  gitHost = spawn('ip', ['netns', 'exec', ns, `${env.SF_BUILD}/tests/proxy/sp_upstream`, '--https', '8443',
    '--cert', join(dir, 'git.pem'), '--key', join(dir, 'git.key'), '--files', FILES, '--log', UPLOG], { stdio: 'ignore' });
  for (let i = 0; i < 200; i++) { // until it listens
    if (spawnSync('ip', ['netns', 'exec', ns, 'bash', '-c', 'exec 3<>/dev/tcp/127.0.0.1/8443']).status === 0) return;
    await new Promise((res) => setTimeout(res, 50));
  }
  assert.fail('the HTTPS git host did not start');
}

function upstreamSaw(prefix) {
  return readFileSync(UPLOG, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
    .filter((e) => e.uri?.startsWith(prefix));
}

function tmUrl(name, repoUrl, entry) {
  const u = new URL(url);
  u.searchParams.set('name', name);
  u.searchParams.set('test_mode', 'true');
  if (repoUrl !== undefined) u.searchParams.set('repo_url', repoUrl);
  if (entry !== undefined) u.searchParams.set('entrypoint', entry);
  return u;
}

const opened = new Set();
async function open(u, key = env.SF_KEY_ALPHA) {
  const transport = new StreamableHTTPClientTransport(u, { requestInit: { headers: bearer(key) } });
  const client = new Client({ name: 'testmode-e2e', version: '1.0.0' });
  await client.connect(transport);
  const h = { client, transport };
  opened.add(h);
  return h;
}
async function end(h) {
  opened.delete(h);
  try { await h.transport.terminateSession(); } finally { await h.client.close(); }
}
const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('');

// A raw initialize (what a client that does not retry sees).
async function init(u, key = env.SF_KEY_ALPHA, headers = {}) {
  const res = await fetch(u, { method: 'POST', headers: { 'Content-Type': 'application/json',
    Accept: 'application/json, text/event-stream', ...bearer(key), ...headers },
  body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } } }) });
  const body = await res.text();
  let json = null;
  try { json = JSON.parse(body); } catch { /* SSE or nothing */ }
  return { status: res.status, body, message: json?.error?.message ?? '' };
}

let PY_REPO, NODE_REPO;
before(async () => {
  if (driver !== 'jail') return;
  await httpsGitHost();
  PY_REPO = repo(`tm-py-${uniq}`, { 'server.py': PY_SERVER,
    'requirements.txt': `--no-index\n--find-links ${wheelIndex()}\nmcp\n` });
  NODE_REPO = repo(`tm-node-${uniq}`, { 'src/server.mjs': NODE_SERVER,
    'package.json': JSON.stringify({ name: 'node-testmode', version: '1.0.0', type: 'module' }) });
});

afterEach(async () => {
  for (const h of [...opened]) await end(h).catch(() => {});
});

after(() => {
  gitHost?.kill();
  if (driver !== 'jail') return;
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'off']);
  cli(['teams', 'limits', 'beta', '--hosted-test-mode', 'off']);
});

test('test mode is off by default: refused with the command that turns it on', skip, async () => {
  assert.match(cli(['teams', 'show', 'beta']), /hosted_test_mode: off/);
  const r = await init(tmUrl('tm', PY_REPO, 'server.py'), env.SF_KEY_BETA);
  assert.equal(r.status, 403, r.body);
  assert.match(r.message, /Test mode is off for your team: an operator turns it on with `sandfleet teams limits TEAM --hosted-test-mode on`/);
  const client = new Client({ name: 'x', version: '1' });
  await assert.rejects(client.connect(new StreamableHTTPClientTransport(tmUrl('tm', PY_REPO, 'server.py'),
    { requestInit: { headers: bearer(env.SF_KEY_BETA) } })), /Test mode is off for your team/);
  await client.close();
  assert.equal(upstreamSaw(`/files/tm-py-${uniq}.git`).length, 0, 'nothing was fetched');
});

test('test mode: a Python SDK server cloned over HTTPS through egress, its requirements.txt installed there', skip, async () => {
  assert.match(cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']), /hosted_test_mode: on/);
  const a = await open(tmUrl('tm-py', PY_REPO, 'server.py'));
  assert.equal(a.client.getServerVersion().name, 'py-testmode', 'the server\'s own initialize answer');
  assert.deepEqual((await a.client.listTools()).tools.map((t) => t.name), ['bump']);
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1');
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '2');
  const b = await open(tmUrl('tm-py', PY_REPO, 'server.py'));
  assert.equal(text(await b.client.callTool({ name: 'bump', arguments: {} })), '1', 'each session its own sandbox');
  const got = upstreamSaw(`/files/tm-py-${uniq}.git/`);
  assert.ok(got.some((e) => e.uri.includes('/objects/')), 'the repository came from the upstream');
  assert.ok(got.every((e) => e.tls === true), 'over HTTPS');
  assert.ok(upstreamSaw(`/files/wheels-${uniq}/mcp-`).length > 0, 'pip fetched the wheels through egress');
  await end(a);
  await end(b);
});

test('test mode: a .mjs entrypoint runs with node', skip, async () => {
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  const a = await open(tmUrl('tm-node', NODE_REPO, 'src/server.mjs'));
  assert.equal(a.client.getServerVersion().name, 'node-testmode');
  assert.equal(text(await a.client.callTool({ name: 'inc', arguments: {} })), '1');
  await end(a);
});

test('test mode: the fetch error is in the answer', skip, async () => {
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  const missing = `${UP}/none-${uniq}.git`;
  const r = await init(tmUrl('tm-gone', missing, 'server.py'));
  assert.equal(r.status, 502, r.body);
  assert.match(r.message, new RegExp(`Test mode could not fetch ${missing.replace(/[.]/g, '\\.')} \\(git clone through your team's egress rules\\): .*(not found|404)`, 's'));
  const noentry = await init(tmUrl('tm-py', PY_REPO, 'nothere.py'));
  assert.equal(noentry.status, 502, noentry.body);
  assert.match(noentry.message, /The entrypoint 'nothere\.py' is not a file inside the repository/);
});

// A server that exits before it answers initialize: the client is told so, with its last
// lines; the session's sandbox goes. (The kill sent on that way out took the gateway down
// before: gw_jobs_submit wrote through its NULL out pointer.)
test('a server that exits during initialize: its error and last lines; the gateway goes on', skip, async () => {
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  const dies = repo(`tm-dies-${uniq}`, { 'dies.py': 'import sys\nprint("early-exit-marker", file=sys.stderr)\nsys.exit(4)\n' });
  const r = await init(tmUrl('tm-dies', dies, 'dies.py'));
  assert.equal(r.status, 502, r.body);
  assert.match(r.message, /hosted MCP server exited \(status 4\)[\s\S]*early-exit-marker/);
  const again = await init(tmUrl('tm-dies', dies, 'dies.py'));
  assert.equal(again.status, 502, 'the gateway still answers');
});

test('attack: bad repo_url and entrypoint refused before anything runs', skip, async () => {
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  for (const bad of ['http://api.example.test/files/x.git', 'ftp://api.example.test/x.git',
    'https://u:p@api.example.test/x.git', "https://api.example.test/x'.git", 'https://api.example.test/x.git;id',
    'https://api.example.test/$(id).git', 'https://[::1]/x.git', '--upload-pack=id', '', `https://a.test/${'x'.repeat(1100)}`]) {
    const r = await init(tmUrl('tm-bad', bad, 'server.py'));
    assert.equal(r.status, 400, bad);
    assert.match(r.message, /repo_url/, bad);
  }
  for (const bad of ['../server.py', '/etc/server.py', 'a/../../server.py', '..', 'server.sh', '-c.py',
    "x'.py", 'a b.py', '']) {
    const r = await init(tmUrl('tm-bad', PY_REPO, bad));
    assert.equal(r.status, 400, bad);
    assert.match(r.message, /entrypoint= is the server's file inside the repository: a relative path/, bad);
  }
  const nul = await init(`${url}?name=tm-bad&test_mode=true&repo_url=${encodeURIComponent(PY_REPO)}&entrypoint=server.py%00.sh`);
  assert.equal(nul.status, 400);
  assert.match(nul.message, /URL-encoded \(no %00\)/);
});

test('attack: a repo_url at the platform (loopback, the gateway, Redis, the host) is refused by the egress rules', skip, async () => {
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  const gw = new URL(url);
  const redis = new URL(env.SF_REDIS_URL);
  for (const where of [`https://127.0.0.1:${redis.port}/x.git`, `https://127.0.0.1:${gw.port}/mcp.git`,
    `https://localhost:${gw.port}/mcp.git`, `https://self.test:${gw.port}/mcp.git`,
    `https://169.254.169.254/latest.git`]) {
    const r = await init(tmUrl('tm-plat', where, 'server.py'));
    assert.equal(r.status, 502, `${where}: ${r.body}`);
    assert.match(r.message, /Test mode could not fetch .*egress rules\): .*(403|Forbidden|refused|blocked|Failed to connect|unable to access)/s, where);
  }
});

test('attack: a link in the repository to a host file is no entrypoint (and reads nothing of the host)', skip, async () => {
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  const host = mkdtempSync(join(tmpdir(), 'sf-tm-host-'));
  const marker = `host-secret-${uniq}`;
  writeFileSync(join(host, 'secret.py'), `print("${marker}")\n`);
  const evil = repo(`tm-link-${uniq}`, { 'server.py': { link: join(host, 'secret.py') },
    'up.py': { link: '../../../../../../../etc/hostname' } });
  for (const entry of ['server.py', 'up.py']) {
    const r = await init(tmUrl('tm-link', evil, entry));
    assert.equal(r.status, 502, r.body);
    assert.match(r.message, new RegExp(`The entrypoint '${entry.replace('.', '\\.')}' is not a file inside the repository`));
    assert.doesNotMatch(r.body, new RegExp(marker));
  }
});

test('attack: another team\'s test-mode session: not reachable by id, by name or through the registry path', skip, async () => {
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  cli(['teams', 'limits', 'beta', '--hosted-test-mode', 'on']);
  const a = await open(tmUrl('tm-shared', PY_REPO, 'server.py'));
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1');
  const sid = a.transport.sessionId;
  const bump = JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'bump', arguments: {} } });
  const hdr = (key) => ({ 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
    ...bearer(key), 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '2025-06-18' });
  for (const method of ['POST', 'GET', 'DELETE']) {
    const r = await fetch(tmUrl('tm-shared', PY_REPO, 'server.py'), { method, headers: hdr(env.SF_KEY_BETA),
      body: method === 'POST' ? bump : undefined });
    assert.equal(r.status, 404, `beta ${method}`);
    await r.body?.cancel();
  }
  // the same team, the registry path (no test_mode): no registered server of that name
  const reg = await fetch(`${url}?name=tm-shared`, { method: 'POST', headers: hdr(env.SF_KEY_ALPHA), body: bump });
  assert.equal(reg.status, 404);
  assert.match((await reg.json()).error.message, /No MCP server named 'tm-shared' is registered/);
  // beta's own test-mode session of that name is its own server process
  const b = await open(tmUrl('tm-shared', PY_REPO, 'server.py'), env.SF_KEY_BETA);
  assert.equal(text(await b.client.callTool({ name: 'bump', arguments: {} })), '1');
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '2', 'alpha\'s session untouched');
  await end(b);
  // test mode off again: the team's open session is refused too
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'off']);
  await assert.rejects(a.client.callTool({ name: 'bump', arguments: {} }), /Test mode is off/);
  cli(['teams', 'limits', 'alpha', '--hosted-test-mode', 'on']);
  await end(a);
});
