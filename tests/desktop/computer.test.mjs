// sandbox_computer through MCP (official SDK client) on a sandbox of the built-in
// 'desktop' template, on the desktop stack (tests/integration/stack ... desktop). The
// template is built by the stack's worker itself on the first create (createWhenBuilt
// waits through the product). A page served inside the sandbox, shown by Firefox ESR in
// kiosk mode (it fills the display: page pixels are display pixels): a button that turns
// the page green, an input box that reports what was typed on Enter, a tall body that
// reports scrolling (the page tells its own web server, whose log the test reads inside
// the sandbox).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, call, sh, env, until, createWhenBuilt } from '../e2e/lib.mjs';
import { decodePng, pngSize } from './png.mjs';
import { launchChromium } from '../e2e/browser.mjs';

let client, sb, plain, browser;

const page = `<!doctype html><html><head><meta charset="utf-8"><style>
html, body { margin: 0; background: rgb(0, 0, 255); height: 4000px; }
#go { position: fixed; left: 0; top: 100px; width: 400px; height: 300px; font-size: 40px; }
#box { position: fixed; left: 700px; top: 100px; width: 500px; height: 100px; font-size: 40px; }
</style></head><body>
<button id="go">Make it green</button><input id="box">
<script>
document.getElementById('go').onclick = () => {
  document.documentElement.style.background = document.body.style.background = 'rgb(0, 200, 0)';
  fetch('/clicked');
};
document.getElementById('box').onkeydown = (e) => {
  if (e.key === 'Enter') fetch('/typed?t=' + encodeURIComponent(e.target.value));
};
let told = 0;
window.onscroll = () => { if (!told && window.scrollY > 0) { told = 1; fetch('/scrolled?y=' + window.scrollY); } };
</script></body></html>`;

function image(r) {
  const img = (r.result.content ?? []).find((c) => c.type === 'image');
  return img ? Buffer.from(img.data, 'base64') : null;
}

async function computer(args, opts) {
  return call(client, 'sandbox_computer', { sandbox_id: sb, ...args }, opts);
}

// dark (text) pixels of a PNG in a box: the input box's glyphs on its white
function darkIn(png, x0, y0, x1, y1) {
  let n = 0;
  for (let y = y0; y < y1; y += 2) for (let x = x0; x < x1; x += 2) {
    const [r, g, b] = png.pixel(x, y);
    if (r + g + b < 300) n++;
  }
  return n;
}

async function serverLog() {
  return (await sh(client, sb, 'cat /tmp/page.log 2>/dev/null || true')).stdout;
}

before(async () => {
  client = await connect(env.SF_KEY_ALPHA, 'desktop-e2e');
  const r = await createWhenBuilt(client, { from_template: 'desktop' });
  assert.equal(r.isError, false, r.text);
  sb = r.structured.id;
  // the page and its server (its log says what the page reported)
  await call(client, 'sandbox_files_write', { sandbox_id: sb, path: '/root/page/index.html', content: page });
  await sh(client, sb, 'cd /root/page && python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/page.log 2>&1',
    { background: true });
  await until('the page server', async () => (await sh(client, sb,
    'curl -sf http://127.0.0.1:8000/ >/dev/null && echo up')).stdout.includes('up'), 20000, 200);
  const d = await sh(client, sb, 'echo "$DISPLAY"');
  assert.equal(d.stdout.trim(), ':0', 'sandbox_exec in a desktop sandbox has DISPLAY set');
  await sh(client, sb, 'firefox-esr --kiosk http://127.0.0.1:8000/ >/tmp/firefox.log 2>&1', { background: true });
  // the page is up once the display's middle is the page's blue
  await until('Firefox to show the page', async () => {
    const s = await computer({ action: 'screenshot' });
    if (s.isError) return false;
    const [r, g, b] = decodePng(image(s)).pixel(640, 400);
    return b > 200 && r < 60 && g < 60;
  }, 120000, 1000);
});

after(async () => {
  if (sb) await call(client, 'sandbox_kill', { sandbox_id: sb });
  if (plain) await call(client, 'sandbox_kill', { sandbox_id: plain });
  await browser?.close();
  await client?.close();
});

