// Hosted MCP servers (issue 24): a team's own servers, registered with `sandfleet servers
// add`, spoken to through POST /mcp?name=NAME by the official TypeScript SDK client; one
// sandbox per session, the server's stdio bridged by the worker. The Python server is built
// on the official MCP Python SDK, its wheels downloaded on this host with pip (PyPI) and
// uploaded with the code (also as a Streamable HTTP server, --http, and cloned from a git
// repository, --git); the Node server on the official TypeScript SDK, its node_modules
// uploaded. Real stack, real servers, real clients; the one fake is the proxy tests'
// upstream standing in for internet hosts (an API, a git host).
import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { env, url, driver, bearer, until, cli, connect, call } from './lib.mjs';

const uniq = Date.now().toString(36);
const PY = `py-${uniq}`;
const NODE = `node-${uniq}`;
const HTTP = `http-${uniq}`;
const SECRET = `hosted_tok_${uniq}`;
const VALUE = `real-${uniq}-value`;
const skip = { skip: driver !== 'jail' && 'snapshots of jail hosts hold the server image (a VM one works too, slower)' };

function servers(args, key = env.SF_KEY_ALPHA) {
  const e = { ...process.env, SANDFLEET_URL: env.SF_URL, SANDFLEET_API_KEY: key };
  return spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['servers', ...args],
    { encoding: 'utf8', env: e, timeout: 900000 });
}

// The official Python SDK's wheels, pinned in hosted/requirements.txt, downloaded from PyPI by
// ops/lib.sh's sf_hosted_wheels (ops/test runs it; here it is a no-op when they are there).
function wheels() {
  const root = join(import.meta.dirname, '../..');
  const r = spawnSync('bash', ['-c', '. ops/lib.sh && sf_hosted_wheels'], { cwd: root, encoding: 'utf8', timeout: 300000 });
  assert.equal(r.status, 0, `sf_hosted_wheels: ${r.stderr}`);
  return join(root, '.test-cache/hosted-wheels');
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
def call_upstream(path: str) -> str:
    """GET http://api.example.test{path} with X-Api-Key: $TOKEN."""
    req = urllib.request.Request("http://api.example.test" + path,
                                 headers={"X-Api-Key": os.environ.get("TOKEN", "")})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()

@server.tool()
def huge() -> str:
    """Answers 5 MiB."""
    return "x" * (5 << 20)

@server.tool()
def crash() -> str:
    """Dies."""
    print("about to crash: boom-" + "marker", file=sys.stderr, flush=True)
    os._exit(3)

server.run()
`;

// The same SDK's Streamable HTTP transport, on 127.0.0.1:8123/rpc inside its sandbox.
const PY_HTTP_SERVER = `
import asyncio
from mcp.server.mcpserver import MCPServer, Context

server = MCPServer("py-http")
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

server.run(transport="streamable-http", host="127.0.0.1", port=8123, streamable_http_path="/rpc")
`;

const scratch = []; // the servers' folders made here, removed at the end

function pyDir() {
  const dir = mkdtempSync(join(tmpdir(), 'sf-hosted-py-'));
  scratch.push(dir);
  writeFileSync(join(dir, 'server.py'), PY_SERVER);
  writeFileSync(join(dir, 'http_server.py'), PY_HTTP_SERVER);
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

// Every session a test opens; end() closes it (DELETE, then the client's streams); afterEach
// ends what a failed test left open, so no test starts over the caps.
const opened = new Set();
async function open(name, key) {
  const { transport } = clientFor(name, key);
  const client = new Client({ name: 'hosted-e2e', version: '1.0.0' });
  await client.connect(transport);
  const h = { client, transport };
  opened.add(h);
  return h;
}
async function end(h, strict = true) {
  opened.delete(h);
  try {
    await h.transport.terminateSession();
  } catch (e) {
    if (strict) throw e;
  } finally {
    await h.client.close();
  }
}

const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('');

const NODE_SERVER = `
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
let n = 0;
const server = new Server({ name: 'node-hosted', version: '1.0.0' }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: [
  { name: 'inc', description: 'Counts calls in this session.', inputSchema: { type: 'object' } },
  { name: 'ticks', description: 'Reports n progress ticks.',
    inputSchema: { type: 'object', properties: { n: { type: 'integer' } } } },
  { name: 'huge', description: 'Answers 5 MiB.', inputSchema: { type: 'object' } }] }));
