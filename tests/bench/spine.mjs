// Latency of MCP calls through the whole pipeline, with MCP ping as the baseline.
// Uses fetch with keep-alive and a session, as the SDK does, without the SDK's own cost.
import { rpc, tool, measure as measureWarm } from './mcp.mjs';

const n = Number(process.argv[2] ?? 300);
const measure = (label, count, fn, before) => measureWarm(label, count, fn, before, 20);

const sb = (await tool('sandbox_create', { name: 'bench' })).structuredContent.id;
const rows = [];
rows.push(await measure('ping (baseline: gateway only)', n, () => rpc('ping', {})));
rows.push(await measure('sandbox_list (gw->kafka->scheduler->redis)', n, () => tool('sandbox_list', {})));
rows.push(await measure('sandbox_exec "true" (full pipeline)', n, () => tool('sandbox_exec', { sandbox_id: sb, command: 'true' })));
// Each created sandbox is killed before the next create, outside the timed part.
let last = null;
rows.push(await measure('sandbox_create', Math.max(10, Math.floor(n / 10)), async () => {
  last = (await tool('sandbox_create', {})).structuredContent.id;
}, async () => {
  if (last) await tool('sandbox_kill', { sandbox_id: last });
  last = null;
}));
await tool('sandbox_kill', { sandbox_id: last });
// Commands in one sandbox overlap: four 0.5 s sleeps at once against one alone (the
// e2e features suite proves they run together; this says how close to 1.0x they get).
const k = Math.max(5, Math.floor(n / 50));
const one = await measure('sandbox_exec "sleep 0.5" (one)', k, () =>
  tool('sandbox_exec', { sandbox_id: sb, command: 'sleep 0.5' }));
const four = await measure('4 x sandbox_exec "sleep 0.5" at once', k, () =>
  Promise.all([1, 2, 3, 4].map(() => tool('sandbox_exec', { sandbox_id: sb, command: 'sleep 0.5' }))));
rows.push(one, four);
await tool('sandbox_kill', { sandbox_id: sb });

const base = rows[0].p50;
const f = (x) => x.toFixed(2).padStart(8);
console.log(`\nsandfleet spine benchmark: ${n} sequential calls per row, keep-alive HTTP/1.1, one client`);
console.log(`${'operation'.padEnd(44)} ${'n'.padStart(5)} ${'p50 ms'.padStart(8)} ${'p90 ms'.padStart(8)} ${'p99 ms'.padStart(8)} ${'mean ms'.padStart(8)} ${'p50/base'.padStart(9)}`);
for (const r of rows)
  console.log(`${r.label.padEnd(44)} ${String(r.n).padStart(5)} ${f(r.p50)} ${f(r.p90)} ${f(r.p99)} ${f(r.mean)} ${(r.p50 / base).toFixed(1).padStart(8)}x`);
console.log('\ntargets: sandbox_exec p50 <= 10 ms, sandbox_create p50 <= 50 ms');
console.log(`concurrency: 4 at once / one alone = ${(four.p50 / one.p50).toFixed(2)}x (1.0x: fully overlapped, 4.0x: one after another)`);
