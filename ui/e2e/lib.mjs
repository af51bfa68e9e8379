// Shared helpers of the end-to-end tests: steps and their tally, polling, processes that
// are always stopped, a scratch folder with a config pointing at the mock model.

import { spawn, spawnSync } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const UI_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const ROOT = resolve(UI_DIR, '..');
/** Where cargo puts its builds: CARGO_TARGET_DIR when set (as cargo reads it), else target/. */
export const TARGET_DIR = process.env.CARGO_TARGET_DIR ? resolve(ROOT, process.env.CARGO_TARGET_DIR) : join(ROOT, 'target');

// ---------------------------------------------------------------------------------------
// Steps: run in order; after the first failure the rest are skipped (they build on it).

export function createRunner(name) {
  const results = [];
  let failed = false;
  const started = Date.now();
  return {
    async step(title, fn) {
      if (failed) {
        results.push({ title, status: 'skipped' });
        console.log(`- skip  ${title}`);
        return;
      }
      const t0 = Date.now();
      try {
        await fn();
        results.push({ title, status: 'passed' });
        console.log(`ok      ${title} (${Date.now() - t0} ms)`);
      } catch (err) {
        failed = true;
        results.push({ title, status: 'failed', error: err });
        console.log(`FAILED  ${title} (${Date.now() - t0} ms)\n${indent(err?.stack ?? String(err))}`);
      }
    },
    get failed() {
      return failed;
    },
    /** Prints the tally; returns the exit code. */
    summary() {
      const count = (s) => results.filter((r) => r.status === s).length;
      const skipped = count('skipped');
      console.log(`\n${name}: ${((Date.now() - started) / 1000).toFixed(1)} s${skipped ? `, ${skipped} skipped` : ''}`);
      console.log(`${count('passed')} passed, ${count('failed')} failed`);
      return failed || count('passed') === 0 ? 1 : 0;
    },
  };
}

function indent(text) {
  return String(text)
    .split('\n')
    .map((l) => `        ${l}`)
    .join('\n');
}

// ---------------------------------------------------------------------------------------
// Polling

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `probe` until `test(value)` holds; returns the value. On timeout the error names
 * what was awaited and shows the last value seen. Errors of `probe` are retried; errors
 * thrown by `test` end the wait.
 */
export async function until(what, probe, test = Boolean, { timeout = 20000, interval = 100 } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  let lastError;
  for (;;) {
    let seen = false;
    try {
      last = await probe();
      lastError = undefined;
      seen = true;
    } catch (err) {
      lastError = err;
    }
    // An error thrown by `test` ends the wait at once (e.g. the run failed).
    if (seen && test(last)) return last;
    if (Date.now() > deadline) {
      const seen = lastError ? `error: ${lastError.message}` : JSON.stringify(last, null, 2);
      throw new Error(`timed out after ${timeout} ms waiting for ${what}; last seen: ${seen}`);
    }
    await sleep(interval);
  }
}

export function check(condition, message) {
  if (!condition) throw new Error(message);
}

// ---------------------------------------------------------------------------------------
// Processes: each in its own process group, stopped (group and all) at the end.

const children = new Set();
/** Scratch folders to remove when the test is interrupted. */
const scratches = new Set();

/**
 * Starts a command in its own process group; stdout/stderr go to `log` (a file) unless
 * `stdio` is given. The child is stopped by `stopAll()` (also on SIGINT/SIGTERM/exit).
 */
export function start(command, args, { log, stdio, env, cwd } = {}) {
  const child = spawn(command, args, {
    cwd: cwd ?? ROOT,
    env: { ...process.env, ...env },
    detached: true,
    stdio: stdio ?? ['ignore', log ? 'pipe' : 'ignore', log ? 'pipe' : 'ignore'],
  });
  if (log && !stdio) {
    const out = createWriteStream(log, { flags: 'a' });
    child.stdout.pipe(out);
    child.stderr.pipe(out);
  }
  child.exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  child.once('exit', () => children.delete(child));
  children.add(child);
  return child;
}