test('screenshot: a PNG of the display, its size in structuredContent and the text', async () => {
  const r = await computer({ action: 'screenshot' });
  assert.equal(r.isError, false, r.text);
  assert.deepEqual(r.structured, { width: 1280, height: 800 });
  assert.equal(r.text, 'Took a screenshot (1280x800)');
  const img = r.result.content.find((c) => c.type === 'image');
  assert.equal(img.mimeType, 'image/png');
  assert.deepEqual(pngSize(Buffer.from(img.data, 'base64')), { width: 1280, height: 800 });
});

test('left_click on the button: the screenshot it answers with shows the page green', async () => {
  const r = await computer({ action: 'left_click', coordinate: [200, 250] });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Clicked the left button at (200, 250) (1280x800)');
  assert.deepEqual(r.structured, { width: 1280, height: 800 });
  let png = decodePng(image(r));
  // (the click's screenshot comes after the settle; a slow box may paint later)
  if (png.pixel(640, 400)[1] < 150) png = decodePng(image(await computer({ action: 'wait', duration_ms: 500 })));
  const [red, green, blue] = png.pixel(640, 400);
  assert.ok(green > 150 && red < 80 && blue < 80, `the page centre is green: ${[red, green, blue]}`);
  assert.match(await serverLog(), /GET \/clicked/);
});

test('type into the box, then key Return (alias enter too): the page got the text', async () => {
  let r = await computer({ action: 'left_click', coordinate: [950, 150], screenshot_after: false });
  assert.equal(r.isError, false, r.text);
  assert.equal(image(r), null, 'screenshot_after: false answers without an image');
  assert.equal(r.text, 'Clicked the left button at (950, 150) (1280x800)');
  // (the box is empty but for its caret)
  const before = darkIn(decodePng(image(await computer({ action: 'screenshot' }))), 705, 115, 1000, 185);
  r = await computer({ action: 'type', text: 'hello desktop' });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Typed 13 characters (1280x800)');
  // the text is in the box on the screenshot the type answers with (or the next one)
  let typed = decodePng(image(r));
  if (darkIn(typed, 705, 115, 1000, 185) < before + 60) typed = decodePng(image(await computer({ action: 'wait', duration_ms: 500 })));
  const after = darkIn(typed, 705, 115, 1000, 185);
  assert.ok(after >= before + 60, `the typed text shows in the box (${before} dark samples before, ${after} after)`);
  r = await computer({ action: 'key', text: 'Return' });
  assert.equal(r.isError, false, r.text);
  await until('the page to report the text', async () => /GET \/typed\?t=hello%20desktop/.test(await serverLog()), 10000, 250);
  r = await computer({ action: 'key', text: 'ctrl+a BackSpace' });
  assert.equal(r.isError, false, r.text);
  await computer({ action: 'type', text: 'again' });
  r = await computer({ action: 'key', text: 'enter' });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Pressed enter (1280x800)');
  await until('the page to report the second text', async () => /GET \/typed\?t=again /.test(await serverLog()), 10000, 250);
});

test('scroll down over the page: the page scrolled', async () => {
  const r = await computer({ action: 'scroll', coordinate: [640, 600], scroll_direction: 'down', scroll_amount: 5 });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Scrolled down by 5 at (640, 600) (1280x800)');
  await until('the page to report scrolling', async () => /GET \/scrolled\?y=[1-9]/.test(await serverLog()), 10000, 250);
});

