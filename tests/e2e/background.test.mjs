// Background work (issue 20 item 4): what a command leaves running lives on, whatever the
// shell idiom, also across pause/resume; sandbox_exec background/stdin and the process
// tools (sandbox_process_list, _kill, _logs) manage it. Both drivers (e2e.qemu.background).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env, until, createWhenBuilt } from './lib.mjs';

let client, box, deb = null;
before(async () => {
  client = await connect(env.SF_KEY_ALPHA);
  box = await create({ name: 'bg-idioms', from_template: 'base' });
  // both drivers run 'debian'; a stack's first create of it may wait for the worker's own
  // build (the scheduler's template_wait_s; progress beats keep the call alive)
  deb = await create({ name: 'bg-idioms-debian', from_template: 'debian' });
});
after(async () => {
  if (deb) await kill(deb);
  if (box) await kill(box);
  await client?.close();
});

const create = async (args = {}) => {
  const r = await createWhenBuilt(client, args);
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


// The same idioms in the debian template (the default), on both drivers. Its /bin/sh is
// dash, which has no disown builtin: the template ships /usr/bin/disown, which detaches
// nothing (background jobs outlive the command already); without it `cmd & disown` would
// exit 127 after starting cmd, which must live on.

for (const [name, cmd] of Object.entries(idioms)) test(`debian: ${name} keeps its process running`, async () => {
  const f = `/tmp/count-${name}`;
  const r = await sh(client, deb, cmd(f));
  const has = (await sh(client, deb, 'command -v disown')).exit_code === 0;
  assert.equal(r.exit_code, name === 'disown' && !has ? 127 : 0, `${cmd(f)}: ${r.stderr}`);
  await grows(deb, f, 'started');
  const t0 = Date.now();
  await until('two seconds', async () => Date.now() - t0 >= 2000, 5000);
  await grows(deb, f, 'alive 2 s later');
});

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
    // gone after sandbox_process_kill: the loop's shell, found by its command line
    const mine = async () => (await list(box)).filter((p) => p.command.includes(`count-${name}`) &&
                                                             p.command.includes('while'));
    const procs = await mine();
    assert.ok(procs.length >= 1, `the loop of ${name} is listed`);
    let killed = 0;
    for (const p of procs) {
      const k = await call(client, 'sandbox_process_kill', { sandbox_id: box, pid: p.pid });
      // (a loop's subshell may end with the shell killed before it: gone is fine then)
      if (killed > 0 && k.isError && /^No process \d+ runs in the sandbox/.test(k.text)) continue;
      assert.equal(k.isError, false, k.text);
      assert.equal(k.structured.exited, true);
      killed++;
    }
    assert.deepEqual(await mine(), [], 'no loop left after the kill');
    const n = await lines(box, f);
    await sh(client, box, 'sleep 0.3');
    assert.equal(await lines(box, f), n, 'the counter stopped');
  });
}

async function list(id) {
  const r = await call(client, 'sandbox_process_list', { sandbox_id: id });
  assert.equal(r.isError, false, r.text);
  return r.structured.processes;
}

test('sandbox_process_list: every process, with command, start time, cpu, memory and state', async () => {
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, command: 'sleep 300', background: true });
  assert.equal(r.isError, false, r.text);
  const pid = r.structured.pid;
  assert.ok(Number.isInteger(pid) && pid > 1, r.text);
  // the pid is the one ps in the sandbox shows (as `sh -c sleep 300` until the shell has
  // exec'd the command: the answer may come first)
  await until(`ps to show sleep 300 as pid ${pid}`, async () =>
    new RegExp(`^\\s*${pid}\\s+sleep 300`, 'm').test((await sh(client, box, 'ps -o pid,args')).stdout));
  const p = (await list(box)).find((q) => q.pid === pid);
  assert.ok(p, 'listed');
  assert.equal(p.command, 'sleep 300');
  assert.match(p.started_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
  assert.ok(Math.abs(Date.parse(p.started_at) - Date.now()) < 120000, p.started_at);
  assert.equal(typeof p.cpu_ms, 'number');
  assert.ok(p.rss_kib > 0, `rss ${p.rss_kib}`);
  assert.equal(p.state, 'sleeping');
  assert.ok((await list(box)).some((q) => q.pid === 1), 'pid 1 (the agent) is listed too');
  // TERM ends it; the log says how
  const k = await call(client, 'sandbox_process_kill', { sandbox_id: box, pid });
  assert.equal(k.isError, false, k.text);
  assert.equal(k.structured.signal, 'TERM');
  assert.equal((await list(box)).some((q) => q.pid === pid), false);
  const l = await call(client, 'sandbox_process_logs', { sandbox_id: box, pid });
  assert.equal(l.structured.exited, true);
  assert.equal(l.structured.exit_code, 143);
});

