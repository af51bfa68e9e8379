// The keyboard (E16, E17): focus back to the composer after an approval or a dialog, the
// window's keys, the /agent menu's Enter, the approval dock's key hint, and focus rings.
import { afterEach, describe, expect, it } from 'vitest';
// The stylesheet's text (vitest processes `?raw` as plain text, see vite.config.ts's test.css).
import css from '../styles.css?raw';
import { $, $$, info, inAct, key, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const P = 'p';
const child = (n: number) => ({ task_id: `t${n}`, session_id: `c${n}`, parent_session_id: P, title: `Child ${n}`, state: 'done' });
const request = { type: 'approval_request', approval_id: 'ap1', session_id: P, parent_session_id: null, title: null, tool: 'run_command', arguments: { command: 'ls' }, rememberable: false };

async function open(sessions = [info(P, { title: 'Parent work', updated_at: '2025-01-03T00:00:00Z' })]) {
  const fake = workspacePlatform(sessions);
  fake.handlers.create_session = () => info('n');
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  return { fake, root: mounted.root };
}
const input = (root: HTMLElement) => $(root, 'prompt-input') as HTMLTextAreaElement;
const ctrl = (k: string, init: KeyboardEventInit = {}) => key(document.activeElement as HTMLElement ?? document.body, k, { ctrlKey: true, ...init });
const activeTab = (root: HTMLElement) => root.querySelector('.tabs [aria-selected="true"]') as HTMLElement;

describe('focus goes back to the composer (E16)', () => {
  it('after Approve, the next keys go to the composer', async () => {
    const { fake, root } = await open();
    // The person is not typing (they read the chat): the dock takes focus.
    input(root).blur();
    await inAct(() => fake.emit(P, snapshot(P, { running: true }), request));
    const dialog = $(root, 'approval-dialog')!;
    expect(document.activeElement).toBe(dialog);
    // The dock says which keys do what.
    expect($(dialog, 'approval-keys')!.textContent).toContain('Space');
    expect($(dialog, 'approval-keys')!.textContent).toContain('Enter never approves');
    await inAct(() => $(dialog, 'approval-approve')!.click());
    expect(fake.callsOf('decide_approval')).toHaveLength(1);
    expect($(root, 'approval-dialog')).toBeNull();
    expect(document.activeElement).toBe(input(root));
  });

  it('after Settings (Ctrl+,) closes, and after the session switcher closes', async () => {
    const { fake, root } = await open();
    await inAct(() => fake.emit(P, snapshot(P)));
    await inAct(() => ctrl(','));
    expect($(root, 'settings-dialog')).not.toBeNull();
    await inAct(() => $(root, 'settings-close')!.click());
    expect($(root, 'settings-dialog')).toBeNull();
    expect(document.activeElement).toBe(input(root));
    await inAct(() => ctrl('k'));
    expect(document.activeElement).toBe($(root, 'switcher-input'));
    await inAct(() => key($(root, 'switcher-input')!, 'Escape'));
    expect($(root, 'quick-switcher')).toBeNull();
    expect(document.activeElement).toBe(input(root));
  });
});

describe('window keys (E17)', () => {
  it('Ctrl+N starts a new conversation; Ctrl+K finds a session by its title and opens it', async () => {
    const { fake, root } = await open([
      info(P, { title: 'Parent work', updated_at: '2025-01-03T00:00:00Z' }),
      info('q', { title: 'Fix the parser', updated_at: '2025-01-02T00:00:00Z' }),
      info('r', { title: 'Write docs', updated_at: '2025-01-01T00:00:00Z' }),
    ]);
    await inAct(() => fake.emit(P, snapshot(P)));
    const n = ctrl('n');
    await inAct(() => undefined);
    expect(n.defaultPrevented).toBe(true);
    expect($(root, 'session-pane')).toBeNull();
    expect(document.activeElement).toBe(input(root));
    await inAct(() => ctrl('k'));
    const find = $(root, 'switcher-input')!;
    expect($$(root, 'switcher-item').map((i) => i.dataset.sessionId)).toEqual([P, 'q', 'r']);
    await inAct(() => typeInto(find, 'DOC'));
    expect($$(root, 'switcher-item').map((i) => i.dataset.sessionId)).toEqual(['r']);
    await inAct(() => typeInto(find, 'r'));
    await inAct(() => key(find, 'ArrowDown'));
    await inAct(() => key(find, 'Enter'));
    expect($(root, 'quick-switcher')).toBeNull();
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('q');
  });

  it('Ctrl+Tab / Ctrl+Shift+Tab go round the tabs; Ctrl+2 opens the second, Ctrl+9 the last', async () => {
    const { fake, root } = await open();
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [child(1), child(2)] as any })));
    expect(activeTab(root).dataset.testid).toBe('tab-main');
    await inAct(() => ctrl('Tab'));
    expect(activeTab(root).dataset.testid).toBe('tab-changes');
    await inAct(() => ctrl('Tab'));
    expect(activeTab(root).dataset.sessionId).toBe('c1');
    await inAct(() => ctrl('Tab', { shiftKey: true }));
    expect(activeTab(root).dataset.testid).toBe('tab-changes');
    await inAct(() => ctrl('Tab', { shiftKey: true }));
    await inAct(() => ctrl('Tab', { shiftKey: true }));
    expect(activeTab(root).dataset.sessionId).toBe('c2');
    await inAct(() => ctrl('1'));
    expect(activeTab(root).dataset.testid).toBe('tab-main');
    await inAct(() => ctrl('2'));
    expect(activeTab(root).dataset.testid).toBe('tab-changes');
    await inAct(() => ctrl('9'));
    expect(activeTab(root).dataset.sessionId).toBe('c2');
  });

  it('Ctrl+Shift+Tab goes back in WebKitGTK too, where Shift+Tab comes as key "Unidentified" (code "Tab")', async () => {
    // Seen in the desktop window (e2e keyboard step), from WebDriver and from the X keyboard
    // (xdotool) alike: WebKitGTK 2.50 names the key of Shift+Tab (ISO_Left_Tab) "Unidentified".
    const { fake, root } = await open();
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [child(1), child(2)] as any })));
    const n = ctrl('Unidentified', { shiftKey: true, code: 'Tab' });
    await inAct(() => undefined);
    expect(n.defaultPrevented).toBe(true);
    expect(activeTab(root).dataset.sessionId).toBe('c2');
    await inAct(() => ctrl('Unidentified', { shiftKey: true, code: 'Tab' }));
    expect(activeTab(root).dataset.sessionId).toBe('c1');
  });

  it('in the /agent menu, Enter chooses the highlighted profile', async () => {
    const { fake } = await open();
    fake.handlers.list_agents = () => ({
      profiles: [
        { name: 'explore', description: 'Reads', provider: null, model: null, tools: null, disallowed_tools: [], max_turns: null, instructions: '', source: 'built-in', notices: [] },
        { name: 'review', description: 'Reviews', provider: null, model: null, tools: null, disallowed_tools: [], max_turns: null, instructions: '', source: 'built-in', notices: [] },
      ],
      errors: [],
    });
    fake.handlers.set_agent = ({ session_id, agent }) => info(session_id, { agent });
    unmount?.();
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P)));
    const field = input(mounted.root);
    await inAct(() => typeInto(field, '/agent '));
    expect($$(mounted.root, 'argument-item').map((i) => i.dataset.name)).toEqual(['explore', 'review', 'none']);
    await inAct(() => key(field, 'ArrowDown'));
    await inAct(() => key(field, 'Enter'));
    expect(fake.callsOf('set_agent')).toEqual([{ session_id: P, agent: 'review' }]);
    // Without moving the highlight, `/agent ` + Enter still lists the profiles.
    await inAct(() => typeInto(field, '/agent '));
    await inAct(() => key(field, 'Enter'));
    expect(fake.callsOf('set_agent')).toHaveLength(1);
    expect($(mounted.root, 'composer-info')!.textContent).toContain('Profiles');
  });
});

