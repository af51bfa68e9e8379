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
import { ROOT, UI_DIR, check, createRunner, firstLine, outputDir, run, scratch, start, stopAll } from './lib.mjs';
import { startMockModel } from './mock-model.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const BINARY = join(ROOT, 'target', 'debug', 'bumblehive');

const out = outputDir('e2e-browser');
const runner = createRunner('browser e2e');
let mock;
/** Links the page opened outside itself (new tabs). */
const opened = [];
let space;
let browser;
let page;
let server;

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
    const args = ['serve', '--port', '0', '--ui', join(UI_DIR, 'dist'), '--config', space.config, '--data-dir', space.data];
    server = start(BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const log = join(out, 'server.log');
    server.stderr.on('data', (d) => process.env.E2E_VERBOSE && process.stderr.write(d));
    server.stderr.pipe(createWriteStream(log, { flags: 'a' }));
    const line = await firstLine(server, { log });
    const { url, token } = JSON.parse(line);
    check(url && token, `unexpected first line: ${line}`);
    server.url = url;
    server.token = token;
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
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    // A link opens in a new tab: record where it goes instead of going out to the network.
    await context.route(/^https?:\/\/example\.com\//, (route) => {
      opened.push(route.request().url());
      return route.fulfill({ status: 200, contentType: 'text/plain', body: 'opened outside the app' });
    });
    // The page's notifications are recorded, not shown: attention.ts's request is what is tested.
    await context.addInitScript(() => {
      const seen = [];
      window.__e2eNotifications = seen;
      function Recorder(title, options) {
        seen.push(`${title}: ${options?.body ?? ''}`);
      }
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
  });

  const driver = {
    query: (body) => page.evaluate(`(() => {${body}\n})()`),
    click: (css) => page.click(css, { timeout: 10000 }),
    type: (css, text) => page.fill(css, text, { timeout: 10000 }),
    shot: (name) => page.screenshot({ path: join(out, `${name}.png`) }),
    resize: (width, height) => page.setViewportSize({ width, height }),
    reload: () => page.reload(),
  };
  const notifications = () => page.evaluate('window.__e2eNotifications ?? []');
  for (const [title, fn] of flowSteps(driver, { workspace: space?.workspace ?? '', mock: mock ?? { requests: [] }, opened: () => opened, notifications })) {
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
