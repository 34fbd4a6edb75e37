// Shared by the end-to-end suites: the stack's addresses and keys, and MCP clients
// built with the official TypeScript SDK (StreamableHTTPClientTransport + bearer header).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const state = process.env.SF_E2E_STATE;
if (!state) throw new Error('SF_E2E_STATE is not set: run these through ctest (ops/test)');
export const env = Object.fromEntries(
  readFileSync(`${state}/env`, 'utf8').trim().split('\n').map((l) => {
    const i = l.indexOf('=');
    return [l.slice(0, i), l.slice(i + 1)];
  }));
export const url = env.SF_URL;
// The isolation driver of the stack's worker: 'jail' or 'qemu' (the suites run on both).
export const driver = env.SF_DRIVER ?? 'jail';

export async function connect(key, name = 'sandfleet-e2e') {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
  const client = new Client({ name, version: '1.0.0' });
  await client.connect(transport);
  return client;
}

// Calls a tool and returns { result, structured, text }.
export async function call(client, name, args = {}, opts = {}) {
  // With onprogress the call carries a progressToken: the gateway answers with an SSE stream
  // at once and a progress beat every 15 s, so a long call never hits a header timeout.
  const params = { name, arguments: args, ...(opts.meta ? { _meta: opts.meta } : {}) };
  const result = await client.callTool(params, undefined,
    { timeout: opts.timeout ?? 120000,
      ...(opts.onprogress ? { onprogress: opts.onprogress, resetTimeoutOnProgress: true } : {}) });
  const text = (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');
  return { result, structured: result.structuredContent, text, isError: !!result.isError };
}

// Runs a command and insists it worked at the MCP level.
// (The suites wait for their commands, as a client known to wait does: detach_after_ms 0,
// unless a call says otherwise; e2e.longcall tests the detach.)
export async function sh(client, sandbox_id, command, extra = {}) {
  const r = await call(client, 'sandbox_exec', { sandbox_id, command, detach_after_ms: 0, ...extra });
  if (!r.structured) throw new Error(`exec gave no structured result: ${r.text}`);
  return r.structured;
}

// A raw JSON-RPC POST (for what the SDK will not send).
export async function post(body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      ...headers,
    },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}

export const bearer = (key) => ({ Authorization: `Bearer ${key}` });

// Polls fn() every `every` ms until it returns something truthy (returned), or throws after ms.
export async function until(what, fn, ms = 15000, every = 100) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every));
  }
}

// The sandfleet CLI against the stack's Redis and secrets key; its stdout (a failure fails the test).
export function cli(args, input) {
  const r = spawnSync(`${env.SF_BUILD}/cli/sandfleet`, args, {
    input, encoding: 'utf8',
    env: { ...process.env, SF_REDIS_URL: env.SF_REDIS_URL, SF_SECRETS_KEY_FILE: env.SF_SECRETS_KEY_FILE },
  });
  assert.equal(r.status, 0, `sandfleet ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

// sandbox_create that waits through the product for a template still being built: the
// first create of a stack's 'debian' waits for the worker's own build (the scheduler's
// template_wait_s, with progress beats that keep the call alive); past that wait the
// answer is "still being built, about N s left" and the create is sent again, until
// deadlineMs. Returns the last answer (check isError).
export async function createWhenBuilt(client, args, deadlineMs = 1200000) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const r = await call(client, 'sandbox_create', args, { timeout: 900000, onprogress: () => {} });
    if (!r.isError || !/still being built/.test(r.text) || Date.now() > end) return r;
    await new Promise((res) => setTimeout(res, 2000));
  }
}
