// Egress through MCP: every sandbox reaches the world only through the host's
// secret-proxy. The stack's test internet (tests/integration/stack, e2e profile) is a
// network namespace with HTTP servers for api.example.test (.10), other.test (.20) and
// tls.example.test (.30), and UDP listeners on .53 (ports 53 and 9999) that must never
// hear a sandbox; nothing leaves this machine. The upstream logs every request it gets
// (SF_UPSTREAM_LOG), so each check says what really arrived.
import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { randomBytes } from 'node:crypto';
import { connect, call, sh, env, driver, until, cli } from './lib.mjs';

const jailOnly = { skip: driver === 'qemu' ? 'jail stack only (the qemu stack runs the VM case)' : false };
const NET = env.SF_UPSTREAM_NET;
const tag = randomBytes(4).toString('hex');
const S_API = `EG_API_${tag}`;   // alpha: any header, for api.example.test
const S_BETA = `EG_BETA_${tag}`; // beta's own
const VAL_API = `real-api-value-${randomBytes(12).toString('hex')}`;
const VAL_BETA = `real-beta-value-${randomBytes(12).toString('hex')}`;

const alpha = await connect(env.SF_KEY_ALPHA);
const beta = await connect(env.SF_KEY_BETA);
const made = [];


function stack(cmd) {
  const r = spawnSync(new URL('../integration/stack', import.meta.url).pathname, [cmd, env.SF_STATE, env.SF_BUILD],
    { encoding: 'utf8' });
  assert.equal(r.status, 0, `stack ${cmd}: ${r.stdout}${r.stderr}`);
}

// What the upstream received for a request path (exact), as parsed log lines.
function upstream(uri) {
  return readFileSync(env.SF_UPSTREAM_LOG, 'utf8').trim().split('\n').filter(Boolean)
    .map((l) => JSON.parse(l)).filter((e) => e.uri === uri);
}
const udpHeard = (port) => readFileSync(env.SF_UPSTREAM_LOG, 'utf8').includes(`"port": ${port}}`);


async function create(client, args) {
  const r = await call(client, 'sandbox_create', { name: `egress-${tag}`, ...args });
  assert.equal(r.isError, false, r.text);
  made.push([client, r.structured.id]);
  return r.structured.id;
}

// wget in the sandbox: through the explicit proxy (HTTP_PROXY), or transparently (-Y off).
const wget = (url, { headers = [], direct = false } = {}) =>
  `timeout 10 wget -q -O - ${direct ? '-Y off ' : ''}${headers.map((h) => `--header "${h}" `).join('')}${url} 2>&1; echo " rc=$?"`;

before(() => {
  // any header, plain HTTP too: these cases send X-Api-Key / X-K to the upstream's port 80
  cli(['secrets', 'create', '--team', 'alpha', '--name', S_API, '--allowed-host', 'api.example.test',
    '--any-header', '--allow-http'], VAL_API);
  cli(['secrets', 'create', '--team', 'beta', '--name', S_BETA, '--allowed-host', 'api.example.test',
    '--any-header', '--allow-http'], VAL_BETA);
});

// each test's sandboxes go when it ends (the team's quota is 8)
afterEach(async () => {
  for (const [client, id] of made.splice(0)) await call(client, 'sandbox_kill', { sandbox_id: id });
});

after(async () => {
  await alpha.close();
  await beta.close();
});

