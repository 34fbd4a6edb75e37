// fresh.first_run: a fresh machine, as a user's `ops/run` meets it. The stack starts with an
// empty state folder and an empty templates folder (tests/fresh/first_run); nothing but
// the product builds the default template. Through the official MCP SDK client, a
// sandbox_create without from_template waits for the worker's own build (the scheduler's
// template_wait_s; progress beats keep the call alive) and the sandbox answers
// `python --version`, pip, node, gcc and ps.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env } from '../e2e/lib.mjs';

const alpha = await connect(env.SF_KEY_ALPHA);
const made = [];
after(async () => {
  for (const id of made) await call(alpha, 'sandbox_kill', { sandbox_id: id });
  await alpha.close();
});

test('the default template is debian, described, and base says what it is', async () => {
  const l = await call(alpha, 'sandbox_template_list', {});
  assert.equal(l.isError, false, l.text);
  const deb = l.structured.templates.find((t) => t.name === 'debian');
  const base = l.structured.templates.find((t) => t.name === 'base');
  assert.equal(deb.default, true);
  assert.equal(base.default, false);
  assert.match(base.description, /busybox/);
  assert.match(base.description, /wget -T/);
  assert.match(deb.description, /python/);
});

test('the default sandbox of a fresh machine answers python --version', async () => {
  let beats = 0;
  // the first create waits for the worker's build (minutes, once): progress beats reset
  // the client's timeout; 15 minutes in all at most
  const c = await call(alpha, 'sandbox_create', {},
    { timeout: 900000, onprogress: () => { beats++; } });
  assert.equal(c.isError, false, c.text);
  const id = c.structured.id;
  made.push(id);
  const py = await sh(alpha, id, 'python --version');
  assert.equal(py.exit_code, 0, py.stderr);
  assert.match(py.stdout + py.stderr, /^Python 3\.\d+/);
  for (const [cmd, re] of [['pip --version', /^pip \d+/], ['node --version', /^v\d+\./],
    ['gcc --version', /^gcc/], ['ps -e -o comm=', /\S/], ['npm --version', /^\d+\./],
    ['git --version', /^git version/], ['curl --version', /^curl/], ['make --version', /^GNU Make/]]) {
    const r = await sh(alpha, id, cmd);
    assert.equal(r.exit_code, 0, `${cmd}: ${r.stderr}`);
    assert.match(r.stdout, re, cmd);
  }
  // pip works as root (no PEP 668 refusal): --dry-run of an installed package, no network
  const pip = await sh(alpha, id, 'cat /etc/pip.conf; ls /usr/lib/python3*/EXTERNALLY-MANAGED 2>&1');
  assert.match(pip.stdout, /break-system-packages = true/);
  assert.match(pip.stdout, /No such file/);
  // a later create finds the template at once (no wait)
  const t0 = Date.now();
  const c2 = await call(alpha, 'sandbox_create', {});
  assert.equal(c2.isError, false, c2.text);
  made.push(c2.structured.id);
  assert.ok(Date.now() - t0 < 30000, 'the second create does not wait for a build');
  const py2 = await sh(alpha, c2.structured.id, 'python3 -c "print(1)"');
  assert.equal(py2.stdout.trim(), '1');
});
