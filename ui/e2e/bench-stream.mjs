#!/usr/bin/env node
// Benchmark of streaming into the UI and of opening a long session (#19), in the REAL desktop
// window (Tauri on Xvfb, through tauri-driver + WebKitWebDriver) and in headless Chromium
// (the web UI served by `bumblehive serve`), against the scripted model server.
//
//   node ui/e2e/bench-stream.mjs [--engine desktop|chromium|both] [--runs 3] [--children 8]
//        [--rate 100] [--seconds 6] [--messages 2000] [--app PATH] [--bin PATH] [--ui DIR]
//        [--label NAME] [--json FILE] [--cpu-profile FILE] [--smoke] [--census]
//
// Each run: a fresh data dir holding a session of --messages messages (meta.json +
// messages.jsonl written directly), the app opened on a new conversation; the message
// "Stream bench <children> children <n> deltas" makes the parent delegate to <children>
// sub-agents at once, which each stream at --rate deltas/s, and the parent streams too.
// While all of them stream (--seconds), the page records:
// - main-thread busy time per second: the CPU time of the web content process's main
//   thread (/proc/<pid>/task/<pid>/stat: WebKitWebProcess, or Chromium's renderer), and in
//   Chromium also the DevTools `TaskDuration` (all main-thread tasks); `appCpuPct`: every
//   thread of every process of the app (the desktop shell's IPC included), % of one core;
// - frames: a requestAnimationFrame loop's gaps; "dropped" = gaps over 50 ms, and the
//   longest; long tasks where the engine has the observer (Chromium; WebKit has none);
// - the UI's own accounting (`window.__bumblehivePerf`: apply + render), when the build
//   has it, and its delay from a shown session's `content.delta` reaching the page to its
//   text painted (per frame, the oldest delta it applied; p50, p95 and the longest).
// Then it clicks the long session in the sidebar and times click → chat painted (the
// first rendered message in the DOM, then a frame and the task after it).
// --census adds, per run, which regions of the page (by their nearest data-testid) changed
// in how many frames and the most frequent bounds of a frame's changes: what to look at for
// what a frame paints (it costs time of its own, so the other figures read higher with it).
// BENCH_INJECT: a script run in the page as the measured window starts (an experiment's
// style or focus change). Prints one JSON line per run and the medians; --json writes them. --smoke: one short run
// per engine with small sizes (what scripts/test-all.sh may run; no figure is checked).
// No assertion on any time: this only measures.

import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createWriteStream } from 'node:fs';
import { TARGET_DIR, UI_DIR, cmdline, descendants, firstLine, openDesktopApp, outputDir, procStat, processStat, scratch, sleep, start, stopAll, until } from './lib.mjs';
import { startMockModel } from './mock-model.mjs';

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : fallback;
};
const smoke = args.includes('--smoke');
const engines = (option('--engine', 'both') === 'both' ? ['desktop', 'chromium'] : [option('--engine')]).filter(Boolean);
const RUNS = Number(option('--runs', smoke ? 1 : 3));
const CHILDREN = Number(option('--children', smoke ? 2 : 8));
const RATE = Number(option('--rate', 100));
const SECONDS = Number(option('--seconds', smoke ? 1 : 6));
const CPU_PROFILE = option('--cpu-profile', null);
const CENSUS = args.includes('--census');
const MESSAGES = Number(option('--messages', smoke ? 200 : 2000));
const APP = option('--app', process.env.E2E_DESKTOP_APP || join(TARGET_DIR, 'debug', 'bumblehive-desktop'));
const BIN = option('--bin', join(TARGET_DIR, 'debug', 'bumblehive'));
const DIST = option('--ui', join(UI_DIR, 'dist'));
const LABEL = option('--label', 'current');
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const out = outputDir('bench-stream');

// ------------------------------------------------------------------ the long session

const LONG_ID = '0192f000-0000-7000-8000-000000002000';

