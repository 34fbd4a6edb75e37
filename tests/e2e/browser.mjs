// Headless Chromium for the suites where a person would look (playwright-core, installed with
// the e2e suites; Debian's chromium). launchChromium() is chromium.launch with what every
// suite needs: --no-sandbox (root in CI: Chromium's own sandbox needs an unprivileged user),
// and page.goto that tries again when Chromium aborted the navigation with
// net::ERR_NETWORK_CHANGED. That error is this machine's, not the platform's: Chromium
// watches the host's interfaces, and every sandbox created or killed adds or removes one (a
// person's browser shows the same error page and reloads).
import { createRequire } from 'node:module';

export const { chromium } = createRequire(new URL('./package.json', import.meta.url))('playwright-core');

function steadyGoto(page) {
  const goto = page.goto.bind(page);
  page.goto = async (url, opts) => {
    for (let tries = 1; ; tries++) {
      try {
        return await goto(url, opts);
      } catch (e) {
        if (tries >= 5 || !/net::ERR_NETWORK_CHANGED/.test(String(e?.message))) throw e;
      }
    }
  };
  return page;
}

function steadyContext(ctx) {
  const newPage = ctx.newPage.bind(ctx);
  ctx.newPage = async (...a) => steadyGoto(await newPage(...a));
  return ctx;
}

export async function launchChromium(opts = {}) {
  const b = await chromium.launch({ executablePath: process.env.SF_CHROMIUM ?? '/usr/bin/chromium',
    ...opts, args: ['--no-sandbox', ...(opts.args ?? [])] });
  const newContext = b.newContext.bind(b), newPage = b.newPage.bind(b);
  b.newContext = async (...a) => steadyContext(await newContext(...a));
  b.newPage = async (...a) => steadyGoto(await newPage(...a));
  return b;
}
