// The context window in the UI (#13): the meter (status line, child tabs), compaction
// dividers in the chat, the Compact button and /compact, the loaded instruction files.
import { afterEach, describe, expect, it } from 'vitest';
import type { Compaction } from '../bindings/Compaction';
import { HISTORY_TAIL, mergeCompactions } from '../model';
import { CommandError } from '../platform';
import { formatWindow } from '../util';
import { $, $$, info, inAct, key, kind, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

const P = 'sess-p';
const C = 'sess-child';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const user = (content: string, id: string) => ({ role: 'user', content, id });
const assistant = (content: string) => ({ role: 'assistant', content });

/** Six messages: two early turns (summarised), then the turn the model still sees. */
const HISTORY = [
  user('Set up the project', 'u0'),
  assistant('Done: Cargo.toml written.'),
  user('Add a parser', 'u2'),
  assistant('The parser is in src/parse.rs.'),
  user('Now test it', 'u4'),
  assistant('Tests added.'),
];

function compaction(extra: Partial<Compaction> = {}): Compaction {
  return {
    id: 'cmp-1',
    kind: 'summary',
    at: 4,
    first_kept: 4,
    kept_user: [0],
    elided: [],
    summary: 'The person asked for a **parser**.<img src=x onerror="alert(1)">',
    tokens_before: 12000,
    tokens_after: 2100,
    note: null,
    ...extra,
  };
}

async function open(options: { compactions?: Compaction[]; sessions?: string[]; snapshotExtra?: Record<string, unknown> } = {}) {
  const fake = workspacePlatform([info(P, { title: 'Work' })], { [P]: HISTORY });
  fake.handlers.get_session = ({ session_id }) => ({
    info: info(session_id, session_id === C ? { parent_session_id: P, title: 'Child' } : { title: 'Work' }),
    messages: session_id === P ? HISTORY : [],
    compactions: session_id === P ? (options.compactions ?? []) : [],
  });
  fake.handlers.compact = () => ({});
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  await inAct(() => fake.emit(P, snapshot(P, options.snapshotExtra as any)));
  return { fake, root: mounted.root };
}

const meter = (used: number, window: number) => ({ used, window, percent: Math.min(100, Math.floor((used * 100) / window)) });

describe('formatting', () => {
  it('names windows compactly, powers of two as the person knows them', () => {
    expect(formatWindow(32768)).toBe('32k');
    expect(formatWindow(131072)).toBe('128k');
    expect(formatWindow(200000)).toBe('200k');
    expect(formatWindow(128000)).toBe('128k');
    expect(formatWindow(1048576)).toBe('1M');
    expect(formatWindow(1000000)).toBe('1M');
    expect(formatWindow(8000)).toBe('8k');
    expect(formatWindow(900)).toBe('900');
  });

  it('merges loaded and live compactions by id, oldest first', () => {
    const a = compaction({ id: 'a', at: 4 });
    const b = compaction({ id: 'b', at: 9 });
    expect(mergeCompactions([a], [b, a]).map((c) => c.id)).toEqual(['a', 'b']);
    expect(mergeCompactions([b], [a]).map((c) => c.id)).toEqual(['a', 'b']);
  });
});

describe('the context meter', () => {
  it('shows the snapshot meter, then each context.usage event, warning from 80 %', async () => {
    const { fake, root } = await open({ snapshotExtra: { context: meter(13421, 32768) } });
    const status = $(root, 'status-context')!;
    expect(status.textContent).toBe('40 % of 32k');
    expect(status.title).toBe('13421 of 32768 tokens');
    expect(status.dataset.warn).toBeUndefined();

    await inAct(() => fake.emit(P, kind(P, 'context.usage', { meter: meter(26300, 32768) })));
    expect($(root, 'status-context')!.textContent).toBe('80 % of 32k');
    expect($(root, 'status-context')!.dataset.warn).toBe('true');
    expect($(root, 'status-context')!.classList.contains('warn')).toBe(true);

    await inAct(() => fake.emit(P, kind(P, 'context.usage', { meter: meter(20000, 200000) })));
    expect($(root, 'status-context')!.textContent).toBe('10 % of 200k');
    expect($(root, 'status-context')!.dataset.warn).toBeUndefined();
  });

  it('shows no meter before the first model call', async () => {
    const { root } = await open();
    expect($(root, 'status-context')).toBeNull();
  });

  it("each child's tab and pane show the child's own meter, not the parent's", async () => {
    const { fake, root } = await open({ snapshotExtra: { context: meter(3277, 32768) } });
    await inAct(() =>
      fake.emit(
        P,
        { type: 'session_created', session_id: C, parent_session_id: P, task_id: 'call-1', title: 'Child' },
        kind(C, 'subagent.state', { task_id: 'call-1', state: 'running' }),
        kind(C, 'context.usage', { meter: meter(180000, 200000) }),
      ),
    );
    // The status line keeps the parent's meter.
    expect($(root, 'status-context')!.textContent).toBe('10 % of 32k');
    const tab = $$(root, 'child-tab')[0];
    const tabMeter = $(tab, 'tab-context')!;
    expect(tabMeter.textContent).toBe('90 %');
    expect(tabMeter.title).toBe('180000 of 200000 tokens');
    expect(tabMeter.dataset.warn).toBe('true');
    // The main tab shows no child meter of its own.
    expect($($(root, 'tab-main')!, 'tab-context')).toBeNull();

    await inAct(() => tab.click());
    const child = $(root, 'child-view')!;
    expect($(child, 'child-context')!.textContent).toBe('90 % of 200k');
    // A later call of the child moves its meter only.
    await inAct(() => fake.emit(P, kind(C, 'context.usage', { meter: meter(50000, 200000) })));
    expect($(root, 'child-context')!.textContent).toBe('25 % of 200k');
    expect($(root, 'status-context')!.textContent).toBe('10 % of 32k');
  });
});

describe('compaction dividers', () => {
  it('draws a divider from get_session before first_kept, marks what was summarised, and expands to the summary', async () => {
    const { root } = await open({ compactions: [compaction()] });
    const chat = $(root, 'chat')!;
    const column = chat.querySelector('.chat-column')!;
    const children = Array.from(column.children) as HTMLElement[];
    const dividerAt = children.findIndex((el) => el.dataset.testid === 'compaction-divider');
    const messages = $$(chat, 'chat-message');
    // Every message stays on screen; the divider sits right before message 4.
    expect(messages).toHaveLength(6);
    expect(children[dividerAt + 1]).toBe(messages[4]);
    expect(children[dividerAt - 1]).toBe(messages[3]);

    const divider = $(chat, 'compaction-divider')!;
    expect(divider.dataset.kind).toBe('summary');
    expect(divider.textContent).toContain('Earlier conversation summarised');
    expect($(divider, 'compaction-tokens')!.textContent).toBe('12k → 2.1k tokens');
    // Above it: summarised, except the person's first message, which the model still gets.
    expect(messages.map((m) => m.dataset.summarised ?? '')).toEqual(['', 'true', 'true', 'true', '', '']);

    // Collapsed until asked; then the summary as sanitised Markdown.
    expect($(divider, 'compaction-body')).toBeNull();
    await inAct(() => $(divider, 'compaction-toggle')!.click());
    const body = $(divider, 'compaction-body')!;
    expect(body.querySelector('strong')?.textContent).toBe('parser');
    expect(body.querySelector('img')?.getAttribute('onerror') ?? null).toBeNull();
    expect($(divider, 'compaction-toggle')!.getAttribute('aria-expanded')).toBe('true');
    await inAct(() => $(divider, 'compaction-toggle')!.click());
    expect($(divider, 'compaction-body')).toBeNull();
  });

  it('a live context.compacted event adds its divider (once), with its note, and moves the meter', async () => {
    const { fake, root } = await open({ snapshotExtra: { context: meter(30000, 32768) } });
    expect($(root, 'compaction-divider')).toBeNull();
    const dropped = compaction({ id: 'cmp-2', kind: 'dropped', first_kept: 2, kept_user: [0], summary: null, note: 'The summary request failed: status 500', tokens_before: 30000, tokens_after: 9831 });
    await inAct(() => fake.emit(P, kind(P, 'context.compacted', { compaction: dropped })));
    await inAct(() => fake.emit(P, kind(P, 'context.compacted', { compaction: dropped })));
    const dividers = $$(root, 'compaction-divider');
    expect(dividers).toHaveLength(1);
    expect(dividers[0].textContent).toContain('Earliest turns dropped to fit the window');
    expect($(dividers[0], 'compaction-tokens')!.textContent).toBe('30k → 9.8k tokens');
    const messages = $$(root, 'chat-message');
    expect(messages.map((m) => m.dataset.summarised ?? '')).toEqual(['', 'true', '', '', '', '']);
    await inAct(() => $(dividers[0], 'compaction-toggle')!.click());
    expect($(dividers[0], 'compaction-body')!.textContent).toContain('The summary request failed: status 500');
    // The meter shows the estimate after the compaction until the next call reports.
    expect($(root, 'status-context')!.textContent).toBe('30 % of 32k');
  });

  it('a resync re-reads the history and brings the compactions made meanwhile', async () => {
    const { fake, root } = await open();
    expect(fake.callsOf('get_session')).toEqual([{ session_id: P, last: HISTORY_TAIL }]);
    const later = compaction({ id: 'cmp-late' });
    fake.handlers.get_session = ({ session_id }) => ({ info: info(session_id), messages: HISTORY, compactions: [later] });
    // A second snapshot on the stream means events were missed.
    await inAct(() => fake.emit(P, snapshot(P, { compacted: 'cmp-late' } as any)));
    expect(fake.callsOf('get_session')).toHaveLength(2);
    expect($$(root, 'compaction-divider').map((d) => d.dataset.compactionId)).toEqual(['cmp-late']);
    expect($$(root, 'chat-message')).toHaveLength(6);
  });

  it('elided tool output has its own label and says how many results became stubs', async () => {
    const { fake, root } = await open();
    const elided = compaction({ id: 'cmp-3', kind: 'elided', first_kept: 0, kept_user: [], summary: null, elided: [1, 3] });
    await inAct(() => fake.emit(P, kind(P, 'context.compacted', { compaction: elided })));
    const divider = $(root, 'compaction-divider')!;
    expect(divider.textContent).toContain('Earlier tool output elided');
    await inAct(() => $(divider, 'compaction-toggle')!.click());
    expect($(divider, 'compaction-body')!.textContent).toContain('2 tool results below reach the model as a short stub');
    // Nothing before the cut: nothing is marked.
    expect($$(root, 'chat-message').filter((m) => m.dataset.summarised)).toHaveLength(0);
  });

  it("a child's compaction is drawn in the child's transcript only", async () => {
    const { fake, root } = await open();
    await inAct(() =>
      fake.emit(
        P,
        { type: 'session_created', session_id: C, parent_session_id: P, task_id: 'call-1', title: 'Child' },
        kind(C, 'context.compacted', { compaction: compaction({ id: 'cmp-c', first_kept: 0, kept_user: [] }) }),
      ),
    );
    expect($(root, 'compaction-divider')).toBeNull();
    await inAct(() => $$(root, 'child-tab')[0].click());
    expect($$($(root, 'child-view')!, 'compaction-divider').map((d) => d.dataset.compactionId)).toEqual(['cmp-c']);
  });
});

describe('compacting now', () => {
  it('/compact in the composer invokes compact for the session and sends nothing', async () => {
    const { fake, root } = await open();
    const input = $(root, 'prompt-input')!;
    await inAct(() => typeInto(input, '/compact'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('compact')).toEqual([{ session_id: P }]);
    expect(fake.callsOf('submit')).toEqual([]);
    expect(($(root, 'prompt-input') as HTMLTextAreaElement).value).toBe('');
    expect($(root, 'composer-error')).toBeNull();
  });

  it('a failed /compact shows its error in the composer', async () => {
    const { fake, root } = await open();
    fake.handlers.compact = () => {
      throw new CommandError('conflict', 'a compaction is already running');
    };
    const input = $(root, 'prompt-input')!;
    await inAct(() => typeInto(input, '/compact'));
    await inAct(() => key(input, 'Enter'));
    expect($(root, 'composer-error')!.textContent).toContain('/compact failed: a compaction is already running');
  });

  it('the Compact button invokes compact; its error shows beside it', async () => {
    const { fake, root } = await open();
    const button = $(root, 'compact-button') as HTMLButtonElement;
    expect(button.disabled).toBe(false);
    await inAct(() => button.click());
    expect(fake.callsOf('compact')).toEqual([{ session_id: P }]);
    expect($(root, 'compact-error')).toBeNull();

    fake.handlers.compact = () => {
      throw new CommandError('internal', 'the store is read-only');
    };
    await inAct(() => ($(root, 'compact-button') as HTMLButtonElement).click());
    expect($(root, 'compact-error')!.textContent).toContain('Cannot compact: the store is read-only');
    expect(fake.callsOf('compact')).toHaveLength(2);
  });

  it('the Compact button is disabled when no session is open', async () => {
    const fake = workspacePlatform([]);
    fake.handlers.compact = () => ({});
    const mounted = await mountApp(fake, null);
    unmount = mounted.unmount;
    const button = $(mounted.root, 'compact-button') as HTMLButtonElement;
    expect(button.disabled).toBe(true);
    await inAct(() => button.click());
    expect(fake.callsOf('compact')).toEqual([]);
  });
});

describe('instruction files', () => {
  const files = [
    { path: '/ws/AGENTS.md', bytes: 4800, tokens_estimate: 1200, truncated: false },
    { path: '/home/me/.config/bumblehive/AGENTS.md', bytes: 90000, tokens_estimate: 8000, truncated: true },
  ];

  it('the status line names the loaded files and lists each with its tokens and whether it was cut', async () => {
    const { root } = await open({ snapshotExtra: { instructions: files } });
    const indicator = $(root, 'status-instructions')!;
    expect(indicator.textContent).toBe('AGENTS.md · 2 files');
    expect(indicator.title).toContain('/ws/AGENTS.md ~1.2k tokens');
    expect(indicator.title).toContain('/home/me/.config/bumblehive/AGENTS.md ~8k tokens (cut)');
    expect($(root, 'instructions-list')).toBeNull();
    await inAct(() => indicator.click());
    const items = $$(root, 'instruction-file');
    expect(items.map((i) => i.textContent)).toEqual(['/ws/AGENTS.md ~1.2k tokens', '/home/me/.config/bumblehive/AGENTS.md ~8k tokens (cut)']);
    expect(items.map((i) => i.dataset.truncated ?? '')).toEqual(['', 'true']);
    // A click elsewhere closes the list.
    await inAct(() => $(root, 'chat')!.dispatchEvent(new MouseEvent('mousedown', { bubbles: true })));
    expect($(root, 'instructions-list')).toBeNull();
  });

  it('shows nothing when no files were loaded', async () => {
    const { root } = await open({ snapshotExtra: { instructions: [] } });
    expect($(root, 'status-instructions')).toBeNull();
  });

  it("learns a run's files from the snapshot after its first model call", async () => {
    const { fake, root } = await open();
    expect($(root, 'status-instructions')).toBeNull();
    fake.handlers.snapshot = ({ session_id }) => {
      const { type: _t, ...rest } = snapshot(session_id, { instructions: [files[0]] } as any) as any;
      return rest;
    };
    const before = fake.callsOf('snapshot').length;
    await inAct(() => fake.emit(P, kind(P, 'context.usage', { meter: meter(1000, 32768) })));
    await inAct(() => fake.emit(P, kind(P, 'context.usage', { meter: meter(2000, 32768) })));
    // Once per run, not once per call.
    expect(fake.callsOf('snapshot').length - before).toBe(1);
    expect($(root, 'status-instructions')!.textContent).toBe('AGENTS.md');
  });
});