/** Reads the first line a child prints on stdout (while the rest goes to `log`, if any). */
export function firstLine(child, { timeout = 20000, log } = {}) {
  return new Promise((resolvePromise, reject) => {
    let buffer = '';
    let done = false;
    const out = log ? createWriteStream(log, { flags: 'a' }) : null;
    const timer = setTimeout(() => finish(new Error(`no first line within ${timeout} ms`)), timeout);
    const finish = (err, line) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (err) reject(err);
      else resolvePromise(line);
    };
    child.stdout.on('data', (data) => {
      out?.write(data);
      if (done) return;
      buffer += data.toString('utf8');
      const at = buffer.indexOf('\n');
      if (at >= 0) finish(null, buffer.slice(0, at));
    });
    child.once('exit', (code, signal) => finish(new Error(`exited (${code ?? signal}) before printing a line`)));
  });
}

function killGroup(child, signal) {
  try {
    process.kill(-child.pid, signal);
  } catch {
    try {
      child.kill(signal);
    } catch {
      /* gone */
    }
  }
}

/** Stops every child started here: SIGTERM to its group, SIGKILL after a grace period. */
export async function stopAll(grace = 5000) {
  const list = [...children];
  for (const child of list) killGroup(child, 'SIGTERM');
  await Promise.race([Promise.all(list.map((c) => c.exited)), sleep(grace)]);
  for (const child of children) killGroup(child, 'SIGKILL');
}

let exiting = false;
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(signal, () => {
    if (exiting) return;
    exiting = true;
    console.error(`\n${signal}: stopping everything started`);
    stopAll(2000).finally(() => {
      for (const dir of scratches) rmSync(dir, { recursive: true, force: true });
      process.exit(130);
    });
  });
}
process.on('exit', () => {
  for (const child of children) killGroup(child, 'SIGKILL');
});

/** Runs a command to completion (inheriting stdio); throws when it fails. */
export function run(command, args, { cwd } = {}) {
  const result = spawnSync(command, args, { cwd: cwd ?? ROOT, stdio: 'inherit' });
  if (result.status !== 0) throw new Error(`${command} ${args.join(' ')} failed (${result.status ?? result.signal})`);
}

/** A free TCP port on 127.0.0.1 (free when asked; the caller polls the service anyway). */
export function freePort() {
  return new Promise((resolvePromise, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolvePromise(port));
    });
  });
}

// ---------------------------------------------------------------------------------------
// Scratch space and output

/** `test-output/<name>/`, emptied. */
export function outputDir(name) {
  const dir = join(ROOT, 'test-output', name);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  return dir;
}

/** A scratch folder with `workspace/`, `data/` and `config.json` for the mock model. */
export function scratch(name, baseUrl) {
  const dir = mkdtempSync(join(tmpdir(), `bumblehive-${name}-`));
  const workspace = join(dir, 'workspace');
  const data = join(dir, 'data');
  mkdirSync(workspace);
  mkdirSync(data);
  // A custom command of the workspace, for the /command step (#30).
  mkdirSync(join(workspace, '.bumblehive', 'commands'), { recursive: true });
  writeFileSync(join(workspace, '.bumblehive', 'commands', 'e2e-summary.md'), '---\ndescription: Summarise a file (e2e)\nargument-hint: FILE\n---\nCommand check: $1 was named.\n');
  const config = join(dir, 'config.json');
  writeFileSync(config, JSON.stringify({ provider: { kind: 'openai', base_url: baseUrl, model: 'm' } }, null, 2));
  scratches.add(dir);
  const remove = () => {
    scratches.delete(dir);
    rmSync(dir, { recursive: true, force: true });
  };
  return { dir, workspace, data, config, remove };
}

// The real window's tools (desktop.mjs, bench-stream.mjs).

const ELEMENT = 'element-6066-11e4-a52e-4f735466cecf';
/** WebDriver's codes of the named keys the flow presses. */
const KEYS = { Control: '\uE009', Shift: '\uE008', Alt: '\uE00A', Tab: '\uE004', Enter: '\uE007', Escape: '\uE00C', ArrowDown: '\uE015', ArrowUp: '\uE013' };

export function which(name, extra = []) {
  for (const dir of [...(process.env.PATH ?? '').split(':'), ...extra]) {
    if (dir && existsSync(join(dir, name))) return join(dir, name);
  }
  return null;
}

