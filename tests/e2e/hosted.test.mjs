// Hosted MCP servers (issue 24): a team's own servers, registered with `sandfleet servers
// add`, spoken to through POST /mcp?name=NAME by the official TypeScript SDK client; one
// sandbox per session, the server's stdio bridged by the worker. The Python server is built
// on the official MCP Python SDK, its wheels downloaded on this host with pip (PyPI) and
// uploaded with the code; the Node server on the official TypeScript SDK, its node_modules
// uploaded. Real stack, real servers, real clients.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, mkdirSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { env, url, driver, post, bearer, until } from './lib.mjs';

const uniq = Date.now().toString(36);
const PY = `py-${uniq}`;
const NODE = `node-${uniq}`;
const skip = { skip: driver !== 'jail' && 'snapshots of jail hosts hold the server image (a VM one works too, slower)' };

function servers(args, key = env.SF_KEY_ALPHA) {
  const e = { ...process.env, SANDFLEET_URL: env.SF_URL, SANDFLEET_API_KEY: key };
  return spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['servers', ...args],
    { encoding: 'utf8', env: e, timeout: 900000 });
}

// The official Python SDK's wheels, downloaded here once per build folder (PyPI).
function wheels() {
  const dir = join(env.SF_BUILD, 'hosted-wheels');
  if (existsSync(dir) && readdirSync(dir).some((f) => f.startsWith('mcp-'))) return dir;
  mkdirSync(dir, { recursive: true });
  const r = spawnSync('python3', ['-m', 'pip', 'download', 'mcp', '--only-binary=:all:',
    '--python-version', '3.11', '--implementation', 'cp', '--platform', 'manylinux2014_x86_64',
    '--platform', 'manylinux_2_17_x86_64', '-d', dir, '-q'], { encoding: 'utf8', timeout: 300000 });
  assert.equal(r.status, 0, `pip download mcp: ${r.stderr}`);
  return dir;
}

const PY_SERVER = `
import os, sys, asyncio, urllib.request
from mcp.server.mcpserver import MCPServer, Context

server = MCPServer("py-hosted")
count = 0

@server.tool()
def bump() -> str:
    """Counts calls in this session."""
    global count
    count += 1
    return str(count)

@server.tool()
async def steps(n: int, ctx: Context) -> str:
    """Reports n progress steps."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
        await asyncio.sleep(0.05)
    return f"did {n}"

@server.tool()
def env_token() -> str:
    """What the process holds in TOKEN."""
    return os.environ.get("TOKEN", "")

@server.tool()
def crash() -> str:
    """Dies."""
    print("about to crash: boom-" + "marker", file=sys.stderr, flush=True)
    os._exit(3)

server.run()
`;

function pyDir() {
  const dir = mkdtempSync(join(tmpdir(), 'sf-hosted-py-'));
  writeFileSync(join(dir, 'server.py'), PY_SERVER);
  const w = wheels();
  const r = spawnSync('cp', ['-a', w, join(dir, 'wheels')]);
  assert.equal(r.status, 0);
  return dir;
}

function clientFor(name, key = env.SF_KEY_ALPHA) {
  const u = new URL(url);
  u.searchParams.set('name', name);
  return { u, transport: new StreamableHTTPClientTransport(u, { requestInit: { headers: bearer(key) } }) };
}

