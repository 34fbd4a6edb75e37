// The file tools through the pipeline: write, read, list and download a directory as ZIP;
// each limit as an actionable error; large payloads by claim check (an 8 MiB write and a
// ZIP near 10 MiB cross a Kafka whose messages stay under 1 MiB); paths resolve inside the
// sandbox, whatever they try.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync, existsSync, readFileSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env, driver } from './lib.mjs';
import { readZip } from './zip.mjs';

const client = await connect(env.SF_KEY_ALPHA);
let id;
before(async () => {
  const r = await call(client, 'sandbox_create', { name: 'files' });
  assert.equal(r.isError, false, r.text);
  id = r.structured.id;
});
after(async () => {
  if (id) await call(client, 'sandbox_kill', { sandbox_id: id });
  await client.close();
});

const sha = (b) => createHash('sha256').update(b).digest('hex');
// Checks made by the worker, the scheduler and Redis alone, whatever the driver: the jail
// stack runs them; the qemu stack (TCG here) runs everything that goes through the VM.
const jailOnly = { skip: driver === 'qemu' ? 'driver-independent: the jail stack runs it' : false };

test('write a script, run it, read what it wrote, list the folder, download it as ZIP', async () => {
  const script = '#!/bin/sh\nmkdir -p out/sub\necho "result: $((6 * 7))" > out/answer.txt\n'
    + 'printf "\\001\\002\\003" > out/sub/bytes.bin\n';
  const w = await call(client, 'sandbox_files_write', { sandbox_id: id, path: 'work/run.sh', content: script });
  assert.equal(w.isError, false, w.text);
  assert.deepEqual(w.structured, { path: '/root/work/run.sh', bytes: Buffer.byteLength(script) });

  const run = await sh(client, id, 'sh run.sh && ln -s /etc/hostname out/link', { cwd: '/root/work' });
  assert.equal(run.exit_code, 0, run.stderr);

  const r = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/root/work/out/answer.txt' });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.structured.content, 'result: 42\n');
  assert.equal(r.structured.encoding, 'text');
  assert.equal(r.structured.bytes, 11);
  const bin = await call(client, 'sandbox_files_read', { sandbox_id: id, path: 'work/out/sub/bytes.bin', encoding: 'base64' });
  assert.equal(bin.structured.content, Buffer.from([1, 2, 3]).toString('base64'));

  const l = await call(client, 'sandbox_files_list', { sandbox_id: id, path: '/root/work/out' });
  assert.equal(l.isError, false, l.text);
  assert.deepEqual(l.structured.entries.map((e) => [e.name, e.type]),
    [['answer.txt', 'file'], ['link', 'symlink'], ['sub', 'directory']]);
  assert.equal(l.structured.entries[0].size, 11);
  assert.match(l.structured.entries[0].modified_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);

  const z = await call(client, 'sandbox_files_download_dir', { sandbox_id: id, path: '/root/work' });
  assert.equal(z.isError, false, z.text);
  const zip = Buffer.from(z.structured.content, 'base64');
  assert.equal(zip.length, z.structured.bytes);
  const entries = readZip(zip);
  assert.deepEqual([...entries.keys()].sort(),
    ['out/', 'out/answer.txt', 'out/sub/', 'out/sub/bytes.bin', 'run.sh']);
  assert.equal(entries.get('run.sh').toString(), script);
  assert.equal(entries.get('out/answer.txt').toString(), 'result: 42\n');
  assert.deepEqual([...entries.get('out/sub/bytes.bin')], [1, 2, 3]);
  assert.equal(z.structured.files, 3);
  assert.equal(z.structured.skipped, 1, 'the symlink is skipped');
});

