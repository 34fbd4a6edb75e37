// Hosted MCP servers (issue 24): initialize cold and from the warm pool, tools/call through
// the platform against the same server called directly, and the memory a session holds.
// The server is the official TypeScript SDK's (stdio), registered with `sandfleet servers
// add`; the clients are the official SDK's too (Streamable HTTP through the platform, stdio
// directly), so the difference is what the platform adds.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { env, url, bearer } from '../e2e/lib.mjs';
import { tool, stats, measure } from './mcp.mjs';

const n = Number(process.argv[2] ?? 30);
const k = Number(process.argv[3] ?? 8);
const E2E = join(import.meta.dirname, '../e2e');
// the official SDK as the e2e suites installed it (tests/e2e/node_modules)
const sdk = (p) => import(pathToFileURL(join(E2E, 'node_modules/@modelcontextprotocol/sdk/dist/esm', p)).href);
const { Client } = await sdk('client/index.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');
const { StdioClientTransport } = await sdk('client/stdio.js');
const uniq = Date.now().toString(36);
const COLD = `bench-cold-${uniq}`, WARM = `bench-warm-${uniq}`;

const SERVER = `
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
let n = 0;
const server = new Server({ name: 'bench', version: '1.0.0' }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: [
  { name: 'inc', description: 'Counts calls.', inputSchema: { type: 'object' } }] }));
server.setRequestHandler(CallToolRequestSchema, async () => ({ content: [{ type: 'text', text: String(++n) }] }));
await server.connect(new StdioServerTransport());
`;

// The server's folder: server.mjs and the SDK with its dependencies (tests/e2e/node_modules).
function closure(name, seen = new Set()) {
  const pj = join(E2E, 'node_modules', name, 'package.json');
  if (seen.has(name) || !existsSync(pj)) return seen;
  seen.add(name);
  const p = JSON.parse(readFileSync(pj, 'utf8'));
  for (const d of Object.keys({ ...p.dependencies, ...p.optionalDependencies })) closure(d, seen);
  return seen;
}
const dir = mkdtempSync(join(tmpdir(), 'sf-bench-hosted-'));
writeFileSync(join(dir, 'server.mjs'), SERVER);
const pkgs = [...closure('@modelcontextprotocol/sdk')].map((x) => `node_modules/${x}`);
spawnSync('sh', ['-c', `tar -C ${E2E} -cf - "$@" | tar -C ${dir} -xf -`, 'sh', ...pkgs]);

function servers(args) {
  const r = spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['servers', ...args], { encoding: 'utf8',
    env: { ...process.env, SANDFLEET_URL: env.SF_URL, SANDFLEET_API_KEY: env.SF_KEY_ALPHA }, timeout: 900000 });
  if (r.status !== 0) throw new Error(`servers ${args.join(' ')}: ${r.stderr}`);
  return r;
}
// 'debian' (the servers' template) is built by the stack's worker once per host unless the
// template cache holds it: the bench starts when it is ready
for (let i = 0; ; i++) {
  const l = (await tool('sandbox_template_list', { name_prefix: 'debian' })).structuredContent.templates;
  if (l.find((x) => x.name === 'debian')?.status === 'ready') break;
  if (i % 30 === 0) console.error("waiting for the worker to build 'debian' ...");
  await new Promise((res) => setTimeout(res, 1000));
}
console.error('registering the servers ...');
servers(['add', COLD, '--dir', dir, '--run', 'node server.mjs', '--max-sessions', '1000']);
servers(['add', WARM, '--dir', dir, '--run', 'node server.mjs', '--warm', '4']);

const INIT = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'bench', version: '1' } } });
const H = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...bearer(env.SF_KEY_ALPHA) };
let sid = null;
async function initialize(name) {
  const r = await fetch(`${url}?name=${name}`, { method: 'POST', headers: H, body: INIT });
  const body = await r.text();
  if (r.status !== 200) throw new Error(`initialize ${name}: ${r.status} ${body}`);
  sid = r.headers.get('mcp-session-id');
}
async function drop(name) { // untimed: the session's sandbox goes
  await fetch(`${url}?name=${name}`, { method: 'DELETE', headers: { ...H, 'Mcp-Session-Id': sid } });
}
// the pool's length: its list in Redis (sandboxes made but not yet started, or taken but
// not yet relabelled, would count in a sandbox_list by metadata)
const pool = async () => Number(spawnSync('redis-cli', ['-u', env.SF_REDIS_URL, 'LLEN', `sf:team:{alpha}:srv:${WARM}:warm`],
  { encoding: 'utf8' }).stdout.trim());
