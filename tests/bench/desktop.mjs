// sandbox_computer latency through MCP (tests/bench/desktop): a desktop's create to its
// first screenshot, screenshot p50/p99 at 1280x800, left_click with its screenshot (the
// click, the 300 ms settle, the screenshot). One call at a time, paced under the rate
// limit (one action per 100 ms on average per sandbox).
import { rpc, stats } from './mcp.mjs';

const n = Number(process.argv[2] ?? 100);
const tool = (name, args) => rpc('tools/call', { name, arguments: args }, false);
const ms = (s) => Number(process.hrtime.bigint() - s) / 1e6;
const sleep = (t) => new Promise((r) => setTimeout(r, t));

async function create() {
  for (;;) { // the template may still be being built here: retried (the caller times it)
    const r = await tool('sandbox_create', { from_template: 'desktop' });
    if (!r.isError) return r.structuredContent.id;
    if (!/still being built/.test(r.content[0].text)) throw new Error(r.content[0].text);
    await sleep(2000);
  }
}

async function shot(id, args = { action: 'screenshot' }) {
  const r = await tool('sandbox_computer', { sandbox_id: id, ...args });
  if (r.isError || !r.content.some((c) => c.type === 'image')) throw new Error(JSON.stringify(r).slice(0, 300));
  return r;
}

// create -> first screenshot (a fresh sandbox each time; the build is untimed: one warm-up)
await tool('sandbox_kill', { sandbox_id: await create() });
const first = [];
for (let i = 0; i < 5; i++) {
  const s = process.hrtime.bigint();
  const id = await create();
  await shot(id);
  first.push(ms(s));
  await tool('sandbox_kill', { sandbox_id: id });
}
const rows = [stats('desktop create -> first screenshot', first)];

const id = await create();
const paced = async (label, count, args) => {
  const t = [];
  for (let i = 0; i < count + 5; i++) {
    const s = process.hrtime.bigint();
    await shot(id, args);
    const took = ms(s);
    if (i >= 5) t.push(took);
    if (took < 110) await sleep(110 - took); // under the rate limit
  }
  return stats(label, t);
};
rows.push(await paced('screenshot (1280x800)', n, { action: 'screenshot' }));
rows.push(await paced('left_click + screenshot', Math.max(10, n >> 2), { action: 'left_click', coordinate: [640, 400] }));
const one = await shot(id);
const bytes = Buffer.from(one.content.find((c) => c.type === 'image').data, 'base64').length;
await tool('sandbox_kill', { sandbox_id: id });

console.log('| call | n | p50 ms | p90 ms | p99 ms | mean ms |');
console.log('| --- | --- | --- | --- | --- | --- |');
for (const r of rows) {
  console.log(`| ${r.label} | ${r.n} | ${r.p50.toFixed(1)} | ${r.p90.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.mean.toFixed(1)} |`);
}
console.log(`\n(one screenshot of the idle desktop: ${bytes} bytes of PNG)`);
process.exit(0);