server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
  if (req.params.name === 'inc') return { content: [{ type: 'text', text: String(++n) }] };
  if (req.params.name === 'huge') return { content: [{ type: 'text', text: 'x'.repeat(5 << 20) }] };
  const t = req.params._meta?.progressToken, k = req.params.arguments?.n ?? 2;
  for (let i = 1; i <= k; i++)
    if (t !== undefined) await extra.sendNotification({ method: 'notifications/progress',
      params: { progressToken: t, progress: i, total: k } });
  return { content: [{ type: 'text', text: \`ticked \${k}\` }] };
});
await server.connect(new StdioServerTransport());
`;

// The Node server's folder: server.mjs and the TS SDK with what it needs at run time, from
// the node_modules npm ci made for these tests (only the SDK's own dependency closure: the
// folder also holds the agent clients of other suites, far over the 256 MiB upload bound).
function sdkClosure() {
  const nm = join(import.meta.dirname, 'node_modules'), seen = new Set();
  const walk = (name, from) => {
    // node's resolution: the nearest node_modules holding it, from the dependent upwards
    let dir;
    for (let p = from; !dir; p = dirname(p)) {
      if (existsSync(join(p, 'node_modules', name))) dir = join(p, 'node_modules', name);
      else if (p === import.meta.dirname) throw new Error(`${name} is not installed`);
    }
    if (seen.has(dir)) return;
    seen.add(dir);
    const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
    for (const d of Object.keys(pkg.dependencies ?? {})) walk(d, dir);
  };
  walk('@modelcontextprotocol/sdk', nm);
  return [...seen].map((d) => relative(import.meta.dirname, d));
}

function nodeDir() {
  const dir = mkdtempSync(join(tmpdir(), 'sf-hosted-node-'));
  scratch.push(dir);
  writeFileSync(join(dir, 'server.mjs'), NODE_SERVER);
  const r = spawnSync('sh', ['-c', 'tar -C "$0" -cf - "$@" | tar -C "$1" -xf -',
    import.meta.dirname, dir, ...sdkClosure()]);
  assert.equal(r.status, 0, String(r.stderr));
  return dir;
}

// What the proxy tests' fake upstream (a fake of an internet API: nothing leaves this
// machine) received for a request path.
function upstream(uri) {
  return readFileSync(env.SF_UPSTREAM_LOG, 'utf8').trim().split('\n').filter(Boolean)
    .map((l) => JSON.parse(l)).filter((e) => e.uri === uri);
}

// The team's sandboxes of a hosted session (by the metadata the gateway gives them).
async function sessionBoxes(sid) {
  const c = await connect(env.SF_KEY_ALPHA);
  const r = await call(c, 'sandbox_list', { metadata: { session: sid } });
  await c.close();
  return r.structured.sandboxes.filter((s) => s.status !== 'killed');
}

before(() => {
  if (driver !== 'jail') return;
  cli(['secrets', 'create', '--team', 'alpha', '--name', SECRET, '--allowed-host', 'api.example.test',
    '--any-header', '--allow-http'], VALUE);
  const n = servers(['add', NODE, '--dir', nodeDir(), '--run', 'node server.mjs', '--idle-timeout', '3']);
  assert.equal(n.status, 0, n.stderr);
  const r = servers(['add', PY, '--dir', pyDir(), '--run', '/root/venv/bin/python server.py',
    '--secret', `TOKEN=${SECRET}`, '--allow-out', 'api.example.test',
    '--setup', 'python3 -m venv /root/venv && /root/venv/bin/pip install -q --no-index --find-links wheels mcp',
    '--idle-timeout', '600', '--max-sessions', '3']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, new RegExp(`server ${PY} registered`));
  const h = servers(['add', HTTP, '--dir', pyDir(), '--run', '/root/venv/bin/python http_server.py',
    '--http', '8123/rpc',
    '--setup', 'python3 -m venv /root/venv && /root/venv/bin/pip install -q --no-index --find-links wheels mcp']);
  assert.equal(h.status, 0, h.stderr);
});

afterEach(async () => { // a failed test's sessions end here: the next test starts under the caps
  for (const h of [...opened]) await end(h, false);
});

after(async () => {
  for (const n of [PY, NODE, HTTP]) servers(['remove', n]); // (their snapshots count in the team's)
  for (const d of scratch) rmSync(d, { recursive: true, force: true });
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
  assert.deepEqual(tools, ['bump', 'call_upstream', 'crash', 'env_token', 'huge', 'steps']);
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
  assert.equal((await sessionBoxes(sid)).length, 1, 'the session has its sandbox');
  await end(a);
  assert.equal((await sessionBoxes(sid)).length, 0, 'DELETE killed it');
  const again = await fetch(`${url}?name=${PY}`, { method: 'POST', headers: {
    'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
    ...bearer(env.SF_KEY_ALPHA), 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/list' }) });
  assert.equal(again.status, 404, await again.text());
  await end(b);
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
  // OAuth clients of /mcp/NAME find the protected-resource metadata there too
  const base = url.replace(/\/mcp$/, '');
  const challenge = await fetch(`${url}/${PY}`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(init) });
  assert.equal(challenge.status, 401);
  assert.match(challenge.headers.get('www-authenticate') ?? '', /resource_metadata="/);
  const prm = await fetch(`${base}/.well-known/oauth-protected-resource/mcp/${PY}`);
  assert.equal(prm.status, 200);
  const meta = await prm.json();
  assert.ok(`${url}/${PY}`.startsWith(meta.resource), meta.resource);
  assert.ok(meta.authorization_servers?.length > 0);
});

// Attacks: another team holding a live session's id, a forged registry entry naming another
// team's image, oversized input. Each refused with its sentence; the victim's session goes on.
test('attack: another team cannot use, read or end a session, nor register onto another team\'s image', skip, async () => {
  const a = await open(PY);
  const sid = a.transport.sessionId;
  const hdr = (key) => ({ 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
    ...bearer(key), 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '2025-06-18' });
  const bump = JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'bump', arguments: {} } });
  const base = url.replace(/\/mcp$/, '');
  const init = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } } });

  // beta has no server of that name: 404 before any session is looked at
  const none = await fetch(`${url}?name=${PY}`, { method: 'POST', headers: hdr(env.SF_KEY_BETA), body: bump });
  assert.equal(none.status, 404);
  assert.match((await none.json()).error.message, /No MCP server named .* is registered for your team/);

  // beta registers the same name, its entry naming alpha's image (mcp-PY)
  const put = await fetch(`${base}/v1/servers/${PY}`, { method: 'PUT',
    headers: { 'Content-Type': 'application/json', ...bearer(env.SF_KEY_BETA) },
    body: JSON.stringify({ run: 'cat /root/mcp/server.py', snapshot: `mcp-${PY}` }) });
  assert.equal(put.status, 200, await put.text());
  try {
    // its sessions cannot start from alpha's image
    const st = await fetch(`${url}?name=${PY}`, { method: 'POST', headers: {
      'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...bearer(env.SF_KEY_BETA) },
      body: init });
    const body = await st.text();
    assert.notEqual(st.status, 200, body);
    assert.match(body, /could not get a sandbox/);
    assert.doesNotMatch(body, /MCPServer/, 'nothing of alpha\'s code');
    // now past the name: alpha's session id is still no session of beta's, on every method
    for (const where of [`${url}?name=${PY}`, `${url}/${PY}`]) {
      const p = await fetch(where, { method: 'POST', headers: hdr(env.SF_KEY_BETA), body: bump });
      assert.equal(p.status, 404, 'beta cannot call into alpha\'s session');
      assert.match((await p.json()).error.message, /Session not found/);
      const g = await fetch(where, { method: 'GET', headers: hdr(env.SF_KEY_BETA) });
      assert.equal(g.status, 404, 'beta cannot open its stream');
      await g.body?.cancel();
      const d = await fetch(where, { method: 'DELETE', headers: hdr(env.SF_KEY_BETA) });
      assert.equal(d.status, 404, 'beta cannot end it');
      await d.body?.cancel();
    }
  } finally {
    assert.equal(servers(['remove', PY], env.SF_KEY_BETA).status, 0);
  }
  // the session's id under another server's name (of the same team) is no session either
  const n = await fetch(`${url}?name=${NODE}`, { method: 'POST', headers: hdr(env.SF_KEY_ALPHA), body: bump });
  assert.equal(n.status, 404);
  assert.match((await n.json()).error.message, /Session not found/);
  // the gateway's own jobs are no tools: neither team can call them on the session's sandbox
  const [box] = await sessionBoxes(sid);
  for (const key of [env.SF_KEY_BETA, env.SF_KEY_ALPHA]) {
    const c = await connect(key);
    for (const tool of ['sf.hosted_send', 'sf.hosted_start', 'sf.hosted_listen']) {
      const r = await c.callTool({ name: tool, arguments: { sandbox_id: box.id, run: 'id', message: bump } })
        .then((x) => ({ err: x.isError ? JSON.stringify(x.content) : null }), (e) => ({ err: String(e) }));
      assert.ok(r.err, `${tool} refused`);
      assert.match(r.err, /unknown tool|not a tool|Unknown tool/i, tool);
    }
    await c.close();
  }
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1',
    'alpha\'s session went on untouched (no call of beta reached it)');
  assert.equal(servers(['show', PY]).status, 0, 'alpha\'s entry is its own still');
  await end(a);
});