test('sandbox_process_kill: a process that ignores TERM is KILLed after grace_ms; errors', async () => {
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, background: true,
    command: "trap '' TERM; echo ready; while true; do sleep 0.05; done" });
  const pid = r.structured.pid;
  await until('the trap to be set', async () => (await call(client, 'sandbox_process_logs',
    { sandbox_id: box, pid })).structured.data.includes('ready'));
  const t0 = Date.now();
  const k = await call(client, 'sandbox_process_kill', { sandbox_id: box, pid, grace_ms: 300 });
  assert.equal(k.isError, false, k.text);
  assert.equal(k.structured.killed_after_grace, true);
  assert.ok(Date.now() - t0 >= 300);
  assert.equal((await list(box)).some((q) => q.pid === pid), false);
  const gone = await call(client, 'sandbox_process_kill', { sandbox_id: box, pid });
  assert.equal(gone.isError, true);
  assert.match(gone.text, /No process \d+ runs in the sandbox; sandbox_process_list/);
  const one = await call(client, 'sandbox_process_kill', { sandbox_id: box, pid: 1 });
  assert.equal(one.isError, true);
  assert.match(one.text, /sandbox_kill/);
  const bad = await call(client, 'sandbox_process_kill', { sandbox_id: box, pid, signal: 'USR1' });
  assert.equal(bad.isError, true);
});

test('background: answers at once, timeout_ms does not apply, stdout and stderr merged in its log', async () => {
  const t0 = Date.now();
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, background: true, timeout_ms: 200,
    command: 'echo out; echo err >&2; sleep 1; echo late; i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done; exit 7' });
  assert.equal(r.isError, false, r.text);
  assert.ok(Date.now() - t0 < 900, 'answered before the command ended');
  const pid = r.structured.pid;
  const logs = (args = {}) => call(client, 'sandbox_process_logs', { sandbox_id: box, pid, ...args });
  await until('it to exit (well past timeout_ms)', async () => (await logs()).structured.exited);
  const all = (await logs()).structured;
  assert.equal(all.exit_code, 7);
  assert.match(all.data, /^out\nerr\nlate\nline0\n/);
  assert.match(all.data, /line2999\n$/);
  assert.equal(all.next_offset, Buffer.byteLength(all.data));
  const tail = (await logs({ tail_bytes: 9 })).structured;
  assert.equal(tail.data, 'line2999\n');
  assert.equal(tail.next_offset, all.next_offset);
  const from = (await logs({ offset: 4 })).structured;
  assert.equal(from.data, all.data.slice(4));
  const none = (await logs({ offset: all.next_offset })).structured;
  assert.equal(none.data, '');
  const not = await call(client, 'sandbox_process_logs', { sandbox_id: box, pid: 1 });
  assert.equal(not.isError, true);
  assert.match(not.text, /background: true/);
});

test('the log keeps the last 1 MiB; offsets keep counting', async () => {
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, background: true,
    command: 'head -c 1500000 /dev/zero | tr "\\0" a; echo END' });
  const pid = r.structured.pid;
  const logs = (args = {}) => call(client, 'sandbox_process_logs', { sandbox_id: box, pid, ...args });
  await until('it to exit', async () => (await logs()).structured.exited);
  const first = (await logs()).structured;
  assert.equal(first.offset, 1500004 - 1048576, 'the oldest bytes were dropped');
  let off = first.offset, text = '';
  for (;;) {
    const c = (await logs({ offset: off })).structured;
    if (!c.data.length) break;
    text += c.data;
    off = c.next_offset;
  }
  assert.equal(off, 1500004);
  assert.equal(text.length, 1048576);
  assert.ok(text.endsWith('aEND\n'));
});

test('all logs together keep at most 8 MiB (the largest give way)', async () => {
  const id = await create({ name: 'bg-logcap', from_template: 'base' });
  try {
    const pids = [];
    for (let i = 0; i < 10; i++)
      pids.push((await call(client, 'sandbox_exec', { sandbox_id: id, background: true,
        command: 'head -c 1200000 /dev/zero | tr "\\0" b' })).structured.pid);
    const kept = async (pid) => {
      const first = (await call(client, 'sandbox_process_logs', { sandbox_id: id, pid })).structured;
      const last = (await call(client, 'sandbox_process_logs', { sandbox_id: id, pid, tail_bytes: 1 })).structured;
      return { exited: first.exited, end: last.next_offset, kept: last.next_offset - first.offset };
    };
    await until('all to exit', async () => (await Promise.all(pids.map(kept))).every((k) => k.exited), 30000);
    const all = await Promise.all(pids.map(kept));
    for (const k of all) {
      assert.equal(k.end, 1200000, 'offsets count every byte');
      assert.ok(k.kept <= 1048576, `one log keeps at most 1 MiB (${k.kept})`);
    }
    const total = all.reduce((a, k) => a + k.kept, 0);
    assert.ok(total <= 8 * 1048576, `all logs keep at most 8 MiB (${total})`);
    assert.ok(total >= 7 * 1048576, `...and not much less (${total})`);
  } finally {
    await kill(id);
  }
});

