// Long commands past client timeouts (issue 27 item 1): a sandbox_exec still running after
// detach_after_ms (the worker's exec_detach_ms, 50 s by default) answers with the output so
// far, still_running: true and its pid, and goes on as a background process that
// sandbox_process_logs follows to its exit code. The 90 s case runs with the official SDK
// client at its DEFAULT request timeout (60 s, no option passed), over HTTP, through
// `sandfleet mcp-stdio` and through mcp-remote 0.15.1, and with LangChain's MCP adapters
// 1.1.4 (MultiServerMCPClient, its tools' invoke), mcp-use 1.34.6 (MCPClient sessions) and
// the Vercel AI SDK's MCP client (@ai-sdk/mcp 2.0.99, its tools' execute), and the MCP
// Inspector's CLI (2.12.0, one `mcp-inspector --cli` run per call), each at its default
// timeout (the AI SDK's: none), all at once. The clients are pinned in package.json and
// installed by ops/test's `npm ci` (SF_MCP_REMOTE_BIN overrides mcp-remote; a missing one
// fails its test, saying so). It is its own ctest (e2e.longcall, no stack lock) so it runs
// beside the other suites.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { connect, call, env, url, until } from './lib.mjs';
import { bridge, finish, sandfleetBin } from './bridge.mjs';
import { clientBin } from './clients.mjs';
import { MultiServerMCPClient } from '@langchain/mcp-adapters';
import { createMCPClient } from '@ai-sdk/mcp';

// mcp-use sends anonymous telemetry to the internet unless told not to: no traffic but loopback
process.env.MCP_USE_ANONYMIZED_TELEMETRY = 'false';
const { MCPClient } = await import('mcp-use/client');

// its own team: the quota suites that run meanwhile count alpha's and beta's sandboxes
const key = execFileSync(sandfleetBin(env.SF_BUILD), ['keys', 'create', '--team', 'longcall'],
  { encoding: 'utf8', env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL,
                             SF_AUTH_SECRET_FILE: env.SF_AUTH_SECRET_FILE } }).trim();
let client, box;
before(async () => {
  client = await connect(key);
  const r = await call(client, 'sandbox_create', { name: 'longcall' });
  assert.equal(r.isError, false, r.text);
  box = r.structured.id;
});
after(async () => {
  if (box) await call(client, 'sandbox_kill', { sandbox_id: box });
  await client?.close();
});

const logs = (c, pid, extra = {}) => c.callTool({ name: 'sandbox_process_logs',
  arguments: { sandbox_id: box, pid, ...extra } });
// Reads the process's log from offset 0 until it exited; returns its last answer, with all
// the data read.
async function follow(c, pid, ms, every = 250) {
  let data = '', off = 0;
  return until(`process ${pid} to exit`, async () => {
    const r = await logs(c, pid, { offset: off });
    assert.equal(r.isError, false, JSON.stringify(r.content));
    data += r.structuredContent.data;
    off = r.structuredContent.next_offset;
    return r.structuredContent.exited && { ...r.structuredContent, data };
  }, ms, every);
}

test('a command still running after detach_after_ms answers still_running; its log follows to its exit code', async () => {
  const t0 = Date.now();
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, detach_after_ms: 1000,
    command: 'echo before; echo err-before >&2; sleep 3; echo after; echo err-after >&2; exit 7' });
  assert.equal(r.isError, false, r.text);
  const s = r.structured;
  assert.equal(s.still_running, true, r.text);
  assert.ok(Number.isInteger(s.pid) && s.pid > 1, r.text);
  assert.equal(s.stdout, 'before\n');
  assert.equal(s.stderr, 'err-before\n');
  assert.equal(s.exit_code, undefined, 'no exit code while it runs');
  assert.match(s.note, /sandbox_process_logs/);
  assert.ok(Date.now() - t0 < 3000, `answered after ${Date.now() - t0} ms, before the command ended`);
  // it shows in the process list while it runs
  const list = await call(client, 'sandbox_process_list', { sandbox_id: box });
  assert.ok(list.structured.processes.some((p) => p.pid === s.pid), list.text);
  const end = await follow(client, s.pid, 20000);
  assert.equal(end.exit_code, 7);
  assert.match(end.data, /after\n/);
  assert.match(end.data, /err-after\n/);
  assert.doesNotMatch(end.data, /before/, 'the log holds what came after the answer');
});

test('detach_after_ms 0 waits for the command; a quick command answers as before', async () => {
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, detach_after_ms: 0,
    command: 'sleep 1.5; echo waited' });
  assert.equal(r.structured.still_running, undefined, r.text);
  assert.equal(r.structured.stdout, 'waited\n');
  assert.equal(r.structured.exit_code, 0);
  const q = await call(client, 'sandbox_exec', { sandbox_id: box, command: 'echo quick' });
  assert.equal(q.structured.stdout, 'quick\n');
  assert.equal(q.structured.exit_code, 0);
  assert.equal(q.structured.still_running, undefined);
});

test('a detached command keeps its timeout: killed then, the log says killed_at_timeout', async () => {
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, detach_after_ms: 500,
    timeout_ms: 2000, command: 'sleep 30' });
  assert.equal(r.structured.still_running, true, r.text);
  const end = await follow(client, r.structured.pid, 15000);
  assert.equal(end.killed_at_timeout, true, JSON.stringify(end));
  assert.equal(end.exit_code, 137);
});