test('mouse_move, drag, mouse down and up, right/middle/double/triple clicks answer', async () => {
  for (const [args, text] of [
    [{ action: 'mouse_move', coordinate: [10, 790] }, 'Moved the mouse to (10, 790)'],
    [{ action: 'left_click_drag', start_coordinate: [600, 700], coordinate: [620, 710] }, 'Dragged from (600, 700) to (620, 710)'],
    [{ action: 'left_mouse_down', coordinate: [640, 700] }, 'Pressed the left button at (640, 700)'],
    [{ action: 'left_mouse_up' }, 'Released the left button'],
    [{ action: 'double_click', coordinate: [640, 700] }, 'Double-clicked the left button at (640, 700)'],
    [{ action: 'triple_click', coordinate: [640, 700] }, 'Triple-clicked the left button at (640, 700)'],
    [{ action: 'middle_click', coordinate: [640, 700] }, 'Clicked the middle button at (640, 700)'],
  ]) {
    const r = await computer({ ...args, screenshot_after: false });
    assert.equal(r.isError, false, r.text);
    assert.equal(r.text, `${text} (1280x800)`);
  }
  const r = await computer({ action: 'right_click', coordinate: [640, 700] });
  assert.equal(r.isError, false, r.text);
  await computer({ action: 'key', text: 'esc', screenshot_after: false }); // the context menu goes
});

test('errors: off-screen coordinates, unknown key names, missing fields', async () => {
  let r = await computer({ action: 'left_click', coordinate: [1280, 100] });
  assert.equal(r.isError, true);
  assert.match(r.text, /off the screen: the display is 1280x800, so x goes from 0 to 1279 and y from 0 to 799/);
  r = await computer({ action: 'mouse_move', coordinate: [5, 900] });
  assert.match(r.text, /off the screen/);
  r = await computer({ action: 'key', text: 'ctrl+nosuchkeyname' });
  assert.equal(r.isError, true);
  assert.match(r.text, /Unknown key name 'nosuchkeyname'.*Nothing was typed/);
  r = await computer({ action: 'key', text: 'ctrl+$(reboot)' });
  assert.match(r.text, /Unknown key name/);
  r = await computer({ action: 'mouse_move' });
  assert.match(r.text, /mouse_move needs coordinate/);
  r = await computer({ action: 'resize', width: 1001, height: 700 });
  assert.match(r.text, /multiple of 8/);
  r = await computer({ action: 'left_click', coordinate: [1, 2, 3] });
  assert.equal(r.isError, true);
});

test('key aliases cmd and win (super), esc: X knows them only translated', async () => {
  for (const text of ['cmd', 'win', 'esc']) {
    const r = await computer({ action: 'key', text, screenshot_after: false });
    assert.equal(r.isError, false, `${text}: ${r.text}`);
    assert.equal(r.text, `Pressed ${text} (1280x800)`);
  }
  await computer({ action: 'key', text: 'Escape', screenshot_after: false });
});

test('screenshots back to back (faster than one a second): none refused by the reply budget', async () => {
  for (let i = 0; i < 30; i++) {
    const r = await computer({ action: 'screenshot' });
    assert.equal(r.isError, false, `screenshot ${i}: ${r.text}`);
    assert.ok(image(r).length > 1000);
  }
});

test('wait: default 1 s, capped at 10 s', async () => {
  let t0 = Date.now();
  let r = await computer({ action: 'wait' });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Waited 1000 ms (1280x800)');
  assert.ok(Date.now() - t0 >= 1000);
  t0 = Date.now();
  r = await computer({ action: 'wait', duration_ms: 60000 });
  const took = Date.now() - t0;
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Waited 10000 ms (the most a wait takes) (1280x800)');
  assert.ok(took >= 10000 && took < 20000, `took ${took} ms`);
});

test('a paused desktop resumes for the next action', async () => {
  let r = await call(client, 'sandbox_pause', { sandbox_id: sb });
  assert.equal(r.isError, false, r.text);
  r = await computer({ action: 'screenshot' });
  assert.equal(r.isError, false, r.text);
  assert.ok(image(r));
});

test('resize 1024x768: the next screenshot is 1024x768', async () => {
  let r = await computer({ action: 'resize', width: 1024, height: 768 });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Resized the display to 1024x768 (1024x768)');
  assert.deepEqual(r.structured, { width: 1024, height: 768 });
  r = await computer({ action: 'screenshot' });
  assert.deepEqual(r.structured, { width: 1024, height: 768 });
  assert.deepEqual(pngSize(image(r)), { width: 1024, height: 768 });
  r = await computer({ action: 'left_click', coordinate: [1100, 10] });
  assert.match(r.text, /the display is 1024x768/);
  r = await computer({ action: 'resize', width: 1280, height: 800, screenshot_after: false });
  assert.equal(r.text, 'Resized the display to 1280x800 (1280x800)');
});