/** Starts Xvfb on a display it picks itself (-displayfd); resolves to ":N". */
export async function startXvfb() {
  const xvfb = start('Xvfb', ['-displayfd', '3', '-screen', '0', '1280x800x24', '-nolisten', 'tcp'], {
    stdio: ['ignore', 'ignore', 'pipe', 'pipe'],
  });
  let errors = '';
  xvfb.stderr.on('data', (d) => (errors += d));
  let text = '';
  xvfb.stdio[3].on('data', (d) => (text += d));
  let exit = null;
  xvfb.exited.then((e) => (exit = e));
  const number = await until(
    'Xvfb to report its display',
    () => /^(\d+)\n/.exec(text)?.[1],
    (n) => {
      if (exit) throw new Error(`Xvfb exited (${exit.code ?? exit.signal}): ${errors}`);
      return Boolean(n);
    },
    { timeout: 15000 },
  );
  return `:${number}`;
}

/** A minimal W3C WebDriver client over fetch (keep-alive: no `Connection: close`). */
export class WebDriver {
  constructor(base) {
    this.base = base;
    this.session = null;
  }
  async call(method, path, body) {
    const url = `${this.base}${path.replace(':session', this.session ?? '')}`;
    const response = await fetch(url, {
      method,
      headers: body === undefined ? {} : { 'Content-Type': 'application/json; charset=utf-8' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(60000),
    });
    const text = await response.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      throw new Error(`${method} ${path}: ${response.status} ${text.slice(0, 300)}`);
    }
    if (!response.ok || json?.value?.error) {
      const v = json?.value ?? {};
      throw new Error(`${method} ${path}: ${v.error ?? response.status}: ${v.message ?? text.slice(0, 300)}`);
    }
    return json.value;
  }
  async open(capabilities) {
    const value = await this.call('POST', '/session', { capabilities: { alwaysMatch: capabilities } });
    this.session = value.sessionId;
    return value;
  }
  async close() {
    if (!this.session) return;
    await this.call('DELETE', '/session/:session').catch(() => undefined);
    this.session = null;
  }
  execute(script, args = []) {
    return this.call('POST', '/session/:session/execute/sync', { script, args });
  }
  async element(css) {
    const value = await this.call('POST', '/session/:session/element', { using: 'css selector', value: css });
    return value[ELEMENT];
  }
  async click(css) {
    const id = await until(`the element ${css}`, () => this.element(css), Boolean, { timeout: 10000 });
    await this.call('POST', `/session/:session/element/${id}/click`, {});
  }
  async type(css, text) {
    // The field ends up holding exactly `text`, or this throws: a test that goes on with
    // other text fails later and far from the cause (CI once sent '/e2e-sum/e2e-summary
    // notes.txt' as a message and waited 30 s for an answer to the command).
    for (let attempt = 1; ; attempt++) {
      const id = await until(`the element ${css}`, () => this.element(css), Boolean, { timeout: 10000 });
      await this.call('POST', `/session/:session/element/${id}/clear`, {});
      // WebKitWebDriver's clear empties the field without an input event, so a controlled
      // field (the composer) kept its old text in its state and put it back at its next
      // render, which could come between the clear and the typing. The input event
      // narrows that window; it does not close it, hence the check below.
      await this.execute("arguments[0].dispatchEvent(new Event('input', { bubbles: true })); return true;", [{ [ELEMENT]: id }]);
      await this.call('POST', `/session/:session/element/${id}/value`, { text });
      const held = await this.execute('return arguments[0].value;', [{ [ELEMENT]: id }]);
      if (held === text) return;
      if (attempt === 3) throw new Error(`typing ${JSON.stringify(text)} into ${css} left ${JSON.stringify(held)} three times`);
    }
  }
  /**
   * Keys pressed as a person would, to whatever has focus (W3C actions): `chord` is
   * Playwright's spelling ("Control+Shift+Tab", "Enter", "a"); `text` types each character.
   */
  async keys(chord) {
    const codes = chord.split('+').map((k) => KEYS[k] ?? k);
    const actions = [...codes.map((value) => ({ type: 'keyDown', value })), ...codes.reverse().map((value) => ({ type: 'keyUp', value }))];
    await this.call('POST', '/session/:session/actions', { actions: [{ type: 'key', id: 'keyboard', actions }] });
    await this.call('DELETE', '/session/:session/actions');
  }
  async typeKeys(text) {
    const actions = [...text].flatMap((value) => [{ type: 'keyDown', value }, { type: 'keyUp', value }]);
    await this.call('POST', '/session/:session/actions', { actions: [{ type: 'key', id: 'keyboard', actions }] });
  }
  /** Runs `body` in the page with `done(value)` in scope (WebDriver's execute/async);
   * resolves to the value it hands `done`. */
  run(body) {
    return this.call('POST', '/session/:session/execute/async', { script: `const done = arguments[arguments.length - 1];\n${body}`, args: [] });
  }
  /** Resolves after the page has painted twice (WebKit paints lazily under Xvfb). */
  painted() {
    return this.run('requestAnimationFrame(() => requestAnimationFrame(() => done(true)));');
  }
  async screenshot(file) {
    const data = await this.call('GET', '/session/:session/screenshot');
    writeFileSync(file, Buffer.from(data, 'base64'));
  }
}


