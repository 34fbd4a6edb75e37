// sandbox_create past client timeouts (issue 27 item 1, "the same rule for any other tool
// that can run long"): a create for 'debian' while the only host is still building it
// waits for the build, but a caller that asked for no progress hears back within
// template_wait_detach_ms (45 s by default, before the 60 s request timeout of most MCP
// clients) with "still being built, about N s left; retry"; a caller with a progress token
// (its beats can keep its request alive) waits up to template_wait_s as before. Its own
// Redis, broker, scheduler and gateway, with small waits (detach 3 s, template wait 12 s);
// the host is a fake (a heartbeat written by this test saying 'debian is being built':
// a real build takes minutes), named as such; no worker runs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { daemons } from './daemons.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const build = process.env.SF_BUILD;
if (!build) throw new Error('SF_BUILD is not set: run this through ctest (ops/test)');
const dir = mkdtempSync(resolve(tmpdir(), 'sf-create-wait-'));
const free = () => execFileSync('python3', ['-c',
  'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'], { encoding: 'utf8' }).trim();
const REDIS_PORT = free(), GW_PORT = free();
const common = { SF_REDIS_URL: `redis://127.0.0.1:${REDIS_PORT}`, SF_AUTH_SECRET_FILE: `${dir}/auth.key`,
  SF_SCHEMAS_DIR: resolve(root, 'schemas/tools'), SF_LOG_LEVEL: 'info' };
const d = daemons(build);
let beat, client;
const redis = (...args) => execFileSync('redis-cli', ['-p', REDIS_PORT, ...args], { encoding: 'utf8' });

// The fake host: the heartbeat a jail worker writes while it builds 'debian' (tpl_debian b).
function fakeBeat() {
  const now = String(Date.now());
  redis('HSET', 'sf:host:{host-fake}', 'id', 'host-fake', 'topic', 'sf.host.host-fake', 'driver', 'jail',
    'caps', 'layers builds debian', 'version', '0.2.0', 'ts', now, 'running', '0', 'capacity', '8',
    'mem_mib', '8192', 'vcpu_milli', '4000', 'disk_mib', '20000', 'disk_used_mib', '0', 'tpl_debian', 'b');
  redis('PEXPIRE', 'sf:host:{host-fake}', '60000');
  redis('ZADD', 'sf:hosts', now, 'host-fake');
}

before(async () => {
  writeFileSync(`${dir}/auth.key`, randomBytes(32).toString('hex'));
  const brokers = await d.storeAndBroker(dir, REDIS_PORT);
  fakeBeat();
  beat = setInterval(fakeBeat, 500);
  d.start('scheduler', resolve(build, 'scheduler/sandfleet-scheduler'), [], { ...common,
    SF_KAFKA_BROKERS: brokers, SF_TEMPLATE_WAIT_S: '12', SF_TEMPLATE_WAIT_DETACH_MS: '3000' });
  const gw = d.start('gateway', resolve(build, 'gateway/sandfleet-gateway'), [], { ...common,
    SF_PORT: GW_PORT, SF_KAFKA_BROKERS: brokers, SF_TEMPLATE_WAIT_S: '12', SF_THREADS: '2' });
  await d.gatewayReady(gw, `http://127.0.0.1:${GW_PORT}`);
  const key = execFileSync(resolve(build, 'cli/sandfleet'), ['keys', 'create', '--team', 'waiters'],
    { encoding: 'utf8', env: { ...process.env, ...common, SF_HOME: dir } }).trim();
  client = new Client({ name: 'sandfleet-create-wait', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${GW_PORT}/mcp`),
    { requestInit: { headers: { Authorization: `Bearer ${key}` } } }));
});

after(async () => {
  clearInterval(beat);
  await client?.close();
  await d.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

const create = (opts) => client.callTool({ name: 'sandbox_create', arguments: { from_template: 'debian' } },
  undefined, { timeout: 60000, ...opts });

test('a create without progress hears "still being built" after template_wait_detach_ms, not after template_wait_s', async () => {
  const t0 = Date.now();
  const r = await create();
  const ms = Date.now() - t0;
  assert.equal(r.isError, true, JSON.stringify(r));
  assert.match(r.content[0].text, /The 'debian' template is still being built, about \d+ s left .*retry sandbox_create then/);
  // placement is tried every 2 s: the answer comes in the last 2 s before the detach
  assert.ok(ms >= 1000 && ms <= 5000, `answered after ${ms} ms (detach 3 s, template wait 12 s)`);
});

test('a create with a progress token waits up to template_wait_s (its beats keep the request alive)', async () => {
  const t0 = Date.now();
  const r = await create({ onprogress: () => {}, resetTimeoutOnProgress: true });
  const ms = Date.now() - t0;
  assert.equal(r.isError, true, JSON.stringify(r));
  assert.match(r.content[0].text, /still being built/);
  assert.ok(ms >= 9000, `answered after ${ms} ms: it waited past the 3 s detach, towards the 12 s template wait`);
});
