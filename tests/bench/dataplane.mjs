// Latency of the data-plane tools through the whole pipeline (files by size, pause,
// resume, create), with MCP ping and sandbox_exec `true` as baselines in the same run.
// Payloads of 256 KiB and more travel by claim check (Redis), so the 1 MiB and 8 MiB rows
// include that. An 8 MiB file cannot be read with sandbox_files_read (1 MiB limit): its
// read row is sandbox_files_download_dir of a directory holding it (a ZIP of ~8 MiB).
import { randomBytes } from 'node:crypto';
import { env, url } from '../e2e/lib.mjs';

const n = Number(process.argv[2] ?? 100);
const headers = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
  Authorization: `Bearer ${env.SF_KEY_ALPHA}` };
let seq = 0;
async function rpc(method, params) {
  const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: ++seq, method, params }) });
  const j = await res.json();
  if (j.error || j.result?.isError) throw new Error(JSON.stringify(j).slice(0, 400));
  return j.result;
}
const tool = (name, args) => rpc('tools/call', { name, arguments: args });

const init = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'bench', version: '1' } } }) });
headers['Mcp-Session-Id'] = init.headers.get('mcp-session-id');
headers['MCP-Protocol-Version'] = '2025-06-18';

async function measure(label, count, fn, before = async () => {}) {
  for (let i = 0; i < Math.min(3, count); i++) { await before(); await fn(); } // warm-up
  const t = [];
  for (let i = 0; i < count; i++) {
    await before();
    const s = process.hrtime.bigint();
    await fn();
    t.push(Number(process.hrtime.bigint() - s) / 1e6);
  }
  t.sort((a, b) => a - b);
  const q = (p) => t[Math.min(t.length - 1, Math.floor(p * t.length))];
  return { label, n: count, p50: q(0.5), p99: q(0.99) };
}

const sb = (await tool('sandbox_create', { name: 'bench' })).structuredContent.id;
const rows = [];
rows.push(await measure('ping (baseline: gateway only)', n, () => rpc('ping', {})));
rows.push(await measure('sandbox_exec "true" (pipeline baseline)', n, () => tool('sandbox_exec', { sandbox_id: sb, command: 'true' })));
for (const [label, size, count] of [['1 KiB', 1024, n], ['1 MiB', 1 << 20, Math.max(5, n / 5)], ['8 MiB', 8 << 20, Math.max(5, n / 20)]]) {
  const content = randomBytes(size).toString('base64');
  const path = `/root/b${size}/f`;
  rows.push(await measure(`files_write ${label}`, count, () => tool('sandbox_files_write', { sandbox_id: sb, path, content, encoding: 'base64' })));
  if (size <= 1 << 20)
    rows.push(await measure(`files_read ${label}`, count, () => tool('sandbox_files_read', { sandbox_id: sb, path, encoding: 'base64' })));
  else
    rows.push(await measure(`files_download_dir ${label} (ZIP)`, count, () => tool('sandbox_files_download_dir', { sandbox_id: sb, path: `/root/b${size}` })));
}
let paused = false;
rows.push(await measure('sandbox_pause', n, () => tool('sandbox_pause', { sandbox_id: sb }),
  async () => { if (paused) await tool('sandbox_resume', { sandbox_id: sb }); paused = true; }));
rows.push(await measure('sandbox_resume', n, () => tool('sandbox_resume', { sandbox_id: sb }),
  async () => { await tool('sandbox_pause', { sandbox_id: sb }); }));
let last = null;
rows.push(await measure('sandbox_create (base)', Math.max(10, n / 5), async () => {
  last = (await tool('sandbox_create', {})).structuredContent.id;
}, async () => {
  if (last) await tool('sandbox_kill', { sandbox_id: last });
  last = null;
}));
await tool('sandbox_kill', { sandbox_id: last });
await tool('sandbox_kill', { sandbox_id: sb });

const base = rows[1].p50;
const f = (x) => x.toFixed(2).padStart(9);
console.log(`\nsandfleet data-plane benchmark: up to ${n} sequential calls per row, one client`);
console.log(`${'operation'.padEnd(40)} ${'n'.padStart(5)} ${'p50 ms'.padStart(9)} ${'p99 ms'.padStart(9)} ${'p50/exec'.padStart(9)}`);
for (const r of rows)
  console.log(`${r.label.padEnd(40)} ${String(r.n).padStart(5)} ${f(r.p50)} ${f(r.p99)} ${(r.p50 / base).toFixed(1).padStart(8)}x`);
