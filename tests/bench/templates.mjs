// sandbox_create latency by template (through MCP, the whole pipeline; each sandbox killed
// untimed before the next), and the time a team template takes to build from 'debian'.
import { rpc, stats } from './mcp.mjs';

const n = Number(process.argv[2] ?? 50);
// jail, or qemu (SF_DRIVER=qemu: the team-template rows are the jail's only)
const qemu = process.env.SF_DRIVER === 'qemu';
// tool errors are answers here ('debian' still being built is retried)
const tool = (name, args) => rpc('tools/call', { name, arguments: args }, false);
const ms = (s) => Number(process.hrtime.bigint() - s) / 1e6;

// Polls the list until template name is ready (throws if it failed).
async function ready(name) {
  for (;;) {
    const l = (await tool('sandbox_template_list', { name_prefix: name })).structuredContent.templates;
    const st = l.find((x) => x.name === name)?.status;
    if (st === 'ready') return;
    if (st !== 'building') throw new Error(`template ${name}: ${JSON.stringify(l)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

// The first `python -c 'print(1)'` in a sandbox just created from the default template
// (the create untimed): what an agent's first step costs.
async function firstPython(count) {
  const t = [];
  for (let i = 0; i < count + 5; i++) {
    const r = await tool('sandbox_create', {});
    if (r.isError) throw new Error(r.content[0].text);
    const s = process.hrtime.bigint();
    const x = await tool('sandbox_exec', { sandbox_id: r.structuredContent.id, command: "python -c 'print(1)'" });
    const took = ms(s);
    if (x.isError || x.structuredContent.stdout !== '1\n') throw new Error(JSON.stringify(x));
    if (i >= 5) t.push(took);
    await tool('sandbox_kill', { sandbox_id: r.structuredContent.id });
  }
  return stats("first python -c 'print(1)' after create (default)", t);
}

async function creates(template, count) {
  const t = [];
  for (let i = 0; i < count + 5; i++) { // 5 warm-up
    let r;
    const s = process.hrtime.bigint();
    for (;;) { // 'debian' may still be arriving on the host: retried, untimed
      r = await tool('sandbox_create', template ? { from_template: template } : {});
      if (!r.isError || !/still being built/.test(r.content[0].text)) break;
      await new Promise((res) => setTimeout(res, 1000));
    }
    const took = ms(s);
    if (r.isError) throw new Error(r.content[0].text);
    if (i >= 5) t.push(took);
    await tool('sandbox_kill', { sandbox_id: r.structuredContent.id });
  }
  return stats(template ? `sandbox_create from '${template}'` : 'sandbox_create (default: debian)', t);
}

async function builds(count) {
  const t = [];
  for (let i = 0; i < count; i++) {
    const name = `bench-${Date.now().toString(36)}-${i}`;
    const s = process.hrtime.bigint();
    const r = await tool('sandbox_template_create', { name, from: 'debian', run_steps: ['echo built > /opt/built'] });
    if (r.isError) throw new Error(r.content[0].text);
    await ready(name);
    t.push(ms(s));
  }
  return stats("template build from 'debian' (1 step, to ready)", t);
}

// A team template from 'base' whose service (busybox httpd) each sandbox starts, and whose
// ready_cmd (wget) the create waits for.
async function service() {
  const name = `bench-svc-${Date.now().toString(36)}`;
  const r = await tool('sandbox_template_create', { name, from: 'base', run_steps: ['mkdir -p /srv && echo ok > /srv/index.html'],
    start_cmd: 'exec httpd -f -p 127.0.0.1:8080 -h /srv', ready_cmd: 'wget -q -Y off -O /dev/null http://127.0.0.1:8080/' });
  if (r.isError) throw new Error(r.content[0].text);
  await ready(name);
  const row = await creates(name, n);
  row.label = "sandbox_create from a template with a service";
  await tool('sandbox_template_delete', { name });
  return row;
}

// 'debian' is built by the stack's worker (once per host; on qemu its guest image too):
// the rows start when sandbox_template_list says it is ready
for (let i = 0; ; i++) {
  const l = (await tool('sandbox_template_list', { name_prefix: 'debian' })).structuredContent.templates;
  if (l.find((x) => x.name === 'debian')?.status === 'ready') break;
  if (i % 30 === 0) console.error("waiting for the worker to build 'debian' ...");
  await new Promise((res) => setTimeout(res, 1000));
}
const rows = [await creates('base', n), await creates('debian', n), await creates(null, n),
  await firstPython(n)];
if (!qemu) rows.push(await service(), await builds(3));
const base = rows[0].p50;
console.log(`\n${'call'.padEnd(50)} ${'n'.padStart(4)} ${'p50 ms'.padStart(9)} ${'p90 ms'.padStart(9)} ${'p99 ms'.padStart(9)} ${'mean'.padStart(9)}  p50 vs base`);
for (const r of rows) {
  console.log(`${r.label.padEnd(50)} ${String(r.n).padStart(4)} ${r.p50.toFixed(1).padStart(9)} ${r.p90.toFixed(1).padStart(9)} ${r.p99.toFixed(1).padStart(9)} ${r.mean.toFixed(1).padStart(9)}  ${(r.p50 / base).toFixed(2)}x`);
}