async function open(name, key) {
  const { transport } = clientFor(name, key);
  const client = new Client({ name: 'hosted-e2e', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}

const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('');

before(() => {
  if (driver !== 'jail') return;
  const r = servers(['add', PY, '--dir', pyDir(), '--run', '/root/venv/bin/python server.py',
    '--setup', 'python3 -m venv /root/venv && /root/venv/bin/pip install -q --no-index --find-links wheels mcp',
    '--idle-timeout', '600', '--max-sessions', '3']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, new RegExp(`server ${PY} registered`));
});

test('servers list/show: the key\'s team sees its server; another team does not', skip, () => {
  const l = servers(['list']);
  assert.equal(l.status, 0, l.stderr);
  assert.match(l.stdout, new RegExp(`^${PY}$`, 'm'));
  const s = servers(['show', PY]);
  assert.equal(s.status, 0, s.stderr);
  const entry = JSON.parse(s.stdout);
  assert.equal(entry.run, '/root/venv/bin/python server.py');
  assert.equal(entry.snapshot, `mcp-${PY}`);
  assert.equal(entry.max_sessions, 3);
  const lb = servers(['list'], env.SF_KEY_BETA);
  assert.equal(lb.status, 0, lb.stderr);
  assert.doesNotMatch(lb.stdout, new RegExp(PY));
  const sb = servers(['show', PY], env.SF_KEY_BETA);
  assert.equal(sb.status, 1);
  assert.match(sb.stderr, /No server of that name is registered for your team/);
});

test('Python SDK server: the SDK client lists and calls its tools; per-session state; progress; DELETE', skip, async () => {
  // the venv's python runs the server: the registration's --setup made it
  const a = await open(PY);
  assert.equal(a.client.getServerVersion().name, 'py-hosted', 'the server\'s own initialize answer');
  const tools = (await a.client.listTools()).tools.map((t) => t.name).sort();
  assert.deepEqual(tools, ['bump', 'crash', 'env_token', 'steps']);
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1');
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '2');

  const b = await open(PY);
  assert.notEqual(b.transport.sessionId, a.transport.sessionId);
  assert.equal(text(await b.client.callTool({ name: 'bump', arguments: {} })), '1',
    'a second session has its own server process (its own sandbox)');

  const seen = [];
  const r = await a.client.callTool({ name: 'steps', arguments: { n: 3 } }, undefined,
    { onprogress: (p) => seen.push(p.progress) });
  assert.equal(text(r), 'did 3');
  assert.deepEqual(seen, [1, 2, 3], 'progress notifications reach the client');

  // DELETE: 204, the session is gone (404), its sandbox killed
  const sid = a.transport.sessionId;
  await a.transport.terminateSession();
  const again = await fetch(`${url}?name=${PY}`, { method: 'POST', headers: {
    'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
    ...bearer(env.SF_KEY_ALPHA), 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/list' }) });
  assert.equal(again.status, 404, await again.text());
  await b.transport.terminateSession();
});

test('unknown name, another team\'s server, unknown session: 404 with a sentence', skip, async () => {
  const init = { jsonrpc: '2.0', id: 1, method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } } };
  const u = (n) => `${url}?name=${n}`;
  const raw = async (where, key, headers = {}) => {
    const res = await fetch(where, { method: 'POST', headers: { 'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream', ...bearer(key), ...headers }, body: JSON.stringify(init) });
    return { status: res.status, json: await res.json().catch(() => null) };
  };
  const none = await raw(u(`nope-${uniq}`), env.SF_KEY_ALPHA);
  assert.equal(none.status, 404);
  assert.match(none.json.error.message, /No MCP server named 'nope-.*' is registered for your team/);
  const other = await raw(u(PY), env.SF_KEY_BETA);
  assert.equal(other.status, 404, 'another team\'s server is not found');
  assert.match(other.json.error.message, /is registered for your team/);
  const path = await raw(`${url}/nope-${uniq}`, env.SF_KEY_ALPHA);
  assert.equal(path.status, 404, '/mcp/NAME too');
  const sess = await raw(u(PY), env.SF_KEY_ALPHA, { 'Mcp-Session-Id': 'hs_doesnotexist0000' });
  assert.equal(sess.status, 404);
  assert.match(sess.json.error.message, /Session not found/);
  const unauth = await fetch(u(PY), { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(init) });
  assert.equal(unauth.status, 401);
});

test('over the session cap: an actionable 429', skip, async () => {
  const held = [];
  for (let i = 0; i < 3; i++) held.push(await open(PY));
  const { transport } = clientFor(PY);
  const client = new Client({ name: 'hosted-e2e', version: '1.0.0' });
  await assert.rejects(client.connect(transport), /sessions of hosted MCP server '.*', the most its registration allows/);
  for (const h of held) await h.transport.terminateSession();
});

test('a crashing server: a JSON-RPC error saying so; its last lines in servers logs', skip, async () => {
  const a = await open(PY);
  await assert.rejects(a.client.callTool({ name: 'crash', arguments: {} }),
    /hosted MCP server exited \(status 3\)[\s\S]*boom-marker/);
  const l = servers(['logs', PY]);
  assert.equal(l.status, 0, l.stderr);
  assert.match(l.stdout, /boom-marker/);
  await a.transport.terminateSession().catch(() => {});
});

test('a second gateway serves a session opened on the first', skip, async () => {
  // ops/run's stack runs one gateway; the second is the same binary on another port
  if (!env.SF_URL2) return;
  const a = await open(PY);
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1');
  const res = await fetch(`${env.SF_URL2}?name=${PY}`, { method: 'POST', headers: {
    'Content-Type': 'application/json', Accept: 'application/json', ...bearer(env.SF_KEY_ALPHA),
    'Mcp-Session-Id': a.transport.sessionId, 'MCP-Protocol-Version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 77, method: 'tools/call', params: { name: 'bump', arguments: {} } }) });
  assert.equal(res.status, 200);
  assert.equal((await res.json()).result.content[0].text, '2');
  await a.transport.terminateSession();
});

test('servers remove: the name is gone', skip, () => {
  const r = servers(['remove', PY]);
  assert.equal(r.status, 0, r.stderr);
  assert.doesNotMatch(servers(['list']).stdout, new RegExp(PY));
});