test('bounded input: an oversized message, a bad name, an oversized registry entry', skip, async () => {
  const a = await open(PY);
  const big = JSON.stringify({ jsonrpc: '2.0', id: 6, method: 'tools/call',
    params: { name: 'bump', arguments: { pad: 'x'.repeat(300 * 1024) } } });
  const r = await fetch(`${url}?name=${PY}`, { method: 'POST', headers: { 'Content-Type': 'application/json',
    Accept: 'application/json, text/event-stream', ...bearer(env.SF_KEY_ALPHA),
    'Mcp-Session-Id': a.transport.sessionId, 'MCP-Protocol-Version': '2025-06-18' }, body: big });
  assert.equal(r.status, 413);
  assert.match((await r.json()).error.message, /at most 256 KiB/);
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1', 'the session goes on');
  for (const bad of ['x'.repeat(64), 'UPPER', '..%2Fetc', 'a%00b', 'a/b']) {
    const res = await fetch(`${url}?name=${bad}`, { method: 'POST', headers: { 'Content-Type': 'application/json',
      ...bearer(env.SF_KEY_ALPHA) }, body: '{}' });
    assert.equal(res.status, 404, bad);
    assert.match((await res.json()).error.message, /must be 1-63 of a-z, 0-9/, bad);
  }
  // the code's 256 MiB: refused before any sandbox is made (a sparse file of 257 MiB)
  const bigDir = mkdtempSync(join(tmpdir(), 'sf-hosted-big-'));
  assert.equal(spawnSync('truncate', ['-s', String(257 * 1024 * 1024), join(bigDir, 'code.tar')]).status, 0);
  const up = servers(['add', `big-${uniq}`, '--archive', join(bigDir, 'code.tar'), '--run', 'x']);
  assert.equal(up.status, 1, up.stderr);
  assert.match(up.stderr, /The server's code is 257 MiB packed; the most is 256 MiB: leave out what it does not need/);
  assert.doesNotMatch(up.stderr, /builder sandbox/, 'nothing was made');
  const nodir = servers(['add', `big-${uniq}`, '--archive', bigDir, '--run', 'x']);
  assert.equal(nodir.status, 1);
  assert.match(nodir.stderr, /Cannot read .*not a regular file.*; pass a readable archive/);
  const base = url.replace(/\/mcp$/, '');
  const put = await fetch(`${base}/v1/servers/big-${uniq}`, { method: 'PUT',
    headers: { 'Content-Type': 'application/json', ...bearer(env.SF_KEY_ALPHA) },
    body: JSON.stringify({ run: 'x', snapshot: 'y', setup: 'z'.repeat(70 * 1024) }) });
  assert.equal(put.status, 413, await put.text());
  const long = await fetch(`${base}/v1/servers/long-${uniq}`, { method: 'PUT',
    headers: { 'Content-Type': 'application/json', ...bearer(env.SF_KEY_ALPHA) },
    body: JSON.stringify({ run: 'x'.repeat(5000), snapshot: 'y' }) });
  assert.equal(long.status, 400);
  assert.match((await long.json()).error, /at most 4096 bytes/);
  await end(a);
});

test('over the session cap: an actionable 429', skip, async () => {
  const held = [];
  for (let i = 0; i < 3; i++) held.push(await open(PY));
  const { transport } = clientFor(PY);
  const client = new Client({ name: 'hosted-e2e', version: '1.0.0' });
  await assert.rejects(client.connect(transport), /sessions of hosted MCP server '.*', the most its registration allows/);
  await client.close();
  for (const h of held) await end(h);
});

// A server's message is at most 4 MiB: a longer answer is dropped, and the request it answers
// (its id found at either end: the TS SDK writes it last, the Python SDK first) is told so
// at once instead of waiting out its deadline; the session goes on.
test('an answer over 4 MiB: the request is told so at once; the session goes on', skip, async () => {
  for (const [name, count] of [[NODE, 'inc'], [PY, 'bump']]) {
    const a = await open(name);
    // (without the answer, the call would wait out its 300 s and the SDK client give up at 60)
    await assert.rejects(a.client.callTool({ name: 'huge', arguments: {} }),
      /The hosted MCP server's answer is over 4 MiB, the most one message may be; ask it for less/, name);
    assert.equal(text(await a.client.callTool({ name: count, arguments: {} })), '1', `${name}: the session goes on`);
    await end(a);
  }
});

test('a crashing server: a JSON-RPC error saying so; its last lines in servers logs', skip, async () => {
  const a = await open(PY);
  await assert.rejects(a.client.callTool({ name: 'crash', arguments: {} }),
    /hosted MCP server exited \(status 3\)[\s\S]*boom-marker/);
  const l = servers(['logs', PY]);
  assert.equal(l.status, 0, l.stderr);
  assert.match(l.stdout, /boom-marker/);
  await end(a, false);
});

test('another gateway process serves a session opened on the first (sessions live in Redis)', skip, async () => {
  const a = await open(PY);
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1');
  // the gateway is killed (-9) and a new process takes the port: it never saw the session
  const r = spawnSync(join(import.meta.dirname, '../integration/stack'),
    ['restart-gateway', process.env.SF_E2E_STATE, env.SF_BUILD], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  // (the first try may meet fetch's pooled connection to the dead gateway: that request never
  // reached a live process, so it is sent again)
  const res = await until('the new gateway to answer', () => fetch(`${url}?name=${PY}`, { method: 'POST', headers: {
    'Content-Type': 'application/json', Accept: 'application/json', ...bearer(env.SF_KEY_ALPHA),
    'Mcp-Session-Id': a.transport.sessionId, 'MCP-Protocol-Version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 77, method: 'tools/call', params: { name: 'bump', arguments: {} } }) })
    .catch((e) => (e.cause?.code === 'UND_ERR_SOCKET' ? null : Promise.reject(e))), 10000);
  assert.equal(res.status, 200);
  assert.equal((await res.json()).result.content[0].text, '2', 'the same server process answers');
  await end(a);
});

test('a bound secret: the upstream sees the real value, the server process only a placeholder', skip, async () => {
  const a = await open(PY);
  const held = text(await a.client.callTool({ name: 'env_token', arguments: {} }));
  assert.ok(held.length > 0, 'the server has TOKEN');
  assert.notEqual(held, VALUE, 'the process never holds the real value');
  assert.ok(!held.includes(VALUE));
  const path = `/hosted-secret-${uniq}`;
  assert.equal(text(await a.client.callTool({ name: 'call_upstream', arguments: { path } })).trim(), 'ok');
  assert.equal(upstream(path)[0]?.headers['X-Api-Key'], VALUE, 'the proxy swapped in the real value');
  await end(a);
});

test('Node TS SDK server: tools, per-session state, progress; an idle session is evicted', skip, async () => {
  const a = await open(NODE);
  assert.equal(a.client.getServerVersion().name, 'node-hosted');
  assert.deepEqual((await a.client.listTools()).tools.map((t) => t.name), ['inc', 'ticks', 'huge']);
  assert.equal(text(await a.client.callTool({ name: 'inc', arguments: {} })), '1');
  assert.equal(text(await a.client.callTool({ name: 'inc', arguments: {} })), '2');
  const seen = [];
  assert.equal(text(await a.client.callTool({ name: 'ticks', arguments: { n: 4 } }, undefined,
    { onprogress: (p) => seen.push(p.progress) })), 'ticked 4');
  assert.deepEqual(seen, [1, 2, 3, 4]);
  // idle (3 s here): the worker kills the session's sandbox; the next call gets 404 and a new
  // session starts from scratch
  const sid = a.transport.sessionId;
  await until('the idle session to be evicted', async () => (await sessionBoxes(sid)).length === 0, 60000, 500);
  await assert.rejects(a.client.callTool({ name: 'inc', arguments: {} }), /404|Session not found/);
  await end(a, false);
  const b = await open(NODE);
  assert.equal(text(await b.client.callTool({ name: 'inc', arguments: {} })), '1');
  await end(b);
});

test('--http: a Streamable HTTP server (the Python SDK\'s) behind the same endpoint', skip, async () => {
  const entry = JSON.parse(servers(['show', HTTP]).stdout);
  assert.equal(entry.http, '8123/rpc');
  const a = await open(HTTP);
  assert.equal(a.client.getServerVersion().name, 'py-http', 'the server\'s own initialize answer');
  assert.deepEqual((await a.client.listTools()).tools.map((t) => t.name).sort(), ['bump', 'steps']);
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1');
  assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '2');
  const b = await open(HTTP);
  assert.equal(text(await b.client.callTool({ name: 'bump', arguments: {} })), '1', 'its own sandbox');
  const seen = [];
  assert.equal(text(await a.client.callTool({ name: 'steps', arguments: { n: 3 } }, undefined,
    { onprogress: (p) => seen.push(p.progress) })), 'did 3');
  assert.deepEqual(seen, [1, 2, 3], 'progress over the server\'s SSE answer');
  await end(a);
  await end(b);
  for (const bad of ['0', '70000/mcp', '80/a b', 'x/mcp', "80/../'x"]) {
    const r = servers(['add', `bad-${uniq}`, '--dir', '/nonexistent', '--run', 'x', '--http', bad]);
    assert.equal(r.status, 2, bad);
    assert.match(r.stderr, /--http takes PORT\[\/PATH\]/, bad);
  }
});

test('servers remove: the name is gone, its image too', skip, async () => {
  const snaps = async () => {
    const c = await connect(env.SF_KEY_ALPHA);
    const r = await call(c, 'sandbox_snapshot_list', {});
    await c.close();
    return r.structured.snapshots.map((x) => x.name);
  };
  assert.ok((await snaps()).includes(`mcp-${PY}`), 'the server\'s image is a snapshot of the team');
  const live = await open(PY);
  const sid = live.transport.sessionId;
  assert.equal((await sessionBoxes(sid)).length, 1);
  const r = servers(['remove', PY]);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /removed \(1 live session ended\)/);
  assert.equal((await sessionBoxes(sid)).length, 0, 'remove ended the live session\'s sandbox');
  await end(live, false);
  assert.doesNotMatch(servers(['list']).stdout, new RegExp(PY));
  assert.ok(!(await snaps()).includes(`mcp-${PY}`), 'remove deleted the image');
  const again = servers(['remove', PY]);
  assert.equal(again.status, 1);
  assert.match(again.stderr, /No server of that name is registered for your team/);
});

// --git: a repository the proxy tests' fake upstream serves (dumb HTTP, a fake of a git host:
// nothing leaves this machine) at http://api.example.test/files/NAME.git, fetched by the
// builder through its egress proxy. Its default branch holds a README only; --ref release
// holds the server (the Python SDK's, its wheels committed beside it).
test('--git URL --ref REF: the server cloned through the egress proxy; bad URLs and a missing repo refused', skip, async () => {
  const repo = `srv-${uniq}.git`;
  const work = pyDir();
  const bare = join(process.env.SF_E2E_STATE, 'upstream/files', repo);
  const g = 'git -c user.name=t -c user.email=t@example.test -c init.defaultBranch=main';
  const r = spawnSync('sh', ['-c', `set -e; cd ${work}; mkdir ../keep-${uniq}; mv * ../keep-${uniq}/;
    ${g} init -q .; echo readme > README; ${g} add README; ${g} commit -qm readme;
    ${g} checkout -qb release; mv ../keep-${uniq}/* .; ${g} add -A; ${g} commit -qm server;
    ${g} checkout -q main; git clone -q --bare . ${bare}; cd ${bare}; git repack -qad; git update-server-info`],
    { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const GIT = `git-${uniq}`;
  const add = servers(['add', GIT, '--git', `http://api.example.test/files/${repo}`, '--ref', 'release',
    '--run', '/root/venv/bin/python server.py',
    '--setup', 'python3 -m venv /root/venv && /root/venv/bin/pip install -q --no-index --find-links wheels mcp']);
  assert.equal(add.status, 0, add.stderr);
  const fetched = readFileSync(env.SF_UPSTREAM_LOG, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
    .filter((e) => e.uri?.startsWith(`/files/${repo}/`));
  assert.ok(fetched.some((e) => e.uri.includes('/objects/pack/')), 'the pack came from the upstream, through the proxy');
  try {
    const entry = JSON.parse(servers(['show', GIT]).stdout);
    assert.equal(entry.source, `http://api.example.test/files/${repo}`);
    assert.equal(entry.ref, 'release');
    const a = await open(GIT);
    assert.equal(a.client.getServerVersion().name, 'py-hosted');
    assert.equal(text(await a.client.callTool({ name: 'bump', arguments: {} })), '1');
    await end(a);
  } finally {
    servers(['remove', GIT]);
  }
  const missing = servers(['add', `gone-${uniq}`, '--git', `http://api.example.test/files/none-${uniq}.git`,
    '--run', 'x']);
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /Cloning the server's repository failed/);
  for (const bad of ['ftp://api.example.test/r.git', "https://api.example.test/r'.git", 'https://u:p@api.example.test/r.git',
    'https://api.example.test/r.git;id']) {
    const b = servers(['add', `bad-${uniq}`, '--git', bad, '--run', 'x']);
    assert.equal(b.status, 2, bad);
    assert.match(b.stderr, /--git takes an http\(s\) URL/, bad);
  }
  const badref = servers(['add', `bad-${uniq}`, '--git', 'https://api.example.test/r.git', '--ref', '--upload-pack=x', '--run', 'x']);
  assert.equal(badref.status, 2);
});

// --vcpu/--memory_mib/--disk_mib: the image is built in a sandbox of a team template of that
// shape (mcp-NAME-XXXX), so the snapshot, and every session made from it, has it.
test('a server\'s shape: each session\'s sandbox has it; bounds and a shape no host holds refused', skip, async () => {
  const SH = `shape-${uniq}`;
  const templates = async () => {
    const c = await connect(env.SF_KEY_ALPHA);
    const r = await call(c, 'sandbox_template_list', { name_prefix: `mcp-${SH}` });
    await c.close();
    return r.structured.templates.map((t) => t.name);
  };
  const add = servers(['add', SH, '--dir', nodeDir(), '--run', 'node server.mjs', '--template', 'debian',
    '--vcpu', '1', '--memory_mib', '320', '--disk_mib', '700']);
  assert.equal(add.status, 0, add.stderr);
  try {
    const entry = JSON.parse(servers(['show', SH]).stdout);
    assert.deepEqual([entry.vcpu, entry.memory_mib, entry.disk_mib], [1, 320, 700]);
    assert.match(entry.shape_template, new RegExp(`^mcp-${SH}-[0-9a-f]{4}$`));
    assert.equal(entry.template, 'debian');
    const a = await open(SH);
    const [box] = await sessionBoxes(a.transport.sessionId);
    const c = await connect(env.SF_KEY_ALPHA);
    const info = (await call(c, 'sandbox_info', { sandbox_id: box.id })).structured;
    await c.close();
    assert.equal(info.resources.memory_mib, 320, JSON.stringify(info.resources));
    assert.equal(info.resources.disk_mib, 700, JSON.stringify(info.resources));
    assert.equal(text(await a.client.callTool({ name: 'inc', arguments: {} })), '1');
    await end(a);
  } finally {
    const r = servers(['remove', SH]);
    assert.equal(r.status, 0, r.stderr);
  }
  assert.deepEqual(await templates(), [], 'remove deleted the shape template');
  for (const [opt, v, why] of [['--vcpu', '0', /--vcpu is a whole number of vCPUs from 1 to 8/],
    ['--vcpu', '9', /--vcpu is a whole number of vCPUs from 1 to 8/], ['--memory_mib', '12', /--memory_mib is a whole number of MiB from 64 to 65536/],
    ['--disk_mib', '1e9', /--disk_mib is a whole number of MiB from 64 to 65536/]]) {
    const r = servers(['add', SH, '--dir', '/nonexistent', '--run', 'x', opt, v]);
    assert.equal(r.status, 2, `${opt} ${v}`);
    assert.match(r.stderr, why);
  }
  const huge = servers(['add', SH, '--dir', nodeDir(), '--run', 'node server.mjs', '--memory_mib', '65536']);
  assert.equal(huge.status, 1, huge.stderr);
  assert.match(huge.stderr, /No host can build a template of memory_mib 65536.*ask for a smaller shape/);
  assert.match(huge.stderr, /The server's template mcp-[a-z0-9-]+ could not be built from debian; fix what the line above says, or leave the shape out to use the template's own/);
  assert.deepEqual(await templates(), [], 'a failed registration leaves no template');
  assert.equal(servers(['show', SH]).status, 1, 'nor an entry');
});

// --warm N: N sandboxes made from the image ahead of time, their servers started; initialize
// takes one (its sandbox gets the session's metadata, its server the session's idle
// timeout) and one is made in its place; they count in the team's quota (a pool the quota
// cannot hold says so); remove ends them.
test('--warm: a pool of ready sandboxes, taken by initialize and refilled; bounded by the quota; removed with the server', skip, async () => {
  const W = `warm-${uniq}`;
  const boxes = async (md, key = env.SF_KEY_ALPHA) => {
    const c = await connect(key);
    const r = await call(c, 'sandbox_list', { metadata: md });
    await c.close();
    return r.structured.sandboxes.filter((s) => s.status !== 'killed').map((s) => s.id);
  };
  const add = servers(['add', W, '--dir', nodeDir(), '--run', 'node server.mjs', '--warm', '2', '--idle-timeout', '3']);
  assert.equal(add.status, 0, add.stderr);
  assert.match(add.stderr, /warm pool: 2 sandboxes ready/);
  try {
    const gen = String(JSON.parse(servers(['show', W]).stdout).created);
    const pool = await boxes({ sandfleet_hosted: W, sandfleet_warm: gen });
    assert.equal(pool.length, 2, 'two sandboxes wait');
    const a = await open(W);
    assert.equal(text(await a.client.callTool({ name: 'inc', arguments: {} })), '1');
    const mine = await until('the taken sandbox to carry the session', async () => {
      const b = await boxes({ sandfleet_hosted: W, session: a.transport.sessionId });
      return b.length === 1 && b;
    });
    assert.ok(pool.includes(mine[0]), 'the session got a sandbox of the pool');
    await until('the pool to be refilled', async () =>
      (await boxes({ sandfleet_hosted: W, sandfleet_warm: gen })).filter((id) => id !== mine[0]).length === 2, 60000, 200);
    // a session taken from the pool has the server's idle timeout (3 s); the pool's own
    // servers wait longer than that for a client
    await until('the idle session from the pool to be evicted', async () =>
      (await boxes({ sandfleet_hosted: W, session: a.transport.sessionId })).length === 0, 60000, 200);
    await end(a, false);
    const waiting = pool.find((id) => id !== mine[0]);
    assert.ok((await boxes({ sandfleet_hosted: W, sandfleet_warm: gen })).includes(waiting),
      'a pool sandbox made before the session outlived its idle timeout');
    // a pool whose sandboxes died: initialize makes a fresh one instead
    const c = await connect(env.SF_KEY_ALPHA);
    for (const id of await boxes({ sandfleet_hosted: W, sandfleet_warm: gen }))
      await call(c, 'sandbox_kill', { sandbox_id: id });
    await c.close();
    const b = await open(W);
    assert.equal(text(await b.client.callTool({ name: 'inc', arguments: {} })), '1', 'a dead pool sandbox is replaced, not handed out');
    await end(b);
  } finally {
    const r = servers(['remove', W]);
    assert.equal(r.status, 0, r.stderr);
  }
  assert.deepEqual(await boxes({ sandfleet_hosted: W }), [], 'remove ended the pool');
  const bad = servers(['add', W, '--dir', '/nonexistent', '--run', 'x', '--warm', '17']);
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /--warm is how many sandboxes to keep ready for new sessions: 0 to 16/);

  // beta may hold 2 sandboxes: a pool of 3 holds 2 and says why
  cli(['teams', 'limits', 'beta', '--sandboxes', '2']);
  try {
    const q = servers(['add', W, '--dir', nodeDir(), '--run', 'node server.mjs', '--warm', '3'], env.SF_KEY_BETA);
    assert.equal(q.status, 0, q.stderr);
    // (2 of 3, or 1 while the builder's kill still counts in the quota on a loaded host)
    const held = q.stderr.match(new RegExp(`The warm pool of '${W}' holds ([12]) of 3 sandboxes: Sandbox quota reached`));
    assert.ok(held, q.stderr);
    assert.equal((await boxes({ sandfleet_hosted: W }, env.SF_KEY_BETA)).length, Number(held[1]), 'the quota held');
  } finally {
    cli(['teams', 'limits', 'beta', '--sandboxes', 'default']);
    servers(['remove', W], env.SF_KEY_BETA);
  }
  assert.deepEqual(await boxes({ sandfleet_hosted: W }, env.SF_KEY_BETA), []);
});
