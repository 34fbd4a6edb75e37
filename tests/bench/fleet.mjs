// The fleet's throughput (tests/bench/fleet): 64 concurrent MCP clients (plain JSON-RPC
// tools/call over keep-alive HTTP/1.1, no session) through two gateways to three workers:
// sustained sandbox_exec `true` per second with p50/p99, then the same at half that rate
// (paced), beside the baseline of MCP ping (the gateway alone) at the same concurrency;
// then the same jobs from `sandfleet batch run` (straight onto the queue, 64 in flight),
// as fast as it goes and with --rate at half that.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fleetEnv, mcall, sleep } from '../fault/load.mjs';

const env = fleetEnv(process.env.SF_FLEET_STATE);
const urls = [env.SF_URL, env.SF_URL2];
const key = env.SF_KEY;
const secs = Number(process.argv[2] ?? 10);
const conc = 64;

async function ping(url) {
  const t0 = performance.now();
  const res = await fetch(url, { method: 'POST', headers: { Authorization: `Bearer ${key}`,
    'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
  body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' });
  await res.text();
  return { ok: res.status === 200, ms: performance.now() - t0 };
}

// conc loops for secs; rate (calls/s over all loops) paces them when set.
async function run(fn, rate) {
  const lat = [];
  let errors = 0;
  const t0 = performance.now();
  const end = t0 + secs * 1000;
  let next = t0;
  await Promise.all(Array.from({ length: conc }, async (_, i) => {
    while (performance.now() < end) {
      if (rate) {
        const slot = next;
        next += 1000 / rate;
        if (slot > performance.now()) await sleep(slot - performance.now());
        if (performance.now() >= end) break;
      }
      const r = await fn(i);
      if (r.ok) lat.push(r.ms); else errors++;
    }
  }));
  const took = (performance.now() - t0) / 1000;
  lat.sort((a, b) => a - b);
  const q = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : NaN);
  return { n: lat.length, errors, rate: lat.length / took, p50: q(0.5), p99: q(0.99) };
}

const sandboxes = [];
for (let i = 0; i < 6; i++) {
  const r = await mcall(urls[i % 2], key, 'sandbox_create', { name: `bench-${i}` });
  if (!r.ok) throw new Error(`create: ${r.text}`);
  sandboxes.push(r.structured.id);
}
const exec = async (i) => {
  const r = await mcall(urls[i % 2], key, 'sandbox_exec', { sandbox_id: sandboxes[i % sandboxes.length], command: 'true' });
  return { ok: r.ok, ms: r.ms };
};
// n jobs of `true` through the batch CLI (rate: --rate); its summary line has the figures.
function batch(n, rate) {
  const dir = mkdtempSync(join(tmpdir(), 'sf-bench-batch-'));
  const jobs = join(dir, 'jobs.jsonl');
  writeFileSync(jobs, Array.from({ length: n }, (_, i) => JSON.stringify({ id: i, tool: 'sandbox_exec',
    arguments: { sandbox_id: sandboxes[i % sandboxes.length], command: 'true' } })).join('\n') + '\n');
  const r = spawnSync(`${env.SF_BUILD}/cli/sandfleet`, ['batch', 'run', jobs, '--out', join(dir, 'out.jsonl'),
    '--concurrency', String(conc), ...(rate ? ['--rate', String(Math.max(1, Math.round(rate)))] : [])],
  { env: { ...process.env, SANDFLEET_API_KEY: key, SF_KAFKA_BROKERS: env.SF_KAFKA_BROKERS, SF_HOME: dir }, encoding: 'utf8' });
  const results = readFileSync(join(dir, 'out.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  rmSync(dir, { recursive: true, force: true });
  const m = r.stderr.match(/(\d+) errors, in [\d.]+ s: (\d+) jobs\/s; latency p50 (\d+) ms, p99 (\d+) ms/);
  if (r.status !== 0 || !m) throw new Error(`batch: ${r.stderr}`);
  return { n: results.length, errors: results.filter((x) => x.result?.exit_code !== 0).length,
    rate: Number(m[2]), p50: Number(m[3]), p99: Number(m[4]) };
}

const base = await run((i) => ping(urls[i % 2]));
const full = await run(exec);
const half = await run(exec, full.rate / 2);
const bfull = batch(Math.round(Math.max(full.rate, 50) * secs * 1.5));
const bhalf = batch(Math.round((bfull.rate / 2) * secs), bfull.rate / 2);
const row = (name, r) => `| ${name} | ${r.rate.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.errors} | ${(r.p50 / base.p50).toFixed(1)}x |`;
console.log(`\n${conc} concurrent clients, ${secs} s per row, 2 gateways, 2 schedulers, 3 workers\n`);
console.log('| calls | per s | p50 ms | p99 ms | errors | p50 / ping |');
console.log('| --- | ---: | ---: | ---: | ---: | ---: |');
console.log(row('ping (baseline: gateway only)', base));
console.log(row('sandbox_exec `true`, as fast as it goes', full));
console.log(row('sandbox_exec `true`, at half that rate', half));
console.log(row(`batch CLI: sandbox_exec \`true\` (${bfull.n} jobs), as fast as it goes`, bfull));
console.log(row(`batch CLI: the same at half that rate (--rate, ${bhalf.n} jobs)`, bhalf));
for (const id of sandboxes) await mcall(urls[0], key, 'sandbox_kill', { sandbox_id: id });
