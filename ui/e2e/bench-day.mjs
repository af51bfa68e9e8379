#!/usr/bin/env node
// Benchmark of memory in use (issue #31): the REAL desktop window (Tauri on Xvfb through
// tauri-driver + WebKitWebDriver) through a scripted day against the scripted model, and the
// PSS of all of the app's processes (the shell, WebKit's web and network processes) after it
// against a fresh start.
//
//   node ui/e2e/bench-day.mjs [--app PATH] [--minutes 30] [--sessions 10] [--children 3]
//        [--deltas 300] [--rate 100] [--pause 2] [--sample 5] [--json FILE] [--reload] [--new-web-process] [--away S]
//
// The day: round robin over --sessions conversations (each made with the sidebar's New
// button the first time, opened from the sidebar after), each visit one turn: every other
// turn "Stream bench <children> children <deltas> deltas" (the parent delegates to
// <children> sub-agents at once; they and the parent stream long answers at --rate
// deltas/s, and each report comes back into the parent), the others "Slow answer please"
// (120 sentences streamed over 6 s). While children run, their tabs are opened one by one
// and the parent's tab again (tab switches). Then a pause of --pause seconds (the person
// reads) and the next session, until --minutes have passed.
// Memory is read (`/proc/PID/smaps_rollup` PSS, and scripts/pss-alone.py: PSS with shared
// pages split only among the app's own processes) 10 s after the fresh start, every
// --sample minutes of the day, 10 s after the day's last turn ended and 60 s after that;
// then the app is started again on the day's data (the last session open) and read after
// 10 s, which separates what the day's data costs from what the day left behind. Each
// reading's top mappings per process go to test-output/bench-day/. After the day and after the
// fresh start, the page's elements are also counted by owner (`dom`: the ten largest groups by
// nearest data-testid), which tells what the DOM holds from what the allocators keep.
// Prints one JSON line per reading and a summary; no assertion: this only measures.

import { readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { ROOT, TARGET_DIR, cmdline, descendants, openDesktopApp, outputDir, scratch, sleep, stopAll, until } from './lib.mjs';
import { startMockModel } from './mock-model.mjs';

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : fallback;
};
const APP = option('--app', process.env.E2E_DESKTOP_APP || join(TARGET_DIR, 'release', 'bumblehive-desktop'));
const MINUTES = Number(option('--minutes', 30));
const SESSIONS = Number(option('--sessions', 10));
const CHILDREN = Number(option('--children', 3));
const DELTAS = Number(option('--deltas', 300));
const RATE = Number(option('--rate', 100));
const PAUSE_S = Number(option('--pause', 2));
const SAMPLE_MIN = Number(option('--sample', 5));
const AWAY_S = Number(option('--away', 0));
const out = outputDir('bench-day');

// ------------------------------------------------------------------ memory

/** The app's processes: the shell (below tauri-driver and WebKitWebDriver) and its own. */
function appProcesses(root) {
  const exe = (pid) => {
    try {
      return readlinkSync(`/proc/${pid}/exe`);
    } catch {
      return '';
    }
  };
  const shell = descendants(root).find((pid) => exe(pid) === APP || cmdline(pid)[0] === APP);
  if (!shell) throw new Error(`no process of ${APP} below ${root}`);
  const kind = (pid) => (pid === shell ? 'shell' : (cmdline(pid)[0] ?? '').split('/').pop());
  return [shell, ...descendants(shell)].map((pid) => ({ pid, kind: kind(pid) }));
}

/** The app's web processes (their pids). */
const webProcesses = (ui) => appProcesses(ui.root).filter((p) => p.kind === 'WebKitWebProcess').map((p) => p.pid);

