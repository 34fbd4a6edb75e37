// The fleet's throughput (tests/bench/fleet): 64 concurrent MCP clients (plain JSON-RPC
// tools/call over keep-alive HTTP/1.1, no session, from the C client mcp_load, so the
// client is not the limit) through two gateways to three workers: sustained sandbox_exec
// `true` per second with p50/p99, then the same at half that rate (paced), beside the
// baseline of MCP ping (the gateways alone) at the same concurrency; then the same jobs
// from `sandfleet batch run` (straight onto the queue, 64 in flight), as fast as it goes
// and with --rate at half that.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fleetEnv, mcall } from '../fault/load.mjs';

const env = fleetEnv(process.env.SF_FLEET_STATE);
const urls = [env.SF_URL, env.SF_URL2];
const key = env.SF_KEY;
const secs = Number(process.argv[2] ?? 10);
const conc = 64;
const work = mkdtempSync(join(tmpdir(), 'sf-bench-fleet-'));

// conc connections for secs through mcp_load, one JSON-RPC body per line of bodies
// (connection i sends line i % lines to gateway i % 2); rate (calls/s in all) paces them.
function load(bodies, match, rate) {
  const file = join(work, 'bodies.jsonl');
  writeFileSync(file, bodies.map((b) => JSON.stringify(b)).join('\n') + '\n');
  const r = spawnSync(`${env.SF_BUILD}/tests/mcp_load`, [String(secs), String(rate ?? 0), String(conc),
    key, match, file, ...urls], { encoding: 'utf8' });
  const m = r.stdout.match(/n=(\d+) errors=(\d+) secs=[\d.]+ rps=([\d.]+) p50_ms=([\d.]+) p99_ms=([\d.]+)/);
  if (r.status !== 0 || !m) throw new Error(`mcp_load: ${r.stderr}${r.stdout}`);
  return { n: Number(m[1]), errors: Number(m[2]), rate: Number(m[3]), p50: Number(m[4]), p99: Number(m[5]) };
}

const sandboxes = [];
for (let i = 0; i < 6; i++) {
  const r = await mcall(urls[i % 2], key, 'sandbox_create', { name: `bench-${i}` });
  if (!r.ok) throw new Error(`create: ${r.text}`);
  sandboxes.push(r.structured.id);
}
const call = (id, name, args) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } });
const execs = sandboxes.map((sb, i) => call(i, 'sandbox_exec', { sandbox_id: sb, command: 'true' }));
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

// The broker's CPU time (/proc) and, when it counts them (ops/kafka: SIGUSR1 logs a
// "broker counts" line), its Fetch and Produce requests, for the figures per job.
const state = process.env.SF_FLEET_STATE;
// (on the production engines, SF_FLEET_ENGINES=1: the three Apache Kafka brokers' CPU)
const engines = !existsSync(join(state, 'pids/kafka'));
const brokerPids = (engines ? [1, 2, 3].map((i) => `engines/pids/kafka-${i}`) : ['pids/kafka'])
  .map((f) => Number(readFileSync(join(state, f), 'utf8')));