async function poolFull() { // untimed: the pool refilled to its 4
  for (let i = 0; (await pool()) < 4; i++) {
    if (i > 600) throw new Error('the warm pool did not refill');
    await new Promise((res) => setTimeout(res, 100));
  }
}

const rows = [];
rows.push(await measure('initialize, cold (sandbox from the image + start)', n, () => initialize(COLD), async () => { if (sid) await drop(COLD); sid = null; }, 2));
if (sid) await drop(COLD);
sid = null;
rows.push(await measure('initialize, from the warm pool', n, () => initialize(WARM),
  async () => { if (sid) await drop(WARM); sid = null; await poolFull(); }, 2));
if (sid) await drop(WARM);
servers(['remove', WARM]); // its pool's sandboxes leave room for the rows below

// tools/call: through the platform (the SDK client over /mcp?name=) and directly (the SDK
// client over stdio to the same server.mjs on this host)
const u = new URL(url);
u.searchParams.set('name', COLD);
const via = new Client({ name: 'bench', version: '1' });
await via.connect(new StreamableHTTPClientTransport(u, { requestInit: { headers: bearer(env.SF_KEY_ALPHA) } }));
const platform = await measure('tools/call through the platform', n * 10, () => via.callTool({ name: 'inc', arguments: {} }), undefined, 10);
const direct = new Client({ name: 'bench', version: '1' });
await direct.connect(new StdioClientTransport({ command: process.execPath, args: [join(dir, 'server.mjs')], cwd: dir }));
const local = await measure('tools/call directly (stdio, this host)', n * 10, () => direct.callTool({ name: 'inc', arguments: {} }), undefined, 10);
await direct.close();
rows.push(platform, local);

// memory: K live sessions (one tools/call each), their sandboxes' cgroups (v1 or v2)
const held = [via];
for (let i = 1; i < k; i++) {
  const c = new Client({ name: 'bench', version: '1' });
  try {
    await c.connect(new StreamableHTTPClientTransport(u, { requestInit: { headers: bearer(env.SF_KEY_ALPHA) } }));
  } catch (e) { // the host is full (disk or memory): the row uses what it holds
    console.error(`session ${i + 1} of ${k} not opened: ${String(e).slice(0, 300)}`);
    break;
  }
  await c.callTool({ name: 'inc', arguments: {} });
  held.push(c);
}
const ids = (await tool('sandbox_list', { metadata: { sandfleet_hosted: COLD } })).structuredContent.sandboxes
  .filter((s) => s.status !== 'killed').map((s) => s.id);
const usage = (id) => {
  for (const f of [`/sys/fs/cgroup/memory/sandfleet/${env.SF_HOST_ID}/${id}/memory.usage_in_bytes`,
    `/sys/fs/cgroup/sandfleet/${env.SF_HOST_ID}/${id}/memory.current`])
    if (existsSync(f)) return Number(readFileSync(f, 'utf8'));
  return NaN;
};
const bytes = ids.map(usage).filter((x) => !Number.isNaN(x));
const mean = bytes.reduce((a, b) => a + b, 0) / Math.max(1, bytes.length);
for (const c of held) await c.close();

servers(['remove', COLD]);

const f = (x) => x.toFixed(1).padStart(9);
console.log(`\n${'row'.padEnd(52)} ${'n'.padStart(5)} ${'p50 ms'.padStart(9)} ${'p90 ms'.padStart(9)} ${'p99 ms'.padStart(9)}`);
for (const r of rows) console.log(`${r.label.padEnd(52)} ${String(r.n).padStart(5)} ${f(r.p50)} ${f(r.p90)} ${f(r.p99)}`);
console.log(`${'tools/call: added by the platform (p50)'.padEnd(52)} ${''.padStart(5)} ${f(platform.p50 - local.p50)}`);
console.log(`${'initialize: saved by the warm pool (p50)'.padEnd(52)} ${''.padStart(5)} ${f(rows[0].p50 - rows[1].p50)}`);
console.log(`\nmemory of a live session (its sandbox's cgroup: agent + node server, ${bytes.length} sessions): ` +
  `${(mean / 2 ** 20).toFixed(1)} MiB mean -> ${(2 ** 30 / mean).toFixed(1)} sessions per GiB of host memory`);
process.exit(0);
