// Preview URLs, the worker half (issue 22): sandbox_preview_url through the MCP SDK client,
// the records the gateways read, and the worker's ingress spoken to directly with the hop
// protocol a gateway uses (docs/internals/ingress.md): the line MACed with the host key
// derived from the stack's auth secret as common/sf_jobauth.c's sf_host_job_key does. The
// attacks (a bad, stale or replayed MAC, another sandbox's epoch, an unpublished port, a
// port on the host's loopback, the agent's port) each must reach nothing.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import net from 'node:net';
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env, until, driver, createWhenBuilt } from './lib.mjs';

const client = await connect(env.SF_KEY_ALPHA);
const created = [];
after(async () => {
  for (const id of created) await call(client, 'sandbox_kill', { sandbox_id: id }).catch(() => {});
  await client.close();
});

const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();
const secret = Buffer.from(readFileSync(env.SF_AUTH_SECRET_FILE, 'utf8').slice(0, 64), 'hex');
const hostKey = crypto.createHmac('sha256', secret)
  .update(`sandfleet host job key v1\n${env.SF_HOST_ID}`).digest();
const hmac = (key, msg) => crypto.createHmac('sha256', key).update(msg).digest('hex');

function ingress() {
  const a = redis('hget', `sf:host:{${env.SF_HOST_ID}}`, 'ingress');
  assert.match(a, /^127\.0\.0\.1:\d+$/, 'the heartbeat names the ingress');
  const [host, port] = a.split(':');
  return { host, port: +port };
}

function hopLine(id, port, epoch, { iat = Date.now(), nonce = crypto.randomBytes(8).toString('hex'), key = hostKey } = {}) {
  const mac = hmac(key, `sandfleet-preview-hop-v1\n${id}\n${port}\n${epoch}\n${iat}\n${nonce}`);
  return `SFHOP1 ${id} ${port} ${epoch} ${iat} ${nonce} ${mac}\n`;
}

// One hop: the line, then `after` (a request), then half-close; everything the ingress sent
// back until it closed. { head: the answer line, body: the rest }.
function hop(line, after = 'GET / HTTP/1.0\r\nHost: preview\r\n\r\n', { half = true } = {}) {
  const { host, port } = ingress();
  return new Promise((resolve, reject) => {
    const s = net.connect(port, host);
    const chunks = [];
    s.on('data', (d) => chunks.push(d));
    s.on('error', reject);
    s.on('close', () => {
      const all = Buffer.concat(chunks).toString('latin1');
      const nl = all.indexOf('\n');
      resolve({ head: nl < 0 ? all : all.slice(0, nl), body: nl < 0 ? '' : all.slice(nl + 1) });
    });
    s.write(line + after);
    if (half) s.end();
  });
}

const epochOf = (id, port) => redis('hget', `sf:sb:{${id}}`, `pv:${port}`).split(' ')[1];

async function sandbox(args = {}) {
  const r = await call(client, 'sandbox_create', args);
  assert.equal(r.isError, false, r.text);
  created.push(r.structured.id);
  return r.structured.id;
}

// A busybox httpd on 127.0.0.1:port inside the sandbox serving text at /.
async function serve(id, port, text) {
  const r = await sh(client, id, `mkdir -p /tmp/w${port} && printf '%s\\n' '${text}' > /tmp/w${port}/index.html && ` +
    `chmod -R a+rX /tmp/w${port} && busybox httpd -p 127.0.0.1:${port} -h /tmp/w${port} && ` +
    `for i in $(seq 50); do busybox wget -Y off -qO- http://127.0.0.1:${port}/ 2>/dev/null && break; sleep 0.1; done`);
  assert.equal(r.stdout, `${text}\n`, `the server answers inside the sandbox: ${JSON.stringify(r)}`);
}

