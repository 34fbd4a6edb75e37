// tests/bench/preview's measurements (see that script): direct vs preview, one run.
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
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

function h2load(direct, args, h1 = ['--h1']) {
  const r = direct ? inNs('h2load', [...h1, ...args]) : spawnSync('h2load', [...h1, ...viaHdr, ...args], { encoding: 'utf8' });
  const rps = /finished in [^,]+, ([\d.]+) req\/s/.exec(r.stdout);
  const ok = /(\d+) succeeded/.exec(r.stdout);
  if (!rps || Number(ok[1]) === 0) throw new Error(r.stdout + r.stderr);
  return { rps: Number(rps[1]), ok: Number(ok[1]) };
}
function p50(direct) {
  const log = `${dir}/lat-${direct ? 'd' : 'p'}.log`;
  const url = direct ? 'http://127.0.0.1:18080/small.html' : `${base}/small.html`;
  h2load(direct, ['-n', '5000', '-c', '1', '--log-file', log, url]);
  const us = readFileSync(log, 'utf8').trim().split('\n').map((l) => Number(l.split('\t')[2])).sort((a, b) => a - b);
  return us[Math.floor(us.length / 2)] / 1000;
}
function speed(direct) { // MB/s, best of 3
  let best = 0;
  for (let i = 0; i < 3; i++) {
    const a = ['-s', '-o', '/dev/null', '-w', '%{speed_download}'];
    const r = direct ? inNs('curl', [...a, 'http://127.0.0.1:18080/big.bin'])
      : spawnSync('curl', [...a, '-H', `Host: ${host}`, `${base}/big.bin`], { encoding: 'utf8' });
    best = Math.max(best, Number(r.stdout) / 1e6);
  }
  return best;
}
const ms = (f) => { const t = process.hrtime.bigint(); f(); return Number(process.hrtime.bigint() - t) / 1e6; };
const get = () => spawnSync('curl', ['-sf', '-o', '/dev/null', '-H', `Host: ${host}`, `${base}/small.html`]);

const rows = [];
const warm = () => { h2load(true, ['-n', '2000', '-c', '64', 'http://127.0.0.1:18080/small.html']); h2load(false, ['-n', '2000', '-c', '64', `${base}/small.html`]); };
warm();
const d = h2load(true, ['-n', String(n), '-c', '64', 'http://127.0.0.1:18080/small.html']);
const p = h2load(false, ['-n', String(n), '-c', '64', `${base}/small.html`]);
rows.push(['small page, req/s at 64 connections', d.rps.toFixed(0), p.rps.toFixed(0), (p.rps / d.rps).toFixed(2) + 'x', '>= 0.6x']);
// HTTP/2 from the client (h2c, 64 streams on 8 connections): each stream is its own hop
const p2 = h2load(false, ['-n', String(Math.min(n, 20000)), '-c', '8', '-m', '8', `${base}/small.html`], []);
rows.push(['small page over h2c, req/s (8 conns x 8 streams)', '-', p2.rps.toFixed(0), '', 'a hop per stream']);
const ld = p50(true), lp = p50(false);
rows.push(['p50 latency, 1 connection (ms)', ld.toFixed(3), lp.toFixed(3), `+${(lp - ld).toFixed(3)} ms`, '<= +1 ms']);
const sd = speed(true), sp = speed(false);
rows.push(['50 MB download (MB/s, best of 3)', sd.toFixed(0), sp.toFixed(0), (sp / sd).toFixed(2) + 'x', '>= 0.8x']);
const first = [], paused = [];
for (let i = 0; i < 5; i++) {
  first.push(ms(get));
  const r = await call(client, 'sandbox_pause', { sandbox_id: id });
  if (r.isError) throw new Error(r.text);
  paused.push(ms(() => { if (get().status !== 0) throw new Error('a paused sandbox did not answer'); }));
}
const med = (a) => a.sort((x, y) => x - y)[Math.floor(a.length / 2)];
rows.push(['first request, new connection (ms, median of 5)', '-', med(first).toFixed(1), '', '']);
rows.push(['first request to a paused sandbox (ms, median of 5)', '-', med(paused).toFixed(1), '', 'resume included']);

const w = [52, 10, 10, 11, 16];
const line = (r) => r.map((x, i) => String(x).padEnd(w[i])).join(' ');
console.log(line(['', 'direct', 'preview', 'ratio', 'goal']));
for (const r of rows) console.log(line(r));
ngx.kill();
await call(client, 'sandbox_kill', { sandbox_id: id });
await client.close();
