#!/usr/bin/env node
// End-to-end test in the REAL desktop window: the Tauri app (target/debug/bumblehive-desktop)
// on a virtual X display (Xvfb), driven through tauri-driver + WebKitWebDriver with plain
// fetch calls to the W3C WebDriver API, against the scripted model server (mock-model.mjs).
//
//   node ui/e2e/desktop.mjs          (E2E_NO_BUILD=1 skips `npm run build` / `cargo build`)
//
// Needs: Xvfb, dbus-daemon, dunst, xdotool, xclip, import and convert (ImageMagick), WebKitWebDriver (webkit2gtk-driver), and
// tauri-driver (`cargo install tauri-driver --locked`); scripts/e2e.sh installs them.
// Screenshots (WebDriver's, and the X screen's with `import -window root`) and logs go to
// test-output/e2e-desktop/. Prints "N passed, N failed"; exits non-zero on failure.

import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { flowSteps } from './flow.mjs';
import { TARGET_DIR, UI_DIR, WebDriver, check, cmdline, createRunner, descendants, freePort, outputDir, run, scratch, start, startXvfb, stopAll, until, which } from './lib.mjs';
import { startMockModel } from './mock-model.mjs';

// scripts/e2e.sh may hand over a build it already has (E2E_DESKTOP_APP, e.g. the release one).
const APP = process.env.E2E_DESKTOP_APP || join(TARGET_DIR, 'debug', 'bumblehive-desktop');
const TITLE = 'Bumblehive';

const out = outputDir('e2e-desktop');
/** Links the app handed to the system opener (the stub xdg-open writes them here). */
const OPENED = join(out, 'opened.txt');
const runner = createRunner('desktop e2e');
let mock;
let space;
let display;
let wd;
/** The test's own session bus, where dunst shows the app's notifications. */
let busAddress;

