// `sandfleet connect CLIENT`: what it prints is valid for each client's format (JSON parses,
// TOML parses with a real TOML parser, the Claude Code and Codex command lines carry the
// right flags as the shell passes them), the Claude Desktop entry really starts a working
// mcp-stdio, and --write merges into each client's file without losing what is there and,
// for every file but Claude Desktop's, without the key.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, statSync, symlinkSync, lstatSync,
  accessSync, constants, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from 'smol-toml';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { env, url } from './lib.mjs';
import { sandfleetBin } from './bridge.mjs';

const bin = sandfleetBin(env.SF_BUILD);
const parseToml = (text) => JSON.parse(JSON.stringify(parse(text))); // plain objects
const KEY = env.SF_KEY_ALPHA;
// every HOME and folder of this file under one scratch folder, removed at the end
const scratch = mkdtempSync(join(tmpdir(), 'sf-connect-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

// Runs `sandfleet connect ...` in a fresh HOME and folder (or the given ones).
function connect(args, { home, cwd, extraEnv = {} } = {}) {
  home ??= mkdtempSync(join(scratch, 'home-'));
  cwd ??= mkdtempSync(join(scratch, 'cwd-'));
  const r = spawnSync(bin, ['connect', ...args], { cwd, encoding: 'utf8',
    env: { PATH: process.env.PATH, HOME: home, SF_HOME: '/nonexistent',
      ASAN_OPTIONS: process.env.ASAN_OPTIONS ?? '', ...extraEnv } });
  assert.doesNotMatch(r.stderr, /AddressSanitizer|LeakSanitizer|runtime error:/, r.stderr);
  return { ...r, home, cwd };
}

// The argv a shell line gives the named command.
function argvOf(line, command) {
  const out = execFileSync('bash', ['-c', `${command}() { printf '%s\\0' "$@"; }; eval "$1"`, '_', line],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH, SANDFLEET_API_KEY: 'from-env' } });
  return out.split('\0').slice(0, -1);
}

const odd = 'http://127.0.0.1:8080/mcp?team=a&x=$HOME';