// A window of random pixels over the whole display (python3-xlib, in the template): the
// PNG of a noisy 4096x4096 display is ~64 MiB, past the 32 MiB cap.
const NOISE = `import os
from Xlib import X, display
d = display.Display(':0'); s = d.screen(); W, H = s.width_in_pixels, s.height_in_pixels
w = s.root.create_window(0, 0, W, H, 0, s.root_depth, override_redirect=True)
w.map(); d.sync()
gc = w.create_gc()
rows = max(1, 250000 // (W * 4))
for y in range(0, H, rows):
    n = min(rows, H - y)
    w.put_image(gc, 0, y, W, n, X.ZPixmap, s.root_depth, 0, os.urandom(W * n * 4))
d.sync()
open('/tmp/noise.ready', 'w').write('%dx%d' % (W, H))
while True:
    d.next_event()
`;

test('a screenshot past 32 MiB is downscaled to fit; size and coordinates stay in display pixels', async () => {
  let r = await computer({ action: 'resize', width: 4096, height: 4096, screenshot_after: false });
  assert.equal(r.isError, false, r.text);
  await call(client, 'sandbox_files_write', { sandbox_id: sb, path: '/tmp/noise.py', content: NOISE });
  await sh(client, sb, 'rm -f /tmp/noise.ready; exec python3 /tmp/noise.py', { background: true });
  try {
    await until('the noise to cover the display', async () =>
      (await sh(client, sb, 'cat /tmp/noise.ready 2>/dev/null || true')).stdout === '4096x4096', 120000, 500);
    const full = await sh(client, sb, 'DISPLAY=:0 scrot -o -q 60 /tmp/full.png && stat -c %s /tmp/full.png');
    assert.ok(Number(full.stdout) > 32 * 1024 * 1024, `the display's own PNG is ${full.stdout.trim()} bytes: past the cap`);
    r = await computer({ action: 'screenshot' }, { timeout: 300000 });
    assert.equal(r.isError, false, r.text);
    const png = image(r), size = pngSize(png);
    assert.ok(png.length <= 32 * 1024 * 1024, `the answer's PNG is ${png.length} bytes`);
    assert.ok(size.width < 4096 && size.height < 4096, `the PNG is downscaled (${size.width}x${size.height})`);
    assert.ok(size.width >= 1024, `and not needlessly small (${size.width}x${size.height})`);
    assert.deepEqual(r.structured, { width: 4096, height: 4096 });
    assert.equal(r.text, 'Took a screenshot (4096x4096)');
    // coordinates are the display's: past the PNG's own size, still on the display
    r = await computer({ action: 'mouse_move', coordinate: [4000, 4000], screenshot_after: false });
    assert.equal(r.isError, false, r.text);
    assert.equal((await sh(client, sb, 'DISPLAY=:0 xdotool getmouselocation --shell | head -2 | tr "\\n" " "')).stdout.trim(), 'X=4000 Y=4000');
  } finally {
    await sh(client, sb, 'pkill -f /tmp/noise.py; rm -f /tmp/full.png');
    r = await computer({ action: 'resize', width: 1280, height: 800, screenshot_after: false });
    assert.equal(r.isError, false, r.text);
  }
});

test('a sandbox that is not a desktop: the error names its template and the desktop one', async () => {
  const r = await call(client, 'sandbox_create', { from_template: 'base' });
  assert.equal(r.isError, false, r.text);
  plain = r.structured.id;
  const c = await call(client, 'sandbox_computer', { sandbox_id: plain, action: 'screenshot' });
  assert.equal(c.isError, true);
  assert.match(c.text, /was made from the 'base' template, which has no desktop: .*from_template 'desktop'/);
});

// ---- stream_url: noVNC in real headless Chromium, through the gateway's preview host and
// the worker's ingress into the sandbox's websockify (a public sandbox first, then private)

