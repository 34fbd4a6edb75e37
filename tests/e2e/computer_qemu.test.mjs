// sandbox_computer and the 'desktop' template on a qemu stack (e2e.qemu.computer_qemu): the
// desktop runs on jail hosts only (issue 23), so a qemu fleet answers both a desktop create
// and a sandbox_computer call with a sentence that says what to do. On the jail stack the
// suite skips itself (tests/desktop/ covers the desktop there).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, env, driver } from '../e2e/lib.mjs';

const qemu = driver === 'qemu';
let client, sb;

before(async () => {
  if (!qemu) return;
  client = await connect(env.SF_KEY_ALPHA, 'computer-qemu');
});

after(async () => {
  if (sb) await call(client, 'sandbox_kill', { sandbox_id: sb });
  await client?.close();
});

test('a desktop create on a qemu fleet names the jail and what to create instead', { skip: !qemu && 'jail stack' }, async () => {
  const r = await call(client, 'sandbox_create', { from_template: 'desktop' });
  assert.equal(r.isError, true);
  assert.match(r.text, /No live worker host here runs the 'desktop' template: it needs a host with the jail driver \(qemu hosts do not run it\); create from 'debian', or ask the operator for a jail host\./);
});

test('sandbox_computer on a qemu sandbox: the desktop needs a jail host', { skip: !qemu && 'jail stack' }, async () => {
  const c = await call(client, 'sandbox_create', { from_template: 'base' });
  assert.equal(c.isError, false, c.text);
  sb = c.structured.id;
  for (const action of ['screenshot', 'stream_url']) {
    const r = await call(client, 'sandbox_computer', { sandbox_id: sb, action });
    assert.equal(r.isError, true);
    assert.match(r.text, new RegExp(`Sandbox ${sb} runs on a qemu host, which has no desktop: sandbox_computer needs a sandbox made from the 'desktop' template, which runs on jail hosts only; ask the operator for one\\.`));
  }
});
