// Where a slow job waits: joins the per-job stage stamps the daemons and the batch CLI write
// with `trace_dir` / SF_TRACE_DIR (common/sf_trace.h) and prints, for the slowest 1 % of
// jobs, how long each hop took and which hop held the most time (tests/bench/README.md,
// "Where a slow job waits"). `node tests/bench/trace.mjs DIR [FROM_US TO_US]`: jobs
// published in [FROM_US, TO_US) (wall-clock microseconds), by client (gateway or batch);
// without them, the rows DIR/rows.json names (tests/bench/fleet writes it).
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

// The hops of a job, in order: [name, from stamp, to stamp]. A stamp is PROCESS.STAGE.
export const HOPS = [
  ['client -> scheduler (produce, broker, fetch)', 'client.pub', 'scheduler.in'],
  ['scheduler (signature, Redis lookups)', 'scheduler.in', 'scheduler.out'],
  ['scheduler -> worker (produce, broker, fetch)', 'scheduler.out', 'worker.in'],
  ['worker run-once guard (Redis)', 'worker.in', 'worker.guard'],
  ['worker dispatch', 'worker.guard', 'worker.exec'],
  ['agent: exec request -> result', 'worker.exec', 'worker.exit'],
  ['worker reply kept (Redis)', 'worker.exit', 'worker.kept'],
  ['worker reply produce', 'worker.kept', 'worker.out'],
  ['worker -> client (produce, broker, fetch)', 'worker.out', 'client.ans'],
];
// Parts of those hops (not in the sum): until the broker confirmed the produce (the
// delivery report, as the producing process saw it).
export const PARTS = [
  ['of scheduler -> worker: until the broker\'s ack', 'scheduler.out', 'scheduler.dr'],
  ['of worker -> client: until the broker\'s ack', 'worker.out', 'worker.dr'],
];

// Reads every DIR/WHO.PID.trace: Map job id -> { 'PROCESS.STAGE': us (first stamp) }, and
// the agent's own run time of each command (worker.exit's value, ms).
export function readStamps(dir) {
  const jobs = new Map();
  for (const f of readdirSync(dir)) {
    const m = f.match(/^([a-z-]+)\.\d+\.trace$/);
    if (!m) continue;
    const proc = m[1] === 'gateway' || m[1] === 'batch' ? 'client' : m[1];
    for (const line of readFileSync(join(dir, f), 'utf8').split('\n')) {
      const [us, id, stage, value] = line.split(' ');
      if (!stage) continue;
      let j = jobs.get(id);
      if (!j) jobs.set(id, (j = { kind: undefined, t: {}, agentMs: undefined }));
      const k = `${proc}.${stage}`;
      if (j.t[k] === undefined) j.t[k] = Number(us);
      if (proc === 'client' && stage === 'pub') j.kind = m[1];
      if (k === 'worker.exit') j.agentMs = Number(value);
    }
  }
  return jobs;
}

const pct = (xs, p) => (xs.length ? xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))] : NaN);

// The report for the jobs of one client kind published in [from, to) (us; undefined: all).
export function report(jobs, kind, from, to) {
  const done = [];
  for (const [id, j] of jobs) {
    const t0 = j.t['client.pub'];
    if (j.kind !== kind || t0 === undefined || j.t['client.ans'] === undefined) continue;
    if ((from !== undefined && t0 < from) || (to !== undefined && t0 >= to)) continue;
    if (![...HOPS, ...PARTS].every(([, a, b]) => j.t[a] !== undefined && j.t[b] !== undefined)) continue;
    done.push({ id, total: j.t['client.ans'] - t0, hops: HOPS.map(([, a, b]) => j.t[b] - j.t[a]),
      parts: PARTS.map(([, a, b]) => j.t[b] - j.t[a]), agentMs: j.agentMs });
  }
  if (done.length < 100) return `${kind}: ${done.length} jobs with every stamp: too few for a 1 % tail\n`;
  done.sort((a, b) => a.total - b.total);
  const slow = done.slice(Math.floor(done.length * 0.99));
  const ms = (us) => (us / 1000).toFixed(1);
  const lines = [`${kind}: ${done.length} jobs; total p50 ${ms(pct(done.map((d) => d.total), 50))} ms, ` +
    `p99 ${ms(pct(done.map((d) => d.total), 99))} ms; the slowest 1 % (${slow.length} jobs, from ` +
    `${ms(slow[0].total)} ms):`, '',
    '| hop | all jobs: p50 ms | slowest 1 %: median ms | slowest 1 %: max ms | holds the most time in |',
    '| --- | ---: | ---: | ---: | ---: |'];
  const most = HOPS.map(() => 0);
  for (const d of slow) most[d.hops.indexOf(Math.max(...d.hops))]++;
  HOPS.forEach(([name], i) => {
    const all = done.map((d) => d.hops[i]).sort((a, b) => a - b);
    const s = slow.map((d) => d.hops[i]).sort((a, b) => a - b);
    lines.push(`| ${name} | ${ms(pct(all, 50))} | ${ms(pct(s, 50))} | ${ms(s[s.length - 1])} | ${most[i]} of ${slow.length} |`);
  });
  PARTS.forEach(([name], i) => {
    const all = done.map((d) => d.parts[i]).sort((a, b) => a - b);
    const s = slow.map((d) => d.parts[i]).sort((a, b) => a - b);
    lines.push(`| (${name}) | ${ms(pct(all, 50))} | ${ms(pct(s, 50))} | ${ms(s[s.length - 1])} | |`);
  });
  const agent = slow.map((d) => d.agentMs).sort((a, b) => a - b);
  lines.push('', `(the agent's own run time of those commands: median ${pct(agent, 50)} ms, max ${agent[agent.length - 1]} ms)`);
  return lines.join('\n') + '\n';
}

if (process.argv[1] && process.argv[1].endsWith('trace.mjs')) {
  const [dir, from, to] = process.argv.slice(2);
  if (!dir) {
    console.error('usage: node tests/bench/trace.mjs DIR [FROM_US TO_US]');
    process.exit(2);
  }
  const jobs = readStamps(dir);
  const rows = join(dir, 'rows.json');
  if (from === undefined && existsSync(rows)) { // the rows of tests/bench/fleet
    for (const r of JSON.parse(readFileSync(rows, 'utf8')))
      console.log(`### ${r.name}\n\n${report(jobs, r.kind, r.from, r.to)}`);
  } else {
    for (const kind of ['gateway', 'batch'])
      console.log(report(jobs, kind, from && Number(from), to && Number(to)));
  }
}
