// Shared by the preview suites (issue 22): preview addresses, link tokens and hop lines
// computed the way the contract says (docs/internals/preview.md), and raw HTTP/1.1 requests
// to a gateway with a chosen Host (Node's resolver does not know *.localhost; browsers do).
import { createHmac, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { env } from '../e2e/lib.mjs';

export const gwPort = Number(new URL(env.SF_URL).port);
export const authSecret = Buffer.from(readFileSync(env.SF_AUTH_SECRET_FILE, 'utf8').trim().slice(0, 64), 'hex');

// sf_host_job_key (common/sf_jobauth.c)
export const hostKey = (host) =>
  createHmac('sha256', authSecret).update(`sandfleet host job key v1\n${host}`).digest();

export const label = (id) => id.replace('_', '-');
export const previewHost = (id, port, gw = gwPort) => `${port}-${label(id)}.preview.localhost:${gw}`;

// A private link's token (contract 4), as the worker makes them.
export function makeToken(key, id, port, epoch, exp, nonce = randomBytes(8).toString('hex')) {
  const mac = createHmac('sha256', key)
    .update(`sandfleet-preview-link-v1\n${id}\n${port}\n${epoch}\n${exp}\n${nonce}`).digest('hex');
  return `v1.${id}.${port}.${epoch}.${exp}.${nonce}.${mac}`;
}

export function hopMac(key, id, port, epoch, iat, nonce) {
  return createHmac('sha256', key)
    .update(`sandfleet-preview-hop-v1\n${id}\n${port}\n${epoch}\n${iat}\n${nonce}`).digest('hex');
}

// One request on its own connection to 127.0.0.1:port with these headers (Host among
// them); resolves { status, headers, body (Buffer) }.
export function request(port, { method = 'GET', path = '/', headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, headers, agent: false },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers,
          body: Buffer.concat(chunks) }));
        res.on('error', reject);
      });
    req.on('error', reject);
    if (body !== undefined) req.end(body); else req.end();
  });
}

// Chromium through playwright-core, installed with the e2e suites (tests/e2e/browser.mjs).
export { chromium } from '../e2e/browser.mjs';
