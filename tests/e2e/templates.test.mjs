// Templates through the pipeline with the official MCP SDK client: the built-in 'debian'
// (python3, bash, git, curl just work) with the file tools on it; team templates built by
// sandbox_template_create (asynchronous: building -> ready or failed with the step's output),
// their shape as their sandboxes' limits, and invisible to other teams; a build whose host
// went down (the reaper removed it) is failed there with why.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env, driver, until, createWhenBuilt } from './lib.mjs';
import { readZip } from './zip.mjs';

const alpha = await connect(env.SF_KEY_ALPHA);
const beta = await connect(env.SF_KEY_BETA);
const made = [];
after(async () => {
  for (const id of made) await call(alpha, 'sandbox_kill', { sandbox_id: id });
  await alpha.close();
  await beta.close();
});

// Polls sandbox_template_list until the template leaves 'building'.
async function settled(client, name, deadlineMs = 300000) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const l = await call(client, 'sandbox_template_list', { name_prefix: name });
    assert.equal(l.isError, false, l.text);
    const t = l.structured.templates.find((x) => x.name === name);
    assert.ok(t, `${name} is listed`);
    if (t.status !== 'building' || Date.now() > end) return t;
    await new Promise((res) => setTimeout(res, 500));
  }
}
const uniq = Date.now().toString(36);

// Creates a sandbox, waiting through the product while a template is still being built.
async function create(client, args, deadlineMs = 600000) {
  const r = await createWhenBuilt(client, args, deadlineMs);
  if (!r.isError) made.push(r.structured.id);
  return r.isError ? r : r.structured.id;
}