test('tools/list serves sandbox_preview_url with its annotations', async () => {
  const { tools } = await client.listTools();
  const t = tools.find((x) => x.name === 'sandbox_preview_url');
  assert.ok(t, 'listed');
  assert.deepEqual(t.inputSchema.required, ['sandbox_id', 'port']);
  assert.equal(t.annotations.readOnlyHint, false);
  assert.equal(t.annotations.destructiveHint, false);
  assert.equal(t.annotations.idempotentHint, true);
  assert.equal(t.annotations.openWorldHint, true);
  const upd = tools.find((x) => x.name === 'sandbox_update');
  assert.ok(upd.inputSchema.properties.preview_access && upd.inputSchema.properties.preview_close);
  assert.ok(tools.find((x) => x.name === 'sandbox_create').inputSchema.properties.preview_access);
});

test('a public port: URL, record, sandbox_info, and the page through the ingress', async (t) => {
  const id = await sandbox();
  await serve(id, 8000, 'hello-preview');
  const r = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8000 });
  assert.equal(r.isError, false, r.text);
  const label = id.replace('_', '-');
  assert.equal(r.structured.url, `${env.SF_PREVIEW_SCHEME}://8000-${label}.${env.SF_PREVIEW_DOMAIN}/`);
  assert.equal(r.structured.access, 'public');
  assert.equal(r.structured.sandbox_id, id);
  assert.equal(r.structured.port, 8000);
  assert.equal(r.structured.expires_at, undefined);
  assert.ok(r.text.includes(r.structured.url), 'the URL is in the text');
  assert.match(redis('hget', `sf:sb:{${id}}`, 'pv:8000'), /^public \d+$/);
  assert.equal(redis('hget', `sf:sb:{${id}}`, 'preview_access'), 'public');

  await t.test('idempotent: the same URL and the same publication', async () => {
    const e = epochOf(id, 8000);
    const again = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8000 });
    assert.equal(again.structured.url, r.structured.url);
    assert.equal(epochOf(id, 8000), e);
  });

  await t.test('sandbox_info lists the published ports', async () => {
    const info = await call(client, 'sandbox_info', { sandbox_id: id });
    assert.deepEqual(info.structured.preview_ports, [{ port: 8000, access: 'public', url: r.structured.url }]);
  });

  await t.test('a hop gets the page (half-close passed on: the request ends with our FIN)', async () => {
    const h = await hop(hopLine(id, 8000, epochOf(id, 8000)));
    assert.equal(h.head, 'SFHOP1 OK');
    assert.match(h.body, /^HTTP\/1\.[01] 200/);
    assert.match(h.body, /hello-preview/);
  });

  await t.test('a large download streams through', async () => {
    await sh(client, id, 'dd if=/dev/zero of=/tmp/w8000/big bs=1M count=24 2>/dev/null && chmod a+r /tmp/w8000/big');
    const h = await hop(hopLine(id, 8000, epochOf(id, 8000)), 'GET /big HTTP/1.0\r\nHost: p\r\n\r\n');
    assert.equal(h.head, 'SFHOP1 OK');
    const bodyStart = h.body.indexOf('\r\n\r\n') + 4;
    assert.equal(h.body.length - bodyStart, 24 << 20, 'every byte of 24 MiB');
  });

  await t.test("the team's bytes appear in the host's heartbeat", async () => {
    await until('ingress_bytes to count the download', () => {
      const b = JSON.parse(redis('hget', `sf:host:{${env.SF_HOST_ID}}`, 'ingress_bytes') || '{}');
      return b.alpha && b.alpha.out >= 24 << 20 && b.alpha.in > 0;
    });
  });
});

test('refusals: reserved ports, the range, link lifetimes, unknown sandboxes', async () => {
  const id = await sandbox();
  for (const port of [3128, 3129, 49983]) {
    const r = await call(client, 'sandbox_preview_url', { sandbox_id: id, port });
    assert.equal(r.isError, true, `${port} is refused`);
    assert.match(r.text, new RegExp(`Port ${port} is reserved`));
    assert.doesNotMatch(r.text, /\n/);
  }
  for (const port of [80, 1023, 65536]) {
    const r = await call(client, 'sandbox_preview_url', { sandbox_id: id, port });
    assert.equal(r.isError, true, `${port} is refused`);
    assert.match(r.text, /port/i);
  }
  for (const e of [0, 604801]) {
    const r = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8000, expires_in_seconds: e });
    assert.equal(r.isError, true, `expires_in_seconds ${e} is refused`);
    assert.match(r.text, /expires_in_seconds/);
  }
  const none = await call(client, 'sandbox_preview_url', { sandbox_id: 'sb_nosuchsandbox', port: 8000 });
  assert.equal(none.isError, true);
  const beta = await connect(env.SF_KEY_BETA);
  const other = await call(beta, 'sandbox_preview_url', { sandbox_id: id, port: 8000 });
  await beta.close();
  assert.equal(other.isError, true, "another team's sandbox is not found");
  assert.equal(redis('hget', `sf:sb:{${id}}`, 'pv:8000'), '', 'nothing was published');
});