/** Writes a session of `count` messages (alternating person / model, markdown answers). */
function writeLongSession(data, workspace, count) {
  const dir = join(data, 'sessions', LONG_ID);
  mkdirSync(dir, { recursive: true });
  const at = '2026-01-01T00:00:00Z';
  writeFileSync(
    join(dir, 'meta.json'),
    JSON.stringify({ session_id: LONG_ID, workspace, title: `Long session (${count} messages)`, created_at: at, updated_at: at }),
  );
  const lines = [];
  for (let i = 0; i < count; i++) {
    if (i % 2 === 0) lines.push(JSON.stringify({ role: 'user', content: `Question ${i}: what does step ${i} do?`, id: `u${i}` }));
    else
      lines.push(
        JSON.stringify({
          role: 'assistant',
          content: `Step ${i} **reads** the file and *checks* it:\n\n- one point\n- another point\n\n\`\`\`rust\nfn step_${i}() -> u32 { ${i} }\n\`\`\`\n\nThat is all for step ${i}.`,
        }),
      );
  }
  writeFileSync(join(dir, 'messages.jsonl'), lines.join('\n') + '\n');
}

function writeConfig(config, baseUrl) {
  writeFileSync(config, JSON.stringify({ provider: { kind: 'openai', base_url: baseUrl, model: 'm' }, subagents: { max_concurrent: Math.max(1, CHILDREN) } }, null, 2));
}

// ------------------------------------------------------------------ processes (/proc)

/** The web content processes under `root` (WebKitWebProcess, or Chromium renderers). */
function contentProcesses(root, engine) {
  return descendants(root).filter((pid) => {
    const argv = cmdline(pid);
    if (engine === 'desktop') return (argv[0] ?? '').includes('WebKitWebProcess');
    // Chromium rewrites its command line into one string (the process title).
    return argv.join(' ').includes('--type=renderer');
  });
}

const TICK_MS = 10; // USER_HZ = 100 on Linux
const mainThreadMs = (pids) => pids.reduce((sum, pid) => sum + (procStat(pid)?.ticks ?? 0) * TICK_MS, 0);

/** Every process of the app (the desktop shell and WebKit's, or Chromium's), all threads. */
function appProcesses(root, engine) {
  return descendants(root).filter((pid) => {
    const name = cmdline(pid)[0] ?? '';
    return engine === 'desktop' ? name === APP || /bumblehive-desktop$|WebKit(Web|Network)Process/.test(name) : /chrom/i.test(name);
  });
}
const processMs = (pids) => pids.reduce((sum, pid) => sum + (processStat(pid)?.ticks ?? 0) * TICK_MS, 0);

// ------------------------------------------------------------------ in-page scripts