test('a write replaces a file whole and creates missing parents; bad input is explained', async () => {
  await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/tmp/a/b/c.txt', content: 'first version, long' });
  await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/tmp/a/b/c.txt', content: 'second' });
  assert.equal((await sh(client, id, 'cat /tmp/a/b/c.txt; ls -a /tmp/a/b')).stdout, 'second.\n..\nc.txt\n');
  const bad = await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/tmp/x', content: '%%%', encoding: 'base64' });
  assert.equal(bad.isError, true);
  assert.match(bad.text, /not valid base64/);
  const missing = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/nope/file' });
  assert.equal(missing.isError, true);
  assert.match(missing.text, /\/nope\/file does not exist in the sandbox/);
  const dir = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/tmp' });
  assert.match(dir.text, /\/tmp is a directory/);
  const binary = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/bin/busybox' });
  assert.equal(binary.isError, true);
  assert.match(binary.text, /over the 1 MiB|not UTF-8 text/);
  const notdir = await call(client, 'sandbox_files_list', { sandbox_id: id, path: '/tmp/a/b/c.txt' });
  assert.match(notdir.text, /is not a directory/);
});

test('limits: 1 MiB + 1 read and 8 MiB + 1 write are refused with what to do', async () => {
  await sh(client, id, 'head -c 1048577 /dev/zero > /tmp/big && head -c 1048576 /dev/zero > /tmp/ok');
  const over = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/tmp/big' });
  assert.equal(over.isError, true);
  assert.match(over.text, /1048577 bytes, over the 1 MiB .* limit of sandbox_files_read; read a part with sandbox_exec \(head -c/);
  const ok = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/tmp/ok', encoding: 'base64' });
  assert.equal(ok.isError, false, ok.text);
  assert.equal(Buffer.from(ok.structured.content, 'base64').length, 1048576);

  const tooBig = randomBytes(8 * 1024 * 1024 + 1).toString('base64');
  const w = await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/tmp/w', content: tooBig, encoding: 'base64' });
  assert.equal(w.isError, true);
  assert.match(w.text, /8388609 bytes, over the 8 MiB .* limit of sandbox_files_write/);
  await sh(client, id, 'rm -f /tmp/big');
});

test('a directory whose ZIP would pass 10 MiB is refused with what to do', jailOnly, async () => {
  // 11 MiB that does not compress: its ZIP would pass 10 MiB
  await sh(client, id, 'mkdir -p /tmp/huge && head -c 11534336 /dev/urandom > /tmp/huge/noise');
  const z = await call(client, 'sandbox_files_download_dir', { sandbox_id: id, path: '/tmp/huge' });
  assert.equal(z.isError, true);
  assert.match(z.text, /The ZIP of \/tmp\/huge would be 11\.0 MiB, over the 10 MiB limit of sandbox_files_download_dir; download its subdirectories/);
  await sh(client, id, 'rm -rf /tmp/huge');
});

test('an 8 MiB write travels by claim check and comes back byte-exact', async () => {
  const data = randomBytes(8 * 1024 * 1024);
  const w = await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/root/big/data.bin', content: data.toString('base64'), encoding: 'base64' });
  assert.equal(w.isError, false, w.text);
  assert.equal(w.structured.bytes, data.length);
  assert.equal((await sh(client, id, 'sha256sum /root/big/data.bin')).stdout.split(' ')[0], sha(data));
  // ...and back out, as a ZIP (incompressible: about 8 MiB, so it too is a claim)
  const z = await call(client, 'sandbox_files_download_dir', { sandbox_id: id, path: '/root/big' });
  assert.equal(z.isError, false, z.text);
  assert.ok(z.structured.bytes > 8 * 1024 * 1024);
  assert.equal(sha(readZip(Buffer.from(z.structured.content, 'base64')).get('data.bin')), sha(data));
  // a 1 MiB read (over the claim threshold too) comes back whole
  await sh(client, id, 'head -c 1048576 /root/big/data.bin > /root/big/head');
  const r = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/root/big/head', encoding: 'base64' });
  assert.equal(sha(Buffer.from(r.structured.content, 'base64')), sha(data.subarray(0, 1048576)));
  await sh(client, id, 'rm -rf /root/big');
});

test('an idempotent retry of a large answer gets the first answer again, not a new read', async () => {
  // 1 MiB read as base64: its answer is a claim, and with its value over 1 MiB too large
  // to keep whole under the key
  const first = randomBytes(1024 * 1024), second = randomBytes(1024 * 1024);
  const meta = { 'sandfleet/idempotency_key': `big-read-${randomBytes(6).toString('hex')}` };
  const put = async (data) => assert.equal((await call(client, 'sandbox_files_write', { sandbox_id: id,
    path: '/root/idem.bin', content: data.toString('base64'), encoding: 'base64' })).isError, false);
  const read = (opts) => call(client, 'sandbox_files_read', { sandbox_id: id, path: '/root/idem.bin', encoding: 'base64' }, opts);
  await put(first);
  const a = await read({ meta });
  assert.equal(a.isError, false, a.text);
  assert.equal(sha(Buffer.from(a.structured.content, 'base64')), sha(first));
  await put(second); // a second run would read this
  const b = await read({ meta });
  assert.equal(b.isError, false, b.text);
  assert.equal(sha(Buffer.from(b.structured.content, 'base64')), sha(first), 'the retry ran the read again');
  assert.equal(b.structured.bytes, first.length);
  const c = await read({ meta: { 'sandfleet/idempotency_key': `${meta['sandfleet/idempotency_key']}-new` } });
  assert.equal(sha(Buffer.from(c.structured.content, 'base64')), sha(second), 'another key is another call');
  // Its large value lives 5 minutes (the claim's TTL): once it is gone, a retry is told
  // that the call ran, and nothing runs again (here its claims are removed by hand).
  const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
  const claims = redis('--scan', '--pattern', 'sf:cc:*:job_i*:r:content').split('\n').filter(Boolean);
  assert.ok(claims.length >= 2, `the idempotent reads' claims are kept: ${claims}`);
  for (const k of claims) redis('DEL', k);
  const d = await read({ meta });
  assert.equal(d.isError, true);
  assert.match(d.text, /already ran \(same idempotency key\).*large answers are kept only 5 minutes/);
  await sh(client, id, 'rm -f /root/idem.bin');
});

test('paths stay inside the sandbox: .., absolute symlinks out, /proc/1/root', async () => {
  // A file on the host, where a careless worker would look.
  const host = mkdtempSync('/tmp/sf-host-');
  writeFileSync(`${host}/secret`, 'host secret\n');
  try {
    const up = await call(client, 'sandbox_files_read', { sandbox_id: id, path: `/../../../../../../${host}/secret` });
    assert.equal(up.isError, true);
    assert.match(up.text, /does not exist in the sandbox/);
    const hn = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '../../../../proc/sys/kernel/hostname' });
    assert.equal(hn.structured.content.trim(), id, "the hostname is the sandbox's");

    await sh(client, id, `ln -sf ${host}/secret /root/hostlink && ln -sfn / /root/rootlink && ln -sfn /tmp /root/tmplink`);
    const viaLink = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/root/hostlink' });
    assert.equal(viaLink.isError, true);
    assert.match(viaLink.text, /does not exist in the sandbox/);
    const viaRoot = await call(client, 'sandbox_files_read', { sandbox_id: id, path: `/root/rootlink${host}/secret` });
    assert.equal(viaRoot.isError, true);
    const proc = await call(client, 'sandbox_files_read', { sandbox_id: id, path: '/proc/1/root/proc/sys/kernel/hostname' });
    assert.equal(proc.structured.content.trim(), id, '/proc/1/root is the sandbox root');
    const procHost = await call(client, 'sandbox_files_read', { sandbox_id: id, path: `/proc/1/root${host}/secret` });
    assert.equal(procHost.isError, true);

    // Writes through the same tricks land in the sandbox, never on the host.
    const ww = await call(client, 'sandbox_files_write', { sandbox_id: id, path: `/root/tmplink/../../..${host}/planted`, content: 'x' });
    assert.equal(existsSync(`${host}/planted`), false);
    if (!ww.isError) assert.equal((await sh(client, id, `cat ${host}/planted`)).stdout, 'x');
    const w2 = await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/root/tmplink/through-link.txt', content: 'in sandbox tmp' });
    assert.equal(w2.isError, false, w2.text);
    assert.equal((await sh(client, id, 'cat /tmp/through-link.txt')).stdout, 'in sandbox tmp');
    assert.equal(readFileSync(`${host}/secret`, 'utf8'), 'host secret\n');
    const list = await call(client, 'sandbox_files_list', { sandbox_id: id, path: '/proc/1/root/root' });
    assert.ok(list.structured.entries.some((e) => e.name === 'hostlink'));
  } finally {
    rmSync(host, { recursive: true, force: true });
  }
});