test('attacks on the ingress reach nothing', async (t) => {
  const a = await sandbox();
  const b = await sandbox();
  await serve(a, 8000, 'page-a');
  await serve(a, 8001, 'unpublished-a');
  await serve(b, 8000, 'page-b');
  assert.equal((await call(client, 'sandbox_preview_url', { sandbox_id: a, port: 8000 })).isError, false);
  assert.equal((await call(client, 'sandbox_preview_url', { sandbox_id: b, port: 8000 })).isError, false);
  const ea = epochOf(a, 8000), eb = epochOf(b, 8000);
  assert.notEqual(ea, eb);

  await t.test('a MAC under another key', async () => {
    const h = await hop(hopLine(a, 8000, ea, { key: crypto.randomBytes(32) }));
    assert.equal(h.head, 'SFHOP1 ERR 403 The hop was refused.');
    assert.doesNotMatch(h.body, /page-a/);
  });
  await t.test('a tampered line (the port changed after signing)', async () => {
    const h = await hop(hopLine(a, 8000, ea).replace(` 8000 `, ` 8001 `));
    assert.equal(h.head, 'SFHOP1 ERR 403 The hop was refused.');
  });
  await t.test('a stale line (signed 60 s ago)', async () => {
    const h = await hop(hopLine(a, 8000, ea, { iat: Date.now() - 60000 }));
    assert.equal(h.head, 'SFHOP1 ERR 403 The hop was refused.');
  });
  await t.test('a replayed line', async () => {
    const line = hopLine(a, 8000, ea);
    assert.equal((await hop(line)).head, 'SFHOP1 OK');
    const again = await hop(line);
    assert.equal(again.head, 'SFHOP1 ERR 403 The hop was refused.');
    assert.doesNotMatch(again.body, /page-a/);
  });
  await t.test("another sandbox's epoch", async () => {
    const h = await hop(hopLine(a, 8000, eb));
    assert.match(h.head, /^SFHOP1 ERR 409 /);
    assert.doesNotMatch(h.body, /page-/);
  });
  await t.test('an unpublished port (something listens there)', async () => {
    const h = await hop(hopLine(a, 8001, ea));
    assert.match(h.head, /^SFHOP1 ERR 409 Port 8001 of sandbox /);
    assert.doesNotMatch(h.body, /unpublished-a/);
  });
  await t.test("the egress proxy's and the agent's ports", async () => {
    for (const p of [3128, 3129, 49983])
      assert.match((await hop(hopLine(a, p, ea))).head, /^SFHOP1 ERR 409 /, `port ${p}`);
  });
  await t.test("a port on the host's loopback is not the sandbox's", async () => {
    let reached = 0;
    const srv = net.createServer((s) => { reached++; s.end('HOST-SECRET\n'); });
    await new Promise((r) => srv.listen(0, '127.0.0.1', r));
    const hp = srv.address().port;
    try {
      const pub = await call(client, 'sandbox_preview_url', { sandbox_id: a, port: hp });
      assert.equal(pub.isError, false, pub.text);
      const h = await hop(hopLine(a, hp, epochOf(a, hp)));
      assert.equal(h.head, `SFHOP1 ERR 502 Nothing in sandbox ${a} listens on port ${hp} yet; start the server with sandbox_exec.`);
      assert.doesNotMatch(h.body, /HOST-SECRET/);
      assert.equal(reached, 0, "the host's server saw no connection");
    } finally {
      srv.close();
    }
  });
  await t.test('not the protocol: a bare HTTP request', async () => {
    const h = await hop('GET / HTTP/1.1\r\nHost: x\r\n\r\n', '');
    assert.equal(h.head, 'SFHOP1 ERR 403 The hop was refused.');
  });
  await t.test('an overlong line', async () => {
    const h = await hop('SFHOP1 ' + 'a'.repeat(600), '', { half: false });
    assert.equal(h.head, 'SFHOP1 ERR 403 The hop was refused.');
  });
});

