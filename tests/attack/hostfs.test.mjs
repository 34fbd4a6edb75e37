// Host-side file access (issue 19, critical): a team template whose build plants links and a
// FIFO where the worker reads the template's CA bundle (etc/ssl/certs/ca-certificates.crt,
// merged with the egress CA into every sandbox) must give its sandboxes nothing of the host
// (the worker's environment, a host file), must not hang the create (a FIFO), and its
// sandboxes still work. And ZIP names (issue 19, item 6): sandbox_files_download_dir leaves
// out entries named `..\..\evil.bat`, `C:x`, `a\b:c` and says so. Through MCP only, with the
// official SDK client, on the attack stack; how the worker builds a team template (a jail on
// the host or a sandbox on a loop disk) does not matter here.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, mkdirSync, writeFileSync, rmSync, chmodSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { connect, call, sh, env, until } from '../e2e/lib.mjs';
import { readZip } from '../e2e/zip.mjs';

const alpha = await connect(env.SF_KEY_ALPHA);
const uniq = Date.now().toString(36);
const made = [];
const workerPid = Number(readFileSync(`${env.SF_STATE}/pids/worker`, 'utf8'));
// a host directory the tenant names by a link: its bundle and its mode must stay on the host
const HOSTDIR = `/tmp/sf-hostfs-${uniq}`;
const MARK = `HOST-ONLY-${uniq}`;
mkdirSync(HOSTDIR, { recursive: true });
writeFileSync(`${HOSTDIR}/ca-certificates.crt`, `${MARK}\n`);
chmodSync(HOSTDIR, 0o711);
// the same one level up: /etc/ssl made a link to a host directory holding certs/
const HOSTSSL = `${HOSTDIR}-ssl`;
mkdirSync(`${HOSTSSL}/certs`, { recursive: true });
writeFileSync(`${HOSTSSL}/certs/ca-certificates.crt`, `${MARK}\n`);
chmodSync(`${HOSTSSL}/certs`, 0o711);
// and /etc itself made a link to a host directory holding ssl/certs/
const HOSTETC = `${HOSTDIR}-etc`;
mkdirSync(`${HOSTETC}/ssl/certs`, { recursive: true });
writeFileSync(`${HOSTETC}/ssl/certs/ca-certificates.crt`, `${MARK}\n`);
chmodSync(`${HOSTETC}/ssl/certs`, 0o711);

// This stack's teardowns (of sandboxes and of template builds) stop themselves half-way
// (teardown_stop, for attack.suite): this suite lets each one go on (SIGCONT).
function resumeTeardowns() {
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const m = readFileSync(`/proc/${d}/stat`, 'utf8').match(/^\d+ \((.*)\) (\S) (\d+)/);
      if (m && m[1] === 'sf-teardown' && Number(m[3]) === workerPid && m[2] === 'T')
        process.kill(Number(d), 'SIGCONT');
    } catch { /* gone meanwhile */ }
  }
}
const redis = (...args) => execFileSync('redis-cli', ['-u', env.SF_REDIS_URL, ...args]).toString().trim();

after(async () => {
  for (const id of made) await call(alpha, 'sandbox_kill', { sandbox_id: id });
  await until('the sandboxes killed', () => {
    resumeTeardowns();
    return made.every((id) => redis('HGET', `sf:sb:{${id}}`, 'state') === 'killed');
  }, 120000, 100);
  await alpha.close();
  rmSync(HOSTDIR, { recursive: true, force: true });
  rmSync(HOSTSSL, { recursive: true, force: true });
  rmSync(HOSTETC, { recursive: true, force: true });
});

async function settled(name, deadlineMs = 600000) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const l = await call(alpha, 'sandbox_template_list', { name_prefix: name });
    assert.equal(l.isError, false, l.text);
    const t = l.structured.templates.find((x) => x.name === name);
    assert.ok(t, `${name} is listed`);
    if (t.status !== 'building' || Date.now() > end) return t;
    resumeTeardowns(); /* a build's sandbox ends with a teardown */
    await new Promise((res) => setTimeout(res, 200));
  }
}

async function create(args, deadlineMs = 600000) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const r = await call(alpha, 'sandbox_create', args);
    if (!r.isError) {
      made.push(r.structured.id);
      return r;
    }
    if (!/still being built/.test(r.text) || Date.now() > end) return r;
    await new Promise((res) => setTimeout(res, 2000));
  }
}