// Each is the body of `(done) => { … }`: run through WebDriver's execute/async or
// Playwright's evaluate.
const PROBE_START = `
  const w = window;
  ${process.env.BENCH_INJECT ?? ''}
  const p = { gaps: [], long: [], last: performance.now(), on: true, perf0: w.__bumblehivePerf ? { ...w.__bumblehivePerf, paint0: (w.__bumblehivePerf.deltaToPaint || []).length } : null, t0: performance.now() };
  // --census: what changed in the page per frame, by the nearest data-testid, and the
  // bounds of what changed (a frame paints at least those).
  p.changed = new Set(); p.regions = {}; p.nodes = new Set(); p.unions = [];
  p.mutations = new MutationObserver((records) => {
    for (const r of records) {
      const node = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      const at = node && node.closest('[data-testid]');
      const id = at ? at.getAttribute('data-testid') : '(no test id)';
      p.changed.add(r.type === 'attributes' ? id + ' [' + r.attributeName + ']' : id + ' ' + r.type + ' ' + (node ? node.nodeName + '.' + node.className : ''));
      if (node) p.nodes.add(node);
    }
  });
  // Only with --census: an observer makes the engine queue a record per change, which is
  // work of its own (and WebKit then skips its same-text shortcut).
  if (${CENSUS}) p.mutations.observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  const loop = (t) => {
    if (!p.on) return;
    p.gaps.push(t - p.last); p.last = t;
    for (const id of p.changed) p.regions[id] = (p.regions[id] || 0) + 1;
    p.changed.clear();
    if (p.nodes.size) {
      let u = null;
      for (const n of p.nodes) {
        if (!n.isConnected) continue;
        const b = n.getBoundingClientRect();
        if (!b.width || !b.height) continue;
        u = u ? { l: Math.min(u.l, b.left), t: Math.min(u.t, b.top), r: Math.max(u.r, b.right), b: Math.max(u.b, b.bottom) } : { l: b.left, t: b.top, r: b.right, b: b.bottom };
      }
      if (u) p.unions.push(Math.round(u.l) + ',' + Math.round(u.t) + ' ' + Math.round(u.r - u.l) + 'x' + Math.round(u.b - u.t));
      p.nodes.clear();
    }
    requestAnimationFrame(loop);
  };
  requestAnimationFrame((t) => { p.last = t; requestAnimationFrame(loop); });
  try {
    if ((PerformanceObserver.supportedEntryTypes || []).includes('longtask')) {
      p.observer = new PerformanceObserver((list) => { for (const e of list.getEntries()) p.long.push(e.duration); });
      p.observer.observe({ type: 'longtask' });
      p.longSupported = true;
    }
  } catch (e) {}
  w.__benchProbe = p;
  done(true);
`;
const PROBE_STOP = `
  const w = window;
  const p = w.__benchProbe;
  p.on = false;
  p.observer && p.observer.disconnect();
  p.mutations.disconnect();
  const wall = performance.now() - p.t0;
  const gaps = p.gaps;
  const perf = w.__bumblehivePerf;
  const own = perf && p.perf0 ? (perf.applyMs - p.perf0.applyMs + perf.renderMs - p.perf0.renderMs) : null;
  // The samples of this window only (the UI keeps the newest 20,000; 6 s is far fewer).
  const paint = perf && perf.deltaToPaint && p.perf0 ? perf.deltaToPaint.slice(p.perf0.paint0).sort((a, b) => a - b) : [];
  const pct = (q) => (paint.length ? paint[Math.min(paint.length - 1, Math.floor(q * paint.length))] : null);
  done({
    wallMs: wall,
    frames: gaps.length,
    over50: gaps.filter((g) => g > 50).length,
    maxGapMs: gaps.length ? Math.max(...gaps) : null,
    longTasks: p.longSupported ? p.long.length : null,
    longTaskMs: p.longSupported ? p.long.reduce((a, b) => a + b, 0) : null,
    uiOwnMs: own,
    // The part of it spent applying events to the UI's state (the rest is rendering).
    uiApplyMs: perf && p.perf0 ? perf.applyMs - p.perf0.applyMs : null,
    uiEvents: perf && p.perf0 ? perf.events - p.perf0.events : null,
    // Frames in which each region changed, the most first.
    changedRegions: ${CENSUS} ? Object.entries(p.regions).sort((a, b) => b[1] - a[1]).slice(0, 12) : undefined,
    unions: !${CENSUS} ? undefined : Object.entries(p.unions.reduce((m, k) => ((m[k] = (m[k] || 0) + 1), m), {})).sort((a, b) => b[1] - a[1]).slice(0, 15),
    uiFrames: perf && p.perf0 ? perf.frames - p.perf0.frames : null,
    deltaPaintSamples: paint.length,
    deltaPaintP50: pct(0.5),
    deltaPaintP95: pct(0.95),
    deltaPaintMax: paint.length ? paint[paint.length - 1] : null,
    contentVisibility: typeof CSS !== 'undefined' && CSS.supports('content-visibility', 'auto'),
    engine: navigator.userAgent,
  });
`;
const OPEN_LONG = `
  const id = ${JSON.stringify(LONG_ID)};
  const item = [...document.querySelectorAll('[data-testid=session-item]')].find((e) => e.dataset.sessionId === id);
  if (!item) return done({ error: 'the long session is not in the sidebar' });
  const t0 = performance.now();
  (item.querySelector('.session-open') || item).click();
  const check = () => {
    const chat = document.querySelector('[data-testid=chat]');
    const shown = chat && chat.dataset.sessionId === id ? chat.querySelectorAll('[data-testid=chat-message]').length : 0;
    if (!shown) return void requestAnimationFrame(check);
    const inDom = performance.now();
    // Painted: the frame after the DOM has it, then the task that follows that frame.
    requestAnimationFrame(() => {
      const ch = new MessageChannel();
      ch.port1.onmessage = () => {
        // Where the time went, in a browser (WebKit's IPC is not a resource).
        const calls = performance.getEntriesByType('resource').filter((e) => e.startTime >= t0 && e.name.includes('/api/'));
        const api = calls.map((e) => [e.name.split('/api/')[1], Math.round(e.startTime - t0), Math.round(e.responseEnd - t0)]);
        done({ ms: performance.now() - t0, domMs: inDom - t0, rendered: shown, api });
      };
      ch.port2.postMessage(0);
    });
  };
  check();
`;
const STATE = `
  const all = (s) => [...document.querySelectorAll(s)];
  done({
    prompt: !!document.querySelector('[data-testid=prompt-input]'),
    setup: !!document.querySelector('[data-testid=setup-dismiss]'),
    tabs: all('[data-testid=child-tab]').map((e) => e.getAttribute('data-state')),
    streaming: !!document.querySelector('[data-streaming=true]'),
    errors: all('[data-testid=run-error]').map((e) => e.textContent),
    sidebar: all('[data-testid=session-item]').map((e) => e.dataset.sessionId),
  });
`;

