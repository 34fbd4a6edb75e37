// The fault suite's load: MCP tools/call over plain HTTP/1.1 JSON-RPC (no session) to
// the fleet's gateways, and a side-effect ledger: every exec appends its call id to
// /tmp/ledger in its sandbox, so a test can count how often each call really ran.
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import http from 'node:http';

export function fleetEnv(state) {
  return Object.fromEntries(readFileSync(`${state}/env`, 'utf8').trim().split('\n').map((l) => {
    const i = l.indexOf('=');
    return [l.slice(0, i), l.slice(i + 1)];
  }));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One tools/call. { ok, isError, text, structured, status, ms } or { neterr, ms }.
export async function mcall(url, key, name, args, { timeoutMs = 60000, meta } = {}) {
  const t0 = Date.now();
  const params = { name, arguments: args };
  if (meta) params._meta = meta;
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers: {
        Authorization: `Bearer ${key}`,
        'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream',
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const body = await res.text();
    const ms = Date.now() - t0;
    let j = null;
    try { j = JSON.parse(body); } catch { /* SSE or not JSON */ }
    if (!j) {
      const line = body.split('\n').reverse().find((l) => l.startsWith('data: {'));
      try { j = line ? JSON.parse(line.slice(6)) : null; } catch { j = null; }
    }
    const r = j?.result;
    const text = r ? (r.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('')
      : (j?.error?.message ?? body.slice(0, 300));
    return { ok: !!r && !r.isError, isError: !r || !!r.isError, text, structured: r?.structuredContent,
      status: res.status, ms, retryAfter: res.headers.get('retry-after') };
  } catch (e) {
    return { neterr: String(e.cause?.code ?? e.name ?? e), ms: Date.now() - t0 };
  }
}

// Load: one loop per sandbox, each sending `echo ID >> /tmp/ledger` through the gateways
// in turn, until stop() is called. Every call is recorded.
export function startLoad(urls, key, sandboxes, { prefix = 'c', timeoutMs = 5000 } = {}) {
  const calls = [];
  let running = true;
  let seq = 0;
  const loops = sandboxes.map(async (sb, i) => {
    while (running) {
      const id = `${prefix}${i}x${seq++}`;
      const url = urls[seq % urls.length];
      const rec = { id, sb, url, t: Date.now() };
      calls.push(rec);
      rec.r = await mcall(url, key, 'sandbox_exec',
        { sandbox_id: sb, command: `echo ${id} >> /tmp/ledger`, timeout_ms: timeoutMs },
        { timeoutMs: timeoutMs + 20000 });
      if (rec.r.neterr || rec.r.isError) await sleep(50);
    }
  });
  return {
    calls,
    async stop() { running = false; await Promise.all(loops); return calls; },
  };
}

// Polls fn() until it returns true (deadline in ms); how long it took, or -1.
export async function until(fn, deadlineMs = 30000, stepMs = 100) {
  const t0 = Date.now();
  while (Date.now() - t0 < deadlineMs) {
    if (await fn()) return Date.now() - t0;
    await sleep(stepMs);
  }
  return -1;
}

// (on a Redis Cluster's URL, the first of its seeds that answers, following redirects)
export function redis(env, ...args) {
  const seeds = env.SF_REDIS_URL.replace(/^redis:\/\//, '').split(',');
  for (const [i, s] of seeds.entries()) {
    try {
      return execFileSync('redis-cli', ['-c', '-u', `redis://${s}`, ...args],
        { stdio: ['ignore', 'pipe', 'pipe'] }).toString().trim();
    } catch (e) {
      if (i === seeds.length - 1) throw e;
    }
  }
}

// One tools/call on a connection of its own (node:http, no keep-alive pool), so a test
// can tell "refused before it was accepted" (ECONNREFUSED) from "cut after" (a reset).
export function hcall(url, key, name, args, { timeoutMs = 60000 } = {}) {
  const t0 = Date.now();
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, arguments: args } });
  return new Promise((resolve) => {
    const req = http.request(url, {
      method: 'POST', agent: false, timeout: timeoutMs,
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream', 'Content-Length': Buffer.byteLength(body) },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        let j = null;
        try { j = JSON.parse(text); } catch { /* not JSON */ }
        const r = j?.result;
        resolve({ ok: !!r && !r.isError, isError: !r || !!r.isError, status: res.statusCode,
          text: r ? (r.content ?? []).map((c) => c.text).join('') : (j?.error?.message ?? text),
          structured: r?.structuredContent, ms: Date.now() - t0 });
      });
      res.on('error', (e) => resolve({ neterr: e.code ?? String(e), ms: Date.now() - t0 }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve({ neterr: e.code ?? String(e), ms: Date.now() - t0 }));
    req.end(body);
  });
}
