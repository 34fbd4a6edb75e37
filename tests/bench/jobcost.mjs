// Per-job costs of the fleet (tests/bench/jobcost [JOBS]): load-independent counts for one
// `sandbox_exec true` job from `sandfleet batch run` (JOBS jobs, 64 in flight, after a
// warm-up batch): each daemon's CPU time (/proc/PID/stat utime+stime), the sandboxes' CPU
// (the workers' cpuacct groups: agents and commands), the batch CLI's own CPU, Redis
// commands (`info commandstats`), log lines, and each daemon's context switches; printed
// per job, as a table.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fleetEnv, mcall } from '../fault/load.mjs';

const env = fleetEnv(process.env.SF_FLEET_STATE);
const state = process.env.SF_FLEET_STATE;
const urls = [env.SF_URL, env.SF_URL2];
const jobs = Number(process.argv[2] ?? 5000);
const hz = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

const sandboxes = [];
for (let i = 0; i < 6; i++) {
  const r = await mcall(urls[i % 2], env.SF_KEY, 'sandbox_create', { name: `cost-${i}` });
  if (!r.ok) throw new Error(`create: ${r.text}`);
  sandboxes.push(r.structured.id);
}

function daemons() {
  const out = {};
  for (const name of readdirSync(join(state, 'pids'))) {
    if (name.endsWith('.start')) continue;
    const pid = readFileSync(join(state, 'pids', name), 'utf8').trim();
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const cs = [...status.matchAll(/ctxt_switches:\s+(\d+)/g)].reduce((a, m) => a + Number(m[1]), 0);
      // utime, stime, cutime, cstime (fields 14-17; f[0] is field 3)
      out[name] = { us: ((+f[11]) + (+f[12]) + (+f[13]) + (+f[14])) * 1e6 / hz, cs };
    } catch { /* gone */ }
  }
  let sb = 0;
  for (const h of ['fleet-1', 'fleet-2', 'fleet-3']) {
    const f = `/sys/fs/cgroup/cpuacct/sandfleet/${h}/cpuacct.usage`;
    if (existsSync(f)) sb += Number(readFileSync(f, 'utf8')) / 1000;
  }
  out['sandboxes (agents + commands)'] = { us: sb, cs: 0 };
  return out;
}
function redisCmds() {
  const r = spawnSync('redis-cli', ['-u', env.SF_REDIS_URL, 'info', 'commandstats'], { encoding: 'utf8' });
  const out = {};
  for (const m of r.stdout.matchAll(/cmdstat_(\w+):calls=(\d+)/g)) out[m[1]] = Number(m[2]);
  return out;
}
function logLines() {
  const out = {};
  for (const f of readdirSync(join(state, 'logs')))
    out[f] = readFileSync(join(state, 'logs', f), 'utf8').split('\n').length - 1;
  return out;
}
function batch(n) {
  const dir = mkdtempSync(join(tmpdir(), 'sf-jobcost-'));
  const file = join(dir, 'jobs.jsonl');
  writeFileSync(file, Array.from({ length: n }, (_, i) => JSON.stringify({ id: i, tool: 'sandbox_exec',
    arguments: { sandbox_id: sandboxes[i % sandboxes.length], command: 'true' } })).join('\n') + '\n');
  const r = spawnSync('sh', ['-c', `t0=$(cut -d' ' -f1-2 /proc/uptime); "$0" "$@"; rc=$?; cat /proc/$$/stat >&2; exit $rc`,
    `${env.SF_BUILD}/cli/sandfleet`, 'batch', 'run', file, '--out', join(dir, 'out.jsonl'), '--concurrency', '64'],
  { env: { ...process.env, SANDFLEET_API_KEY: env.SF_KEY, SF_KAFKA_BROKERS: env.SF_KAFKA_BROKERS, SF_HOME: dir },
    encoding: 'utf8' });
  const ok = readFileSync(join(dir, 'out.jsonl'), 'utf8').trim().split('\n')
    .filter((l) => JSON.parse(l).result?.exit_code === 0).length;
  rmSync(dir, { recursive: true, force: true });
  const st = r.stderr.trim().split('\n').pop();
  const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
  const m = r.stderr.match(/in [\d.]+ s: (\d+) jobs\/s/);
  if (r.status !== 0 || ok !== n) throw new Error(`batch: ${ok}/${n} ok: ${r.stderr}`);
  return { cliUs: ((+f[13]) + (+f[14])) * 1e6 / hz, rate: m ? Number(m[1]) : 0 };
}

batch(500); // warm-up: the reply topic known everywhere, sandboxes' first commands done
// idle: what each process costs per second with no jobs (fetch polls, heartbeats, timers)
const idleSecs = 3;
const i0 = daemons(), t0 = performance.now();
await new Promise((r) => setTimeout(r, idleSecs * 1000));
const i1 = daemons(), idleMs = performance.now() - t0;
const load0 = loadavg()[0];
const d0 = daemons(), r0 = redisCmds(), l0 = logLines(), tb = performance.now();
const b = batch(jobs);
const d1 = daemons(), r1 = redisCmds(), l1 = logLines(), busyMs = performance.now() - tb;
console.log(`\n${jobs} batch jobs of sandbox_exec \`true\` (${b.rate} jobs/s), load average ` +
  `${load0.toFixed(1)} before, ${loadavg()[0].toFixed(1)} after\n`);
console.log('| process | CPU us/job | of it idle | idle % of a core | ctx switches/job | log lines/job |');
console.log('| --- | ---: | ---: | ---: | ---: | ---: |');
let total = 0, totalIdle = 0;
for (const k of Object.keys(d1).sort()) {
  if (!d0[k]) continue;
  const us = (d1[k].us - d0[k].us) / jobs;
  // the idle rate over the batch's time, per job: what the process would cost with no jobs
  const idlePerMs = i1[k] && i0[k] ? (i1[k].us - i0[k].us) / idleMs : 0;
  const idle = Math.min(us, idlePerMs * busyMs / jobs);
  total += us;
  totalIdle += idle;
  const ll = l1[`${k}.log`] !== undefined ? ((l1[`${k}.log`] - (l0[`${k}.log`] ?? 0)) / jobs).toFixed(3) : '';
  console.log(`| ${k} | ${us.toFixed(0)} | ${idle.toFixed(0)} | ${(idlePerMs / 10).toFixed(1)} | ` +
    `${((d1[k].cs - d0[k].cs) / jobs).toFixed(2)} | ${ll} |`);
}
console.log(`| batch CLI | ${(b.cliUs / jobs).toFixed(0)} | | | | |`);
total += b.cliUs / jobs;
console.log(`| all | ${total.toFixed(0)} | ${totalIdle.toFixed(0)} | | | |`);
const cmds = Object.keys(r1).map((c) => [c, (r1[c] - (r0[c] ?? 0)) / jobs]).filter(([, v]) => v > 0.001)
  .sort((a, z) => z[1] - a[1]);
console.log(`\nRedis commands per job: ${cmds.reduce((a, [, v]) => a + v, 0).toFixed(2)} (` +
  cmds.map(([c, v]) => `${c} ${v.toFixed(2)}`).join(', ') + ')');
for (const id of sandboxes) await mcall(urls[0], env.SF_KEY, 'sandbox_kill', { sandbox_id: id });