const brokerPid = brokerPids[0];
const brokerLog = join(state, 'logs/kafka.log');
async function brokerNow() {
  let cpuMs = 0;
  for (const pid of brokerPids) {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    cpuMs += ((Number(f[11]) + Number(f[12])) * 1000) / 100; // utime + stime, 100 Hz ticks
  }
  if (engines || !existsSync(brokerLog) || !readFileSync(brokerLog, 'utf8').includes('counts_on=SIGUSR1')) return { cpuMs };
  const before = readFileSync(brokerLog, 'utf8').length;
  process.kill(brokerPid, 'SIGUSR1');
  for (let i = 0; i < 100; i++) {
    const tail = readFileSync(brokerLog, 'utf8').slice(before);
    const m = tail.match(/broker counts" produce=(\d+) fetch=(\d+)/);
    if (m) return { cpuMs, produce: Number(m[1]), fetch: Number(m[2]) };
    await new Promise((r) => setTimeout(r, 50));
  }
  return { cpuMs };
}
// CPU throttling of the workers' cgroups (cgroup v1 cpu/sandfleet/<host>/<sandbox>, or v2
// sandfleet/<host>/<sandbox>): periods, periods throttled, time throttled; the hosts'
// groups (their share of the box) apart from the bench's six sandboxes.
function throttle() {
  const sum = { host: { periods: 0, throttled: 0, ms: 0 }, box: { periods: 0, throttled: 0, ms: 0 } };
  const add = (t, file) => {
    let text;
    try { text = readFileSync(file, 'utf8'); } catch { return; }
    const v = (k) => Number(text.match(new RegExp(`^${k} (\\d+)`, 'm'))?.[1] ?? 0);
    t.periods += v('nr_periods');
    t.throttled += v('nr_throttled');
    t.ms += v('throttled_time') / 1e6 + v('throttled_usec') / 1e3;
  };
  for (const root of ['/sys/fs/cgroup/cpu/sandfleet', '/sys/fs/cgroup/sandfleet']) {
    for (const h of [1, 2, 3]) {
      const dir = join(root, `fleet-${h}`);
      if (!existsSync(dir)) continue;
      add(sum.host, join(dir, 'cpu.stat'));
      for (const d of readdirSync(dir)) if (sandboxes.includes(d)) add(sum.box, join(dir, d, 'cpu.stat'));
    }
  }
  return sum;
}
const broker0 = await brokerNow();
const throttle0 = throttle();
const load0 = loadavg()[0];
// With stage stamps on (SF_TRACE_DIR: tests/bench/fleet --trace), each exec row's window
// goes to rows.json for tests/bench/trace.mjs.
const windows = [];
function timed(name, kind, fn) {
  const from = Date.now() * 1000;
  const r = fn();
  windows.push({ name, kind, from, to: Date.now() * 1000 });
  return r;
}
const base = load([{ jsonrpc: '2.0', id: 1, method: 'ping' }], '"result"');
const full = timed('MCP, as fast as it goes', 'gateway', () => load(execs, '"isError":false'));
const half = timed('MCP, at half that rate', 'gateway', () => load(execs, '"isError":false', full.rate / 2));
const bfull = timed('batch, as fast as it goes', 'batch', () => batch(Math.round(Math.max(full.rate, 50) * secs * 1.5)));
const bhalf = timed('batch, at half that rate', 'batch', () => batch(Math.round((bfull.rate / 2) * secs), bfull.rate / 2));
if (process.env.SF_TRACE_DIR) writeFileSync(join(process.env.SF_TRACE_DIR, 'rows.json'), JSON.stringify(windows));
const broker1 = await brokerNow();
const throttle1 = throttle();
const row = (name, r) => `| ${name} | ${r.rate.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.errors} | ${(r.p50 / base.p50).toFixed(1)}x |`;
console.log(`\n${engines ? 'Apache Kafka (3 brokers, RF 3, min ISR 2) + Redis Cluster (3+3)' : 'embedded broker + one Redis'}: ` +
  `${conc} concurrent clients, ${secs} s per row, 2 gateways, 2 schedulers, 3 workers; ` +
  `load average ${load0.toFixed(1)} before, ${loadavg()[0].toFixed(1)} after\n`);
console.log('| calls | per s | p50 ms | p99 ms | errors | p50 / ping |');
console.log('| --- | ---: | ---: | ---: | ---: | ---: |');
console.log(row('ping (baseline: gateway only)', base));
console.log(row('sandbox_exec `true`, as fast as it goes', full));
console.log(row('sandbox_exec `true`, at half that rate', half));
console.log(row(`batch CLI: sandbox_exec \`true\` (${bfull.n} jobs), as fast as it goes`, bfull));
console.log(row(`batch CLI: the same at half that rate (--rate, ${bhalf.n} jobs)`, bhalf));
console.log(`\nexec per s vs the goal (1000): MCP ${(full.rate / 1000).toFixed(2)}x, batch ${(bfull.rate / 1000).toFixed(2)}x; ` +
  `p99 at half rate (goal <= 50 ms): MCP ${half.p99.toFixed(1)} ms, batch ${bhalf.p99.toFixed(1)} ms`);
{
  const jobs = full.n + half.n + bfull.n + bhalf.n;
  const per = (k) => (broker1[k] - broker0[k]) / jobs;
  console.log(`broker, per job of the four exec rows (${jobs} jobs): CPU ${per('cpuMs').toFixed(3)} ms` +
    (broker1.fetch !== undefined ? `, Fetch requests ${per('fetch').toFixed(2)}, Produce requests ${per('produce').toFixed(2)}` : ''));
}
for (const k of ['box', 'host']) {
  const d = (f) => throttle1[k][f] - throttle0[k][f];
  console.log(`CPU throttling of the ${k === 'box' ? 'sandboxes\' groups (6)' : 'hosts\' groups (3)'} during the exec rows: ` +
    `${d('throttled')} of ${d('periods')} periods, ${(d('ms') / 1000).toFixed(1)} s in all`);
}
for (const id of sandboxes) await mcall(urls[0], key, 'sandbox_kill', { sandbox_id: id });
rmSync(work, { recursive: true, force: true });
