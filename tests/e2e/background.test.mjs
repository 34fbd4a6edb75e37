// Background work (issue 20 item 4): what a command leaves running lives on, whatever the
// shell idiom, also across pause/resume; sandbox_exec background/stdin and the process
// tools (sandbox_process_list, _kill, _logs) manage it. Both drivers (e2e.qemu.background).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env, until } from './lib.mjs';

let client, box;
before(async () => {
  client = await connect(env.SF_KEY_ALPHA);
  box = await create({ name: 'bg-idioms' });
});
after(async () => {
  if (box) await kill(box);
  await client?.close();
});

const create = async (args = {}) => {
  const r = await call(client, 'sandbox_create', args);
  assert.equal(r.isError, false, r.text);
  return r.structured.id;
};
const kill = (id) => call(client, 'sandbox_kill', { sandbox_id: id });

// The counter loop each idiom leaves behind: appends a line to FILE every 50 ms.
const loop = (f) => `sh -c 'while true; do echo x >> ${f}; sleep 0.05; done'`;
const idioms = {
  amp: (f) => `${loop(f)} >/dev/null 2>&1 &`,
  nohup: (f) => `nohup ${loop(f)} >/dev/null 2>&1 &`,
  setsid: (f) => `setsid ${loop(f)} >/dev/null 2>&1 &`,
  double_fork: (f) => `( ( ${loop(f)} >/dev/null 2>&1 & ) & )`,
  disown: (f) => `${loop(f)} >/dev/null 2>&1 & disown`,
};
const lines = async (id, f) => Number((await sh(client, id, `wc -l < ${f} 2>/dev/null || echo 0`)).stdout.trim());
const grows = async (id, f, what) => {
  const n0 = await lines(id, f);
  await until(`${what}: ${f} to grow past ${n0}`, async () => (await lines(id, f)) > n0 + 2);
};


for (const [name, cmd] of Object.entries(idioms)) {
  test(`${name}: the process a command leaves behind keeps running, also across pause/resume`, async () => {
    const f = `/tmp/count-${name}`;
    const r = await sh(client, box, cmd(f));
    assert.equal(r.exit_code, 0, `${cmd(f)}: ${r.stderr}`);
    // alive 2 s later: the counter still grows after two seconds
    await grows(box, f, 'started');
    const t0 = Date.now();
    await until('two seconds', async () => Date.now() - t0 >= 2000, 5000);
    await grows(box, f, 'alive 2 s later');
    const p = await call(client, 'sandbox_pause', { sandbox_id: box });
    assert.equal(p.isError, false, p.text);
    const r2 = await call(client, 'sandbox_resume', { sandbox_id: box });
    assert.equal(r2.isError, false, r2.text);
    await grows(box, f, 'after resume');
  });
}