const pssKiB = (pid) => {
  try {
    return Number(/^Pss:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
};

/**
 * PSS and PSS alone (MiB) of each of the app's process kinds and of all, from one run of
 * pss-alone.py --by-mapping (its unindented lines: pid, rss, alone, private in KiB; the
 * indented ones, each process's top mappings, are kept as `mappings`).
 */
function memory(root) {
  const procs = appProcesses(root);
  const alone = new Map();
  const result = spawnSync('python3', [join(ROOT, 'scripts', 'pss-alone.py'), '--by-mapping', '12', ...procs.map((p) => String(p.pid))], { encoding: 'utf8' });
  const mappings = result.stdout ?? '';
  for (const line of mappings.split('\n')) {
    if (/^\s/.test(line)) continue;
    const [pid, , aloneKiB] = line.trim().split(/\s+/).map(Number);
    if (pid && Number.isFinite(aloneKiB)) alone.set(pid, aloneKiB);
  }
  const byKind = {};
  const mib = (kib) => Math.round(kib / 102.4) / 10;
  for (const { pid, kind } of procs) {
    const k = (byKind[kind] ??= { pss: 0, alone: 0 });
    k.pss += pssKiB(pid);
    k.alone += alone.get(pid) ?? 0;
  }
  const all = Object.values(byKind).reduce((a, k) => ({ pss: a.pss + k.pss, alone: a.alone + k.alone }), { pss: 0, alone: 0 });
  return {
    pssMiB: mib(all.pss),
    aloneMiB: alone.size ? mib(all.alone) : null,
    byKind: Object.fromEntries(Object.entries(byKind).map(([kind, k]) => [kind, { pssMiB: mib(k.pss), aloneMiB: alone.size ? mib(k.alone) : null }])),
    mappings,
  };
}

// ------------------------------------------------------------------ the page

const STATE = `
  const all = (s) => [...document.querySelectorAll(s)];
  const chat = document.querySelector('[data-testid=chat]');
  done({
    prompt: !!document.querySelector('[data-testid=prompt-input]'),
    setup: !!document.querySelector('[data-testid=setup-dismiss]'),
    chatSession: chat ? chat.dataset.sessionId || null : null,
    tabs: all('[data-testid=child-tab]').map((e) => ({ title: e.getAttribute('data-title'), state: e.getAttribute('data-state') })),
    streaming: !!document.querySelector('[data-streaming=true]'),
    running: document.querySelector('[data-testid=session-pane]')?.dataset.running === 'true',
    errors: all('[data-testid=run-error]').map((e) => e.textContent),
    domNodes: document.getElementsByTagName('*').length,
  });
`;
// Where the page's elements are: counted by their nearest element with a data-testid (or
// class), the ten largest groups, to tell what a day leaves in the DOM from what a fresh
// start on the same data shows.
const CENSUS = `
  const count = {};
  for (const e of document.getElementsByTagName('*')) {
    const owner = e.closest('[data-testid]');
    const key = owner ? owner.dataset.testid : (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ')[0] : e.tagName.toLowerCase());
    count[key] = (count[key] ?? 0) + 1;
  }
  done(Object.fromEntries(Object.entries(count).sort((a, b) => b[1] - a[1]).slice(0, 10)));
`;
const OPEN_SESSION = (id) => `
  const item = [...document.querySelectorAll('[data-testid=session-item]')].find((e) => e.dataset.sessionId === ${JSON.stringify(id)});
  if (!item) return done(false);
  (item.querySelector('.session-open') || item).click();
  done(true);
`;

async function open(space) {
  // With --away, the person's absence after the day is AWAY_S seconds: the recycle's
  // delay made that (its growth and settle as shipped).
  const extra = AWAY_S ? ['--web-recycle', `${AWAY_S},96,20`] : [];
  const { wd, root, display } = await openDesktopApp(APP, space, join(out, 'tauri-driver.log'), extra);
  const run = (body) => wd.run(body);
  const state = () => run(STATE);
  await until('the composer', state, (s) => s.prompt, { timeout: 60000 });
  if ((await state()).setup) await wd.click('[data-testid=setup-dismiss]');
  return { wd, root, run, state, display };
}

const reading = (label, ui, extra = {}) => {
  const { mappings, ...figures } = memory(ui.root);
  const line = { label, at: new Date().toISOString(), ...figures, ...extra };
  // Where it is, by mapping (test-output/bench-day/<n>-<label>.txt), to compare readings.
  writeFileSync(join(out, `${readings.length}-${label.replace(/[^a-z0-9]+/gi, '-')}.txt`), mappings);
  console.log(JSON.stringify(line));
  return line;
};

// ------------------------------------------------------------------ the day

/** Throws when the page shows a failed run: the day would measure nothing after it. */
const noError = (s) => {
  if (s.errors.length) throw new Error(`the run failed: ${s.errors.join(' | ')}`);
  return true;
};
/** The shown session neither streams nor runs, and none of its children runs or waits. */
const idle = (s) => noError(s) && !s.streaming && !s.running && !s.tabs.some((t) => t.state === 'running' || t.state === 'waiting');

const mock = await startMockModel({ rate: RATE, delay: 5 });
const space = scratch('bench-day', mock.baseUrl);
writeFileSync(space.config, JSON.stringify({ provider: { kind: 'openai', base_url: mock.baseUrl, model: 'm' }, subagents: { max_concurrent: Math.max(1, CHILDREN) } }, null, 2));
const readings = [];
let turns = 0;
let children = 0;
let failed = false;
try {
  let ui = await open(space);
  await sleep(10000);
  readings.push(reading('fresh', ui, { domNodes: (await ui.state()).domNodes }));

  const sessions = [];
  const t0 = Date.now();
  let nextSample = SAMPLE_MIN;
  while (Date.now() - t0 < MINUTES * 60000) {
    const slot = turns % SESSIONS;
    if (slot >= sessions.length) {
      await ui.wd.click('[data-testid=new-session]');
      await until('a new conversation', ui.state, (s) => s.prompt && !s.chatSession, { timeout: 20000 });
    } else {
      if (!(await ui.run(OPEN_SESSION(sessions[slot])))) throw new Error(`session ${sessions[slot]} is not in the sidebar`);
      await until(`session ${slot + 1} shown`, ui.state, (s) => s.chatSession === sessions[slot] && s.prompt, { timeout: 20000 });
    }
    const delegate = turns % 2 === 0;
    const tabsBefore = delegate ? (await ui.state()).tabs.length : 0;
    await ui.wd.type('[data-testid=prompt-input]', delegate ? `Stream bench ${CHILDREN} children ${DELTAS} deltas` : 'Slow answer please');
    await ui.wd.click('[data-testid=send-button]');
    if (delegate) {
      const s = await until('the children running', ui.state, (s) => noError(s) && s.tabs.length >= tabsBefore + CHILDREN, { timeout: 60000, interval: 100 });
      children += CHILDREN;
      // Tab switches while they stream: each new child's tab, then the parent's.
      for (const tab of s.tabs.slice(tabsBefore)) {
        await ui.wd.click(`[data-testid=child-tab][data-title="${tab.title}"]`).catch(() => undefined);
        await sleep(300);
      }
      await ui.wd.click('[data-testid=tab-main]').catch(() => undefined);
    }
    await until('the turn and its children to end', ui.state, (s) => s.chatSession && idle(s), { timeout: 180000, interval: 250 });
    // A report can wake the parent just after its last child ended: quiet twice, 500 ms apart.
    await sleep(500);
    await until('the parent to stay idle', ui.state, idle, { timeout: 180000, interval: 250 });
    if (slot >= sessions.length) sessions.push((await ui.state()).chatSession);
    turns++;
    await sleep(PAUSE_S * 1000);
    const minutes = (Date.now() - t0) / 60000;
    if (minutes >= nextSample) {
      readings.push(reading(`day ${Math.round(minutes)} min`, ui, { turns, children, domNodes: (await ui.state()).domNodes }));
      nextSample += SAMPLE_MIN;
    }
  }
  await sleep(10000);
  readings.push(reading('after the day', ui, { turns, children, domNodes: (await ui.state()).domNodes, dom: await ui.run(CENSUS) }));
  await sleep(60000);
  readings.push(reading('after the day +60 s', ui, { turns, children, domNodes: (await ui.state()).domNodes }));
  if (args.includes('--reload')) {
    // The page loaded again in the same web process: whether what the day left is the
    // page's (freed with it) or the process's (kept).
    await ui.run('location.reload(); return true;').catch(() => undefined);
    await sleep(15000);
    readings.push(reading('after a reload of the page', ui, { domNodes: (await ui.state()).domNodes }));
  }
  if (AWAY_S) {
    // The person leaves the window (hidden) after the day: the page asks for a new web
    // process after AWAY_S s, which the shell gives it once the old one grew 96 MiB
    // (src-tauri/src/web_process.rs). WebDriver's session ends with the old page.
    const env = { ...process.env, DISPLAY: ui.display };
    const id = spawnSync('xdotool', ['search', '--onlyvisible', '--name', 'Bumblehive'], { env }).stdout.toString().trim().split('\n')[0];
    const [old] = webProcesses(ui);
    spawnSync('xdotool', ['windowunmap', id], { env });
    await until('a new web process', () => webProcesses(ui), (w) => w.length > 0 && !w.includes(old), { timeout: (AWAY_S + 60) * 1000 });
    await sleep(15000);
    readings.push(reading(`after the person was away ${AWAY_S} s`, ui, {}));
    spawnSync('xdotool', ['windowmap', id], { env });
  }
  if (args.includes('--new-web-process')) {
    // The web process ended (as the shell's recycle would end it): the shell loads the page
    // again in a new one (src-tauri/src/web_process.rs). WebDriver's session ends with the
    // old page, so this reading has no DOM count.
    const [old] = webProcesses(ui);
    if (old) process.kill(old, 'SIGKILL');
    await until('a new web process', () => webProcesses(ui), (w) => w.length > 0 && !w.includes(old), { timeout: 20000 });
    await sleep(15000);
    readings.push(reading('after a new web process', ui, {}));
  }

  // The same data, a fresh start: what the data costs, apart from what the day left.
  await ui.wd.close();
  await stopAll();
  ui = await open(space);
  await sleep(10000);
  readings.push(reading('fresh start on the day\'s data', ui, { domNodes: (await ui.state()).domNodes, dom: await ui.run(CENSUS) }));
  await ui.wd.close();
} catch (err) {
  console.error(`the day failed after ${turns} turns: ${err?.stack ?? err}`);
  failed = true;
} finally {
  await stopAll();
  await mock.close();
  space.remove();
}
const fresh = readings.find((r) => r.label === 'fresh');
const after = readings.find((r) => r.label === 'after the day');
const summary = {
  minutes: MINUTES,
  sessions: SESSIONS,
  turns,
  children,
  freshPssMiB: fresh?.pssMiB,
  afterPssMiB: after?.pssMiB,
  growthPssMiB: fresh && after ? Math.round((after.pssMiB - fresh.pssMiB) * 10) / 10 : null,
  growthAloneMiB: fresh?.aloneMiB != null && after?.aloneMiB != null ? Math.round((after.aloneMiB - fresh.aloneMiB) * 10) / 10 : null,
};
console.log(`summary: ${JSON.stringify(summary)}`);
const jsonFile = option('--json');
if (jsonFile) writeFileSync(jsonFile, JSON.stringify({ summary, readings }, null, 2) + '\n');
process.exitCode = failed ? 1 : 0;
