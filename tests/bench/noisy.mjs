// Noisy neighbour: team beta's `sandbox_exec true` latency while team alpha, on the same
// host, idles (the baseline), burns CPU, fills its memory, writes to its disk, and kills a
// sandbox of 100k directories and 400k files; plus how long that kill takes to finish
// (answered at once; the teardown runs off the worker's loop). Run by tests/bench/noisy.
import { env, url } from '../e2e/lib.mjs';
import { execFileSync } from 'node:child_process';

const n = Number(process.argv[2] ?? 200);
const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function session(key) {
  const headers = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
    Authorization: `Bearer ${key}` };
  let seq = 0;
  const init = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 0,
    method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {},
      clientInfo: { name: 'noisy-bench', version: '1' } } }) });
  headers['Mcp-Session-Id'] = init.headers.get('mcp-session-id');
  headers['MCP-Protocol-Version'] = '2025-06-18';
  return async (name, args) => {
    const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: ++seq,
      method: 'tools/call', params: { name, arguments: args } }) });
    const j = await res.json();
    if (j.error || j.result?.isError) throw new Error(`${name}: ${JSON.stringify(j).slice(0, 300)}`);
    return j.result.structuredContent;
  };
}

const alpha = await session(env.SF_KEY_ALPHA);
const beta = await session(env.SF_KEY_BETA);
const b = (await beta('sandbox_create', { name: 'victim' })).id;

async function latency(label, count) {
  for (let i = 0; i < 10; i++) await beta('sandbox_exec', { sandbox_id: b, command: 'true' });
  const t = [];
  for (let i = 0; i < count; i++) {
    const s = process.hrtime.bigint();
    await beta('sandbox_exec', { sandbox_id: b, command: 'true' });
    t.push(Number(process.hrtime.bigint() - s) / 1e6);
  }
  t.sort((x, y) => x - y);
  const q = (p) => t[Math.min(t.length - 1, Math.floor(p * t.length))];
  return { label, n: count, p50: q(0.5), p99: q(0.99), max: t[t.length - 1] };
}

const rows = [];
const a = (await alpha('sandbox_create', { name: 'noisy' })).id;
rows.push(await latency('alpha idle (baseline)', n));

await alpha('sandbox_exec', { sandbox_id: a, command:
  'i=0; while [ $i -lt 100 ]; do (while :; do :; done) >/dev/null 2>&1 & i=$((i+1)); done; echo ok' });
await sleep(500);
rows.push(await latency('alpha burns CPU (100 busy loops)', n));
await alpha('sandbox_exec', { sandbox_id: a, command: 'kill -9 -1 2>/dev/null; true' });

// Memory: a process that keeps its sandbox at its memory limit (OOM-killed, restarted).
await alpha('sandbox_exec', { sandbox_id: a, command:
  "(while :; do x=$(head -c 400000000 /dev/zero | tr '\\0' a); done) >/dev/null 2>&1 & echo ok" });
await sleep(500);
rows.push(await latency('alpha fills its memory (OOM loop)', n));
await alpha('sandbox_exec', { sandbox_id: a, command: 'kill -9 -1 2>/dev/null; true' });

await alpha('sandbox_exec', { sandbox_id: a, command:
  '(while :; do dd if=/dev/zero of=/root/f bs=1M count=800 2>/dev/null; rm -f /root/f; done) >/dev/null 2>&1 & echo ok' });
await sleep(500);
rows.push(await latency('alpha writes to its disk (dd loop)', n));
await alpha('sandbox_exec', { sandbox_id: a, command: 'kill -9 -1 2>/dev/null; true' });
await alpha('sandbox_kill', { sandbox_id: a });

// The big tree, killed while beta measures.
const t = (await alpha('sandbox_create', { name: 'tree' })).id;
await alpha('sandbox_exec', { sandbox_id: t, timeout_ms: 600000, detach_after_ms: 0, command:
  "mkdir /root/t && cd /root/t && seq 100000 | xargs mkdir && seq 100000 | sed 's|.*|&/a &/b &/c &/d|' | xargs touch" });
let killMs = null;
const k0 = process.hrtime.bigint();
await alpha('sandbox_kill', { sandbox_id: t });
const answered = Number(process.hrtime.bigint() - k0) / 1e6;
const watch = (async () => {
  while (redis('HGET', `sf:sb:{${t}}`, 'state') !== 'killed') await sleep(5);
  killMs = Number(process.hrtime.bigint() - k0) / 1e6;
})();
rows.push(await latency('alpha kills a 100k-dir / 400k-file sandbox', Math.max(50, Math.floor(n / 2))));
await watch;
await beta('sandbox_kill', { sandbox_id: b });

const base = rows[0].p50;
const f = (x) => x.toFixed(2).padStart(8);
console.log(`\nsandfleet noisy-neighbour benchmark: team beta's sandbox_exec "true", ${n} sequential calls per row,`);
console.log('while team alpha, on the same host (one worker), does what the row says');
console.log(`${'alpha'.padEnd(46)} ${'n'.padStart(5)} ${'p50 ms'.padStart(8)} ${'p99 ms'.padStart(8)} ${'max ms'.padStart(8)} ${'p50/idle'.padStart(9)}`);
for (const r of rows)
  console.log(`${r.label.padEnd(46)} ${String(r.n).padStart(5)} ${f(r.p50)} ${f(r.p99)} ${f(r.max)} ${(r.p50 / base).toFixed(1).padStart(8)}x`);
console.log(`\nkill of the 100k-dir / 400k-file sandbox: answered in ${answered.toFixed(1)} ms, ` +
  `torn down (record 'killed') after ${killMs.toFixed(0)} ms`);