test('connect says which URL it used and where it found it; without a stack, that it fell back', () => {
  const none = connect(['cursor']); // SF_HOME=/nonexistent
  assert.equal(none.status, 0, none.stderr);
  assert.match(none.stderr, /^# URL http:\/\/127\.0\.0\.1:8080\/mcp: the default, as no stack was found \(\/nonexistent\/env does not exist\); .*--url URL, or set SF_HOME/m);
  const home = mkdtempSync(join(scratch, 'sfhome-'));
  writeFileSync(join(home, 'env'), `SF_REDIS_URL=redis://x\nSF_URL=${url}\n`);
  const found = connect(['cursor'], { extraEnv: { SF_HOME: home } });
  assert.match(found.stderr, new RegExp(`^# URL ${url.replace(/[.?]/g, '\\$&')}, from ${home}/env \\(SF_URL in the file ops/run writes\\)\\.`, 'm'));
  assert.equal(JSON.parse(found.stdout).mcpServers.sandfleet.url, url);
  const byEnv = connect(['cursor'], { extraEnv: { SANDFLEET_URL: 'http://10.1.2.3:9/mcp' } });
  assert.match(byEnv.stderr, /^# URL http:\/\/10\.1\.2\.3:9\/mcp, from the environment variable SANDFLEET_URL\./m);
  assert.match(connect(['cursor', '--url', odd]).stderr, /, from --url\./);
});

test('claude-code: the claude mcp add line has the right flags, also for an odd URL', () => {
  for (const [u, key, header] of [[url, KEY, `Authorization: Bearer ${KEY}`],
    [odd, undefined, 'Authorization: Bearer from-env']]) {
    const r = connect(['claude-code', '--url', u, ...(key ? ['--key', key] : [])]);
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(argvOf(r.stdout.trim(), 'claude'),
      ['mcp', 'add', '--transport', 'http', 'sandfleet', u, '--header', header]);
  }
});

test('codex: the TOML parses and the codex mcp add line has the right flags', () => {
  const r = connect(['codex', '--url', odd, '--key', KEY]);
  assert.equal(r.status, 0, r.stderr);
  const toml = parseToml(r.stdout);
  assert.deepEqual(toml, { mcp_servers: { sandfleet: { url: odd, bearer_token_env_var: 'SANDFLEET_API_KEY' } } });
  const line = r.stdout.split('\n')[0].replace(/^# /, '');
  assert.deepEqual(argvOf(line, 'codex'),
    ['mcp', 'add', 'sandfleet', '--url', odd, '--bearer-token-env-var', 'SANDFLEET_API_KEY']);
  assert.ok(!r.stdout.includes(KEY), 'no key in the TOML');
});

test('cursor, vscode, windsurf: valid JSON with the key referenced, never written', () => {
  const c = connect(['cursor', '--url', url, '--key', KEY]);
  assert.deepEqual(JSON.parse(c.stdout), { mcpServers: { sandfleet: { url,
    headers: { Authorization: 'Bearer ${env:SANDFLEET_API_KEY}' } } } });
  const w = connect(['windsurf', '--url', url, '--key', KEY]);
  assert.deepEqual(JSON.parse(w.stdout), { mcpServers: { sandfleet: { serverUrl: url,
    headers: { Authorization: 'Bearer ${env:SANDFLEET_API_KEY}' } } } });
  const v = connect(['vscode', '--url', url, '--key', KEY]);
  const doc = JSON.parse(v.stdout);
  assert.deepEqual(doc.inputs, [{ type: 'promptString', id: 'sandfleet-api-key',
    description: 'sandfleet API key (sf_live_...)', password: true }]);
  assert.deepEqual(doc.servers.sandfleet, { type: 'http', url,
    headers: { Authorization: 'Bearer ${input:sandfleet-api-key}' } });
  for (const r of [c, w, v]) {
    assert.equal(r.status, 0, r.stderr);
    assert.ok(!r.stdout.includes(KEY));
  }
});

test('claude-desktop: the entry starts a working mcp-stdio', async () => {
  const r = connect(['claude-desktop', '--url', url, '--key', KEY]);
  assert.equal(r.status, 0, r.stderr);
  const entry = JSON.parse(r.stdout).mcpServers.sandfleet;
  assert.ok(entry.command.startsWith('/'), 'an absolute path: Claude Desktop has no shell PATH');
  accessSync(entry.command, constants.X_OK);
  assert.deepEqual(entry.args, ['mcp-stdio', url]);
  assert.equal(entry.env.SANDFLEET_API_KEY, KEY);
  // Start it as Claude Desktop would: that command, those args, that env.
  const transport = new StdioClientTransport({ command: entry.command, args: entry.args,
    env: { ...entry.env, ASAN_OPTIONS: process.env.ASAN_OPTIONS ?? '' }, stderr: 'pipe' });
  const client = new Client({ name: 'claude-desktop-stand-in', version: '1' });
  await client.connect(transport);
  const { tools } = await client.listTools();
  assert.ok(tools.some((t) => t.name === 'sandbox_exec'));
  await client.close();
});

test('--write merges into each client file, keeps the rest, and only Claude Desktop holds the key', () => {
  const home = mkdtempSync(join(scratch, 'home-'));
  const cwd = mkdtempSync(join(scratch, 'cwd-'));
  const put = (p, text) => { mkdirSync(join(p, '..'), { recursive: true }); writeFileSync(p, text); };
  const other = { command: 'other-server', args: ['--x'] };
  put(join(cwd, '.vscode/mcp.json'), JSON.stringify({ inputs: [{ type: 'promptString', id: 'mine', password: true }],
    servers: { mine: other } }));
  put(join(cwd, '.cursor/mcp.json'), JSON.stringify({ mcpServers: { mine: other } }));
  put(join(cwd, '.mcp.json'), JSON.stringify({ mcpServers: { mine: other } }));
  put(join(home, '.config/Claude/claude_desktop_config.json'),
    JSON.stringify({ globalShortcut: 'Ctrl+Space', mcpServers: { mine: other } }));
  // Windsurf's file is a link (dotfiles): the file it points to is the one edited.
  put(join(home, 'dotfiles/windsurf.json'), JSON.stringify({ mcpServers: { mine: other } }));
  mkdirSync(join(home, '.codeium/windsurf'), { recursive: true });
  symlinkSync(join(home, 'dotfiles/windsurf.json'), join(home, '.codeium/windsurf/mcp_config.json'));
  put(join(home, 'codex/config.toml'), [
    'model = "o3"  # mine',
    '[mcp_servers.mine]', 'command = "other-server"', '',
    '[mcp_servers.sandfleet]', 'command = "old"', 'args = [', '  "x",', ']', 'tool_timeout_sec = 120', '',
    '[mcp_servers.sandfleet.env]', 'A = "1"', '',
  ].join('\n'));
  const opts = { home, cwd, extraEnv: { SANDFLEET_API_KEY: KEY, CODEX_HOME: join(home, 'codex') } };

  for (const id of ['vscode', 'cursor', 'claude-code', 'claude-desktop', 'windsurf', 'codex']) {
    const r = connect([id, '--write', '--url', url, '--key', KEY], opts);
    assert.equal(r.status, 0, `${id}: ${r.stderr}`);
    assert.match(r.stderr, /(Added|Updated) sandfleet in /);
    assert.equal(connect([id, '--write', '--url', url, '--key', KEY], opts).stderr
      .includes('nothing to change'), true, `${id}: a second --write changes nothing`);
  }
  const read = (p) => readFileSync(p, 'utf8');
  const vs = read(join(cwd, '.vscode/mcp.json'));
  assert.ok(!vs.includes(KEY), 'no key in .vscode/mcp.json');
  const vsj = JSON.parse(vs);
  assert.deepEqual(vsj.servers.mine, other);
  assert.deepEqual(vsj.inputs.map((i) => i.id), ['mine', 'sandfleet-api-key']);
  assert.equal(vsj.servers.sandfleet.headers.Authorization, 'Bearer ${input:sandfleet-api-key}');
  for (const p of [join(cwd, '.cursor/mcp.json'), join(cwd, '.mcp.json'), join(home, 'dotfiles/windsurf.json')]) {
    const text = read(p);
    assert.ok(!text.includes(KEY), `no key in ${p}`);
    const j = JSON.parse(text);
    assert.deepEqual(j.mcpServers.mine, other);
    assert.ok(j.mcpServers.sandfleet, `sandfleet in ${p}`);
  }
  assert.ok(lstatSync(join(home, '.codeium/windsurf/mcp_config.json')).isSymbolicLink(), 'the link stays');
  assert.equal(JSON.parse(read(join(cwd, '.mcp.json'))).mcpServers.sandfleet.headers.Authorization,
    'Bearer ${SANDFLEET_API_KEY}');
  const cd = join(home, '.config/Claude/claude_desktop_config.json');
  const cdj = JSON.parse(read(cd));
  assert.equal(cdj.globalShortcut, 'Ctrl+Space');
  assert.deepEqual(cdj.mcpServers.mine, other);
  assert.equal(cdj.mcpServers.sandfleet.env.SANDFLEET_API_KEY, KEY);
  const codexText = read(join(home, 'codex/config.toml'));
  assert.ok(!codexText.includes(KEY));
  assert.match(codexText, /model = "o3" {2}# mine/);
  assert.deepEqual(parseToml(codexText), { model: 'o3', mcp_servers: {
    mine: { command: 'other-server' },
    sandfleet: { url, bearer_token_env_var: 'SANDFLEET_API_KEY', tool_timeout_sec: 120 } } });

  // A new Claude Desktop file (it holds the key) is private.
  const fresh = mkdtempSync(join(scratch, 'home-'));
  assert.equal(connect(['claude-desktop', '--write', '--url', url, '--key', KEY], { home: fresh }).status, 0);
  assert.equal(statSync(join(fresh, '.config/Claude/claude_desktop_config.json')).mode & 0o777, 0o600);
});

test('--write refuses what it cannot merge safely and changes nothing', () => {
  const cwd = mkdtempSync(join(scratch, 'cwd-'));
  mkdirSync(join(cwd, '.vscode'));
  const jsonc = '{\n  // my servers\n  "servers": {}\n}\n';
  writeFileSync(join(cwd, '.vscode/mcp.json'), jsonc);
  const r = connect(['vscode', '--write', '--url', url], { cwd });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /is not plain JSON .*nothing was changed/);
  assert.equal(readFileSync(join(cwd, '.vscode/mcp.json'), 'utf8'), jsonc);

  const home = mkdtempSync(join(scratch, 'home-'));
  mkdirSync(join(home, '.codex'));
  const inline = '[mcp_servers]\nsandfleet = { url = "http://elsewhere/mcp" }\n';
  writeFileSync(join(home, '.codex/config.toml'), inline);
  const t = connect(['codex', '--write', '--url', url], { home });
  assert.equal(t.status, 1);
  assert.match(t.stderr, /inline table; edit that entry by hand\. Nothing was changed\./);
  assert.equal(readFileSync(join(home, '.codex/config.toml'), 'utf8'), inline);

  const d = connect(['claude-desktop', '--write', '--url', url]);
  assert.equal(d.status, 2);
  assert.match(d.stderr, /must hold the key: give --key KEY or set SANDFLEET_API_KEY/);

  const u = connect(['emacs']);
  assert.equal(u.status, 2);
  assert.match(u.stderr, /no client named 'emacs'/);
});