test('private ports, preview_close, a paused sandbox woken, a killed one', async (t) => {
  const id = await sandbox({ preview_access: 'private' });
  assert.equal(redis('hget', `sf:sb:{${id}}`, 'preview_access'), 'private');
  await serve(id, 8000, 'private-page');
  await serve(id, 8002, 'public-later');

  await t.test('a private link: signed token, expires_at, a new link per call', async () => {
    const before = Math.floor(Date.now() / 1000);
    const r = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8000, expires_in_seconds: 120 });
    assert.equal(r.isError, false, r.text);
    assert.equal(r.structured.access, 'private');
    const u = new URL(r.structured.url);
    const token = u.searchParams.get('sf_token');
    const [v, tid, port, epoch, exp, nonce, mac] = token.split('.');
    assert.deepEqual([v, tid, port, epoch], ['v1', id, '8000', epochOf(id, 8000)]);
    assert.ok(+exp >= before + 120 && +exp <= before + 122, `exp ${exp}`);
    assert.equal(mac, hmac(hostKey, `sandfleet-preview-link-v1\n${id}\n8000\n${epoch}\n${exp}\n${nonce}`));
    assert.equal(new Date(r.structured.expires_at).getTime() / 1000, +exp);
    assert.match(redis('hget', `sf:sb:{${id}}`, 'pv:8000'), /^private \d+$/);
    const again = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8000 });
    assert.notEqual(again.structured.url, r.structured.url, 'a new link');
    assert.equal(new URL(again.structured.url).searchParams.get('sf_token').split('.')[3], epoch, 'the same publication');
  });

  await t.test('preview_access public: ports published later only', async () => {
    const u = await call(client, 'sandbox_update', { sandbox_id: id, preview_access: 'public' });
    assert.equal(u.isError, false, u.text);
    assert.equal(redis('hget', `sf:sb:{${id}}`, 'preview_access'), 'public');
    const r = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8002 });
    assert.equal(r.structured.access, 'public');
    const kept = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8000 });
    assert.equal(kept.structured.access, 'private', 'a published port keeps its mode');
    const info = await call(client, 'sandbox_info', { sandbox_id: id });
    assert.deepEqual(info.structured.preview_ports.map((p) => [p.port, p.access]), [[8000, 'private'], [8002, 'public']]);
  });

  await t.test('a paused sandbox is woken by a hop', async () => {
    const p = await call(client, 'sandbox_pause', { sandbox_id: id });
    assert.equal(p.isError, false, p.text);
    assert.equal(redis('hget', `sf:sb:{${id}}`, 'state'), 'paused');
    const h = await hop(hopLine(id, 8002, epochOf(id, 8002)));
    assert.equal(h.head, 'SFHOP1 OK');
    assert.match(h.body, /public-later/);
    assert.equal(redis('hget', `sf:sb:{${id}}`, 'state'), 'running');
  });

  await t.test('preview_close stops access at once, open connections too', async () => {
    const e = epochOf(id, 8002);
    // an open connection, its request not sent yet
    const { host, port } = ingress();
    const s = net.connect(port, host);
    let got = '';
    const closed = new Promise((r) => s.on('close', r));
    s.on('data', (d) => { got += d; });
    s.write(hopLine(id, 8002, e));
    await until('the hop to be admitted', () => got.startsWith('SFHOP1 OK'));
    const u = await call(client, 'sandbox_update', { sandbox_id: id, preview_close: [8002] });
    assert.equal(u.isError, false, u.text);
    await closed;
    assert.equal(redis('hexists', `sf:sb:{${id}}`, 'pv:8002'), '0');
    const h = await hop(hopLine(id, 8002, e));
    assert.match(h.head, /^SFHOP1 ERR 409 /);
    const info = await call(client, 'sandbox_info', { sandbox_id: id });
    assert.deepEqual(info.structured.preview_ports.map((p) => p.port), [8000]);
    const again = await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8002 });
    assert.notEqual(epochOf(id, 8002), e, 'published again: a new epoch');
  });

  await t.test('nothing listens yet: 502 with what to do', async () => {
    await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 9000 });
    const h = await hop(hopLine(id, 9000, epochOf(id, 9000)));
    assert.equal(h.head, `SFHOP1 ERR 502 Nothing in sandbox ${id} listens on port 9000 yet; start the server with sandbox_exec.`);
  });

  await t.test('a killed sandbox: 404', async () => {
    const e = epochOf(id, 8000);
    assert.equal((await call(client, 'sandbox_kill', { sandbox_id: id })).isError, false);
    const h = await hop(hopLine(id, 8000, e));
    assert.match(h.head, /^SFHOP1 ERR 404 Sandbox .* is not running on this host/);
  });
});