test('stdin: wc -c of "12345" is 5; large stdin arrives whole', async () => {
  const r = await sh(client, box, 'wc -c', { stdin: '12345' });
  assert.equal(r.stdout.trim(), '5');
  assert.equal(r.exit_code, 0);
  const big = 'x'.repeat(3 * 1024 * 1024 + 7);
  const b = await sh(client, box, 'wc -c', { stdin: big });
  assert.equal(b.stdout.trim(), String(big.length));
  const e = await sh(client, box, 'cat', { stdin: '' });
  assert.equal(e.stdout, '');
  const c = await sh(client, box, 'true', { stdin: big }); // never read: no hang
  assert.equal(c.exit_code, 0);
  const over = await call(client, 'sandbox_exec', { sandbox_id: box, command: 'wc -c',
                                                    stdin: 'y'.repeat(8 * 1024 * 1024 + 1) });
  assert.equal(over.isError, true);
  assert.match(over.text, /stdin/);
});

test('the background-process cap (64) gives its actionable error', async () => {
  const id = await create({ name: 'bg-cap' });
  try {
    const pids = [];
    for (let i = 0; i < 64; i++) {
      const r = await call(client, 'sandbox_exec', { sandbox_id: id, command: 'sleep 600', background: true });
      assert.equal(r.isError, false, r.text);
      pids.push(r.structured.pid);
    }
    const over = await call(client, 'sandbox_exec', { sandbox_id: id, command: 'sleep 600', background: true });
    assert.equal(over.isError, true);
    assert.match(over.text, /64 background processes .*sandbox_process_kill/);
    const k = await call(client, 'sandbox_process_kill', { sandbox_id: id, pid: pids[0], signal: 'KILL' });
    assert.equal(k.isError, false, k.text);
    const again = await call(client, 'sandbox_exec', { sandbox_id: id, command: 'sleep 600', background: true });
    assert.equal(again.isError, false, again.text);
  } finally {
    await kill(id);
  }
});

test('python3 -m http.server in the background answers a later curl; its log is readable', async () => {
  // python3: the debian template, on both drivers (the busybox case below: base)
  const id = await create({ name: 'bg-http', from_template: 'debian' });
  try {
    const r = await call(client, 'sandbox_exec', { sandbox_id: id, background: true,
      command: 'cd /tmp && echo hello > index.txt && exec python3 -u -m http.server 8123' });
    assert.equal(r.isError, false, r.text);
    const pid = r.structured.pid;
    await until('the server to answer', async () =>
      (await sh(client, id, 'curl -s http://127.0.0.1:8123/index.txt')).stdout === 'hello\n', 30000);
    const l = await call(client, 'sandbox_process_logs', { sandbox_id: id, pid });
    assert.equal(l.structured.exited, false);
    assert.match(l.structured.data, /GET \/index.txt/);
    assert.ok((await list(id)).some((p) => p.pid === pid && p.command.includes('http.server')));
  } finally {
    await kill(id);
  }
});

test('a busybox httpd started with background: true answers a later wget; its log is readable', async () => {
  // -Y off: past the egress proxy that http_proxy names (loopback is the sandbox's own)
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, background: true,
    command: 'mkdir -p /tmp/www && echo hello > /tmp/www/index.txt && echo serving && exec httpd -f -vv -p 127.0.0.1:8124 -h /tmp/www' });
  assert.equal(r.isError, false, r.text);
  const pid = r.structured.pid;
  await until('the server to answer', async () =>
    (await sh(client, box, 'wget -Y off -q -O - http://127.0.0.1:8124/index.txt')).stdout === 'hello\n');
  const l = await call(client, 'sandbox_process_logs', { sandbox_id: box, pid });
  assert.equal(l.structured.exited, false);
  assert.match(l.structured.data, /^serving\n/);
  assert.match(l.structured.data, /index\.txt/);
  const k = await call(client, 'sandbox_process_kill', { sandbox_id: box, pid });
  assert.equal(k.isError, false, k.text);
  const w = await sh(client, box, 'wget -Y off -q -O - http://127.0.0.1:8124/index.txt');
  assert.notEqual(w.exit_code, 0, 'nothing answers once it is killed');
});

test('background and stdin on a paused sandbox: it resumes and they work', async () => {
  const p = await call(client, 'sandbox_pause', { sandbox_id: box });
  assert.equal(p.isError, false, p.text);
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, background: true, command: 'echo woke' });
  assert.equal(r.isError, false, r.text);
  await until('its line in its log', async () => (await call(client, 'sandbox_process_logs',
    { sandbox_id: box, pid: r.structured.pid })).structured.data === 'woke\n');
  const p2 = await call(client, 'sandbox_pause', { sandbox_id: box });
  assert.equal(p2.isError, false, p2.text);
  assert.equal((await sh(client, box, 'wc -c', { stdin: 'abc' })).stdout.trim(), '3');
});
