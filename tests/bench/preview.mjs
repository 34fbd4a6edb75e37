// tests/bench/preview's measurements (see that script): direct vs preview, one run.
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { call, connect, env, until } from '../e2e/lib.mjs';

const n = Number(process.env.SF_BENCH_N ?? 50000);
const gwPort = Number(new URL(env.SF_URL).port);
const client = await connect(env.SF_KEY_ALPHA, 'bench-preview');
const c = await call(client, 'sandbox_create', { name: 'bench-preview' });
if (c.isError) throw new Error(c.text);
const id = c.structured.id;
const marker = 900000 + Math.floor(Math.random() * 99999);
await call(client, 'sandbox_exec', { sandbox_id: id, background: true, command: `exec sleep ${marker}` });
const pid = await until('the marker process', () => {
  const r = spawnSync('pgrep', ['-f', `^sleep ${marker}$`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim().split('\n')[0] : null;
}, 15000);

// nginx in the sandbox's network namespace
const dir = `${env.SF_STATE}/nginx`;
mkdirSync(`${dir}/www`, { recursive: true });
writeFileSync(`${dir}/www/small.html`, `<!doctype html><title>bench</title><p>${'x'.repeat(512)}</p>\n`);
spawnSync('sh', ['-c', `head -c ${50 << 20} /dev/urandom > ${dir}/www/big.bin`]);
writeFileSync(`${dir}/nginx.conf`, `worker_processes 1; pid ${dir}/nginx.pid; error_log ${dir}/error.log;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000; keepalive_timeout 60s; sendfile on;
  client_body_temp_path ${dir}/tmp; proxy_temp_path ${dir}/tmp; fastcgi_temp_path ${dir}/tmp;
  uwsgi_temp_path ${dir}/tmp; scgi_temp_path ${dir}/tmp;
  server { listen 127.0.0.1:18080; root ${dir}/www; } }
`);
mkdirSync(`${dir}/tmp`, { recursive: true });
const ngx = spawn('nsenter', ['-t', pid, '-n', 'nginx', '-c', `${dir}/nginx.conf`, '-g', 'daemon off;'], { stdio: 'ignore' });
const inNs = (cmd, args) => spawnSync('nsenter', ['-t', pid, '-n', cmd, ...args], { encoding: 'utf8', maxBuffer: 64 << 20 });
await until('nginx in the sandbox', () => inNs('curl', ['-sf', '-o', '/dev/null', 'http://127.0.0.1:18080/small.html']).status === 0, 10000);
const pv = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 18080 });
if (pv.isError) throw new Error(pv.text);
const host = new URL(pv.structured.url).host;
// h2load sets Host from the URL: the header form names the preview (the same path inside)
const viaHdr = ['-H', `x-sandfleet-preview: ${host.split('.')[0]}`];
const base = `http://127.0.0.1:${gwPort}`;
if (spawnSync('curl', ['-sf', '-o', '/dev/null', '-H', `Host: ${host}`, `${base}/small.html`]).status !== 0)
  throw new Error('the preview does not answer');