const CERTS = '/etc/ssl/certs';
const cases = {
  abs: [`mkdir -p ${CERTS}`, `rm -f ${CERTS}/ca-certificates.crt`,
    `ln -s /proc/self/environ ${CERTS}/ca-certificates.crt`],
  rel: [`mkdir -p ${CERTS}`, `rm -f ${CERTS}/ca-certificates.crt`,
    `ln -s ${'../'.repeat(48)}proc/self/environ ${CERTS}/ca-certificates.crt`],
  dir: ['mkdir -p /etc/ssl', `rm -rf ${CERTS}`, `ln -s ${HOSTDIR} ${CERTS}`],
  ssl: ['rm -rf /etc/ssl', `ln -s ${HOSTSSL} /etc/ssl`],
  etc: ['rm -rf /etc', `ln -s ${HOSTETC} /etc`],
  fifo: [`mkdir -p ${CERTS}`, `rm -f ${CERTS}/ca-certificates.crt`,
    `mkfifo ${CERTS}/ca-certificates.crt`],
};

test('the precondition: the worker\'s environment holds SF_ names (what a leak would show)', () => {
  const environ = readFileSync(`/proc/${workerPid}/environ`, 'utf8');
  assert.match(environ, /(^|\0)SF_[A-Z_]+=/);
});

test('a template with links or a FIFO at its CA bundle: its sandboxes get nothing of the host, promptly, and work', async () => {
  const names = {};
  for (const [k, steps] of Object.entries(cases)) {
    names[k] = `hostfs-${k}-${uniq}`;
    const r = await call(alpha, 'sandbox_template_create', { name: names[k], from: 'base', run_steps: steps });
    assert.equal(r.isError, false, r.text);
  }
  for (const k of Object.keys(cases)) {
    const t = await settled(names[k]);
    assert.equal(t.status, 'ready', `${k}: ${JSON.stringify(t)}`);
  }
  // every case is checked (a leak in one does not hide the others), then all are reported
  const problems = [];
  for (const k of Object.keys(cases)) {
    try {
      // a FIFO the worker opened blocking would hold the create until its deadline: the
      // create must answer (and succeed) rather than time out
      const c = await create({ from_template: names[k] });
      assert.equal(c.isError, false, `${k}: ${c.text}`);
      const id = c.structured.id;
      const o = await sh(alpha, id, `cat ${CERTS}/ca-certificates.crt; echo ==; cat ${CERTS}/sandfleet-ca-bundle.pem; echo ==; stat -c %a ${CERTS}; echo alive`);
      assert.equal(o.exit_code, 0, `${k}: ${o.stderr}`);
      assert.doesNotMatch(o.stdout, /SF_[A-Z_]+=|redis:\/\//, `${k}: the worker's environment leaked into the sandbox`);
      assert.ok(!o.stdout.includes(MARK), `${k}: a host file leaked into the sandbox`);
      assert.match(o.stdout, /-----BEGIN CERTIFICATE-----/, `${k}: the egress CA is still there`);
      assert.doesNotMatch(o.stdout.split('==\n')[2], /^711/, `${k}: the host directory's mode leaked`);
      assert.match(o.stdout, /alive\n$/);
    } catch (e) {
      problems.push(e.message.split('\n')[0]);
    }
  }
  assert.deepEqual(problems, []);
  // the host's own file and directory are as they were
  assert.equal(readFileSync(`${HOSTDIR}/ca-certificates.crt`, 'utf8'), `${MARK}\n`);
});

test('ZIP names that would unpack outside the folder on Windows are left out and named', async () => {
  const c = await create({ from_template: 'base' });
  assert.equal(c.isError, false, c.text);
  const id = c.structured.id;
  const bad = ['..\\..\\evil.bat', 'C:x', 'a\\b:c'];
  const w = await sh(alpha, id, "mkdir -p /root/z/sub && cd /root/z && echo ok > good.txt && echo s > sub/in.txt"
    + " && printf evil > '..\\..\\evil.bat' && printf x > 'C:x' && printf y > 'a\\b:c' && mkdir 'd\\e' && echo in > 'd\\e/f' && ls");
  assert.equal(w.exit_code, 0, w.stderr);
  const z = await call(alpha, 'sandbox_files_download_dir', { sandbox_id: id, path: '/root/z' });
  assert.equal(z.isError, false, z.text);
  const entries = readZip(Buffer.from(z.structured.content, 'base64'));
  const keys = [...entries.keys()].sort();
  assert.deepEqual(keys, ['good.txt', 'sub/', 'sub/in.txt']);
  for (const k of keys) assert.doesNotMatch(k, /[\\:]|(^|\/)\.\.(\/|$)/);
  assert.equal(z.structured.files, 2);
  assert.equal(z.structured.unsafe_skipped, 4);
  assert.deepEqual([...z.structured.unsafe_names].sort(), [...bad, 'd\\e'].sort());
  assert.match(z.structured.note, /4 entries were left out of the ZIP: their names have a '\\', a ':' or a '\.\.' that would unpack outside the target folder on Windows/);
  assert.match(z.text, /unsafe_names|left out of the ZIP/);
});