// the canvas noVNC draws the desktop on, its framebuffer pixel at (x, y)
const canvasPixel = (page, x, y) => page.evaluate(([x, y]) => {
  const c = document.querySelector('#noVNC_container canvas');
  return c && c.width ? Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3)) : null;
}, [x, y]);

// dark (text) pixels of the canvas along the row y from x0 to x1
const canvasDark = (page, x0, x1, y) => page.evaluate(([x0, x1, y]) => {
  const c = document.querySelector('#noVNC_container canvas');
  if (!c || !c.width) return 0;
  const d = c.getContext('2d').getImageData(x0, y, x1 - x0, 1).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] + d[i + 1] + d[i + 2] < 300) n++;
  return n;
}, [x0, x1, y]);

async function openView(url, what) {
  browser ??= await launchChromium();
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
  const res = await page.goto(url);
  assert.equal(res.status(), 200, `${what}: the viewer's page loads`);
  await page.waitForSelector('html.noVNC_connected', { timeout: 30000 });
  // it shows the desktop: the canvas's centre is the display's (the page Firefox shows)
  const ref = decodePng(image(await computer({ action: 'screenshot' }))).pixel(640, 400);
  await until(`${what}: the canvas to show the desktop`, async () => {
    const p = await canvasPixel(page, 640, 400);
    return p && p.every((v, i) => Math.abs(v - ref[i]) < 40) && p.some((v) => v > 60);
  }, 30000, 250);
  return page;
}

// framebuffer (x, y) -> the page's coordinates over the (scaled) canvas
async function onCanvas(page, x, y) {
  const box = await page.locator('#noVNC_container canvas').boundingBox();
  return [box.x + (x + 0.5) * box.width / 1280, box.y + (y + 0.5) * box.height / 800];
}

const pointer = async () => {
  const m = /x:(\d+) y:(\d+)/.exec((await sh(client, sb, 'xdotool getmouselocation')).stdout);
  return [Number(m[1]), Number(m[2])];
};

test('stream_url: a live noVNC view in headless Chromium shows the desktop and drives it', async () => {
  const r = await computer({ action: 'stream_url' });
  assert.equal(r.isError, false, r.text);
  assert.equal(image(r), null, 'stream_url answers with no image');
  const { url, view_only, expires_at } = r.structured;
  assert.equal(view_only, false);
  assert.equal(expires_at, undefined, 'a public sandbox\'s view does not expire');
  assert.match(url, new RegExp(`^http://6080-${sb.replace('_', '-')}\\.preview\\.localhost:\\d+/vnc\\.html\\?`));
  assert.doesNotMatch(url, /password|sf_token/i, 'no secret in the URL');
  assert.equal(r.text, url);
  const page = await openView(url, 'the interactive view');
  // the viewer's pointer moves the desktop's
  const [px, py] = await onCanvas(page, 1000, 500);
  await page.mouse.move(px, py);
  await until('the desktop pointer to follow the viewer\'s', async () => {
    const [x, y] = await pointer();
    return Math.abs(x - 1000) <= 3 && Math.abs(y - 500) <= 3;
  }, 15000, 250);
  // and its keys type into the page: click the input box on the canvas, type, Enter
  await computer({ action: 'triple_click', coordinate: [950, 150], screenshot_after: false });
  await computer({ action: 'key', text: 'BackSpace', screenshot_after: false });
  const [bx, by] = await onCanvas(page, 950, 150);
  await page.mouse.click(bx, by);
  await page.keyboard.type('viastream');
  await page.keyboard.press('Enter');
  await until('the page to report the text typed in the viewer', async () =>
    /GET \/typed\?t=viastream /.test(await serverLog()), 15000, 250);
  await page.context().close();
});

