// A worker restart with SANDBOXES sandboxes on its host: kill -9 of the worker while a call
// for one of its sandboxes is on its way (it waits in the host topic), a new worker started
// (tests/integration/stack restart-worker), and the times of that call's answer: from the
// new worker process's start (its /proc start time) and from the kill. Also how long the
// new worker took to be up (its "worker up" log line), every sandbox taken back.
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { env } from '../e2e/lib.mjs';
import { tool, stats } from './mcp.mjs';

const restarts = Number(process.argv[2] ?? 10);
const boxes = Number(process.argv[3] ?? 20);
const workerPid = () => Number(readFileSync(`${env.SF_STATE}/pids/worker`, 'utf8'));
const btimeMs = Number(readFileSync('/proc/stat', 'utf8').match(/^btime (\d+)$/m)[1]) * 1000;
const hz = Number(execFileSync('getconf', ['CLK_TCK']).toString());
const startedMs = (pid) => btimeMs + Number(readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')[19]) * 1000 / hz;
const upMs = () => { // the last "worker up" line's time
  const l = readFileSync(`${env.SF_STATE}/logs/worker.log`, 'utf8').split('\n').filter((x) => x.includes('msg="worker up"')).pop();
  return Date.parse(l.match(/^ts=(\S+)/)[1]);
};

const ids = [];
for (let i = 0; i < boxes; i++) ids.push((await tool('sandbox_create', { name: `bench-restart-${i}` })).structuredContent.id);
for (const id of ids) await tool('sandbox_exec', { sandbox_id: id, command: `echo ${id} > /root/mark` });

const fromStart = [], fromKill = [], toUp = [];
for (let r = 0; r < restarts; r++) {
  const id = ids[r % ids.length];
  const killed = Date.now();
  process.kill(workerPid(), 'SIGKILL');
  const pending = tool('sandbox_exec', { sandbox_id: id, command: 'cat /root/mark', timeout_ms: 20000 });
  execFileSync(new URL('../integration/stack', import.meta.url).pathname, ['restart-worker', env.SF_STATE, env.SF_BUILD]);
  const res = await pending;
  const answered = Date.now();
  if (res.structuredContent?.stdout !== `${id}\n`) throw new Error(`restart ${r}: ${JSON.stringify(res).slice(0, 300)}`);
  const started = startedMs(workerPid());
  fromStart.push(answered - started);
  fromKill.push(answered - killed);
  toUp.push(upMs() - started);
}
const log = readFileSync(`${env.SF_STATE}/logs/worker.log`, 'utf8');
const kept = (log.match(/sandbox kept across the worker restart/g) ?? []).length;
const lost = (log.match(/sandbox lost across the worker restart/g) ?? []).length;
for (const id of ids) await tool('sandbox_kill', { sandbox_id: id });

const rows = [
  stats(`new worker process start -> worker up (${boxes} taken back)`, toUp),
  stats('new worker process start -> first call answered', fromStart),
  stats('kill -9 -> first call answered (incl. the restart)', fromKill),
];
const f = (x) => x.toFixed(0).padStart(8);
console.log(`\nsandfleet worker restart benchmark: ${restarts} restarts (kill -9), ${boxes} sandboxes on the host, ${process.env.SF_DRIVER || 'jail'}; ` +
  `${kept} sandboxes taken back, ${lost} lost`);
console.log(`${'row'.padEnd(56)} ${'n'.padStart(4)} ${'p50 ms'.padStart(8)} ${'p90 ms'.padStart(8)} ${'max ms'.padStart(8)}`);
for (const r of rows)
  console.log(`${r.label.padEnd(56)} ${String(r.n).padStart(4)} ${f(r.p50)} ${f(r.p90)} ${f(Math.max(...(r.label.includes('worker up') ? toUp : r.label.includes('kill') ? fromKill : fromStart)))}`);