// ---------------------------------------------------------------------------------------
// The benches' view of processes (/proc) and of the real window.

/** A thread's parent pid and CPU ticks (user + system) from /proc; null when it is gone. */
export function procStat(pid, tid = pid) {
  return readStat(`/proc/${pid}/task/${tid}/stat`);
}

/** The same for a whole process: the ticks of all its threads. */
export function processStat(pid) {
  return readStat(`/proc/${pid}/stat`);
}

function readStat(path) {
  try {
    const text = readFileSync(path, 'utf8');
    const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
    // Fields after the name: state(3) ppid(4) … utime(14) stime(15), counted from 3.
    return { ppid: Number(rest[1]), ticks: Number(rest[11]) + Number(rest[12]) };
  } catch {
    return null;
  }
}

/** Every process below `root`, at any depth. */
export function descendants(root) {
  const children = new Map();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const stat = procStat(Number(name));
    if (!stat) continue;
    if (!children.has(stat.ppid)) children.set(stat.ppid, []);
    children.get(stat.ppid).push(Number(name));
  }
  const all = [];
  const walk = (pid) => {
    for (const c of children.get(pid) ?? []) {
      all.push(c);
      walk(c);
    }
  };
  walk(root);
  return all;
}

export const cmdline = (pid) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
};

/**
 * Opens the desktop build `app` in its real window on a fresh Xvfb through tauri-driver,
 * on `space` (from `scratch`), with XDG folders of its own under it. Resolves to the
 * WebDriver session and tauri-driver's pid (the app and WebKit's processes are below it).
 */
export async function openDesktopApp(app, space, log, extraArgs = []) {
  const display = await startXvfb();
  const port = await freePort();
  const nativePort = await freePort();
  const tauriDriver = which('tauri-driver', [join(homedir(), '.cargo', 'bin')]);
  if (!tauriDriver) throw new Error('tauri-driver is missing: cargo install tauri-driver --locked');
  const profile = join(space.dir, 'profile');
  for (const d of ['data', 'config', 'cache']) mkdirSync(join(profile, d), { recursive: true });
  const driverProcess = start(tauriDriver, ['--port', String(port), '--native-port', String(nativePort)], {
    log,
    env: {
      DISPLAY: display,
      WAYLAND_DISPLAY: '',
      GDK_BACKEND: 'x11',
      XDG_DATA_HOME: join(profile, 'data'),
      XDG_CONFIG_HOME: join(profile, 'config'),
      XDG_CACHE_HOME: join(profile, 'cache'),
      RUST_LOG: 'warn',
    },
  });
  const wd = new WebDriver(`http://127.0.0.1:${port}`);
  await until('tauri-driver to answer /status', () => wd.call('GET', '/status'), (v) => v?.ready !== false, { timeout: 20000 });
  await wd.open({ 'tauri:options': { application: app, args: ['--workspace', space.workspace, '--config', space.config, '--data-dir', space.data, ...extraArgs] } });
  return { wd, root: driverProcess.pid, display };
}