test('an allowed and a denied request from the sandbox (jail and VM)', async () => {
  const id = await create(alpha, { allow_out: ['api.example.test'] });
  const ok = await sh(alpha, id, wget(`http://api.example.test/eg-vm-x-${tag}`));
  assert.match(ok.stdout, /^ok\s+rc=0/, 'through HTTP_PROXY');
  const t = await sh(alpha, id, wget(`http://api.example.test/eg-vm-t-${tag}`, { direct: true }));
  assert.match(t.stdout, /^ok\s+rc=0/, 'transparently');
  assert.equal(upstream(`/eg-vm-x-${tag}`).length, 1);
  assert.equal(upstream(`/eg-vm-t-${tag}`).length, 1);
  const no = await sh(alpha, id, wget(`http://other.test/eg-vm-no-${tag}`));
  assert.match(no.stdout, /403 Forbidden/, 'the proxy refuses a host that is not allowed');
  const dns = await sh(alpha, id, `nslookup other.test; nslookup api.example.test`);
  assert.match(dns.stdout, /can't find other.test|NXDOMAIN/);
  assert.match(dns.stdout, new RegExp(`Address:? *${NET.replaceAll('.', '\\.')}\\.10`));
  assert.equal(upstream(`/eg-vm-no-${tag}`).length, 0, 'nothing reached other.test');
  const ca = await sh(alpha, id, 'cat /etc/ssl/certs/sandfleet-ca-bundle.pem; echo; echo "$SSL_CERT_FILE"');
  const egressCa = readFileSync(env.SF_EGRESS_CA, 'utf8').trim();
  assert.ok(ca.stdout.includes(egressCa), 'the egress CA is in the trust bundle');
  assert.match(ca.stdout, /\/etc\/ssl\/certs\/sandfleet-ca-bundle\.pem\n$/);
  const store = await sh(alpha, id, 'cat /etc/ssl/certs/ca-certificates.crt');
  assert.ok(store.stdout.includes(egressCa), 'and in the trust store');
});

test('an allowed host receives the real secret; the sandbox holds only the placeholder', jailOnly, async () => {
  const id = await create(alpha, { allow_out: ['api.example.test'], secrets: { API_KEY: S_API } });
  const x = await sh(alpha, id, wget(`http://api.example.test/eg-swap-x-${tag}`, { headers: ['X-Api-Key: $API_KEY'] }));
  assert.match(x.stdout, /^ok\s+rc=0/);
  const t = await sh(alpha, id, wget(`http://api.example.test/eg-swap-t-${tag}`, { headers: ['Authorization: Bearer $API_KEY'], direct: true }));
  assert.match(t.stdout, /^ok\s+rc=0/);
  assert.equal(upstream(`/eg-swap-x-${tag}`)[0]?.headers['X-Api-Key'], VAL_API, 'explicit proxy: swapped');
  assert.equal(upstream(`/eg-swap-t-${tag}`)[0]?.headers.Authorization, `Bearer ${VAL_API}`, 'transparent: swapped');

  const e = await sh(alpha, id, `cat /proc/self/environ | tr '\\0' '\\n' | grep '^API_KEY='; env | grep -c '${VAL_API}'`);
  const ph = e.stdout.match(/^API_KEY=(sfph_[A-Za-z0-9]{32})$/m)?.[1];
  assert.ok(ph, `a placeholder in the environment: ${e.stdout}`);
  assert.match(e.stdout, /\n0\n$/, 'the value is nowhere in the environment');
  // every file of its root filesystem (regular files, symlinks not followed)
  const files = await sh(alpha, id, `find / -xdev -type f -exec grep -l -e '${VAL_API}' -e '${ph}' {} +; echo end`);
  assert.equal(files.stdout, 'end\n', 'no file holds the value (nor the placeholder: only the environment does)');
  // A dump of a process's whole memory (what a core would hold): it holds the placeholder
  // (its environment), never the value.
  const dump = await sh(alpha, id, [
    'sleep 300 & p=$!; usleep 200000; : >/tmp/core',
    'while read -r range perms rest; do case $perms in r*) ;; *) continue ;; esac',
    '  s=$((0x${range%-*})); e=$((0x${range#*-}))',
    '  dd if=/proc/$p/mem bs=4096 skip=$((s / 4096)) count=$(((e - s) / 4096)) >>/tmp/core 2>/dev/null',
    'done </proc/$p/maps; kill $p',
    `echo "bytes=$(wc -c </tmp/core) ph=$(grep -c '${ph}' /tmp/core) value=$(grep -c '${VAL_API}' /tmp/core)"`,
  ].join('\n'));
  const m = dump.stdout.match(/bytes=(\d+) ph=(\d+) value=(\d+)/);
  assert.ok(m && Number(m[1]) > 100000, `the dump read the process: ${dump.stdout}${dump.stderr}`);
  assert.ok(Number(m[2]) > 0, 'the dump holds the placeholder');
  assert.equal(m[3], '0', 'the dump never holds the value');

  const info = await call(alpha, 'sandbox_info', { sandbox_id: id });
  assert.deepEqual(info.structured.secrets, { API_KEY: S_API });
  assert.deepEqual(info.structured.network, { egress_default: 'deny', allow_out: ['api.example.test'], deny_out: [] });
  assert.ok(!info.text.includes(VAL_API) && !info.text.includes(ph), 'sandbox_info shows no value or placeholder');
});

test('the placeholder to another host arrives unchanged; spoofed Host and IP literals are never swapped', jailOnly, async () => {
  const id = await create(alpha, { allow_out: ['api.example.test', 'other.test'], secrets: { API_KEY: S_API } });
  const ph = (await sh(alpha, id, 'echo $API_KEY')).stdout.trim();
  for (const direct of [false, true]) {
    const uri = `/eg-ns-${direct ? 't' : 'x'}-${tag}`;
    const r = await sh(alpha, id, wget(`http://other.test${uri}`, { headers: ['X-Api-Key: $API_KEY'], direct }));
    assert.match(r.stdout, /^ok\s+rc=0/);
    assert.equal(upstream(uri)[0]?.headers['X-Api-Key'], ph, `${uri}: the placeholder, unchanged`);
  }
  const spoof = await sh(alpha, id, wget(`http://other.test/eg-spoof-${tag}`,
    { headers: ['Host: api.example.test', 'X-Api-Key: $API_KEY'], direct: true }));
  assert.match(spoof.stdout, /403|rc=1/, 'a Host that is not the dialled address is refused');
  assert.equal(upstream(`/eg-spoof-${tag}`).length, 0);
  const ip = await sh(alpha, id, wget(`http://${NET}.10/eg-ip-${tag}`, { headers: ['X-Api-Key: $API_KEY'], direct: true }));
  assert.match(ip.stdout, /rc=1/, 'an IP literal is not an allowed name');
  assert.equal(upstream(`/eg-ip-${tag}`).length, 0);
  for (const e of readFileSync(env.SF_UPSTREAM_LOG, 'utf8').split('\n').filter((l) => l.includes('other.test'))) {
    assert.ok(!e.includes(VAL_API), `never the value at other.test: ${e}`);
  }
});

test('default deny: nothing but the proxy is reachable from a jail', jailOnly, async () => {
  const id = await create(alpha, {});
  const r = await sh(alpha, id, [
    wget(`http://api.example.test/eg-dd-name-${tag}`, { direct: true }),
    `printf 'GET /eg-dd-ip-${tag} HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${NET}.10 80; echo " tcp=$?"`,
    `timeout 3 tftp -g -r eg -l /tmp/t ${NET}.53 9999; echo " udp=$?"`,
    `nslookup api.example.test ${NET}.53; echo " dns=$?"`,
    `nc -w 2 2001:db8::10 80 </dev/null; echo " ipv6=$?"; cat /proc/net/if_inet6 | wc -l`,
  ].join('\n'), { timeout_ms: 60000 });
  assert.match(r.stdout, /rc=1/, 'a name that is not allowed does not resolve');
  assert.doesNotMatch(r.stdout, /HTTP\/1\.[01] 200/, 'direct TCP to an address got no answer from it');
  assert.equal(upstream(`/eg-dd-ip-${tag}`).length, 0, 'the upstream never saw the direct request');
  assert.match(r.stdout, /can't find api.example.test|NXDOMAIN/, 'DNS to an outside resolver is answered by the proxy');
  assert.equal(udpHeard(53), false, 'the outside resolver heard nothing');
  assert.equal(udpHeard(9999), false, 'the UDP service heard nothing');
  assert.match(r.stdout, /ipv6=1\n0\n/, 'no IPv6 at all');

  // The host's own services: Redis, the Kafka broker, the gateway, on every address.
  const ports = [new URL(env.SF_REDIS_URL).port, new URL(env.SF_URL).port,
    ...env.SF_KAFKA_BROKERS.split(',').map((b) => b.split(':')[1])];
  const ips = ['127.0.0.1', ...Object.values(networkInterfaces()).flat()
    .filter((a) => a.family === 'IPv4' && !a.internal).map((a) => a.address)];
  const probes = [];
  for (const ip of ips) for (const port of ports)
    probes.push(`printf 'PING\\r\\nGET /healthz HTTP/1.0\\r\\n\\r\\n' | nc -w 2 ${ip} ${port} 2>&1 | head -c 200; echo " <${ip}:${port}>"`);
  const h = await sh(alpha, id, probes.join('\n'), { timeout_ms: 120000 });
  assert.doesNotMatch(h.stdout, /PONG|200 OK|"status"/, `no platform service answered: ${h.stdout}`);
});

test('platform addresses: an allow_out entry inside one is refused by name; 0.0.0.0/0 still reaches none of them', jailOnly, async () => {
  // issue 19 item 4, through MCP: the proxy's refusal reaches the caller as a sentence
  for (const entry of ['169.254.169.254', '169.254.0.0/16', '127.0.0.1', '192.0.0.8']) {
    const r = await call(alpha, 'sandbox_create', { name: `egress-${tag}`, allow_out: [entry] });
    assert.equal(r.isError, true, `${entry} accepted: ${r.text}`);
    assert.ok(r.text.includes(entry), `the sentence names ${entry}: ${r.text}`);
  }
  const id = await create(alpha, { allow_out: ['0.0.0.0/0'] });
  const u = await call(alpha, 'sandbox_update', { sandbox_id: id, allow_out: ['0.0.0.0/0', '169.254.169.254/32'] });
  assert.equal(u.isError, true, u.text);
  assert.match(u.text, /169\.254\.169\.254/);
  // covered, not named: every platform address stays blocked, the test internet is reachable
  const ports = [new URL(env.SF_REDIS_URL).port, new URL(env.SF_URL).port,
    ...env.SF_KAFKA_BROKERS.split(',').map((b) => b.split(':')[1])];
  const ips = ['169.254.169.254', '169.254.77.1', '192.0.0.1', '100.100.100.200',
    ...Object.values(networkInterfaces()).flat()
      .filter((a) => a.family === 'IPv4' && !a.internal).map((a) => a.address)];
  const probes = [wget(`http://${NET}.10/eg-plat-ok-${tag}`, { direct: true })];
  for (const ip of ips) for (const port of [80, ...ports])
    probes.push(`printf 'PING\\r\\nGET /healthz HTTP/1.0\\r\\n\\r\\n' | nc -w 2 ${ip} ${port} 2>&1 | head -c 200; echo " <${ip}:${port}>"`);
  const h = await sh(alpha, id, probes.join('\n'), { timeout_ms: 120000 });
  assert.equal(h.stdout.split('rc=')[1]?.[0], '0', `the covered test internet is reachable: ${h.stdout}`);
  assert.equal(upstream(`/eg-plat-ok-${tag}`).length, 1);
  assert.doesNotMatch(h.stdout, /PONG|200 OK|"status"/, `no platform address answered: ${h.stdout}`);
  const log = await call(alpha, 'sandbox_network_log', { sandbox_id: id, verdict: 'blocked', limit: 200 });
  assert.equal(log.isError, false, log.text);
  assert.ok(JSON.stringify(log.structured).includes('169.254.169.254'), 'the metadata attempt is logged blocked');
});

test('deny_out 0.0.0.0/0 with allow_out api.example.test lets exactly that host through', jailOnly, async () => {
  const id = await create(alpha, { deny_out: ['0.0.0.0/0'], allow_out: ['api.example.test'] });
  const r = await sh(alpha, id, [
    wget(`http://api.example.test/eg-strict-x-${tag}`),
    wget(`http://api.example.test/eg-strict-t-${tag}`, { direct: true }),
    wget(`http://other.test/eg-strict-o-${tag}`),
    wget(`http://tls.example.test/eg-strict-s-${tag}`, { direct: true }),
    wget(`http://${NET}.10/eg-strict-ip-${tag}`, { direct: true }),
  ].join('\n'));
  const lines = r.stdout.split('rc=').slice(1).map((s) => s[0]);
  assert.deepEqual(lines, ['0', '0', '1', '1', '1'], r.stdout);
  assert.equal(upstream(`/eg-strict-x-${tag}`).length, 1);
  assert.equal(upstream(`/eg-strict-t-${tag}`).length, 1);
  for (const p of ['o', 's', 'ip']) assert.equal(upstream(`/eg-strict-${p}-${tag}`).length, 0);
});

test('a team cannot bind another team\'s secret: the same error as one that does not exist', jailOnly, async () => {
  const theirs = await call(beta, 'sandbox_create', { secrets: { K: S_API } });
  const none = await call(beta, 'sandbox_create', { secrets: { K: `NOPE_${tag}` } });
  assert.equal(theirs.isError, true);
  assert.equal(none.isError, true);
  assert.equal(theirs.text, `No secret named ${S_API} for this team; see secret_list.`);
  assert.equal(none.text.replace(`NOPE_${tag}`, S_API), theirs.text, 'indistinguishable');
  const own = await create(beta, { secrets: { K: S_BETA }, allow_out: ['api.example.test'] });
  const r = await sh(beta, own, wget(`http://api.example.test/eg-beta-${tag}`, { headers: ['X-K: $K'] }));
  assert.match(r.stdout, /^ok\s+rc=0/);
  assert.equal(upstream(`/eg-beta-${tag}`)[0]?.headers['X-K'], VAL_BETA, 'its own secret works');
});

test('the proxy down: creates refused with a clear error; back: sandboxes registered again, placeholders kept', jailOnly, async () => {
  const id = await create(alpha, { allow_out: ['api.example.test'], secrets: { API_KEY: S_API } });
  const ph = (await sh(alpha, id, 'echo $API_KEY')).stdout.trim();
  stack('stop-proxy');
  try {
    const refused = await until('a refused create', async () => {
      const r = await call(alpha, 'sandbox_create', { name: `egress-down-${tag}` });
      if (!r.isError) made.push([alpha, r.structured.id]);
      return r.isError ? r : null;
    }, 30000, 250);
    assert.match(refused.text, /egress proxy .*is not running; retry sandbox_create in a few seconds/);
  } finally {
    stack('start-proxy');
  }
  const uri = `/eg-back-${tag}`;
  await until('the sandbox registered again', async () => {
    const r = await sh(alpha, id, wget(`http://api.example.test${uri}`, { headers: ['X-Api-Key: $API_KEY'] }));
    return /^ok\s+rc=0/.test(r.stdout);
  }, 30000, 250);
  assert.equal(upstream(uri)[0]?.headers['X-Api-Key'], VAL_API, 'the old placeholder still swaps');
  assert.equal((await sh(alpha, id, 'echo $API_KEY')).stdout.trim(), ph);
  await create(alpha, {});
});

test('secret_list: the team\'s own secrets, metadata only, never a value', jailOnly, async () => {
  const a = await call(alpha, 'secret_list', {});
  assert.equal(a.isError, false, a.text);
  const mine = a.structured.secrets.find((s) => s.name === S_API);
  assert.deepEqual(mine?.allowed_hosts, ['api.example.test']);
  assert.equal(a.structured.secrets.some((s) => s.name === S_BETA), false, 'not beta\'s');
  assert.ok(!a.text.includes(VAL_API) && !JSON.stringify(a.structured).includes(VAL_API), 'no value');
  const b = await call(beta, 'secret_list', {});
  assert.deepEqual(b.structured.secrets.map((s) => s.name).filter((n) => n.endsWith(tag)), [S_BETA]);
});

test('attach and detach: the placeholder swaps while bound and is worthless at once after', jailOnly, async () => {
  const id = await create(alpha, { allow_out: ['api.example.test'] });
  const att = await call(alpha, 'sandbox_attach_secret', { sandbox_id: id, env_key: 'API_KEY', secret_name: S_API });
  assert.equal(att.isError, false, att.text);
  assert.deepEqual(att.structured.secrets, { API_KEY: S_API });
  const ph = (await sh(alpha, id, 'echo $API_KEY')).stdout.trim();
  assert.match(ph, /^sfph_[A-Za-z0-9]{32}$/);
  assert.ok(!att.text.includes(ph), 'the answer shows no placeholder');
  const r = await sh(alpha, id, wget(`http://api.example.test/eg-att-${tag}`, { headers: ['X-Api-Key: $API_KEY'] }));
  assert.match(r.stdout, /^ok\s+rc=0/);
  assert.equal(upstream(`/eg-att-${tag}`)[0]?.headers['X-Api-Key'], VAL_API, 'bound: swapped');
  assert.deepEqual((await call(alpha, 'sandbox_info', { sandbox_id: id })).structured.secrets, { API_KEY: S_API });

  const det = await call(alpha, 'sandbox_detach_secret', { sandbox_id: id, env_key: 'API_KEY' });
  assert.equal(det.isError, false, det.text);
  assert.deepEqual(det.structured.secrets, {});
  assert.equal((await sh(alpha, id, 'echo "[$API_KEY]"')).stdout.trim(), '[]', 'later commands do not get it');
  const old = await sh(alpha, id, wget(`http://api.example.test/eg-det-${tag}`, { headers: [`X-Api-Key: ${ph}`] }));
  assert.match(old.stdout, /^ok\s+rc=0/);
  assert.equal(upstream(`/eg-det-${tag}`)[0]?.headers['X-Api-Key'], ph, 'detached: the placeholder arrives unchanged');
  assert.deepEqual((await call(alpha, 'sandbox_info', { sandbox_id: id })).structured.secrets, {});

  const again = await call(alpha, 'sandbox_detach_secret', { sandbox_id: id, env_key: 'API_KEY' });
  assert.equal(again.isError, true);
  assert.match(again.text, /No secret is bound to API_KEY/);
  // another team's secret, and one that does not exist: the same words
  const theirs = await call(alpha, 'sandbox_attach_secret', { sandbox_id: id, env_key: 'K', secret_name: S_BETA });
  const none = await call(alpha, 'sandbox_attach_secret', { sandbox_id: id, env_key: 'K', secret_name: `NOPE_${tag}` });
  assert.equal(theirs.isError, true);
  assert.equal(theirs.text, `No secret named ${S_BETA} for this team; see secret_list.`);
  assert.equal(none.text.replace(`NOPE_${tag}`, S_BETA), theirs.text, 'indistinguishable');
  // nor can beta touch alpha's sandbox
  const foreign = await call(beta, 'sandbox_attach_secret', { sandbox_id: id, env_key: 'K', secret_name: S_BETA });
  assert.equal(foreign.isError, true);
  assert.match(foreign.text, new RegExp(`${id}`));
});

test('the network log through MCP: each attempt with its verdict and byte counts', jailOnly, async () => {
  const id = await create(alpha, { allow_out: ['api.example.test'], secrets: { API_KEY: S_API } });
  const r = await sh(alpha, id, [
    wget(`http://api.example.test/eg-log-a-${tag}`, { headers: ['X-Api-Key: $API_KEY'] }),
    wget(`http://other.test/eg-log-b-${tag}`),
    wget(`http://api.example.test/eg-log-c-${tag}`, { direct: true }),
  ].join('\n'));
  assert.deepEqual(r.stdout.split('rc=').slice(1).map((s) => s[0]), ['0', '1', '0'], r.stdout);
  const log = await until('three entries', async () => {
    const l = await call(alpha, 'sandbox_network_log', { sandbox_id: id });
    assert.equal(l.isError, false, l.text);
    return l.structured.entries.filter((e) => e.proto !== 'dns').length >= 3 ? l.structured : null;
  }, 30000, 250);
  const http = log.entries.filter((e) => e.proto !== 'dns');
  const allowed = http.filter((e) => e.verdict === 'allowed');
  const blocked = http.filter((e) => e.verdict === 'blocked');
  assert.equal(allowed.length, 2, JSON.stringify(http));
  assert.equal(blocked.length, 1, JSON.stringify(http));
  for (const e of allowed) {
    assert.equal(e.host, 'api.example.test');
    assert.equal(e.port, 80);
    assert.ok(e.bytes_up > 40 && e.bytes_down > 40, `bytes counted: ${JSON.stringify(e)}`);
  }
  assert.deepEqual(allowed.map((e) => e.secret_injected).sort(), [false, true]);
  assert.equal(blocked[0].host, 'other.test');
  assert.ok(log.entries.every((e, i) => i === 0 || log.entries[i - 1].ts_ms >= e.ts_ms), 'newest first');
  assert.ok(!JSON.stringify(log).includes(VAL_API), 'never the value');

  const only = await call(alpha, 'sandbox_network_log', { sandbox_id: id, verdict: 'blocked' });
  assert.ok(only.structured.entries.length >= 1 && only.structured.entries.every((e) => e.verdict === 'blocked'));
  const one = await call(alpha, 'sandbox_network_log', { sandbox_id: id, limit: 1 });
  assert.equal(one.structured.entries.length, 1);
  const big = await call(alpha, 'sandbox_network_log', { sandbox_id: id, limit: 201 });
  assert.equal(big.isError, true);
  assert.match(big.text, /limit/);
  const foreign = await call(beta, 'sandbox_network_log', { sandbox_id: id });
  const none = await call(beta, 'sandbox_network_log', { sandbox_id: `sb_nope${tag}` });
  assert.equal(foreign.isError, true);
  assert.equal(foreign.text.replace(id, 'X'), none.text.replace(`sb_nope${tag}`, 'X'), 'not theirs = not there');
});

test('sandbox_update tightening the rules takes effect for new connections at once', jailOnly, async () => {
  const id = await create(alpha, { allow_out: ['api.example.test', 'other.test'] });
  const before = await sh(alpha, id, [
    wget(`http://other.test/eg-upd-1x-${tag}`),
    wget(`http://other.test/eg-upd-1t-${tag}`, { direct: true }),
  ].join('\n'));
  assert.deepEqual(before.stdout.split('rc=').slice(1).map((s) => s[0]), ['0', '0'], before.stdout);
  const u = await call(alpha, 'sandbox_update', { sandbox_id: id, allow_out: ['api.example.test'] });
  assert.equal(u.isError, false, u.text);
  assert.deepEqual(u.structured.network, { egress_default: 'deny', allow_out: ['api.example.test'], deny_out: [] });
  const after = await sh(alpha, id, [
    wget(`http://other.test/eg-upd-2x-${tag}`),
    wget(`http://other.test/eg-upd-2t-${tag}`, { direct: true }),
    wget(`http://api.example.test/eg-upd-2a-${tag}`),
  ].join('\n'));
  assert.deepEqual(after.stdout.split('rc=').slice(1).map((s) => s[0]), ['1', '1', '0'], after.stdout);
  assert.equal(upstream(`/eg-upd-1x-${tag}`).length, 1);
  assert.equal(upstream(`/eg-upd-2x-${tag}`).length + upstream(`/eg-upd-2t-${tag}`).length, 0, 'nothing reached other.test after');
  assert.deepEqual((await call(alpha, 'sandbox_info', { sandbox_id: id })).structured.network.allow_out, ['api.example.test']);
  // deny_out narrows what allow_out opens (the longer prefix decides)
  const d = await call(alpha, 'sandbox_update', { sandbox_id: id, allow_out: [`${NET}.0/24`], deny_out: [`${NET}.10/32`] });
  assert.equal(d.isError, false, d.text);
  const cidr = await sh(alpha, id, [
    wget(`http://${NET}.20/eg-upd-3o-${tag}`, { direct: true }),
    wget(`http://${NET}.10/eg-upd-3a-${tag}`, { direct: true }),
  ].join('\n'));
  assert.deepEqual(cidr.stdout.split('rc=').slice(1).map((s) => s[0]), ['0', '1'], cidr.stdout);
  assert.equal(upstream(`/eg-upd-3o-${tag}`).length, 1);
  assert.equal(upstream(`/eg-upd-3a-${tag}`).length, 0);
  const bad = await call(alpha, 'sandbox_update', { sandbox_id: id, deny_out: ['example.org'] });
  assert.equal(bad.isError, true);
  assert.match(bad.text, /deny_out\[0\] must be an IPv4 address or CIDR/);
  const nothing = await call(alpha, 'sandbox_update', { sandbox_id: id });
  assert.equal(nothing.isError, true);
  assert.match(nothing.text, /pass at least one of them/);
});