// CPU time (ms) of a process and its threads so far: the scheduler's own count (ns)
function cpuMs(pid) {
  let ns = 0;
  try {
    for (const t of readdirSync(`/proc/${pid}/task`))
      ns += Number(readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
  } catch { /* gone */ }
  return ns / 1e6;
}
const ngxPids = () => {
  const master = readFileSync(`${dir}/nginx.pid`, 'utf8').trim();
  const kids = spawnSync('pgrep', ['-P', master], { encoding: 'utf8' }).stdout.trim().split('\n').filter(Boolean);
  return [master, ...kids];
};
const daemons = ['gateway', 'worker'].map((d) => readFileSync(`${env.SF_STATE}/pids/${d}`, 'utf8').trim());
// Runs a load generator (argv) directly or in the namespace; its own CPU comes from
// wait4's rusage (a small Python parent), the servers' from /proc.
const waiter = `import os, sys
pid = os.fork()
if pid == 0:
    fd = os.open(os.environ['SF_OUT'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1); os.dup2(fd, 2); os.execvp(sys.argv[1], sys.argv[1:])
_, _, ru = os.wait4(pid, 0)
print((ru.ru_utime + ru.ru_stime) * 1000)`;
function run(direct, argv) {
  const pids = [...ngxPids(), ...daemons];
  const before = pids.map(cpuMs);
  const cmd = ['env', `SF_OUT=${dir}/out`, 'python3', '-c', waiter, ...argv];
  const r = direct ? inNs(cmd[0], cmd.slice(1)) : spawnSync(cmd[0], cmd.slice(1), { encoding: 'utf8' });
  const client = Number(r.stdout.trim());
  const spent = pids.map((p, i) => cpuMs(p) - before[i]);
  const servers = spent.reduce((a, v) => a + v, 0);
  const k = ngxPids().length;
  // by process: the load generator, nginx, the gateway, the worker (ms)
  const by = [client, spent.slice(0, k).reduce((a, v) => a + v, 0), spent[k], spent[k + 1]];
  return { out: readFileSync(`${dir}/out`, 'utf8'), cpu: client + servers, by };
}
function h2load(direct, args, h1 = ['--h1']) {
  const url = direct ? 'http://127.0.0.1:18080/small.html' : `${base}/small.html`;
  const r = run(direct, ['h2load', ...h1, ...(direct ? [] : viaHdr), ...args, url]);
  const rps = /finished in [^,]+, ([\d.]+) req\/s/.exec(r.out);
  const ok = /(\d+) succeeded/.exec(r.out);
  if (!rps || Number(ok[1]) === 0) throw new Error(r.out);
  return { rps: Number(rps[1]), ok: Number(ok[1]), us: (r.cpu * 1000) / Number(ok[1]),
    by: r.by.map((v) => (v * 1000) / Number(ok[1])) };
}
function p50(direct) {
  const log = `${dir}/lat-${direct ? 'd' : 'p'}.log`;
  h2load(direct, ['-n', '5000', '-c', '1', '--log-file', log]);
  const us = readFileSync(log, 'utf8').trim().split('\n').map((l) => Number(l.split('\t')[2])).sort((a, b) => a - b);
  return us[Math.floor(us.length / 2)] / 1000;
}
function download(direct) { // MB/s and CPU ms per MB of one 50 MB download
  const a = ['curl', '-s', '-o', '/dev/null', '-w', '%{speed_download}'];
  const r = direct ? run(true, [...a, 'http://127.0.0.1:18080/big.bin'])
    : run(false, [...a, '-H', `Host: ${host}`, `${base}/big.bin`]);
  return { mbs: Number(r.out) / 1e6, ms: r.cpu / 50, by: r.by.map((v) => v / 50) };
}
const ms = (f) => { const t = process.hrtime.bigint(); f(); return Number(process.hrtime.bigint() - t) / 1e6; };
const get = () => spawnSync('curl', ['-sf', '-o', '/dev/null', '-H', `Host: ${host}`, `${base}/small.html`]);
const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
// Each row alternates direct and preview `rounds` times (the machine's other load hits
// both alike) and reports the medians.
const rounds = Number(process.env.SF_BENCH_ROUNDS ?? 3);
function alternate(f) {
  const d = [], p = [];
  for (let i = 0; i < rounds; i++) { d.push(f(true)); p.push(f(false)); }
  return [d, p];
}

const rows = [];
const x = (a, b) => (a / b).toFixed(2) + 'x';
h2load(true, ['-n', '2000', '-c', '64']); h2load(false, ['-n', '2000', '-c', '64']); // warm
const [sd, sp] = alternate((direct) => h2load(direct, ['-n', String(n), '-c', '64']));
const [rd, rp] = [med(sd.map((r) => r.rps)), med(sp.map((r) => r.rps))];
const [cd, cp] = [med(sd.map((r) => r.us)), med(sp.map((r) => r.us))];
rows.push(['small page, req/s at 64 connections', rd.toFixed(0), rp.toFixed(0), x(rp, rd), '>= 0.6x']);
rows.push(['  CPU per request, all processes (us)', cd.toFixed(1), cp.toFixed(1), x(cd, cp), 'ceiling if CPU-bound']);
// the preview run whose total is the median: where its time went
const byOf = (runs, v) => runs.find((r) => r.us === v || r.ms === v).by.map((t) => t.toFixed(1)).join(' / ');
rows.push(['  ...h2load / nginx / gateway / worker (us)', byOf(sd, cd), byOf(sp, cp), '', '']);
// HTTP/2 from the client (h2c, 64 streams on 8 connections): each stream is its own hop
const p2 = h2load(false, ['-n', String(Math.min(n, 20000)), '-c', '8', '-m', '8'], []);
rows.push(['small page over h2c, req/s (8 conns x 8 streams)', '-', p2.rps.toFixed(0), '', 'a hop per stream']);
const [ld, lp] = alternate(p50).map(med);
rows.push(['p50 latency, 1 connection (ms)', ld.toFixed(3), lp.toFixed(3), `+${(lp - ld).toFixed(3)} ms`, '<= +1 ms']);
const [bd, bp] = alternate(download);
const [md, mp] = [med(bd.map((r) => r.mbs)), med(bp.map((r) => r.mbs))];
const [kd, kp] = [med(bd.map((r) => r.ms)), med(bp.map((r) => r.ms))];
rows.push(['50 MB download (MB/s)', md.toFixed(0), mp.toFixed(0), x(mp, md), '>= 0.8x']);
rows.push(['  CPU per MB, all processes (ms)', kd.toFixed(2), kp.toFixed(2), x(kd, kp), 'ceiling if CPU-bound']);
rows.push(['  ...curl / nginx / gateway / worker (ms)', byOf(bd, kd), byOf(bp, kp), '', '']);
const first = [], paused = [];
for (let i = 0; i < 5; i++) {
  first.push(ms(get));
  const r = await call(client, 'sandbox_pause', { sandbox_id: id });
  if (r.isError) throw new Error(r.text);
  paused.push(ms(() => { if (get().status !== 0) throw new Error('a paused sandbox did not answer'); }));
}
rows.push(['first request, new connection (ms, median of 5)', '-', med(first).toFixed(1), '', '']);
rows.push(['first request to a paused sandbox (ms, median of 5)', '-', med(paused).toFixed(1), '', 'resume included']);

const w = [52, 22, 22, 11, 16];
const line = (r) => r.map((x, i) => String(x).padEnd(w[i])).join(' ');
console.log(line(['', 'direct', 'preview', 'ratio', 'goal']));
for (const r of rows) console.log(line(r));
const lh = spawnSync('redis-cli', ['-u', env.SF_REDIS_URL, 'hget', `sf:host:{${env.SF_HOST_ID}}`, 'ingress_local_hops'], { encoding: 'utf8' }).stdout.trim();
console.log(`hops: local (the gateway relays alone) ${lh || 'none (an older worker)'} as of the last heartbeat; the rest TCP`);
ngx.kill();
await call(client, 'sandbox_kill', { sandbox_id: id });
await client.close();