describe('focus rings (E17)', () => {
  it('every focus stop shows the ring, drawn inside the bars and lists that clip', async () => {
    const style = document.createElement('style');
    style.textContent = css;
    const fake = workspacePlatform([info(P, { title: 'Parent work' })]);
    fake.handlers.get_config = () => ({
      provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'qwen' },
      providers: { claude: { kind: 'anthropic', base_url: 'https://api.anthropic.com', model: 'claude-sonnet-4-5' } },
    });
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    document.head.appendChild(style);
    try {
      const root = mounted.root;
      await inAct(() => fake.emit(P, snapshot(P, { subagents: [child(1)] as any, tree_usage: { input_tokens: 100, output_tokens: 35 } as any })));
      const stops = Array.from(root.querySelectorAll('button:not(:disabled), select, textarea, input:not([hidden]), [tabindex]:not([tabindex="-1"])')) as HTMLElement[];
      const names = (el: HTMLElement) => el.dataset.testid ?? el.className ?? el.tagName;
      // The stops the review found without a ring are among them.
      expect(stops.some((el) => el.matches('.model-picker'))).toBe(true);
      expect(stops.filter((el) => el.closest('.status-line')).length).toBeGreaterThan(0);
      const clipping = (el: HTMLElement) => {
        for (let p = el.parentElement; p; p = p.parentElement) {
          const cs = getComputedStyle(p);
          if ([cs.overflow, cs.overflowX, cs.overflowY].some((o) => o === 'hidden' || o === 'auto' || o === 'scroll')) {
            if (p.matches('.status-line, .tabs, .sessions')) return true;
          }
        }
        return false;
      };
      const bad: string[] = [];
      for (const el of stops) {
        el.focus();
        const cs = getComputedStyle(el);
        // jsdom keeps the shorthand as written: "2px solid var(--accent)".
        const ring = /\bsolid\b/.test(cs.outline) && parseFloat(/([\d.]+)px/.exec(cs.outline)?.[1] ?? '0') >= 2;
        if (!ring) bad.push(`${names(el)}: no ring (${cs.outline})`);
        else if (clipping(el) && parseFloat(cs.outlineOffset) > -2) bad.push(`${names(el)}: ring clipped (offset ${cs.outlineOffset})`);
      }
      expect(bad).toEqual([]);
    } finally {
      style.remove();
    }
  });
});