test('a debian sandbox: write a Python script, run it, read, list and download what it made',
  async () => {
    const id = await create(alpha, { name: 'py', from_template: 'debian' });
    assert.equal(typeof id, 'string', id.text);
    const v = await sh(alpha, id, "python3 --version && bash -c 'echo $BASH_VERSION' && git --version && curl --version | head -1");
    assert.equal(v.exit_code, 0, v.stderr);
    assert.match(v.stdout, /^Python 3\.11\.\d+\n5\.2\.\d+.*\ngit version 2\.\d+.*\ncurl 7\.\d+/);
    // a dev server on localhost is reachable by that name: /etc/hosts, not the egress DNS
    // (which refuses names outside the sandbox's rules)
    const lh = await sh(alpha, id, "getent hosts localhost | head -1; python3 -c \"import socket; print(socket.gethostbyname('localhost'))\"");
    assert.equal(lh.exit_code, 0, lh.stderr);
    assert.match(lh.stdout, /^(127\.0\.0\.1|::1)\s+localhost.*\n127\.0\.0\.1\n$/);

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

test('the qemu driver builds no team templates: a clear error',
  { skip: driver !== 'qemu' && 'jail stack' }, async () => {
    const b = await call(alpha, 'sandbox_template_create', { name: `q-${uniq}`, from: 'base' });
    assert.equal(b.isError, true);
    assert.match(b.text, /No worker host that can build templates \(jail driver\)/);
  });

test('the template list: the built-ins, ready, with their shape', async () => {
  const l = await call(alpha, 'sandbox_template_list', {});
  assert.equal(l.isError, false, l.text);
  const base = l.structured.templates.find((t) => t.name === 'base');
  assert.equal(base.status, 'ready');
  assert.equal(base.builtin, true);
  assert.ok(base.memory_mib > 0 && base.vcpu >= 1);
  assert.ok(l.structured.templates.some((t) => t.name === 'debian'));
  const none = await call(alpha, 'sandbox_template_list', { name_prefix: 'zz-nothing' });
  assert.deepEqual(none.structured.templates, []);
});

test('bad template names and sources are refused with what to do', async () => {
  const bad = await call(alpha, 'sandbox_template_create', { name: 'Bad Name', from: 'base' });
  assert.equal(bad.isError, true);
  const builtin = await call(alpha, 'sandbox_template_create', { name: 'debian', from: 'base' });
  assert.match(builtin.text, /built-in template's name; pick another name/);
  const nofrom = await call(alpha, 'sandbox_template_create', { name: `x-${uniq}`, from: 'missing' });
  assert.match(nofrom.text, /Template 'missing' does not exist/);
});

test('a template whose step fails reports failed, with that step and its output',
  { skip: driver !== 'jail' && 'jail hosts build templates' }, async () => {
    const name = `broken-${uniq}`;
    const r = await call(alpha, 'sandbox_template_create', {
      name, from: 'base', run_steps: ['echo first-ok', 'echo about-to-fail; echo oops >&2; exit 3', 'echo never'],
    });
    assert.equal(r.isError, false, r.text);
    assert.equal(r.structured.status, 'building');
    const t = await settled(alpha, name);
    assert.equal(t.status, 'failed', JSON.stringify(t));
    assert.equal(t.failed_step, 2);
    assert.match(t.error, /Step 2 \(echo about-to-fail.*\) exited with 3; its output ends: about-to-fail\n.*oops/s);
    const c = await call(alpha, 'sandbox_create', { from_template: name });
    assert.equal(c.isError, true);
    assert.match(c.text, /is failed, not ready/);
    // a failed template's name can be used again
    const again = await call(alpha, 'sandbox_template_create', { name, from: 'base', run_steps: ['true'] });
    assert.equal(again.isError, false, again.text);
    assert.equal((await settled(alpha, name)).status, 'ready');
  });

test('a good template becomes ready; its sandboxes have what the steps installed and its shape; other teams cannot see or use it',
  { skip: driver !== 'jail' && 'jail hosts build templates' }, async () => {
    const name = `pytool-${uniq}`;
    const r = await call(alpha, 'sandbox_template_create', {
      name, from: 'debian', memory_mib: 192, vcpu: 1, disk_mib: 512,
      run_steps: [
        'mkdir -p /usr/local/lib/python3.11/dist-packages /opt/data',
        `printf 'def hi():\\n    return "hi from the template"\\n' > /usr/local/lib/python3.11/dist-packages/greet.py`,
        'echo 12345 > /opt/data/seed && apt-get --version | head -1',
      ],
      start_cmd: 'python3 -m http.server 8000 --bind 127.0.0.1',
      ready_cmd: 'python3 -c "import urllib.request; urllib.request.urlopen(\'http://127.0.0.1:8000/\')"',
    });
    assert.equal(r.isError, false, r.text);
    const dup = await call(alpha, 'sandbox_template_create', { name, from: 'base' });
    assert.equal(dup.isError, true);
    assert.match(dup.text, /already has a template named/);
    const t = await settled(alpha, name);
    assert.equal(t.status, 'ready', JSON.stringify(t));
    assert.equal(t.memory_mib, 192);
    assert.equal(t.from, 'debian');

    const id = await create(alpha, { from_template: name });
    assert.equal(typeof id, 'string', id.text);
    const o = await sh(alpha, id, 'python3 -c "import greet; print(greet.hi())"; cat /opt/data/seed; id -u');
    assert.equal(o.exit_code, 0, o.stderr);
    assert.equal(o.stdout, 'hi from the template\n12345\n0\n');
    // its start_cmd (python3 -m http.server) runs in the sandbox, ready when the create answered
    const web = await sh(alpha, id, 'curl -sf -o /dev/null -w "%{http_code}" http://127.0.0.1:8000/');
    assert.equal(web.stdout, '200', web.stderr);
    // the template underneath is read-only: a sandbox changes its own copy (the overlay)
    const w = await sh(alpha, id, 'echo mine >> /opt/data/seed 2>&1; cat /opt/data/seed');
    assert.match(w.stdout, /12345\n/);
    const info = await call(alpha, 'sandbox_info', { sandbox_id: id });
    assert.equal(info.structured.resources.memory_mib, 192);

    // another team: not listed, not usable, not a base to build from, name free for it
    const bl = await call(beta, 'sandbox_template_list', {});
    assert.ok(!bl.structured.templates.some((x) => x.name === name));
    const bc = await call(beta, 'sandbox_create', { from_template: name });
    assert.equal(bc.isError, true);
    assert.match(bc.text, new RegExp(`Template '${name}' does not exist`));
    const bb = await call(beta, 'sandbox_template_create', { name: `b-${uniq}`, from: name });
    assert.match(bb.text, new RegExp(`Template '${name}' does not exist`));
  });

test("a template's start_cmd runs in every sandbox created from it, ready before the create answers; files it left private stay readable",
  { skip: driver !== 'jail' && 'jail hosts build templates' }, async () => {
    const name = `svc-${uniq}`;
    const r = await call(alpha, 'sandbox_template_create', {
      name, from: 'base', memory_mib: 128,
      run_steps: [
        'mkdir -p /srv/www && echo hello-from-the-service > /srv/www/index.html',
        // left private by the step: 0600 file, 0700 directory
        'echo secret-1 > /srv/private.txt && chmod 600 /srv/private.txt && mkdir -m 700 /srv/locked && echo secret-2 > /srv/locked/f && chmod 600 /srv/locked/f',
      ],
      start_cmd: 'echo service starting; sleep 0.3; exec httpd -f -p 127.0.0.1:8080 -h /srv/www',
      // FAIL_READY (a sandbox's env_vars) makes it fail on purpose in one case below
      ready_cmd: 'test -z "$FAIL_READY" || { echo failing on purpose; exit 3; }; wget -q -Y off -O - http://127.0.0.1:8080/ >/dev/null',
    });
    assert.equal(r.isError, false, r.text);
    const t = await settled(alpha, name);
    assert.equal(t.status, 'ready', JSON.stringify(t));

    // each sandbox runs its own service, answering as soon as the create has
    for (const n of [1, 2]) {
      const id = await create(alpha, { from_template: name, name: `svc-${n}` });
      assert.equal(typeof id, 'string', id.text);
      const o = await sh(alpha, id, 'wget -q -Y off -O - http://127.0.0.1:8080/; cat /tmp/sandfleet-start.log');
      assert.equal(o.exit_code, 0, o.stderr);
      assert.equal(o.stdout, 'hello-from-the-service\nservice starting\n');
      const p = await sh(alpha, id, 'cat /srv/private.txt /srv/locked/f && ls /srv/locked');
      assert.equal(p.exit_code, 0, p.stderr);
      assert.equal(p.stdout, 'secret-1\nsecret-2\nf\n');
    }

    // ready_cmd never succeeds: the create fails naming the command and its output, and
    // the sandbox is gone
    const tag = `ready-fail-${uniq}`;
    const bad = await call(alpha, 'sandbox_create', { from_template: name, env_vars: { FAIL_READY: '1' },
      metadata: { case: tag } });
    assert.equal(bad.isError, true, bad.text);
    assert.match(bad.text, /did not start its service: ready_cmd \(test -z "\$FAIL_READY".*\) did not succeed within \d+ s of start_cmd \(its last exit status 3, its output ending: failing on purpose; start_cmd's output in \/tmp\/sandfleet-start.log ending: service starting\)\. The sandbox was removed; fix the template's start_cmd or ready_cmd/);
    await until('the failed sandbox to leave the list', async () =>
      (await call(alpha, 'sandbox_list', { metadata: { case: tag } })).structured.sandboxes.length === 0);
  });

test('sandbox_template_delete: refused while in use (with the count), for other teams and built-ins; frees the files, record, log and name',
  { skip: driver !== 'jail' && 'jail hosts build templates' }, async () => {
    const redis = (...a) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...a]).toString().trim();
    const name = `del-${uniq}`;
    const build = async (v) => {
      const r = await call(alpha, 'sandbox_template_create', { name, from: 'base', run_steps: [`echo ${v} > /version`] });
      assert.equal(r.isError, false, r.text);
      assert.equal((await settled(alpha, name)).status, 'ready');
    };
    await build('v1');
    const dir = `${env.SF_STATE}/worker/templates/team/alpha/${name}`;
    assert.ok(existsSync(`${dir}/rootfs/version`), dir);
    assert.equal(redis('EXISTS', `sf:team:{alpha}:tpl:${name}:log`), '1');

    const id = await create(alpha, { from_template: name });
    const inuse = await call(alpha, 'sandbox_template_delete', { name });
    assert.equal(inuse.isError, true);
    assert.equal(inuse.text, `Template '${name}' is used by 1 live sandbox (${id}); kill it with sandbox_kill, then delete the template again.`);
    assert.equal((await settled(alpha, name)).status, 'ready', 'a refused delete leaves it ready');
    assert.equal((await sh(alpha, id, 'cat /version')).stdout, 'v1\n');

    const other = await call(beta, 'sandbox_template_delete', { name });
    assert.equal(other.isError, true);
    assert.match(other.text, new RegExp(`^Template '${name}' does not exist`));
    const builtin = await call(alpha, 'sandbox_template_delete', { name: 'debian' });
    assert.match(builtin.text, /'debian' is a built-in template and cannot be deleted/);

    assert.equal((await call(alpha, 'sandbox_kill', { sandbox_id: id })).isError, false);
    const d = await call(alpha, 'sandbox_template_delete', { name });
    assert.equal(d.isError, false, d.text);
    assert.deepEqual(d.structured, { name, status: 'deleted', hosts: 1 });
    const l = await call(alpha, 'sandbox_template_list', { name_prefix: name });
    assert.deepEqual(l.structured.templates, []);
    const c = await call(alpha, 'sandbox_create', { from_template: name });
    assert.match(c.text, new RegExp(`Template '${name}' does not exist`));
    assert.equal(redis('EXISTS', `sf:team:{alpha}:tpl:${name}:log`), '0', 'its build log is gone');
    await until('its files to go from the host', async () => !existsSync(dir), 20000);

    // the name is free again: a new template under it, with what its own steps made
    await build('v2');
    const id2 = await create(alpha, { from_template: name });
    assert.equal((await sh(alpha, id2, 'cat /version')).stdout, 'v2\n');
    await call(alpha, 'sandbox_kill', { sandbox_id: id2 });
    assert.equal((await call(alpha, 'sandbox_template_delete', { name })).isError, false);
    const again = await call(alpha, 'sandbox_template_delete', { name });
    assert.match(again.text, /does not exist/);
  });

test('a build whose host went down is failed there, with why; the template is ready where it was built',
  { skip: driver !== 'jail' && 'jail hosts build templates' }, async () => {
    const redis = (...a) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...a]).toString().trim();
    const name = `lost-${uniq}`;
    const ghost = `ghost-tpl-${uniq}`;
    const key = `sf:team:{alpha}:tpl:${name}`;
    // a second jail host (full: not the lead while the live one has room) that heartbeats, is handed the build, and
    // falls silent before it builds anything
    redis('HSET', `sf:host:{${ghost}}`, 'id', ghost, 'driver', 'jail', 'ts', String(Date.now()),
      'capacity', '1', 'running', '1', 'mem_mib', '1024', 'vcpu_milli', '1000');
    redis('ZADD', 'sf:hosts', String(Date.now()), ghost);
    let r;
    try {
      r = await call(alpha, 'sandbox_template_create', { name, from: 'base', run_steps: ['true'] });
    } finally {
      redis('ZADD', 'sf:hosts', String(Date.now() - 3600e3), ghost); // silent for an hour
    }
    assert.equal(r.isError, false, r.text);
    assert.equal(r.structured.hosts, 2, 'handed to both hosts');
    await until('the reaper to fail the build of the host that went down',
      () => redis('HGET', key, `at:${ghost}`) === 'failed', 30000, 250);
    assert.equal(redis('HGET', key, `err:${ghost}`),
      `Host ${ghost} went down while it built this template; a failed template can be built again under its name.`);
    assert.equal(redis('EXISTS', `sf:host:{${ghost}}:tpls`), '0', 'the host\'s keys went');
    const t = await settled(alpha, name);
    assert.equal(t.status, 'ready', JSON.stringify(t));
    assert.deepEqual([t.hosts, t.hosts_ready], [2, 1]);
    const d = await call(alpha, 'sandbox_template_delete', { name });
    assert.equal(d.isError, false, d.text);
    assert.equal(redis('SISMEMBER', `sf:host:{${env.SF_HOST_ID}}:tpls`, `alpha ${name}`), '0',
      'a deleted template leaves its hosts\' lists');
  });
