// A long session opens by its tail (#19): `get_session` with `last`, earlier pages read with
// `before` as the person scrolls up or asks for them, and every index an action sends or a
// marker carries still counts from the start of the whole history.
import { afterEach, describe, expect, it } from 'vitest';
import type { Compaction } from '../bindings/Compaction';
import { HISTORY_PAGE, HISTORY_TAIL } from '../model';
import { $, $$, historyPage, info, inAct, settle, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const N = 250;
/** Even indexes are the person's, odd ones the model's answers. */
const HISTORY = Array.from({ length: N }, (_, i) => (i % 2 ? { role: 'assistant', content: `answer ${i}` } : { role: 'user', content: `question ${i}`, id: `m${i}` }));

function compaction(extra: Partial<Compaction> = {}): Compaction {
  return { id: 'cmp-1', kind: 'summary', at: 140, first_kept: 140, kept_user: [130], elided: [], summary: 'earlier work', tokens_before: 9000, tokens_after: 900, note: null, ...extra };
}

async function open(compactions: Compaction[] = []) {
  const fake = workspacePlatform([info('a')], { a: HISTORY });
  fake.handlers.get_session = ({ session_id, last, before }) => historyPage(info(session_id), HISTORY, last, before, { compactions });
  fake.handlers.fork_session = (args) => ({ session: info('f', { forked_from: 'a', forked_at: args.message_index }), draft: 'again' });
  const mounted = await mountApp(fake, 'a');
  unmount = mounted.unmount;
  await inAct(() => fake.emit('a', snapshot('a')));
  return { fake, root: mounted.root };
}

const texts = (root: ParentNode) => $$(root, 'chat-message').map((m) => m.querySelector('.plain, .markdown')?.textContent ?? m.textContent);

describe('a long session opened by its tail', () => {
  it('asks for the last messages only, then reads earlier pages as the person asks for them', async () => {
    const { fake, root } = await open();
    expect(fake.callsOf('get_session')).toEqual([{ session_id: 'a', last: HISTORY_TAIL }]);
    // The whole history's count is said, not the loaded part's.
    expect($(root, 'show-earlier')!.textContent).toContain(`${N - 24} not shown`);
    expect(texts(root).at(-1)).toContain(`answer ${N - 1}`);

    // Rendering reaches above the loaded tail: the page before it is read.
    await inAct(() => $(root, 'show-earlier')!.click());
    await settle();
    const first = N - HISTORY_TAIL;
    expect(fake.callsOf('get_session').slice(1)).toEqual([{ session_id: 'a', before: first, last: HISTORY_PAGE }]);
    expect(texts(root)[0]).toContain(`question ${N - 24 - 100}`);
    expect($$(root, 'chat-message')).toHaveLength(24 + 100);

    // Scrolling near the top reads the next (last) page, down to the first message.
    const chat = $(root, 'chat')!;
    Object.defineProperty(chat, 'scrollHeight', { configurable: true, get: () => 50000 });
    Object.defineProperty(chat, 'clientHeight', { configurable: true, get: () => 400 });
    chat.scrollTop = 0;
    await inAct(() => chat.dispatchEvent(new Event('scroll')));
    await settle();
    expect(fake.callsOf('get_session').slice(2)).toEqual([{ session_id: 'a', before: first - HISTORY_PAGE, last: HISTORY_PAGE }]);
    await inAct(() => $(root, 'show-earlier')!.click());
    await settle();
    expect(texts(root)[0]).toContain('question 0');
    expect($$(root, 'chat-message')).toHaveLength(N);
    expect($(root, 'show-earlier')).toBeNull();
    // All was read in three pages; none twice.
    expect(fake.callsOf('get_session')).toHaveLength(3);
  }, 30000);

  it('actions on messages of any page send whole-history indexes; compaction markers stay in place', async () => {
    const { fake, root } = await open([compaction()]);
    const forkOf = (content: string) => {
      const row = $$(root, 'chat-message').find((m) => m.textContent?.includes(content))!;
      return $(row, 'fork-message')!;
    };
    // A message of the tail: its index in the whole history, not in the page.
    await inAct(() => forkOf(`question ${N - 2}`).click());
    await settle();
    expect(fake.callsOf('fork_session').at(-1)).toEqual({ session_id: 'a', message_index: N - 2, rewind: false });

    // Reopen the original and read an earlier page: the divider sits before message 140.
    unmount?.();
    const again = await open([compaction()]);
    await inAct(() => $(again.root, 'show-earlier')!.click());
    await settle();
    const column = again.root.querySelector('.chat-column')!;
    const divider = $(column, 'compaction-divider')!;
    expect(divider.dataset.firstKept).toBe('140');
    const next = divider.nextElementSibling as HTMLElement;
    expect(next.textContent).toContain('question 140');
    // Before the cut: summarised, except the person's message the compaction kept.
    const row = (content: string) => $$(again.root, 'chat-message').find((m) => m.textContent?.includes(content))!;
    expect(row('answer 139').dataset.summarised).toBe('true');
    expect(row('question 128').dataset.summarised).toBe('true');
    expect(row('question 130').dataset.summarised).toBeUndefined();
    expect(row('question 142').dataset.summarised).toBeUndefined();
    // A message of the page read later: its whole-history index.
    await inAct(() => $(row('question 130'), 'fork-message')!.click());
    await settle();
    expect(again.fake.callsOf('fork_session').at(-1)).toEqual({ session_id: 'a', message_index: 130, rewind: false });
  }, 30000);

  it('back in a session scrolled far up, the pages of its remembered place are read again', async () => {
    const fake = workspacePlatform([info('a', { updated_at: '2025-01-02T00:00:00Z' }), info('b')], { a: HISTORY, b: [] });
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    const select = (id: string) => ($$(root, 'session-item').find((i) => i.dataset.sessionId === id)!.querySelector('.session-open') as HTMLElement).click();
    await inAct(() => fake.emit('a', snapshot('a')));
    await inAct(() => $(root, 'show-earlier')!.click());
    await settle();
    expect(texts(root)[0]).toContain(`question ${N - 24 - 100}`);
    await inAct(() => select('b'));
    await inAct(() => select('a'));
    await inAct(() => fake.emit('a', snapshot('a')));
    await settle();
    // Read by the tail again, then the page its place needs.
    const reads = fake.callsOf('get_session').filter((c) => c.session_id === 'a');
    expect(reads.slice(-2)).toEqual([{ session_id: 'a', last: HISTORY_TAIL }, { session_id: 'a', before: N - HISTORY_TAIL, last: HISTORY_PAGE }]);
    expect(texts(root)[0]).toContain(`question ${N - 24 - 100}`);
    expect($$(root, 'chat-message')).toHaveLength(24 + 100);
  }, 30000);

  it('Edit still offers the last message of the person, and a failed run is noted after the end', async () => {
    const { fake, root } = await open();
    const edits = $$(root, 'edit-message');
    expect(edits).toHaveLength(1);
    await inAct(() => edits[0].click());
    expect(($(root, 'prompt-input') as HTMLTextAreaElement).value).toBe(`question ${N - 2}`);
    // The note's place is a whole-history index: after the last message, in view.
    await inAct(() => fake.emit('a', snapshot('a', { running: true }), { type: 'error', session_id: 'a', message: 'network error: connection refused' }));
    const note = $(root, 'run-error')!;
    expect(note).not.toBeNull();
    const rows = Array.from(root.querySelector('.chat-column')!.querySelectorAll('[data-testid="chat-message"], [data-testid="run-error"]'));
    expect(rows.at(-1)).toBe(note);
    await inAct(() => $(note, 'error-retry')!.click());
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'a', content: `question ${N - 2}`, config: null });
  }, 30000);
});
