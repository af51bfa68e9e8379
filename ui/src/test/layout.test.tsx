// Layout at usual widths (E15): titles keep their room before model names, states and
// meters; a row's tools take room only on hover or focus; the tab strip scrolls and an
// "All tabs" menu lists every tab. (jsdom has no layout: the rules are checked as computed.)
import { tabScrollLeft, wheelSideways } from '../components/SessionPane';
import { afterEach, describe, expect, it } from 'vitest';
import css from '../styles.css?raw';
import { $, $$, info, inAct, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
let style: HTMLStyleElement | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
  style?.remove();
  style = null;
});

const P = 'p';
const child = (n: number) => ({ task_id: `t${n}`, session_id: `c${n}`, parent_session_id: P, title: `Review slots-${n}`, state: 'done' });

async function open() {
  const fake = workspacePlatform([
    info(P, { title: 'DELEGATE three reviews of the slot code' }),
    info('q', { title: 'WRITE notes about the slots', created_at: '2024-12-01T00:00:00Z' }),
    ...[1, 2, 3].map((n) => info(`c${n}`, { parent_session_id: P, task_id: `t${n}`, title: `Review slots-${n}`, agent: 'explore', models: [{ provider: 'fake', model: 'qwen2.5-coder-0.5b', usage: { input_tokens: 10, output_tokens: 5 } }] as any })),
  ]);
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  style = document.createElement('style');
  style.textContent = css;
  document.head.appendChild(style);
  await inAct(() => fake.emit(P, snapshot(P, { subagents: [child(1), child(2), child(3)] as any })));
  return { fake, root: mounted.root };
}

/** A flex item's grow and shrink as computed (jsdom keeps the `flex` shorthand as written). */
function flexOf(el: Element) {
  const cs = getComputedStyle(el);
  const parts = (cs.flex || '').split(/\s+/);
  return { shrink: cs.flexShrink || parts[1] || '1', basis: cs.flexBasis || parts[2] || 'auto' };
}

describe('layout at usual widths (E15)', () => {
  it("a session row's rename, Archive and delete take no room until the row is pointed at or focused, the selected one too", async () => {
    const { root } = await open();
    for (const id of [P, 'q']) {
      const item = root.querySelector(`[data-testid="session-item"][data-session-id="${id}"]`) as HTMLElement;
      for (const tool of ['session-rename', 'session-archive', 'session-delete']) expect(getComputedStyle($(item, tool)!).display).toBe('none');
    }
    // Keyboard: focusing the row shows its tools, so Tab reaches them.
    const item = root.querySelector(`[data-testid="session-item"][data-session-id="q"]`) as HTMLElement;
    (item.querySelector('.session-open') as HTMLElement).focus();
    // jsdom caches computed styles until the DOM changes (a focus is no change): touch it.
    document.body.setAttribute('data-focus-moved', '1');
    for (const tool of ['session-rename', 'session-archive', 'session-delete']) expect(getComputedStyle($(item, tool)!).display).not.toBe('none');
  });

  it('titles keep their room: the model name, the state and the meter give way first (tabs and sidebar)', async () => {
    const { root } = await open();
    const tab = $$(root, 'child-tab')[0];
    expect(flexOf(tab.querySelector('.tab-title')!).shrink).toBe('0');
    for (const sel of ['.tab-agent', '.tab-state']) {
      const el = tab.querySelector(sel)!;
      expect(Number(flexOf(el).shrink)).toBeGreaterThan(0);
      expect(getComputedStyle(el).minWidth).toBe('0');
    }
    const row = root.querySelector('[data-testid="session-item"][data-session-id="c1"]')!;
    // The title takes its width first; the model name only what is left (basis 0).
    expect(flexOf(row.querySelector('.session-agent')!).basis).toMatch(/^0/);
    expect(getComputedStyle(row.querySelector('.session-title')!).minWidth).toBe('3em');
  });

  it('the tab strip scrolls instead of squashing tabs, and the All tabs menu opens any of them', async () => {
    const { root } = await open();
    const strip = root.querySelector('.tabs')!;
    // Scrolled by the app (no scrollbar over the tabs): wheelSideways, tabScrollLeft.
    expect(getComputedStyle(strip).overflowX).toBe('hidden');
    for (const tab of $$(root, 'child-tab')) expect(flexOf(tab).shrink).toBe('0');
    const menu = $(root, 'tab-menu') as HTMLSelectElement;
    expect(Array.from(menu.options).map((o) => o.textContent)).toEqual(['Main', 'Changes', 'Review slots-1 — done', 'Review slots-2 — done', 'Review slots-3 — done']);
    menu.value = 'c3';
    await inAct(() => menu.dispatchEvent(new Event('change', { bubbles: true })));
    expect($(root, 'child-view')!.dataset.sessionId).toBe('c3');
    expect(menu.value).toBe('c3');
  });

  it('the All tabs menu does not widen the strip: its text is contained (paint)', async () => {
    // Seen in the desktop window (WebKitGTK, e2e step 17): a long entry in the menu ("Writer —
    // running") made the strip 16 px wider than its box although every tab fitted; the strip's
    // scrollbar then lay over the lower half of the tabs, where a click reached the scrollbar,
    // not the tab (WebDriver: "element not interactable").
    const { root } = await open();
    expect(getComputedStyle($(root, 'tab-menu')!).getPropertyValue('contain')).toBe('paint');
  });
});

