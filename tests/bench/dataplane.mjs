// Latency of the data-plane tools through the whole pipeline (files by size, pause,
// resume, create), with MCP ping and sandbox_exec `true` as baselines in the same run.
// Payloads of 256 KiB and more travel by claim check (Redis), so the 1 MiB and 8 MiB rows
// include that. An 8 MiB file cannot be read with sandbox_files_read (1 MiB limit): its
// read row is sandbox_files_download_dir of a directory holding it (a ZIP of ~8 MiB).
import { randomBytes } from 'node:crypto';
import { rpc, tool, measure } from './mcp.mjs';

const n = Number(process.argv[2] ?? 100);

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