// ------------------------------------------------------------------ engines

async function openDesktop(space) {
  const { wd, root } = await openDesktopApp(APP, space, join(out, 'tauri-driver.log'));
  return {
    root,
    run: (body) => wd.run(body),
    type: (css, text) => wd.type(css, text),
    click: (css) => wd.click(css),
    tasks: null,
    close: () => wd.close(),
  };
}

async function openChromium(space) {
  const { chromium } = await import('playwright-core');
  const server = start(BIN, ['serve', '--port', '0', '--ui', DIST, '--config', space.config, '--data-dir', space.data], { stdio: ['ignore', 'pipe', 'pipe'] });
  const log = join(out, 'server.log');
  server.stderr.pipe(createWriteStream(log, { flags: 'a' }));
  const { url, token } = JSON.parse(await firstLine(server, { log }));
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await (await browser.newContext({ viewport: { width: 1200, height: 800 } })).newPage();
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Performance.enable');
  await page.goto(`${url}/?${new URLSearchParams({ token, workspace: space.workspace })}`);
  // A ?workspace= link to a folder this browser never opened asks first (not measured).
  await page.click('[data-testid=linked-open]', { timeout: 30000 });
  return {
    root: process.pid,
    run: (body) => page.evaluate(`new Promise((done) => {${body}\n})`),
    type: (css, text) => page.fill(css, text, { timeout: 10000 }),
    click: (css) => page.click(css, { timeout: 10000 }),
    async profile(on) {
      // --cpu-profile FILE (Chromium only): the page's JavaScript profile over the window,
      // for `--ui` builds made with `vite build --minify false` to read the names.
      if (!CPU_PROFILE) return;
      if (on) {
        await cdp.send('Profiler.enable');
        await cdp.send('Profiler.setSamplingInterval', { interval: 200 });
        await cdp.send('Profiler.start');
      } else {
        const { profile } = await cdp.send('Profiler.stop');
        writeFileSync(CPU_PROFILE, JSON.stringify(profile));
      }
    },
    async tasks() {
      const { metrics } = await cdp.send('Performance.getMetrics');
      return (metrics.find((m) => m.name === 'TaskDuration')?.value ?? 0) * 1000;
    },
    close: () => browser.close(),
  };
}

// ------------------------------------------------------------------ one run