test("another team's sandbox cannot be read or written", jailOnly, async () => {
  const beta = await connect(env.SF_KEY_BETA, 'beta');
  try {
    for (const [tool, args] of [['sandbox_files_read', { path: '/etc/hostname' }],
      ['sandbox_files_write', { path: '/tmp/x', content: 'x' }], ['sandbox_files_list', { path: '/' }],
      ['sandbox_files_download_dir', { path: '/tmp' }]]) {
      const r = await call(beta, tool, { sandbox_id: id, ...args });
      assert.equal(r.isError, true, tool);
      assert.match(r.text, /No sandbox with id .* exists for your team/, tool);
    }
  } finally {
    await beta.close();
  }
});

test("one team's large payloads are bounded: a team at its claim budget is told to wait, others go on", jailOnly, async () => {
  const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
  const beta = await connect(env.SF_KEY_BETA, 'beta');
  let bid;
  try {
    const c = await call(beta, 'sandbox_create', { name: 'budget' });
    assert.equal(c.isError, false, c.text);
    bid = c.structured.id;
    const big = 'b'.repeat(300 * 1024); // over the 256 KiB claim threshold
    await sh(beta, bid, `head -c ${300 * 1024} /dev/zero | tr '\\0' b > /root/big.txt`);
    // beta's claims already hold its whole budget (64 MiB): a claim that is still alive
    const fake = 'sf:cc:{beta}:job_fake:a:content';
    redis('ZADD', 'sf:team:{beta}:cc', String(Date.now() + 120000), fake);
    redis('HSET', 'sf:team:{beta}:ccb', fake, String(64 << 20));
    try {
      const w = await call(beta, 'sandbox_files_write', { sandbox_id: bid, path: '/root/up.txt', content: big });
      assert.equal(w.isError, true);
      assert.match(w.text, /Your team's large uploads and answers in flight already hold 64 MiB, its limit; wait for other file calls to finish, then retry\./);
      const r = await call(beta, 'sandbox_files_read', { sandbox_id: bid, path: '/root/big.txt' });
      assert.equal(r.isError, true);
      assert.match(r.text, /already hold 64 MiB, its limit; wait for other file calls to finish/);
      // small payloads need no claim; other teams are not touched
      const small = await call(beta, 'sandbox_files_write', { sandbox_id: bid, path: '/root/small.txt', content: 'ok' });
      assert.equal(small.isError, false, small.text);
      const a = await call(client, 'sandbox_files_write', { sandbox_id: id, path: '/root/alpha.txt', content: big });
      assert.equal(a.isError, false, a.text);
      assert.equal(a.structured.bytes, big.length);
    } finally {
      redis('ZREM', 'sf:team:{beta}:cc', fake);
      redis('HDEL', 'sf:team:{beta}:ccb', fake);
    }
    const w = await call(beta, 'sandbox_files_write', { sandbox_id: bid, path: '/root/up.txt', content: big });
    assert.equal(w.isError, false, w.text);
    const r = await call(beta, 'sandbox_files_read', { sandbox_id: bid, path: '/root/big.txt' });
    assert.equal(r.isError, false, r.text);
    assert.equal(r.structured.content, big);
    // taken claims give their bytes back
    assert.equal(redis('HLEN', 'sf:team:{beta}:ccb'), '0');
  } finally {
    if (bid) await call(beta, 'sandbox_kill', { sandbox_id: bid });
    await beta.close();
  }
});