test('a bad detach_after_ms gets one clear sentence', async () => {
  const r = await call(client, 'sandbox_exec', { sandbox_id: box, detach_after_ms: -5, command: 'true' });
  assert.equal(r.isError, true);
  assert.match(r.text, /detach_after_ms/);
});

// `sleep 90; echo done` with each client at the SDK's default timeout: an answer in <= 55 s
// with still_running and a pid, then `done` and exit code 0 through sandbox_process_logs.
async function ninety(c, label, every = 250) {
  const t0 = Date.now();
  const r = await c.callTool({ name: 'sandbox_exec', arguments: { sandbox_id: box,
    command: `echo start-${label}; sleep 90; echo done`, timeout_ms: 120000 } });
  const ms = Date.now() - t0;
  assert.equal(r.isError, false, JSON.stringify(r.content));
  const s = r.structuredContent;
  assert.equal(s.still_running, true, JSON.stringify(s));
  assert.ok(ms <= 55000, `${label}: answered after ${ms} ms`);
  assert.equal(s.stdout, `start-${label}\n`);
  const end = await follow(c, s.pid, 90000, every);
  assert.equal(end.exit_code, 0, `${label}: ${JSON.stringify(end)}`);
  assert.equal(end.data, 'done\n');
  assert.ok(Date.now() - t0 >= 90000, `${label}: exited after the sleep`);
}

describe('sleep 90 under the default 60 s client timeout', { concurrency: 7 }, () => {
  test('over HTTP (the SDK client)', () => ninety(client, 'http'));
  test('through sandfleet mcp-stdio', async () => {
    const b = bridge(sandfleetBin(env.SF_BUILD), url, key);
    await b.client.connect(b.transport);
    try {
      await ninety(b.client, 'stdio');
    } finally {
      await finish(b);
    }
  });
  test('through mcp-remote', async () => {
    const transport = new StdioClientTransport({ command: clientBin('SF_MCP_REMOTE_BIN', 'mcp-remote'),
      args: [url, '--header', `Authorization:Bearer ${key}`, '--allow-http'],
      env: { PATH: process.env.PATH, HOME: mkdtempSync(join(tmpdir(), 'sf-mcp-remote-')) }, stderr: 'pipe' });
    const c = new Client({ name: 'sandfleet-mcp-remote-e2e', version: '1.0.0' });
    await c.connect(transport);
    try {
      await ninety(c, 'remote');
    } finally {
      await c.close();
    }
  });
  test("through LangChain's MCP adapters (a tool's invoke)", async () => {
    const lc = new MultiServerMCPClient({ mcpServers: { sandfleet: { transport: 'http', url,
      headers: { Authorization: `Bearer ${key}` } } } });
    try {
      const tools = await lc.getTools();
      // what a LangChain agent gets back from a tool: its content block (text: the JSON);
      // a tool error throws
      const c = { callTool: async ({ name, arguments: args }) => {
        const tool = tools.find((t) => t.name === name);
        assert.ok(tool, `LangChain lists ${name}`);
        const out = await tool.invoke(args);
        const block = Array.isArray(out) ? out[0] : out;
        assert.equal(block?.type, 'text', JSON.stringify(out));
        return { isError: false, content: [block], structuredContent: JSON.parse(block.text) };
      } };
      await ninety(c, 'langchain');
    } finally {
      await lc.close();
    }
  });
  test('through mcp-use (a session of its MCPClient)', async () => {
    const mu = new MCPClient({ mcpServers: { sandfleet: { url, headers: { Authorization: `Bearer ${key}` } } } });
    try {
      const session = await mu.createSession('sandfleet');
      await ninety({ callTool: ({ name, arguments: args }) => session.callTool(name, args) }, 'mcp-use');
    } finally {
      await mu.closeAllSessions();
    }
  });
  test("through the Vercel AI SDK's MCP client (a tool's execute)", async () => {
    const ai = await createMCPClient({ transport: { type: 'http', url, headers: { Authorization: `Bearer ${key}` } } });
    try {
      const tools = await ai.tools();
      let n = 0;
      await ninety({ callTool: ({ name, arguments: args }) =>
        tools[name].execute(args, { toolCallId: `longcall-${++n}`, messages: [] }) }, 'ai-sdk');
    } finally {
      await ai.close();
    }
  });
  test("through the MCP Inspector's CLI (mcp-inspector --cli, one run per call)", async () => {
    const bin = clientBin('SF_MCP_INSPECTOR_BIN', 'mcp-inspector');
    const home = mkdtempSync(join(tmpdir(), 'sf-inspector-')); // its catalogue goes there
    const callTool = ({ name, arguments: args }) => new Promise((ok, fail) => {
      execFile(bin, ['--cli', url, '--transport', 'http', '--header', `Authorization: Bearer ${key}`,
        '--method', 'tools/call', '--tool-name', name,
        '--tool-arg', ...Object.entries(args).map(([k, v]) => `${k}=${v}`)],
      { env: { PATH: process.env.PATH, HOME: home }, encoding: 'utf8', maxBuffer: 1 << 24 },
      (err, stdout, stderr) => {
        if (err) return fail(new Error(`mcp-inspector --cli ${name}: ${err.message} ${stderr}`));
        try { ok(JSON.parse(stdout)); } catch { fail(new Error(`mcp-inspector printed no JSON: ${stdout} ${stderr}`)); }
      });
    });
    await ninety({ callTool }, 'inspector', 2000); // a node process per call: ask less often
  });
});
