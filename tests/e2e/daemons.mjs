// Daemons a suite starts for itself (its own Redis, embedded broker, gateway, scheduler),
// where the shared stack will not do (a network namespace of its own, a fake host). Each is
// ended with the suite, and its stderr kept to show when it fails or a sanitizer spoke.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { waitFor } from './bridge.mjs';

export function daemons(build) {
  const procs = [];

  function start(name, cmd, args, env) {
    const p = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
    p.log = '';
    p.stderr.on('data', (d) => { p.log += d; });
    p.done = new Promise((r) => p.on('exit', r));
    p.label = name;
    procs.push(p);
    return p;
  }

  // Redis on redisPort and the embedded broker (its address in dir/kafka), both answering:
  // the brokers' address.
  async function storeAndBroker(dir, redisPort) {
    start('redis', 'redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '',
      '--appendonly', 'no', '--dir', dir], {});
    start('kafka', resolve(build, 'ops/sandfleet-kafka'), ['--bootstrap-file', `${dir}/kafka`], {});
    await waitFor('the embedded broker', () => { try { return readFileSync(`${dir}/kafka`, 'utf8').trim(); } catch { return ''; } });
    await waitFor('redis', () => {
      try { execFileSync('redis-cli', ['-p', String(redisPort), 'ping']); return true; } catch { return false; }
    });
    return readFileSync(`${dir}/kafka`, 'utf8').trim();
  }

  // Waits for gateway process gw to be ready at origin (Redis connected, Kafka reachable).
  async function gatewayReady(gw, origin) {
    await waitFor('the gateway', async () => {
      assert.equal(gw.exitCode, null, `the gateway exited: ${gw.log}`);
      try { return (await fetch(`${origin}/readyz`)).ok; } catch { return false; }
    });
  }

  // Ends them all, last started first; then no sanitizer report in any one's stderr.
  async function stopAll() {
    for (const p of [...procs].reverse()) {
      p.kill('SIGTERM');
      await p.done;
    }
    for (const p of procs)
      assert.doesNotMatch(p.log, /AddressSanitizer|LeakSanitizer|runtime error:/, `${p.label}: ${p.log}`);
  }

  return { procs, start, storeAndBroker, gatewayReady, stopAll };
}
