// The spine: an MCP client creates a sandbox, runs commands through gateway -> Kafka ->
// scheduler -> worker -> sandbox and back, and kills it.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env } from './lib.mjs';

const client = await connect(env.SF_KEY_ALPHA);
after(() => client.close());

test('tools/list serves the schemas with annotations', async () => {
  const { tools } = await client.listTools();
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  for (const n of ['sandbox_create', 'sandbox_exec', 'sandbox_kill', 'sandbox_info', 'sandbox_list'])
    assert.ok(byName[n], `tool ${n} is listed`);
  assert.equal(byName.sandbox_kill.annotations.destructiveHint, true);
  assert.equal(byName.sandbox_list.annotations.readOnlyHint, true);
  assert.equal(byName.sandbox_info.annotations.readOnlyHint, true);
  assert.deepEqual(byName.sandbox_exec.inputSchema.required, ['sandbox_id', 'command']);
  assert.equal(byName.sandbox_exec.inputSchema.type, 'object');
  // x-sandfleet (where a tool runs) stays inside the platform; its output schema is served
  assert.equal(byName.sandbox_exec.inputSchema['x-sandfleet'], undefined);
  // exit_code is absent while a detached command is still_running (its pid instead)
  assert.deepEqual(byName.sandbox_exec.outputSchema.required, ['stdout', 'stderr']);
  for (const f of ['exit_code', 'still_running', 'pid'])
    assert.ok(byName.sandbox_exec.outputSchema.properties[f], `sandbox_exec's output has ${f}`);
  for (const t of tools) assert.equal(t.outputSchema.type, 'object', t.name);
  assert.equal(byName['sf.cancel'], undefined, 'the internal cancel message is not a tool');
});

test('create, exec, truncate, timeout, kill', async (t) => {
  const created = await call(client, 'sandbox_create', { name: 'spine', metadata: { suite: 'spine' } });
  assert.equal(created.isError, false, created.text);
  const id = created.structured.id;
  assert.match(id, /^sb_[a-z0-9]+$/);
  assert.equal(created.structured.status, 'active');
  assert.equal(created.structured.name, 'spine');

  await t.test('stdout, stderr and the exit code come back', async () => {
    const r = await sh(client, id, 'echo hello; echo oops >&2; exit 3');
    assert.equal(r.stdout, 'hello\n');
    assert.equal(r.stderr, 'oops\n');
    assert.equal(r.exit_code, 3);
    assert.equal(r.truncated, false);
  });

  await t.test('cwd and env reach the command', async () => {
    const r = await sh(client, id, 'pwd; echo "$GREETING"', { cwd: '/tmp', env: { GREETING: 'hi there' } });
    assert.equal(r.stdout, '/tmp\nhi there\n');
  });

  await t.test('1 MiB of output is truncated with the original length reported', async () => {
    const r = await sh(client, id, 'head -c 1048576 /dev/zero | tr "\\0" a');
    assert.equal(r.truncated, true);
    assert.equal(r.stdout_bytes, 1048576);
    assert.ok(r.stdout.startsWith('a'.repeat(16384)), 'head kept');
    assert.ok(r.stdout.endsWith('a'.repeat(16384)), 'tail kept');
    assert.match(r.stdout, /\[\.\.\. 1015808 bytes omitted \.\.\.\]/);
    assert.ok(r.stdout.length < 33 * 1024, `stdout capped (${r.stdout.length} chars)`);
  });

  await t.test('a timeout kills the command and says so', async () => {
    // answered at the timeout, long before the sleep would end (the client gives up first)
    const r = await call(client, 'sandbox_exec', { sandbox_id: id, command: 'sleep 600', timeout_ms: 500 },
      { timeout: 90000 });
    assert.equal(r.isError, true);
    assert.match(r.text, /timed out/);
    assert.equal(r.structured.timed_out, true);
    const ps = await sh(client, id, 'ps -o pid,args');
    assert.doesNotMatch(ps.stdout, /sleep 600/, 'the sleep is gone');
  });

  await t.test('info and list show the sandbox', async () => {
    const info = await call(client, 'sandbox_info', { sandbox_id: id });
    assert.equal(info.isError, false, info.text);
    assert.equal(info.structured.id, id);
    assert.equal(info.structured.status, 'active');
    assert.deepEqual(info.structured.metadata, { suite: 'spine' });
    const list = await call(client, 'sandbox_list', { metadata: { suite: 'spine' } });
    assert.ok(list.structured.sandboxes.some((s) => s.id === id));
    const none = await call(client, 'sandbox_list', { metadata: { suite: 'nope' } });
    assert.equal(none.structured.sandboxes.length, 0);
  });

  const killed = await call(client, 'sandbox_kill', { sandbox_id: id });
  assert.equal(killed.isError, false, killed.text);
  assert.equal(killed.structured.status, 'killed');

  const later = await call(client, 'sandbox_exec', { sandbox_id: id, command: 'true' });
  assert.equal(later.isError, true);
  assert.match(later.text, /was killed; create a new one with sandbox_create/);
  const list = await call(client, 'sandbox_list', {});
  assert.ok(!list.structured.sandboxes.some((s) => s.id === id), 'a killed sandbox is not listed');
});

test('concurrent calls on two sandboxes all get their own answer', async () => {
  const a = (await call(client, 'sandbox_create', {})).structured.id;
  const b = (await call(client, 'sandbox_create', {})).structured.id;
  const runs = [];
  for (let i = 0; i < 10; i++)
    runs.push(sh(client, i % 2 ? a : b, `echo ${i}`).then((r) => assert.equal(r.stdout, `${i}\n`)));
  await Promise.all(runs);
  await call(client, 'sandbox_kill', { sandbox_id: a });
  await call(client, 'sandbox_kill', { sandbox_id: b });
});
