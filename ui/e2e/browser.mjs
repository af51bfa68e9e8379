#!/usr/bin/env node
// End-to-end test in headless Chromium: the built web UI served by the real
// `bumblehive serve`, against the scripted model server (mock-model.mjs).
//
//   node ui/e2e/browser.mjs          (E2E_NO_BUILD=1 skips `npm run build` / `cargo build`)
//
// Screenshots and logs go to test-output/e2e-browser/. Prints "N passed, N failed";
// exits non-zero on failure.

import { createWriteStream, existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { flowSteps } from './flow.mjs';
import { TARGET_DIR, UI_DIR, check, createRunner, firstLine, outputDir, run, scratch, start, stopAll } from './lib.mjs';
import { startMockModel } from './mock-model.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const BINARY = join(TARGET_DIR, 'debug', 'bumblehive');

const out = outputDir('e2e-browser');
const runner = createRunner('browser e2e');
let mock;
/** Links the page opened outside itself (new tabs). */
const opened = [];
let space;
let browser;
let page;
let server;

/** Starts `bumblehive serve` on `port` (0: any) with the scratch config and data dir. */
async function startServer(port) {
  const args = ['serve', '--port', String(port), '--ui', join(UI_DIR, 'dist'), '--config', space.config, '--data-dir', space.data];
  const child = start(BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const log = join(out, 'server.log');
  child.stderr.on('data', (d) => process.env.E2E_VERBOSE && process.stderr.write(d));
  child.stderr.pipe(createWriteStream(log, { flags: 'a' }));
  const line = await firstLine(child, { log });
  const { url, token } = JSON.parse(line);
  check(url && token, `unexpected first line: ${line}`);
  child.url = url;
  child.token = token;
  return child;
}

/** The flow's driver on a Playwright page; `press` (a key in a field) is for the browser-only steps. */
function driverFor(p) {
  return {
    query: (body) => p.evaluate(`(() => {${body}\n})()`),
    click: (css) => p.click(css, { timeout: 10000 }),
    type: (css, text) => p.fill(css, text, { timeout: 10000 }),
    press: (css, key) => p.press(css, key, { timeout: 10000 }),
    shot: (name) => p.screenshot({ path: join(out, `${name}.png`) }),
    resize: (width, height) => p.setViewportSize({ width, height }),
    reload: () => p.reload(),
    clipboard: () => p.evaluate('navigator.clipboard.readText()'),
    keys: (chord) => p.keyboard.press(chord),
    typeKeys: (text) => p.keyboard.type(text),
    // The "+ Image" button opens the page's file chooser; Playwright answers it with the file.
    async attach(file) {
      const [chooser] = await Promise.all([p.waitForEvent('filechooser', { timeout: 10000 }), p.click('[data-testid=attach-button]', { timeout: 10000 })]);
      await chooser.setFiles(file);
      return 'the file chooser the + Image button opened';
    },
  };
}

try {
  await runner.step('the UI and the bumblehive binary are built', async () => {
    if (!process.env.E2E_NO_BUILD) {
      run('npm', ['run', 'build'], { cwd: UI_DIR });
      run('cargo', ['build', '--bin', 'bumblehive']);
    }
    check(existsSync(join(UI_DIR, 'dist', 'index.html')), 'ui/dist/index.html is missing: run `npm run build` in ui/');
    check(existsSync(BINARY), `${BINARY} is missing: run \`cargo build --bin bumblehive\``);
  });

  await runner.step('the mock model and `bumblehive serve` start', async () => {
    mock = await startMockModel({ log: join(out, 'model-requests.jsonl') });
    space = scratch('browser', mock.baseUrl);
    server = await startServer(0);
  });

  await runner.step('headless Chromium opens the page with the token and the workspace', async () => {
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
    // The clipboard is read back after a Copy button (navigator.clipboard.readText).
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, permissions: ['clipboard-read', 'clipboard-write'] });
    // A link opens in a new tab: record where it goes instead of going out to the network.
    await context.route(/^https?:\/\/example\.com\//, (route) => {
      opened.push(route.request().url());
      return route.fulfill({ status: 200, contentType: 'text/plain', body: 'opened outside the app' });
    });
    // The page's notifications are recorded, not shown: attention.ts's request is what is tested.
    await context.addInitScript(() => {
      const seen = [];
      window.__e2eNotifications = seen;
      window.__e2eShown = [];
      function Recorder(title, options) {
        seen.push(`${title}: ${options?.body ?? ''}`);
        window.__e2eShown.push(this);
      }
      Recorder.prototype.close = function () {};
      Recorder.permission = 'granted';
      Recorder.requestPermission = async () => 'granted';
      window.Notification = Recorder;
    });
    page = await context.newPage();
    const consoleLog = [];
    page.on('console', (m) => consoleLog.push(`[${m.type()}] ${m.text()}`));
    page.on('pageerror', (e) => consoleLog.push(`[pageerror] ${e.message}`));
    page.consoleLog = consoleLog;
    const query = new URLSearchParams({ token: server.token, workspace: space.workspace });
    await page.goto(`${server.url}/?${query}`);
    // A ?workspace= link names a folder this browser never opened: the app asks first.
    const ask = page.locator('[data-testid=linked-workspace]');
    await ask.waitFor({ timeout: 30000 });
    if (!(await ask.textContent()).includes(space.workspace)) throw new Error('the question does not name the folder');
    await page.screenshot({ path: join(out, '00-linked-workspace-asks.png') });
    await page.click('[data-testid=linked-open]');
  });

  const driver = driverFor(page);
  // Step 25: a second browser (its own localStorage) at the address without a workspace.
  const freshPage = async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const fresh = await context.newPage();
    fresh.on('pageerror', (e) => page.consoleLog.push(`[fresh page: pageerror] ${e.message}`));
    await fresh.goto(`${server.url}/?${new URLSearchParams({ token: server.token })}`);
    return { driver: driverFor(fresh), close: () => context.close() };
  };
  // Step 26: `serve` stopped and started again on its port with the same data dir (no --token).
  const restartServer = async () => {
    const before = server;
    process.kill(-before.pid, 'SIGTERM');
    const { code, signal } = await before.exited;
    check(code === 0, `serve exited with ${code ?? signal} on SIGTERM`);
    server = await startServer(Number(new URL(before.url).port));
    check(server.url === before.url, `the restarted server is at ${server.url}, not ${before.url}`);
    return { before: before.token, after: server.token };
  };
  const notifications = () => page.evaluate('window.__e2eNotifications ?? []');
  // A click on the last notification shown, as the browser calls its onclick.
  const clickNotification = () => page.evaluate('window.__e2eShown.at(-1).onclick()');
  const ctx = {
    workspace: space?.workspace ?? '',
    data: space?.data ?? '',
    scratch: space?.dir ?? '',
    mock: mock ?? { requests: [] },
    opened: () => opened,
    notifications,
    clickNotification,
    freshPage,
    restartServer,
  };
  for (const [title, fn] of flowSteps(driver, ctx)) {
    await runner.step(title, fn);
  }
} finally {
  if (runner.failed && page) await page.screenshot({ path: join(out, 'failure.png') }).catch(() => undefined);
  if (page?.consoleLog) {
    writeFileSync(join(out, 'console.log'), page.consoleLog.join('\n') + '\n');
  }
  await browser?.close().catch(() => undefined);
  await stopAll();
  await mock?.close();
  if (!runner.failed) space?.remove();
  else if (space) console.log(`kept for inspection: ${space.dir}`);
  console.log(`screenshots and logs: ${out}`);
}
process.exitCode = runner.summary();
