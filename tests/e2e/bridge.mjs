// Shared by the client-side suites: `sandfleet mcp-stdio` started by the official SDK's
// StdioClientTransport (as Claude Desktop and other stdio-only clients start it), and
// waiting for conditions (never fixed sleeps).
import { resolve } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

export const sandfleetBin = (build) => resolve(build, 'cli/sandfleet');

// A bridge to `url` with `key` in SANDFLEET_API_KEY (undefined: unset). Its stderr is kept
// in b.stderr. Connect with `await b.client.connect(b.transport)`.
export function bridge(bin, url, key, { args = ['-v'] } = {}) {
  const env = { PATH: process.env.PATH, SF_HOME: '/nonexistent' };
  for (const k of ['ASAN_OPTIONS', 'UBSAN_OPTIONS', 'LSAN_OPTIONS', 'HOME'])
    if (process.env[k]) env[k] = process.env[k];
  if (key !== undefined) env.SANDFLEET_API_KEY = key;
  const transport = new StdioClientTransport({
    command: bin, args: ['mcp-stdio', url, ...args], env, stderr: 'pipe',
  });
  const b = {
    transport,
    client: new Client({ name: 'sandfleet-stdio-e2e', version: '1.0.0' }),
    stderr: '',
    exited: null,
  };
  transport.stderr.on('data', (d) => { b.stderr += d; });
  return b;
}

export async function waitFor(what, cond, ms = 30000) { // generous: CI machines are shared
  const end = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const alive = (pid) => {
  try { process.kill(pid, 0); return true; } catch { return false; }
};

// Closes the client (stdin ends), waits for the bridge to exit by itself, and checks that
// its stderr holds no sanitizer report.
export async function finish(b) {
  const pid = b.transport.pid;
  await b.client.close();
  if (pid) await waitFor('the bridge to exit', () => !alive(pid), 10000);
  if (/stopping \(signal/.test(b.stderr))
    throw new Error(`mcp-stdio did not exit when its stdin ended:\n${b.stderr}`);
  if (/AddressSanitizer|LeakSanitizer|runtime error:/.test(b.stderr))
    throw new Error(`sanitizer report from mcp-stdio:\n${b.stderr}`);
}
