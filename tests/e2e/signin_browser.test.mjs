// The OAuth sign-in page in a real browser: Debian's headless Chromium, driven by
// playwright-core (no bundled browser). The page renders (screenshot kept as a test artifact
// under the build folder, outside git), the form works (a person types a team key, approves,
// and the browser lands on the client's redirect URI with a code that trades for tokens);
// a post without the CSRF token is refused, as is one from another site (the SameSite=Strict
// cookie does not come along); the page sends frame-ancestors 'none' and the browser indeed
// refuses to show it inside another site's frame.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdirSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { launchChromium } from './browser.mjs';
import { env, url } from './lib.mjs';

const base = new URL(url).origin; // http://127.0.0.1:PORT
const artifacts = resolve(env.SF_BUILD, 'test-artifacts');
let browser, site, siteUrl, otherSite;
const callbacks = [];

// The client's own web server (its redirect URI) and, under the name localhost (another
// site than 127.0.0.1), an attacker's pages.
function startSite() {
  return new Promise((ok) => {
    site = http.createServer((req, res) => {
      const u = new URL(req.url, 'http://x');
      if (u.pathname === '/callback') {
        callbacks.push(u.searchParams);
        res.writeHead(200, { 'Content-Type': 'text/html' }).end('<h1>Back at the client</h1>');
      } else if (u.pathname === '/frame') {
        res.writeHead(200, { 'Content-Type': 'text/html' })
          .end(`<h1>evil</h1><iframe id="f" src="${u.searchParams.get('src')}"></iframe>`);
      } else if (u.pathname === '/forge') { // a cross-site form post with a copied token
        res.writeHead(200, { 'Content-Type': 'text/html' }).end(
          `<form id="f" method="post" action="${base}/oauth/authorize">` +
          `<input name="csrf" value="${u.searchParams.get('csrf')}"><input name="api_key" value="${env.SF_KEY_ALPHA}">` +
          '<input name="decision" value="approve"><button>go</button></form>');
      } else {
        res.writeHead(404).end();
      }
    });
    site.listen(0, '127.0.0.1', () => {
      siteUrl = `http://127.0.0.1:${site.address().port}`;
      otherSite = `http://localhost:${site.address().port}`;
      ok();
    });
  });
}

async function newSignIn() {
  const redirect = `${siteUrl}/callback`;
  const r = await fetch(`${base}/oauth/register`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_name: 'Browser test <app>', redirect_uris: [redirect] }) });
  assert.equal(r.status, 201);
  const client = await r.json();
  const verifier = randomBytes(32).toString('base64url');
  const challenge = createHash('sha256').update(verifier).digest('base64url');
  const authUrl = `${base}/oauth/authorize?${new URLSearchParams({ response_type: 'code',
    client_id: client.client_id, redirect_uri: redirect, code_challenge: challenge,
    code_challenge_method: 'S256', state: 'browser', resource: url })}`;
  return { client, verifier, redirect, authUrl };
}

before(async () => {
  await startSite();
  browser = await launchChromium();
});
after(async () => {
  await browser?.close();
  site?.close();
});

test('the sign-in page renders, and the form signs in and goes back to the client', async () => {
  const { client, verifier, redirect, authUrl } = await newSignIn();
  const context = await browser.newContext();
  const page = await context.newPage();
  const res = await page.goto(authUrl);
  assert.equal(res.status(), 200);
  const headers = res.headers();
  assert.match(headers['content-security-policy'], /frame-ancestors 'none'/);
  assert.equal(headers['x-frame-options'], 'DENY');
  assert.equal(await page.title(), 'Sign in to sandfleet');
  assert.match(await page.textContent('body'), /Browser test <app> asks to use your team's sandboxes/);
  assert.ok(await page.isVisible('input[name="api_key"][type="password"]'));
  mkdirSync(artifacts, { recursive: true });
  const shot = resolve(artifacts, 'oauth-signin.png');
  await page.screenshot({ path: shot, fullPage: true });
  assert.ok(statSync(shot).size > 1000, 'a screenshot of the page');
  console.log(`screenshot: ${shot}`);

  // a wrong key: the page again, with a sentence
  await page.fill('input[name="api_key"]', 'sf_live_' + 'q'.repeat(32));
  await Promise.all([page.waitForLoadState('load'), page.click('button[value="approve"]')]);
  await page.waitForSelector('.err');
  assert.match(await page.textContent('.err'), /That API key is not valid/);

  // the right key: back at the client with a code and the state
  await page.fill('input[name="api_key"]', env.SF_KEY_ALPHA);
  await Promise.all([page.waitForURL(`${redirect}**`), page.click('button[value="approve"]')]);
  assert.equal(await page.textContent('h1'), 'Back at the client');
  const back = callbacks.at(-1);
  assert.equal(back.get('state'), 'browser');
  assert.equal(back.get('iss'), base);
  const t = await fetch(`${base}/oauth/token`, { method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', code: back.get('code'),
      client_id: client.client_id, redirect_uri: redirect, code_verifier: verifier, resource: url }) });
  assert.equal(t.status, 200);
  assert.match((await t.json()).access_token, /^sf_at_/);
  await context.close();
});

test('a post without the CSRF token, or from another site, is refused', async () => {
  const { authUrl } = await newSignIn();
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(authUrl);
  const csrf = await page.getAttribute('input[name="csrf"]', 'value');
  assert.match(csrf, /^[A-Za-z0-9_-]{43}$/);

  // same page, token field removed: the cookie comes along, the token does not
  await page.evaluate(() => document.querySelector('input[name="csrf"]').remove());
  await page.fill('input[name="api_key"]', env.SF_KEY_ALPHA);
  const [refused] = await Promise.all([page.waitForNavigation(), page.click('button[value="approve"]')]);
  assert.equal(refused.status(), 403);
  assert.match(await page.textContent('body'), /did not come from the sign-in page/);

  // another site posts the (copied) token: the SameSite=Strict cookie stays behind
  await page.goto(authUrl);
  const csrf2 = await page.getAttribute('input[name="csrf"]', 'value');
  await page.goto(`${otherSite}/forge?csrf=${csrf2}`);
  const [forged] = await Promise.all([page.waitForNavigation(), page.click('button')]);
  assert.equal(forged.status(), 403);
  assert.match(await page.textContent('body'), /did not come from the sign-in page/);
  assert.equal(callbacks.filter((c) => c.get('state') === 'browser').length, 1,
    'no code went anywhere but from the first test');
  await context.close();
});

test('another site cannot frame the sign-in page (frame-ancestors none)', async () => {
  const { authUrl } = await newSignIn();
  const context = await browser.newContext();
  const page = await context.newPage();
  let framed = null;
  page.on('response', (r) => { if (r.url().startsWith(`${base}/oauth/authorize`)) framed = r; });
  await page.goto(`${otherSite}/frame?src=${encodeURIComponent(authUrl)}`);
  // the frame's document was fetched but the browser refused to render it
  const deadline = Date.now() + 15000;
  while (!framed && Date.now() < deadline) await page.waitForTimeout(50);
  assert.ok(framed, 'the browser fetched the framed page');
  assert.match(framed.headers()['content-security-policy'], /frame-ancestors 'none'/);
  const frame = page.frames().find((f) => f !== page.mainFrame());
  assert.ok(frame, 'the other site has its frame');
  let text = '';
  try { text = await frame.evaluate(() => document.body?.innerText ?? ''); } catch { /* blocked */ }
  assert.doesNotMatch(text, /Sign in to sandfleet/, 'the page must not render inside a frame');
  await context.close();
});