test("a jail's socket marked as the ingress's reaches no relay (the namespace's one exception)",
  { skip: driver !== 'jail' && 'a VM guest has no socket in the namespace at all' }, async () => {
  // A jail keeps CAP_NET_RAW, so it may set SO_MARK: the exception lets a marked connect
  // to port 49983 skip the egress redirect, and it must still reach nothing.
  const r = await createWhenBuilt(client, { from_template: 'debian' });
  assert.equal(r.isError, false, r.text);
  created.push(r.structured.id);
  const py = [
    'import socket',
    'for addr in ("169.254.78.2", "169.254.77.2", "127.0.0.1", "10.9.9.9"):',
    '  s = socket.socket(); s.settimeout(2)',
    '  s.setsockopt(socket.SOL_SOCKET, 36, 0x53465056)',
    '  try:',
    '    s.connect((addr, 49983)); s.sendall(b"8000\\n"); print(addr, "answered", s.recv(100))',
    '  except OSError as e: print(addr, "nothing", e.errno)',
  ].join('\n');
  const out = await sh(client, r.structured.id, `python3 - <<'PY'\n${py}\nPY`);
  assert.equal(out.exit_code, 0, out.stderr);
  // nothing listens, or the egress proxy took it (and closed it: not allowed); no relay
  const lines = out.stdout.trim().split('\n');
  assert.equal(lines.length, 4, out.stdout);
  for (const l of lines) assert.match(l, / nothing | answered b''$/, out.stdout);
});

// Last: this one restarts the worker with a 2 s idle pause (its sandboxes are kept, and
// killed at the end as the others), then gives the stack its usual worker back.
test('an open preview connection is activity: no idle pause under it', async (t) => {
  const stack = (extra) => execFileSync(`${import.meta.dirname}/../integration/stack`,
    ['restart-worker', env.SF_STATE, env.SF_BUILD], { stdio: 'inherit', env: { ...process.env, ...extra } });
  stack({ SF_IDLE_PAUSE_MS: '2000', SF_TIMER_TICK_MS: '100' });
  t.after(() => stack({}));
  const id = await sandbox();
  // a server that holds its one connection open and says nothing
  await sh(client, id, "setsid sh -c 'sleep 1000 | busybox nc -l -p 8005 >/dev/null 2>&1' & " +
    'for i in $(seq 50); do netstat -ltn 2>/dev/null | grep -q ":8005 " && break; sleep 0.1; done');
  assert.equal((await call(client, 'sandbox_preview_url', { sandbox_id: id, port: 8005 })).isError, false);
  const { host, port } = ingress();
  const s = net.connect(port, host);
  let got = '';
  s.on('data', (d) => { got += d; });
  s.write(hopLine(id, 8005, epochOf(id, 8005)));
  await until('the hop to be answered', () => got.includes('\n'));
  assert.equal(got, 'SFHOP1 OK\n');
  const state = () => redis('hget', `sf:sb:{${id}}`, 'state');
  const t0 = Number(redis('TIME').split('\n')[0]);
  await until('four seconds (twice the idle pause) to pass',
    () => Number(redis('TIME').split('\n')[0]) >= t0 + 4, 8000);
  assert.equal(state(), 'running', 'not paused while a preview connection is open');
  s.destroy();
  await until('the idle pause once the connection closed', () => state() === 'paused', 15000);
});