describe('the approval dock (E20)', () => {
  it('a long "Always allow exactly …" wraps inside the dock, with the whole text in its tooltip', async () => {
    const fake = workspacePlatform([info(P)]);
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    style = document.createElement('style');
    style.textContent = css;
    document.head.appendChild(style);
    const command = `python3 -c "import urllib.request; print(urllib.request.urlopen('https://example.com/${'x'.repeat(200)}').read())"`;
    const label = `always allow exactly \`${command}\` [network] in this session`;
    await inAct(() =>
      fake.emit(P, snapshot(P, { running: true }), {
        type: 'approval_request', approval_id: 'a1', session_id: P, parent_session_id: null, title: null, tool: 'run_command',
        arguments: { command }, rememberable: true, remember_label: label,
      }),
    );
    const always = $(mounted.root, 'approval-always')!;
    expect(always.title).toBe(`A${label.slice(1)}`);
    const cs = getComputedStyle(always);
    expect(cs.whiteSpace).toBe('normal');
    expect(cs.maxWidth).toBe('100%');
    expect(cs.overflowWrap || cs.getPropertyValue('overflow-wrap')).toBe('anywhere');
    // However long the request, the decision and its keys stay in sight at the dock's bottom.
    const buttons = always.closest('.dialog-buttons')!;
    expect(getComputedStyle(buttons).position).toBe('sticky');
    expect($(buttons as HTMLElement, 'approval-keys')).not.toBeNull();
  });
});

describe('the open tab is scrolled into the strip sideways only', () => {
  const box = (left: number, width: number) => ({ left, width, right: left + width, top: 0, bottom: 30, height: 30, x: left, y: 0, toJSON: () => ({}) }) as DOMRect;
  const strip = (scrollLeft: number, clientWidth: number) => {
    const el = document.createElement('div');
    el.style.scrollPaddingInlineEnd = '100px';
    Object.defineProperty(el, 'clientWidth', { value: clientWidth });
    Object.defineProperty(el, 'scrollLeft', { value: scrollLeft, writable: true });
    el.getBoundingClientRect = () => box(0, clientWidth);
    document.body.appendChild(el);
    return el;
  };
  const tab = (left: number, width: number) => {
    const el = document.createElement('button');
    el.getBoundingClientRect = () => box(left, width);
    return el;
  };
  it('leaves a tab in view alone, brings one from the left or the right (left of the All tabs menu)', () => {
    const s = strip(50, 600);
    expect(tabScrollLeft(s, tab(10, 100))).toBe(50);
    expect(tabScrollLeft(s, tab(-30, 100))).toBe(20);
    expect(tabScrollLeft(s, tab(460, 100))).toBe(110);
  });
});

describe('the tab strip scrolls sideways without a scrollbar over its tabs', () => {
  it('has no scrollbar in either engine: the app scrolls it', async () => {
    await open();
    const strip = document.querySelector('.tabs') as HTMLElement;
    expect(getComputedStyle(strip).overflowX).toBe('hidden');
    // Not hidden with scrollbar-width: none, which hung WebKitWebDriver's screenshots.
    expect(css).not.toMatch(/\.tabs\s*\{[^}]*scrollbar-width/);
  });
  const strip = (scrollWidth: number, clientWidth: number) => {
    const el = document.createElement('div');
    Object.defineProperty(el, 'scrollWidth', { value: scrollWidth });
    Object.defineProperty(el, 'clientWidth', { value: clientWidth });
    el.scrollLeft = 0;
    let left = 0;
    Object.defineProperty(el, 'scrollLeft', { get: () => left, set: (v: number) => (left = Math.max(0, v)) });
    el.addEventListener('wheel', (e) => wheelSideways(e as WheelEvent));
    return el;
  };
  const wheel = (el: HTMLElement, init: WheelEventInit) => {
    const e = new WheelEvent('wheel', { cancelable: true, bubbles: true, ...init });
    el.dispatchEvent(e);
    return e.defaultPrevented;
  };
  it('turns an up/down wheel into sideways scrolling while the tabs overflow', () => {
    const s = strip(1200, 400);
    expect(wheel(s, { deltaY: 100 })).toBe(true);
    expect(s.scrollLeft).toBe(100);
    expect(wheel(s, { deltaY: 3, deltaMode: 1 })).toBe(true);
    expect(s.scrollLeft).toBe(220);
    expect(wheel(s, { deltaY: -500 })).toBe(true);
    expect(s.scrollLeft).toBe(0);
  });
  it('scrolls with a sideways swipe too, and leaves a strip whose tabs fit alone', () => {
    const s = strip(1200, 400);
    expect(wheel(s, { deltaX: 80, deltaY: 10 })).toBe(true);
    expect(s.scrollLeft).toBe(80);
    const fits = strip(400, 400);
    expect(wheel(fits, { deltaY: 100 })).toBe(false);
    expect(fits.scrollLeft).toBe(0);
  });
});
