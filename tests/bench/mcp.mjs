// What the MCP benches share: one session over plain fetch (keep-alive, as the SDK does,
// without the SDK's own cost), and the latency figures of a list of timings.
import { env, url } from '../e2e/lib.mjs';

const headers = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
  Authorization: `Bearer ${env.SF_KEY_ALPHA}` };
let seq = 0;

// A JSON-RPC call on the session; a JSON-RPC error, or a tool error when `toolErrors`, throws.
export async function rpc(method, params, toolErrors = true) {
  const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: ++seq, method, params }) });
  const j = await res.json();
  if (j.error || (toolErrors && j.result?.isError)) throw new Error(JSON.stringify(j).slice(0, 400));
  return j.result;
}
export const tool = (name, args) => rpc('tools/call', { name, arguments: args });

const init = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'bench', version: '1' } } }) });
headers['Mcp-Session-Id'] = init.headers.get('mcp-session-id');
headers['MCP-Protocol-Version'] = '2025-06-18';

// p50, p90, p99 and mean (ms) of the timings t.
export function stats(label, t) {
  t.sort((a, b) => a - b);
  const q = (p) => t[Math.min(t.length - 1, Math.floor(p * t.length))];
  return { label, n: t.length, p50: q(0.5), p90: q(0.9), p99: q(0.99), mean: t.reduce((a, b) => a + b, 0) / t.length };
}

// Times fn `count` times after `warm` untimed rounds; before(), if given, runs untimed
// ahead of each call.
export async function measure(label, count, fn, before = async () => {}, warm = 3) {
  for (let i = 0; i < Math.min(warm, count); i++) { await before(); await fn(); }
  const t = [];
  for (let i = 0; i < count; i++) {
    await before();
    const s = process.hrtime.bigint();
    await fn();
    t.push(Number(process.hrtime.bigint() - s) / 1e6);
  }
  return stats(label, t);
}