test('stream_url view_only: the view shows the desktop; its clicks and keys reach nothing', async () => {
  const r = await computer({ action: 'stream_url', view_only: true });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.structured.view_only, true);
  assert.match(r.structured.url, new RegExp(`^http://6081-${sb.replace('_', '-')}\\.preview\\.localhost:\\d+/vnc\\.html\\?.*view_only=1`));
  await (await openView(r.structured.url, 'the view-only view')).context().close();
  // noVNC's view_only=1 only stops the page sending input; a viewer may edit the URL, so
  // the edited page sends its clicks and keys, and the filter in the sandbox must drop them
  const page = await openView(r.structured.url.replace('&view_only=1', ''), 'the edited view-only view');
  // the box focused and empty, the pointer parked on it
  await computer({ action: 'triple_click', coordinate: [950, 150], screenshot_after: false });
  await computer({ action: 'key', text: 'BackSpace', screenshot_after: false });
  const parked = await pointer();
  const [px, py] = await onCanvas(page, 300, 600);
  await page.mouse.move(px, py);
  await page.mouse.click(px, py);
  await page.keyboard.type('zzz');
  await page.keyboard.press('Enter');
  // then the agent types; once the view shows that text, anything the viewer sent before
  // it (same connection, in order) would have reached the display already
  await computer({ action: 'type', text: 'MMMMMMMM', screenshot_after: false });
  await until('the view to show the agent\'s text', async () => await canvasDark(page, 705, 1000, 150) >= 5, 20000, 300);
  assert.deepEqual(await pointer(), parked, 'the viewer did not move the desktop pointer');
  await computer({ action: 'key', text: 'Return', screenshot_after: false });
  await until('the page to report the agent\'s text', async () => /GET \/typed\?t=MMMMMMMM /.test(await serverLog()), 15000, 250);
  assert.doesNotMatch(await serverLog(), /zzz/, 'the viewer typed nothing');
  await page.context().close();
});

test('stream_url on a private sandbox: a signed, expiring link traded for a cookie; nothing without it', async () => {
  // ports published before keep their mode: close them so the new links follow the policy
  let r = await call(client, 'sandbox_update', { sandbox_id: sb, preview_access: 'private', preview_close: [6080, 6081] });
  assert.equal(r.isError, false, r.text);
  r = await computer({ action: 'stream_url' });
  assert.equal(r.isError, false, r.text);
  const { url, expires_at, view_only } = r.structured;
  assert.equal(view_only, false);
  const left = Date.parse(expires_at) - Date.now();
  assert.ok(left > 3500000 && left <= 3600000, `the link lasts an hour: ${expires_at}`);
  assert.match(url, /[?&]sf_token=v1\./);
  assert.doesNotMatch(url, /password/i);
  const page = await openView(url, 'the private view');
  assert.doesNotMatch(page.url(), /sf_token/, 'the token left the address bar for a cookie');
  await page.context().close();
  // the same page without the link, in a fresh browser context: refused
  const bare = await (await browser.newContext()).newPage();
  const res = await bare.goto(url.replace(/&sf_token=[^&]*/, ''));
  assert.equal(res.status(), 403);
  await bare.context().close();
  r = await call(client, 'sandbox_update', { sandbox_id: sb, preview_access: 'public', preview_close: [6080, 6081] });
  assert.equal(r.isError, false, r.text);
});

// (last: it leaves the sandbox's action budget spent)
test('actions are rate-limited per sandbox', async () => {
  const rs = await Promise.all(Array.from({ length: 40 }, () =>
    computer({ action: 'mouse_move', coordinate: [700, 700], screenshot_after: false })));
  const refused = rs.filter((r) => r.isError);
  assert.ok(refused.length > 0, 'some of 40 actions at once are refused');
  const other = refused.filter((r) => !/Too many sandbox_computer actions/.test(r.text));
  assert.deepEqual(other.map((r) => r.text), [], 'refused only by the rate limit');
  assert.ok(rs.length - refused.length >= 20, `a burst of 20 is allowed (${rs.length - refused.length} of 40 were)`);
  assert.match(refused[0].text, /Too many sandbox_computer actions on sandbox .* retry in \d+ ms/);
  await until('the rate limit to let actions through again', async () =>
    !(await computer({ action: 'mouse_move', coordinate: [700, 700], screenshot_after: false })).isError, 5000, 200);
});
