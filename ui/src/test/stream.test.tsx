// Streaming into the UI (#19): the shell's per-frame batches, the model applying one batch
// per animation frame (consecutive deltas merged, order kept, a lone event not held back),
// and long histories rendered from their end, a slice at a time.
import { afterEach, describe, expect, it } from 'vitest';
import { CHAT_STEP, CHAT_WINDOW } from '../components/Chat';
import { SessionModel, mergeDeltas, uiPerf } from '../model';
import { TAURI_EVENT, createTauriPlatform } from '../platform';
import { streamingBlocks } from '../markdown';
import type { Event as WireEvent } from '../bindings/Event';
import { $, $$, FakePlatform, appended, inAct, info, kind, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

const delta = (session: string, text: string) => kind(session, 'content.delta', { text }) as WireEvent;

/** A scheduler the test steps by hand: `frame()` runs what the model asked to run. */
function frames() {
  const queued: (() => void)[] = [];
  return {
    schedule: (run: () => void) => void queued.push(run),
    get waiting() {
      return queued.length;
    },
    frame() {
      for (const run of queued.splice(0)) run();
    },
  };
}

describe('mergeDeltas', () => {
  it('joins consecutive deltas of one session, keeps every other event and the order', () => {
    const stop = kind('p', 'tool.call.started', { call_id: 'c1' }) as WireEvent;
    const merged = mergeDeltas([delta('p', 'a'), delta('p', 'b'), delta('c', 'x'), delta('p', 'c'), stop, delta('p', 'd'), delta('p', 'e')]);
    expect(merged.map((e: any) => [e.session_id, e.kind, e.data.text ?? e.data.call_id])).toEqual([
      ['p', 'content.delta', 'ab'],
      ['c', 'content.delta', 'x'],
      ['p', 'content.delta', 'c'],
      ['p', 'tool.call.started', 'c1'],
      ['p', 'content.delta', 'de'],
    ]);
  });
});

describe('SessionModel per frame', () => {
  it('applies what arrived within a frame as one batch and tells listeners once', async () => {
    const fake = new FakePlatform({ get_session: () => ({ info: info('p'), messages: [] }) });
    const clock = frames();
    const seen: WireEvent[] = [];
    const model = new SessionModel(fake, 'p', { schedule: clock.schedule, onEvent: (e) => seen.push(e) });
    model.start();
    await new Promise((r) => setTimeout(r, 0));
    clock.frame();
    let told = 0;
    model.listen(() => told++);
    fake.emit('p', snapshot('p', { running: true }));
    for (const piece of ['Hel', 'lo', ', ', 'world']) fake.emit('p', delta('p', piece));
    fake.emit('p', appended('p', { role: 'assistant', content: 'Hello, world' }), delta('p', 'Next'));
    // Nothing is applied before the frame.
    expect(model.state.transcripts.p.streaming).toBe('');
    expect(clock.waiting).toBe(1);
    clock.frame();
    expect(told).toBe(1);
    const t = model.state.transcripts.p;
    // In order: the deltas before the message were cleared by it; the one after streams.
    expect(t.messages.map((m) => m.content)).toEqual(['Hello, world']);
    expect(t.streaming).toBe('Next');
    // Every event still reached the app-wide observer, unmerged.
    expect(seen.filter((e: any) => e.kind === 'content.delta')).toHaveLength(5);
    model.dispose();
  });

  it('a lone event is applied at the next frame, not held for more', async () => {
    const fake = new FakePlatform({ get_session: () => ({ info: info('p'), messages: [] }) });
    const clock = frames();
    const model = new SessionModel(fake, 'p', { schedule: clock.schedule });
    model.start();
    await new Promise((r) => setTimeout(r, 0));
    clock.frame();
    expect(clock.waiting).toBe(0);
    fake.emit('p', delta('p', 'only'));
    expect(clock.waiting).toBe(1);
    clock.frame();
    expect(model.state.transcripts.p.streaming).toBe('only');
    expect(clock.waiting).toBe(0);
    model.dispose();
  });

  it('times each frame from its oldest shown delta to after its paint; a hidden child’s deltas are not timed (issue 31)', async () => {
    const fake = new FakePlatform({ get_session: () => ({ info: info('p'), messages: [] }) });
    const clock = frames();
    const model = new SessionModel(fake, 'p', { schedule: clock.schedule });
    model.start();
    await new Promise((r) => setTimeout(r, 0));
    clock.frame();
    model.setShown(['p']);
    const before = uiPerf.deltaToPaint.length;
    // Two deltas in one frame: one sample, from the first.
    fake.emit('p', delta('p', 'a'));
    const first = performance.now();
    await new Promise((r) => setTimeout(r, 20));
    fake.emit('p', delta('p', 'b'));
    clock.frame();
    await new Promise((r) => setTimeout(r, 0));
    expect(uiPerf.deltaToPaint.length).toBe(before + 1);
    const sample = uiPerf.deltaToPaint[uiPerf.deltaToPaint.length - 1];
    expect(sample).toBeGreaterThanOrEqual(15);
    expect(sample).toBeLessThanOrEqual(performance.now() - first + 1);
    // A child that is not shown: its frame is not timed.
    fake.emit('p', delta('c', 'x'));
    clock.frame();
    await new Promise((r) => setTimeout(r, 0));
    expect(uiPerf.deltaToPaint.length).toBe(before + 1);
    model.dispose();
  });

  it('events still queued when the history arrives are merged with it, not added twice', async () => {
    let answer!: (v: unknown) => void;
    const fake = new FakePlatform({ get_session: () => new Promise((r) => (answer = r)) });
    const clock = frames();
    const model = new SessionModel(fake, 'p', { schedule: clock.schedule });
    model.start();
    const a = { role: 'user', content: 'a', id: 'm-a' };
    const b = { role: 'assistant', content: 'b' };
    fake.emit('p', snapshot('p', { running: true }), appended('p', a));
    clock.frame();
    // b was saved (so the read has it) and announced, but its frame has not come yet.
    fake.emit('p', appended('p', b));
    answer({ info: info('p'), messages: [a, b] });
    await new Promise((r) => setTimeout(r, 0));
    clock.frame();
    expect(model.state.transcripts.p.messages.map((m) => m.content)).toEqual(['a', 'b']);
    model.dispose();
  });

  it("a hidden child's deltas stream into the model without re-rendering; its tab shows them all", async () => {
    const fake = new FakePlatform({ get_session: () => ({ info: info('p'), messages: [] }) });
    const model = new SessionModel(fake, 'p', { notifyDelay: 0 });
    model.start();
    await new Promise((r) => setTimeout(r, 0));
    model.setShown(['p']);
    fake.emit('p', { type: 'session_created', session_id: 'c', parent_session_id: 'p', task_id: 't', title: 'C' });
    let told = 0;
    model.listen(() => told++);
    // The first delta starts the child's run: that is news (its tab may show it).
    fake.emit('p', delta('c', 'a'));
    expect(told).toBe(1);
    fake.emit('p', delta('c', 'b'), delta('c', 'c'));
    expect(told).toBe(1);
    expect(model.state.transcripts.c.streaming).toBe('abc');
    // The parent's own deltas still re-render, and so do the child's once it is shown.
    fake.emit('p', delta('p', 'x'));
    expect(told).toBe(2);
    model.setShown(['c']);
    fake.emit('p', delta('c', 'd'));
    expect(told).toBe(3);
    expect(model.state.transcripts.c.streaming).toBe('abcd');
    model.dispose();
  });

  it('the default frame runs by itself (requestAnimationFrame, or a timer without frames)', async () => {
    const fake = new FakePlatform({ get_session: () => ({ info: info('p'), messages: [] }) });
    const model = new SessionModel(fake, 'p');
    model.start();
    fake.emit('p', delta('p', 'a'), delta('p', 'b'));
    await new Promise((r) => setTimeout(r, 150));
    expect(model.state.transcripts.p.streaming).toBe('ab');
    model.dispose();
  });
});

describe('the Tauri adapter', () => {
  it('hands each event of a batch to its subscription in order, also ones that came before the id was known', async () => {
    let handler: ((e: { payload: any }) => void) | null = null;
    const tauri = {
      core: {
        invoke: async (cmd: string) => (cmd === 'subscribe' ? 'feed-7' : null),
      },
      event: {
        listen: async (name: string, fn: (e: { payload: any }) => void) => {
          expect(name).toBe(TAURI_EVENT);
          handler = fn;
          return () => undefined;
        },
      },
    };
    const platform = createTauriPlatform(tauri);
    const got: string[] = [];
    platform.subscribe('p', (e: any) => got.push(e.data?.text ?? e.type));
    await new Promise((r) => setTimeout(r, 0));
    // Sent under the shell's own id before `subscribe` answered: kept, then delivered.
    handler!({ payload: { subscription: 'feed-7', events: [snapshot('p'), delta('p', '1')] } });
    await new Promise((r) => setTimeout(r, 0));
    handler!({ payload: { subscription: 'feed-7', events: [delta('p', '2'), delta('p', '3')] } });
    handler!({ payload: { subscription: 'feed-7', event: delta('p', '4') } });
    expect(got).toEqual(['snapshot', '1', '2', '3', '4']);
  });
});

describe('a long history', () => {
  let unmount: (() => void) | null = null;
  afterEach(() => {
    unmount?.();
    unmount = null;
  });

  it('opens with its last messages rendered; earlier ones come a slice at a time', async () => {
    const history = Array.from({ length: 2000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `message ${i}`, id: `m${i}` }));
    const fake = workspacePlatform([info('a')], { a: history });
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => fake.emit('a', snapshot('a')));
    const shown = () => $$(root, 'chat-message');
    expect(shown()).toHaveLength(CHAT_WINDOW);
    expect(shown()[0].textContent).toContain(`message ${2000 - CHAT_WINDOW}`);
    expect(shown().at(-1)!.textContent).toContain('message 1999');
    expect($(root, 'show-earlier')!.textContent).toContain(`${2000 - CHAT_WINDOW} not shown`);

    // What arrives now is appended below; nothing above moves in.
    await inAct(() => fake.emit('a', appended('a', { role: 'user', content: 'message new', id: 'mn' })));
    expect(shown()).toHaveLength(CHAT_WINDOW + 1);
    expect(shown()[0].textContent).toContain(`message ${2000 - CHAT_WINDOW}`);

    await inAct(() => $(root, 'show-earlier')!.click());
    expect(shown()).toHaveLength(CHAT_WINDOW + CHAT_STEP + 1);
    expect(shown()[0].textContent).toContain(`message ${2000 - CHAT_WINDOW - CHAT_STEP}`);

    // Scrolling near the top renders the next slice too.
    const chat = $(root, 'chat')!;
    Object.defineProperty(chat, 'scrollHeight', { configurable: true, get: () => 50000 });
    Object.defineProperty(chat, 'clientHeight', { configurable: true, get: () => 400 });
    chat.scrollTop = 0;
    await inAct(() => chat.dispatchEvent(new Event('scroll')));
    expect(shown()).toHaveLength(CHAT_WINDOW + 2 * CHAT_STEP + 1);

  }, 60000);

  it('a delta changes the streaming message only: the rows above are the same nodes, untouched', async () => {
    const history = Array.from({ length: 300 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `message ${i}`, id: `m${i}` }));
    const fake = workspacePlatform([info('a')], { a: history });
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => fake.emit('a', snapshot('a', { running: true })));
    const before = $$(root, 'chat-message');
    const column = root.querySelector('.chat-column')!;
    const changes: MutationRecord[] = [];
    const observer = new MutationObserver((list) => changes.push(...list));
    observer.observe(column, { subtree: true, childList: true, characterData: true, attributes: true });
    await inAct(() => fake.emit('a', delta('a', 'Streaming ')));
    await inAct(() => fake.emit('a', delta('a', 'on')));
    observer.disconnect();
    const after = $$(root, 'chat-message');
    expect(after.slice(0, before.length)).toEqual(before);
    expect(root.querySelector('[data-streaming="true"]')!.textContent).toContain('Streaming on');
    // Every DOM change was inside the streaming message (or adding it).
    const streaming = root.querySelector('[data-streaming="true"]')!;
    const outside = changes.filter((c) => !(streaming.contains(c.target) || [...c.addedNodes].includes(streaming)));
    const element = (n: Node) => (n.nodeType === Node.TEXT_NODE ? n.parentElement : (n as Element));
    expect(outside.filter((c) => c.target !== column && !element(c.target)?.closest('.progress'))).toEqual([]);
  });
});

describe('streamingBlocks', () => {
  it('splits at blank lines outside code fences and keeps every character', () => {
    const text = 'One para\nstill one.\n\nTwo.\n\n```js\nconst a = 1;\n\nconst b = 2;\n```\n\n- item\n\n  more of the item\n\nLast, still stream';
    const blocks = streamingBlocks(text);
    expect(blocks.join('')).toBe(text);
    expect(blocks).toEqual([
      'One para\nstill one.\n\n',
      'Two.\n\n',
      '```js\nconst a = 1;\n\nconst b = 2;\n```\n\n',
      '- item\n\n  more of the item\n\n',
      'Last, still stream',
    ]);
    // An open fence keeps everything after it in one block.
    expect(streamingBlocks('a\n\n```\nx\n\ny')).toEqual(['a\n\n', '```\nx\n\ny']);
  });
});