async function oneRun(engine, index) {
  const mock = await startMockModel({ rate: RATE, delay: 5 });
  const space = scratch(`bench-${engine}`, mock.baseUrl);
  writeConfig(space.config, mock.baseUrl);
  writeLongSession(space.data, space.workspace, MESSAGES);
  let ui;
  try {
    ui = engine === 'desktop' ? await openDesktop(space) : await openChromium(space);
    const state = () => ui.run(STATE);
    await until('the composer', state, (s) => s.prompt && s.sidebar.includes(LONG_ID), { timeout: 60000 });
    if ((await state()).setup) await ui.click('[data-testid=setup-dismiss]');

    // Streaming: the parent and its children at once. Enough deltas to outlast the window.
    const deltas = Math.ceil(RATE * (SECONDS + 6));
    await ui.type('[data-testid=prompt-input]', `Stream bench ${CHILDREN} children ${deltas} deltas`);
    await ui.click('[data-testid=send-button]');
    await until(
      `${CHILDREN} children streaming and the parent too`,
      state,
      (s) => {
        if (s.errors.length) throw new Error(`the run failed: ${s.errors.join(' | ')}`);
        return s.tabs.filter((t) => t === 'running').length >= CHILDREN && s.streaming;
      },
      { timeout: 60000, interval: 50 },
    );
    // Let every stream reach its pace, then measure.
    await sleep(500);
    const pids = contentProcesses(ui.root, engine);
    await ui.run(PROBE_START);
    await ui.profile?.(true);
    const apps = appProcesses(ui.root, engine);
    const all0 = processMs(apps);
    const cpu0 = mainThreadMs(pids);
    const task0 = ui.tasks ? await ui.tasks() : null;
    const wall0 = Date.now();
    await sleep(SECONDS * 1000);
    const cpu1 = mainThreadMs(pids);
    const all1 = processMs(apps);
    const task1 = ui.tasks ? await ui.tasks() : null;
    const wall = Date.now() - wall0;
    await ui.profile?.(false);
    const probe = await ui.run(PROBE_STOP);
    const still = await state();
    const streamingThroughout = still.tabs.filter((t) => t === 'running').length >= CHILDREN;

    // Wait for the streams to end, so opening the long session is measured on its own.
    await until('the streams to end', state, (s) => !s.streaming && !s.tabs.some((t) => t === 'running'), { timeout: (SECONDS + 60) * 1000, interval: 250 });
    await sleep(300);
    const open = await ui.run(OPEN_LONG);
    if (open.error) throw new Error(open.error);

    const result = {
      engine,
      label: LABEL,
      run: index + 1,
      children: CHILDREN,
      rate: RATE,
      streamingThroughout,
      mainThreadCpuPct: pids.length ? (100 * (cpu1 - cpu0)) / wall : null,
      // Every thread of every process of the app (the shell's IPC included), % of one core.
      appCpuPct: apps.length ? (100 * (all1 - all0)) / wall : null,
      appProcesses: apps.length,
      devtoolsBusyPct: task0 != null ? (100 * (task1 - task0)) / wall : null,
      uiOwnPct: probe.uiOwnMs != null ? (100 * probe.uiOwnMs) / probe.wallMs : null,
      uiApplyPct: probe.uiApplyMs != null ? (100 * probe.uiApplyMs) / probe.wallMs : null,
      framesPerS: (1000 * probe.frames) / probe.wallMs,
      framesOver50: probe.over50,
      maxFrameGapMs: probe.maxGapMs,
      longTasks: probe.longTasks,
      uiEventsPerFrame: probe.uiFrames ? probe.uiEvents / probe.uiFrames : null,
      changedRegions: probe.changedRegions,
      unions: probe.unions,
      deltaPaintSamples: probe.deltaPaintSamples,
      deltaPaintP50Ms: probe.deltaPaintP50,
      deltaPaintP95Ms: probe.deltaPaintP95,
      deltaPaintMaxMs: probe.deltaPaintMax,
      contentVisibility: probe.contentVisibility,
      userAgent: probe.engine,
      openMs: open.ms,
      openDomMs: open.domMs,
      openRendered: open.rendered,
      openApi: open.api,
      messages: MESSAGES,
    };
    console.log(JSON.stringify(result));
    return result;
  } finally {
    await ui?.close().catch(() => undefined);
    await stopAll();
    await mock.close();
    space.remove();
  }
}

const median = (xs) => {
  const v = xs.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};

const results = [];
let failed = false;
for (const engine of engines) {
  if (engine === 'desktop' && !existsSync(APP)) {
    console.error(`${APP} is missing: cargo build -p bumblehive-desktop`);
    failed = true;
    continue;
  }
  for (let i = 0; i < RUNS; i++) {
    try {
      results.push(await oneRun(engine, i));
    } catch (err) {
      console.error(`${engine} run ${i + 1} failed: ${err?.stack ?? err}`);
      failed = true;
    }
  }
}
const summary = {};
for (const engine of engines) {
  const mine = results.filter((r) => r.engine === engine);
  if (!mine.length) continue;
  summary[engine] = Object.fromEntries(
    ['mainThreadCpuPct', 'appCpuPct', 'devtoolsBusyPct', 'uiOwnPct', 'framesPerS', 'framesOver50', 'maxFrameGapMs', 'longTasks', 'uiEventsPerFrame', 'deltaPaintP50Ms', 'deltaPaintP95Ms', 'deltaPaintMaxMs', 'openMs', 'openDomMs'].map((k) => [
      k,
      median(mine.map((r) => r[k])),
    ]),
  );
  summary[engine].runs = mine.length;
}
console.log(`medians (${LABEL}): ${JSON.stringify(summary, null, 1)}`);
const jsonFile = option('--json');
if (jsonFile) writeFileSync(jsonFile, JSON.stringify({ label: LABEL, children: CHILDREN, rate: RATE, seconds: SECONDS, messages: MESSAGES, results, summary }, null, 2) + '\n');
process.exitCode = failed ? 1 : 0;
