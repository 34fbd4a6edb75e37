// Templates through the pipeline with the official MCP SDK client: the built-in 'debian'
// (python3, bash, git, curl just work) with the file tools on it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env, driver } from './lib.mjs';
import { readZip } from './zip.mjs';

const alpha = await connect(env.SF_KEY_ALPHA);
const made = [];
after(async () => {
  for (const id of made) await call(alpha, 'sandbox_kill', { sandbox_id: id });
  await alpha.close();
});

// Creates a sandbox (the worker answers "still being built" while a template is not on
// the host yet: retried until the deadline).
async function create(client, args, deadlineMs = 600000) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const r = await call(client, 'sandbox_create', args);
    if (!r.isError) {
      made.push(r.structured.id);
      return r.structured.id;
    }
    if (!/still being built/.test(r.text) || Date.now() > end) return r;
    await new Promise((res) => setTimeout(res, 2000));
  }
}

test('a debian sandbox: write a Python script, run it, read, list and download what it made',
  { skip: driver !== 'jail' && 'the qemu driver runs base only (tested below)' }, async () => {
    const id = await create(alpha, { name: 'py', from_template: 'debian' });
    assert.equal(typeof id, 'string', id.text);
    const v = await sh(alpha, id, "python3 --version && bash -c 'echo $BASH_VERSION' && git --version && curl --version | head -1");
    assert.equal(v.exit_code, 0, v.stderr);
    assert.match(v.stdout, /^Python 3\.11\.\d+\n5\.2\.\d+.*\ngit version 2\.\d+.*\ncurl 7\.\d+/);

    const script = 'import json, os\nos.makedirs("out/data", exist_ok=True)\n'
      + 'squares = {str(n): n * n for n in range(10)}\n'
      + 'open("out/squares.json", "w").write(json.dumps(squares, sort_keys=True))\n'
      + 'open("out/data/blob.bin", "wb").write(bytes(range(256)))\nprint("done", len(squares))\n';
    const w = await call(alpha, 'sandbox_files_write', { sandbox_id: id, path: 'proj/make.py', content: script });
    assert.equal(w.isError, false, w.text);
    const run = await sh(alpha, id, 'python3 make.py', { cwd: '/root/proj' });
    assert.equal(run.exit_code, 0, run.stderr);
    assert.equal(run.stdout, 'done 10\n');

    const want = JSON.stringify(Object.fromEntries([...Array(10).keys()].map((n) => [String(n), n * n]))
      ).replace(/,/g, ', ').replace(/:/g, ': ');
    const r = await call(alpha, 'sandbox_files_read', { sandbox_id: id, path: '/root/proj/out/squares.json' });
    assert.equal(r.isError, false, r.text);
    assert.deepEqual(JSON.parse(r.structured.content), JSON.parse(want));
    assert.equal(r.structured.content, want);

    const l = await call(alpha, 'sandbox_files_list', { sandbox_id: id, path: '/root/proj' });
    assert.equal(l.isError, false, l.text);
    assert.deepEqual(l.structured.entries.map((e) => [e.name, e.type]),
      [['make.py', 'file'], ['out', 'directory']]);
    assert.equal(l.structured.entries[0].size, Buffer.byteLength(script));

    const z = await call(alpha, 'sandbox_files_download_dir', { sandbox_id: id, path: '/root/proj' });
    assert.equal(z.isError, false, z.text);
    const entries = readZip(Buffer.from(z.structured.content, 'base64'));
    assert.deepEqual([...entries.keys()].sort(),
      ['make.py', 'out/', 'out/data/', 'out/data/blob.bin', 'out/squares.json']);
    assert.equal(entries.get('make.py').toString(), script);
    assert.equal(entries.get('out/squares.json').toString(), want);
    assert.deepEqual([...entries.get('out/data/blob.bin')], [...Array(256).keys()]);

    // The template itself is shared and read-only underneath: a sandbox's changes stay its own.
    await sh(alpha, id, 'echo changed > /root/mine.txt');
    const other = await create(alpha, { from_template: 'debian' });
    const o = await sh(alpha, other, 'test -e /root/mine.txt; echo $?; python3 -c "print(6*7)"');
    assert.equal(o.stdout, '1\n42\n');
  });

test('an unknown template is refused with what to use instead', async () => {
  const r = await call(alpha, 'sandbox_create', { from_template: 'nope' });
  assert.equal(r.isError, true);
  assert.match(r.text, /Template 'nope' does not exist/);
});

test('the qemu driver refuses non-base templates with a clear error',
  { skip: driver !== 'qemu' && 'jail stack' }, async () => {
    const r = await call(alpha, 'sandbox_create', { from_template: 'debian' });
    assert.equal(r.isError, true);
    assert.match(r.text, /qemu driver runs only the 'base' template/);
  });
