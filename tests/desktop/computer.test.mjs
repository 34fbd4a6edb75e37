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

let client, sb, plain;

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
  r = await computer({ action: 'type', text: 'hello desktop' });
  assert.equal(r.isError, false, r.text);
  assert.equal(r.text, 'Typed 13 characters (1280x800)');
  assert.ok(image(r));
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

test('a sandbox that is not a desktop: the error names its template and the desktop one', async () => {
  const r = await call(client, 'sandbox_create', { from_template: 'base' });
  assert.equal(r.isError, false, r.text);
  plain = r.structured.id;
  const c = await call(client, 'sandbox_computer', { sandbox_id: plain, action: 'screenshot' });
  assert.equal(c.isError, true);
  assert.match(c.text, /was made from the 'base' template, which has no desktop: .*from_template 'desktop'/);
});
