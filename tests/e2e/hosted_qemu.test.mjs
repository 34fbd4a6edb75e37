// Hosted MCP servers on a fleet of qemu hosts only (issue 24; ctest e2e.qemu.hosted_qemu, the
// qemu stack; skipped on a jail stack): the code is uploaded into a builder microVM and the
// server's image is its snapshot, so a session is a microVM restored from it; what is a
// template build (--setup, a server's shape) needs a jail host, and the CLI says so. The
// server is a stdio MCP server in the busybox shell of 'base' (the qemu stack's guest),
// spoken to by the official TypeScript SDK client.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { env, url, driver, bearer, connect, call } from './lib.mjs';

const uniq = Date.now().toString(36);
const skip = { skip: driver !== 'qemu' && 'the qemu-only fleet suite (e2e.qemu.hosted_qemu)' };

// One JSON-RPC message a line, ids are integers (the SDK client's): initialize, tools/list,
// tools/call (a per-process counter and what --setup wrote).
const SERVER = `n=0
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\\([0-9][0-9]*\\).*/\\1/p')
  [ -z "$id" ] && continue
  case "$line" in
  *'"method":"initialize"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"sh-hosted","version":"1.0.0"}}}\\n' "$id";;
  *'"method":"tools/list"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"inc","inputSchema":{"type":"object"}}]}}\\n' "$id";;
  *'"method":"tools/call"'*) n=$((n+1)); printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s %s"}]}}\\n' "$id" "$n" "$(cat data.txt)";;
  *) printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"no such method"}}\\n' "$id";;
  esac
done
`;

function servers(args) {
  return spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['servers', ...args], { encoding: 'utf8',
    env: { ...process.env, SANDFLEET_URL: env.SF_URL, SANDFLEET_API_KEY: env.SF_KEY_ALPHA }, timeout: 900000 });
}

const dirs = [];
function serverDir() {
  const dir = mkdtempSync(join(tmpdir(), 'sf-hosted-sh-'));
  writeFileSync(join(dir, 'server.sh'), SERVER);
  writeFileSync(join(dir, 'data.txt'), 'uploaded');
  dirs.push(dir);
  return dir;
}
after(() => { for (const d of dirs) rmSync(d, { recursive: true, force: true }); });

async function open(name) {
  const u = new URL(url);
  u.searchParams.set('name', name);
  const transport = new StreamableHTTPClientTransport(u, { requestInit: { headers: bearer(env.SF_KEY_ALPHA) } });
  const client = new Client({ name: 'hosted-qemu', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}
const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('');

test('qemu-only fleet: the uploaded code runs; each session is a microVM of its own', skip, async () => {
  const S = `sh-${uniq}`;
  const r = servers(['add', S, '--dir', serverDir(), '--run', 'sh server.sh', '--template', 'base']);
  assert.equal(r.status, 0, r.stderr);
  try {
    const a = await open(S);
    assert.equal(a.client.getServerVersion().name, 'sh-hosted');
    assert.deepEqual((await a.client.listTools()).tools.map((t) => t.name), ['inc']);
    assert.equal(text(await a.client.callTool({ name: 'inc', arguments: {} })), '1 uploaded');
    assert.equal(text(await a.client.callTool({ name: 'inc', arguments: {} })), '2 uploaded');
    const b = await open(S);
    assert.equal(text(await b.client.callTool({ name: 'inc', arguments: {} })), '1 uploaded', 'its own microVM');
    const c = await connect(env.SF_KEY_ALPHA);
    const boxes = (await call(c, 'sandbox_list', { metadata: { sandfleet_hosted: S } })).structured.sandboxes
      .filter((x) => x.status !== 'killed');
    await c.close();
    assert.equal(boxes.length, 2);
    for (const h of [a, b]) {
      await h.transport.terminateSession();
      await h.client.close();
    }
  } finally {
    assert.equal(servers(['remove', S]).status, 0);
  }
});

// --setup and a shape are template builds (jail hosts): refused with the sentence, and
// nothing is left behind.
for (const [what, extra] of [['--setup', ['--setup', 'echo setup-ran > setup.txt']], ['a shape', ['--memory_mib', '256']]]) {
  test(`qemu-only fleet: ${what} is a template build: refused, saying a jail host is needed`, skip, async () => {
    const S = `tb-${what === '--setup' ? 'setup' : 'shape'}-${uniq}`;
    const r = servers(['add', S, '--dir', serverDir(), '--run', 'sh server.sh', '--template', 'base', ...extra]);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /No worker host that can build templates \(jail driver\)/);
    assert.match(r.stderr, /This fleet has no jail host: --setup, a server's shape \(--vcpu\/--memory_mib\/--disk_mib\) and a team --template are template builds, which run on jail hosts only/);
    assert.equal(servers(['show', S]).status, 1, 'nothing registered');
    const c = await connect(env.SF_KEY_ALPHA);
    const t = (await call(c, 'sandbox_template_list', { name_prefix: `mcp-${S}` })).structured.templates;
    const boxes = (await call(c, 'sandbox_list', {})).structured.sandboxes
      .filter((x) => x.status !== 'killed' && x.name === 'sandfleet-server-build');
    await c.close();
    assert.deepEqual(t, [], 'no template left');
    assert.deepEqual(boxes, [], 'no builder sandbox left');
  });
}
