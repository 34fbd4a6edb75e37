// Background work through MCP: how long sandbox_exec background: true takes to answer, and
// from the call to the process's first log line being readable with sandbox_process_logs
// (polled back to back). Each process is killed, untimed, before the next start.
import { tool, measure, rpc } from './mcp.mjs';

const n = Number(process.argv[2] ?? 100);
const template = process.argv[3] ?? 'base';
// 'debian' is built by the stack's worker (on qemu its guest image too): wait for it
while (template === 'debian' && (await tool('sandbox_template_list', { name_prefix: 'debian' }))
  .structuredContent.templates.find((x) => x.name === 'debian')?.status !== 'ready')
  await new Promise((res) => setTimeout(res, 1000));
const sb = (await tool('sandbox_create', { name: 'bench-bg', from_template: template })).structuredContent.id;
let pid = null;
const start = async () => {
  pid = (await tool('sandbox_exec', { sandbox_id: sb, background: true, command: 'echo ready; exec sleep 300' }))
    .structuredContent.pid;
};
const stop = async () => {
  if (pid) await tool('sandbox_process_kill', { sandbox_id: sb, pid, signal: 'KILL' });
  pid = null;
};
const rows = [];
rows.push(await measure('ping (baseline: gateway only)', n, () => rpc('ping', {})));
rows.push(await measure(`sandbox_exec background: true (answer) [${template}]`, n, start, stop));
rows.push(await measure(`background start -> first log line [${template}]`, n, async () => {
  await start();
  for (;;) {
    const r = await tool('sandbox_process_logs', { sandbox_id: sb, pid });
    if (r.structuredContent.data.startsWith('ready\n')) break;
  }
}, stop));
await stop();
await tool('sandbox_kill', { sandbox_id: sb });

const f = (x) => x.toFixed(2).padStart(8);
console.log(`\nsandfleet background benchmark: ${n} sequential runs per row, keep-alive HTTP/1.1, one client`);
console.log(`${'operation'.padEnd(52)} ${'n'.padStart(5)} ${'p50 ms'.padStart(8)} ${'p90 ms'.padStart(8)} ${'p99 ms'.padStart(8)} ${'mean ms'.padStart(8)}`);
for (const r of rows)
  console.log(`${r.label.padEnd(52)} ${String(r.n).padStart(5)} ${f(r.p50)} ${f(r.p90)} ${f(r.p99)} ${f(r.mean)}`);