try {
  await runner.step('the UI and the desktop app are built; the tools are there', async () => {
    if (!process.env.E2E_NO_BUILD) {
      // The UI first: the app embeds ui/dist when it is compiled.
      run('npm', ['run', 'build'], { cwd: UI_DIR });
      run('cargo', ['build', '-p', 'bumblehive-desktop']);
    }
    check(existsSync(APP), `${APP} is missing: run \`cargo build -p bumblehive-desktop\``);
    for (const tool of ['Xvfb', 'xdotool', 'import', 'WebKitWebDriver']) {
      check(which(tool), `${tool} is missing: run scripts/setup-system.sh desktop e2e`);
    }
    check(which('tauri-driver', [join(homedir(), '.cargo', 'bin')]), 'tauri-driver is missing: cargo install tauri-driver --locked');
  });

  await runner.step('a virtual display and tauri-driver start', async () => {
    display = await startXvfb();
    const port = await freePort();
    const nativePort = await freePort();
    const tauriDriver = which('tauri-driver', [join(homedir(), '.cargo', 'bin')]);
    // A fresh WebKit profile (localStorage) for every run, and the display of our Xvfb.
    const profile = join(out, 'profile');
    for (const d of ['data', 'config', 'cache']) mkdirSync(join(profile, d), { recursive: true });
    // The system's link opener, as the opener plugin finds it on PATH: it only records.
    const stubs = join(out, 'bin');
    mkdirSync(stubs, { recursive: true });
    writeFileSync(OPENED, '');
    writeFileSync(join(stubs, 'xdg-open'), `#!/bin/sh\nprintf '%s\\n' "$*" >> '${OPENED}'\n`);
    chmodSync(join(stubs, 'xdg-open'), 0o755);
    // A session bus of this test's own with a real notification server on it (dunst, on
    // the virtual display): the app's notifications are shown, and a click on one is made
    // the way the server reports a person's click (`dunstctl action`).
    const bus = join(out, 'session-bus');
    rmSync(bus, { force: true });
    busAddress = `unix:path=${bus}`;
    start('dbus-daemon', ['--session', '--nofork', '--address', busAddress], { log: join(out, 'dbus.log') });
    await until('the session bus', () => existsSync(bus), Boolean, { timeout: 10000 });
    start('dunst', [], { log: join(out, 'dunst.log'), env: { DISPLAY: display, DBUS_SESSION_BUS_ADDRESS: busAddress } });
    await until('dunst on the session bus', () => spawnSync('dunstctl', ['is-paused'], { env: { ...process.env, DBUS_SESSION_BUS_ADDRESS: busAddress } }).status === 0, Boolean, { timeout: 10000 });
    start(tauriDriver, ['--port', String(port), '--native-port', String(nativePort)], {
      log: join(out, 'tauri-driver.log'),
      env: {
        DISPLAY: display,
        DBUS_SESSION_BUS_ADDRESS: busAddress,
        WAYLAND_DISPLAY: '',
        GDK_BACKEND: 'x11',
        XDG_DATA_HOME: join(profile, 'data'),
        XDG_CONFIG_HOME: join(profile, 'config'),
        XDG_CACHE_HOME: join(profile, 'cache'),
        PATH: `${join(out, 'bin')}:${process.env.PATH ?? ''}`,
        RUST_LOG: process.env.RUST_LOG ?? 'warn,bumblehive=info',
      },
    });
    wd = new WebDriver(`http://127.0.0.1:${port}`);
    await until('tauri-driver to answer /status', () => wd.call('GET', '/status'), (v) => v?.ready !== false, { timeout: 20000 });
  });

  await runner.step('the app window opens on the workspace given on its command line', async () => {
    mock = await startMockModel({ log: join(out, 'model-requests.jsonl') });
    space = scratch('desktop', mock.baseUrl);
    await wd.open({
      'tauri:options': {
        application: APP,
        args: ['--workspace', space.workspace, '--config', space.config, '--data-dir', space.data],
      },
    });
    // The real window, as X sees it.
    await until(`an X window named ${TITLE}`, () => {
      const r = spawnSync('xdotool', ['search', '--onlyvisible', '--name', TITLE], { env: { ...process.env, DISPLAY: display } });
      return r.status === 0 && r.stdout.toString().trim();
    });
  });

  const driver = {
    query: (body) => wd.execute(body),
    click: (css) => wd.click(css),
    type: (css, text) => wd.type(css, text),
    reload: () => wd.call('POST', '/session/:session/refresh', {}),
    keys: (chord) => wd.keys(chord),
    typeKeys: (text) => wd.typeKeys(text),
    // The "+ Image" button's file input, given the file as WebDriver uploads one (Element Send
    // Keys on an <input type=file>): a click on the button would open GTK's chooser, which
    // WebDriver cannot answer.
    async attach(file) {
      const id = await wd.element('[data-testid=attach-input]');
      await wd.call('POST', `/session/:session/element/${id}/value`, { text: file });
      return "WebDriver's file upload into the + Image button's input";
    },
    // What the clipboard holds, as a person would see it: Ctrl+V into the (emptied) composer
    // goes through GTK's clipboard; the composer is emptied again afterwards.
    async clipboard() {
      const empty = `const el = document.querySelector('[data-testid=prompt-input]');
        el.value = ''; el.dispatchEvent(new Event('input', { bubbles: true })); el.focus(); return true;`;
      await wd.execute(empty);
      const id = await wd.element('[data-testid=prompt-input]');
      // Control (U+E009) stays down for the "v"; the null key (U+E000) lets it go.
      await wd.call('POST', `/session/:session/element/${id}/value`, { text: '\uE009v\uE000' });
      const text = await until('the pasted text', () => wd.execute("return document.querySelector('[data-testid=prompt-input]').value;"), Boolean, { timeout: 5000 }).catch(() => '');
      await wd.execute(empty);
      return text;
    },
    async shot(name, { screenOnly = false } = {}) {
      // The DOM is ahead of the pixels: let the window paint what the test just saw.
      await wd.painted();
      if (!screenOnly) await wd.screenshot(join(out, `${name}.png`));
      execFileSync('import', ['-window', 'root', join(out, `${name}-screen.png`)], { env: { ...process.env, DISPLAY: display } });
    },
  };
  const windowTitle = () => {
    const env = { ...process.env, DISPLAY: display };
    const id = spawnSync('xdotool', ['search', '--onlyvisible', '--name', TITLE], { env }).stdout.toString().trim().split('\n')[0];
    return id ? spawnSync('xdotool', ['getwindowname', id], { env }).stdout.toString().trim() : null;
  };
  const notifications = () => {
    const logs = join(space.data, 'logs');
    if (!existsSync(logs)) return [];
    return readdirSync(logs)
      .flatMap((f) => readFileSync(join(logs, f), 'utf8').split('\n'))
      .filter((l) => l.includes('notification requested'));
  };
  // The newest notification dunst shows, clicked: dunst sends the app `ActionInvoked`
  // with the `default` action, as for a person's click on it.
  const clickNotification = async () => {
    const env = { ...process.env, DBUS_SESSION_BUS_ADDRESS: busAddress };
    await until('dunst showing the notification', () => spawnSync('dunstctl', ['count', 'displayed'], { env }).stdout.toString().trim(), (n) => Number(n) > 0, { timeout: 10000 });
    const r = spawnSync('dunstctl', ['action', '0'], { env });
    check(r.status === 0, `dunstctl action: ${r.stderr}`);
  };
  const opened = () => (existsSync(OPENED) ? readFileSync(OPENED, 'utf8').split('\n').filter(Boolean) : []);
  // First of the window's own steps: the fresh composer of a new conversation, before the
  // flow puts anything on the clipboard.
  await runner.step('images on the real X clipboard (xclip, PNG and JPEG) pasted with Ctrl+V become attachments (E14)', async () => {
    check(which('xclip') && which('convert'), 'xclip or convert is missing: run scripts/setup-system.sh desktop e2e');
    const env = { ...process.env, DISPLAY: display };
    const attachments = () => wd.execute("return Array.from(document.querySelectorAll('[data-testid=attachment]')).map((e) => e.getAttribute('title'));");
    const before = (await attachments()).length;
    for (const [type, file] of [['image/png', 'clip.png'], ['image/jpeg', 'clip.jpg']]) {
      const path = join(out, file);
      execFileSync('convert', ['-size', '8x8', 'xc:orange', path]);
      // xclip owns the CLIPBOARD selection until another program takes it: it serves the
      // paste, as a screenshot tool or an image viewer would, and offers only this one type.
      const owner = start('xclip', ['-quiet', '-selection', 'clipboard', '-t', type, '-i', path], { env, log: join(out, `xclip-${file}.log`) });
      await until(`xclip to own the clipboard with ${type}`, () =>
        spawnSync('xclip', ['-selection', 'clipboard', '-o', '-t', 'TARGETS'], { env }).stdout.toString(), (t) => t.includes(type), { timeout: 5000 });
      await wd.execute("document.querySelector('[data-testid=prompt-input]').focus(); return true;");
      const id = await wd.element('[data-testid=prompt-input]');
      // Ctrl+V as the window gets it from the keyboard: WebKitGTK's paste from GTK's
      // clipboard, not a synthetic event. Control (U+E009) stays down for the "v".
      await wd.call('POST', `/session/:session/element/${id}/value`, { text: '\uE009v\uE000' });
      const got = await until(`the ${type} pasted from the X clipboard as an attachment`, attachments, (a) => a.length === before + 1, { timeout: 10000 });
      check(got.length === before + 1, `attachments after pasting ${type}: ${got.join(', ')}`);
      // The thumbnail is the clipboard's picture itself (8×8, its own type), decoded by the page.
      await until(`the ${type} thumbnail shown`, () =>
        wd.execute(`const img = document.querySelector('[data-testid=attachment-thumb]');
          return img ? [img.naturalWidth, img.getAttribute('src').startsWith('data:${type};base64,')] : null;`), (v) => v && v[0] === 8 && v[1], { timeout: 5000 });
      await driver.shot(`e14-real-clipboard-${file.replace('.', '-')}`);
      owner.kill();
      // Removed again, so the next paste is counted alone and the flow starts with none.
      await wd.execute("document.querySelector('[data-testid=attachment-remove]')?.click(); return true;");
      await until('the attachment removed', attachments, (a) => a.length === before, { timeout: 5000 });
    }
    check(!(await wd.execute("return document.querySelector('[data-testid=prompt-input]').value;")), 'an image paste put text into the composer');
  });

  for (const [title, fn] of flowSteps(driver, { workspace: space?.workspace ?? '', data: space?.data ?? '', mock: mock ?? { requests: [] }, timeout: 30000, opened, windowTitle, notifications, clickNotification })) {
    await runner.step(title, fn);
  }

  await runner.step('a second start of the app hands its workspace to the running window and ends (E1)', async () => {
    const other = join(space.dir, 'second-start');
    mkdirSync(other, { recursive: true });
    const env = { ...process.env, DISPLAY: display, WAYLAND_DISPLAY: '', GDK_BACKEND: 'x11' };
    const second = spawnSync(APP, ['--workspace', other, '--config', space.config, '--data-dir', space.data], { env, timeout: 30000 });
    const said = `${second.stdout}${second.stderr}`;
    check(second.status === 0, `the second start exited ${second.status} (${second.signal ?? ''}): ${said}`);
    check(/already running/.test(said) && said.includes(other), `the second start said: ${said}`);
    // The running window opened the workspace it was handed; no second window exists.
    await until('the running window to open the handed-over workspace', () =>
      wd.execute("return document.querySelector('[data-testid=workspace-path]')?.getAttribute('title') ?? '';"), (t) => t === other);
    const windows = spawnSync('xdotool', ['search', '--onlyvisible', '--name', TITLE], { env }).stdout.toString().trim().split('\n').filter(Boolean);
    check(windows.length === 1, `expected one window, found ${windows.length}`);
    await driver.shot('e1-second-start-handed-over');
  });

  // Last: it ends the app and starts it again.
  await runner.step("the window's size and position come back after the app is closed and started again (E23)", async () => {
    const env = { ...process.env, DISPLAY: display };
    const geometry = () => {
      const id = spawnSync('xdotool', ['search', '--onlyvisible', '--name', TITLE], { env }).stdout.toString().trim().split('\n')[0];
      if (!id) return null;
      // "Position: 130,90 (screen: 0)" and "Geometry: 1000x700", as X has the window.
      const text = spawnSync('xdotool', ['getwindowgeometry', id], { env }).stdout.toString();
      const at = /Position: (-?\d+),(-?\d+)/.exec(text);
      const size = /Geometry: (\d+)x(\d+)/.exec(text);
      return at && size ? { id, x: +at[1], y: +at[2], width: +size[1], height: +size[2] } : null;
    };
    const before = geometry();
    check(before, 'the window is not found');
    // Moved and resized the way a person's drag would end (X has no window manager here,
    // so the window gets exactly these figures).
    const wanted = { x: 130, y: 90, width: before.width === 1000 ? 1040 : 1000, height: 700 };
    spawnSync('xdotool', ['windowsize', before.id, String(wanted.width), String(wanted.height)], { env });
    spawnSync('xdotool', ['windowmove', before.id, String(wanted.x), String(wanted.y)], { env });
    const moved = await until('the window moved and resized', geometry, (g) => g && g.width === wanted.width && g.height === wanted.height && g.x === wanted.x && g.y === wanted.y, { timeout: 10000 });
    // The app writes where the window is once it rests; the restart must not race that.
    const saved = join(space.data, 'window.json');
    await until('the app to remember where its window is', () => (existsSync(saved) ? JSON.parse(readFileSync(saved, 'utf8')) : null),
      (g) => g && g.width === wanted.width && g.height === wanted.height, { timeout: 10000 });
    await wd.close();
    await until('the window to close', () => geometry(), (g) => g === null, { timeout: 20000 });
    await wd.open({
      'tauri:options': {
        application: APP,
        args: ['--workspace', space.workspace, '--config', space.config, '--data-dir', space.data],
      },
    });
    const again = await until('the window to open again where it was', geometry, (g) => g && g.width === moved.width && g.height === moved.height && g.x === moved.x && g.y === moved.y, { timeout: 30000 }).catch(() => geometry());
    check(again && again.width === moved.width && again.height === moved.height && again.x === moved.x && again.y === moved.y,
      `the window came back at ${JSON.stringify(again)}, it was at ${JSON.stringify(moved)}`);
    await until('the UI to load again', () => wd.execute("return !!document.querySelector('[data-testid=prompt-input]');"), Boolean, { timeout: 30000 });
    await driver.shot('e23-window-geometry-remembered');
  });

  // The running app's process, its web processes and its log, for the two steps below.
  const appPid = () => {
    const app = realpathSync(APP);
    return readdirSync('/proc').filter((n) => /^\d+$/.test(n)).map(Number).find((pid) => {
      try {
        return readlinkSync(`/proc/${pid}/exe`) === app;
      } catch {
        return false;
      }
    });
  };
  const webProcesses = () => descendants(appPid()).filter((pid) => (cmdline(pid)[0] ?? '').endsWith('WebKitWebProcess'));
  const appLog = () => {
    const logs = join(space.data, 'logs');
    return readdirSync(logs).map((f) => readFileSync(join(logs, f), 'utf8')).join('');
  };
  const logged = (pattern) => (appLog().match(pattern) ?? []).length;
  const PAGE_LOADED = /start-up: page loaded/g;

  // Next to last: WebKitWebDriver ends its session with the page it was driving.
  await runner.step('a web process that dies is replaced: the page loads again in a new one, not a dead window', async () => {
    check(appPid(), 'the app process is not found');
    const [first] = webProcesses();
    check(first, 'the app has no web process');
    const before = logged(PAGE_LOADED);
    // As the kernel's out-of-memory killer or a crash in WebKit would end it.
    process.kill(first, 'SIGKILL');
    await until('a new web process', webProcesses, (w) => w.length > 0 && !w.includes(first), { timeout: 20000 });
    await until('the page to load again in it', () => logged(PAGE_LOADED), (n) => n > before, { timeout: 30000 });
    check(/the web process ended: the page is loaded again/.test(appLog()), 'the log does not say why the page was loaded again');
    spawnSync('import', ['-window', 'root', join(out, 'web-process-replaced.png')], { env: { ...process.env, DISPLAY: display } });
  });

  // After the crash (its WebDriver session went with the page): the app started again with
  // the recycle's delays made short (away 2 s, any growth, memory taken 1 s after a load).
  await runner.step('a window left alone with nothing typed gets a new web process, and the page comes back in it (#31)', async () => {
    const env = { ...process.env, DISPLAY: display };
    // WebDriver's session ended with the crashed page, so closing it does not end the app.
    await wd.close();
    const old = appPid();
    if (old) process.kill(old, 'SIGKILL');
    // Ended once its process is gone or a zombie: its data folder's lock is let go only
    // then (an exiting process stops showing its executable before it closes its files).
    const owner = Number(readFileSync(join(space.data, 'owner.lock'), 'utf8').trim()) || old;
    const ended = (pid) => {
      try {
        return / Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8').split(')').pop());
      } catch {
        return true;
      }
    };
    await until('the app to end', () => [appPid(), owner].filter((pid) => pid && !ended(pid)), (alive) => alive.length === 0, { timeout: 20000 });
    await wd.open({
      'tauri:options': {
        application: APP,
        args: ['--workspace', space.workspace, '--config', space.config, '--data-dir', space.data, '--web-recycle', '2,0,1'],
      },
    });
    await until('the UI', () => wd.execute("return !!document.querySelector('[data-testid=prompt-input]');"), Boolean, { timeout: 30000 });
    const RECYCLED = /the web process grew while the person was away/g;
    const [first] = webProcesses();
    check(first, 'the app has no web process');
    const before = logged(RECYCLED);
    const loadsBefore = logged(PAGE_LOADED);
    // The person leaves: the window is hidden (no window manager here to take its focus).
    const id = spawnSync('xdotool', ['search', '--onlyvisible', '--name', TITLE], { env }).stdout.toString().trim().split('\n')[0];
    check(id, 'the window is not found');
    spawnSync('xdotool', ['windowunmap', id], { env });
    await until('a new web process', webProcesses, (w) => w.length > 0 && !w.includes(first), { timeout: 30000 });
    check(logged(RECYCLED) > before, 'the log does not say the web process was recycled');
    check(/TerminatedByApi/.test(appLog()), 'the page was not loaded again after the recycle');
    await until('the page to load again in the new process', () => logged(PAGE_LOADED), (n) => n > loadsBefore, { timeout: 30000 });
    spawnSync('xdotool', ['windowmap', id], { env });
    // WebDriver's session went with the old page: the X screen shows whether the new one
    // drew the app (a blank page is one flat colour).
    const shot = join(out, 'web-process-recycled.png');
    const spread = () => {
      spawnSync('import', ['-window', id, shot], { env });
      return Number(spawnSync('convert', [shot, '-colorspace', 'Gray', '-format', '%[fx:standard_deviation]', 'info:'], { env }).stdout.toString());
    };
    await until('the page drawn in the new web process', spread, (sd) => sd > 0.05, { timeout: 20000 });
  });
} finally {
  if (runner.failed && display) {
    spawnSync('import', ['-window', 'root', join(out, 'failure-screen.png')], { env: { ...process.env, DISPLAY: display } });
    await wd?.screenshot(join(out, 'failure.png')).catch(() => undefined);
  }
  // Closing the session closes the app (which stops its runs); then everything else.
  await wd?.close();
  await stopAll();
  await mock?.close();
  if (space) {
    const logs = join(space.data, 'logs');
    if (existsSync(logs)) spawnSync('cp', ['-r', logs, join(out, 'app-logs')]);
    if (!runner.failed) space.remove();
    else console.log(`kept for inspection: ${space.dir}`);
  }
  console.log(`screenshots and logs: ${out}`);
}
process.exitCode = runner.summary();
