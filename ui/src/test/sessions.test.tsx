// Session tools in the sidebar: rename, search (titles at once, content through the
// backend), archive; each hidden when the backend does not know its command.
import { afterEach, describe, expect, it } from 'vitest';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { SessionListEvent } from '../bindings/SessionListEvent';
import { $, $$, info, inAct, settle, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const titles = (root: HTMLElement) => $$(root, 'session-item').map((i) => i.querySelector('.session-title')!.textContent);
/** Lets the debounced search run: waits (bounded) until the backend was asked. */
async function waitForSearch(fake: { callsOf(c: string): unknown[] }, count: number) {
  for (let i = 0; i < 400 && fake.callsOf('search_sessions').length < count; i++) await settle(1);
  await settle();
}

describe('session tools', () => {
  it('renames, searches titles and content, and archives', async () => {
    const list: (SessionInfo & { archived?: boolean })[] = [
      info('a', { title: 'Fix the tests', created_at: '2025-01-02T00:00:00Z' }),
      info('b', { title: 'Refactor auth' }),
    ];
    const fake = workspacePlatform(list);
    fake.handlers.rename_session = ({ session_id, title }) => Object.assign(list.find((s) => s.session_id === session_id)!, { title });
    fake.handlers.archive_session = ({ session_id, archived }) => Object.assign(list.find((s) => s.session_id === session_id)!, { archived });
    fake.handlers.search_sessions = ({ query }) => (query === 'tokens' ? [list[1]] : []);
    // A real backend answers with new objects each time.
    fake.handlers.list_sessions = () => list.map((s) => ({ ...s }));
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;

    await inAct(() => $$(root, 'session-rename')[0].click());
    await inAct(() => typeInto($(root, 'session-rename-input')!, 'Green tests'));
    await inAct(() => ($(root, 'session-rename-input')!.closest('form') as HTMLFormElement).requestSubmit());
    await settle();
    expect(fake.callsOf('rename_session')).toEqual([{ session_id: 'a', title: 'Green tests' }]);
    expect(titles(root)).toEqual(['Green tests', 'Refactor auth']);

    await inAct(() => typeInto($(root, 'session-search')!, 'green'));
    expect(titles(root)).toEqual(['Green tests']);
    // Words only in a message: the backend's search finds the session.
    await inAct(() => typeInto($(root, 'session-search')!, 'tokens'));
    await waitForSearch(fake, 2);
    expect(fake.callsOf('search_sessions').at(-1)).toEqual({ query: 'tokens', workspace: '/ws' });
    expect(titles(root)).toEqual(['Refactor auth']);
    await inAct(() => $(root, 'session-search-clear')!.click());
    expect(($(root, 'session-search') as HTMLInputElement).value).toBe('');

    await inAct(() => $$(root, 'session-archive')[1].click());
    await settle(80);
    expect(fake.callsOf('archive_session')).toEqual([{ session_id: 'b', archived: true }]);
    expect(titles(root)).toEqual(['Green tests']);
    await inAct(() => $(root, 'show-archived')!.click());
    expect(titles(root)).toEqual(['Green tests', 'Refactor auth']);
  });

  it('a backend without the commands hides the controls and still filters titles', async () => {
    const fake = workspacePlatform([info('a', { title: 'Fix the tests' }), info('b', { title: 'Refactor auth' })]);
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => $$(root, 'session-rename')[0].click());
    await inAct(() => typeInto($(root, 'session-rename-input')!, 'New name'));
    await inAct(() => ($(root, 'session-rename-input')!.closest('form') as HTMLFormElement).requestSubmit());
    await settle();
    expect($$(root, 'session-rename')).toEqual([]);
    expect($(root, 'session-tool-error')).toBeNull();
    await inAct(() => typeInto($(root, 'session-search')!, 'auth'));
    await waitForSearch(fake, 1);
    expect(titles(root)).toEqual(['Refactor auth']);
    expect(($(root, 'session-search') as HTMLInputElement).placeholder).toBe('Search titles');
  });

  it('keeps the row the person was at in place when the search clears (E23: no rows shifting under the pointer)', async () => {
    // Twelve sessions, newest first; "deploy" matches the ninth.
    const list = Array.from({ length: 12 }, (_, i) =>
      info(`s${i}`, { title: i === 8 ? 'Deploy the site' : `Session ${i}`, created_at: `2025-01-${String(20 - i).padStart(2, '0')}T00:00:00Z` }),
    );
    const fake = workspacePlatform(list);
    fake.handlers.search_sessions = () => [];
    const mounted = await mountApp(fake, 's0');
    unmount = mounted.unmount;
    const root = mounted.root;
    // Layout, as the engine would give it: rows 30 px apart under the list's top, scrolled.
    const ul = $(root, 'session-list')!;
    let scrolled = 0;
    Object.defineProperty(ul, 'scrollTop', { get: () => scrolled, set: (v: number) => (scrolled = Math.max(0, v)) });
    const rects = HTMLElement.prototype.getBoundingClientRect;
    HTMLElement.prototype.getBoundingClientRect = function (this: HTMLElement) {
      const rows = $$(root, 'session-item');
      const i = rows.indexOf(this);
      const top = i < 0 ? 0 : 100 + 30 * i - scrolled;
      return { top, bottom: top + 30, left: 0, right: 200, width: 200, height: 30, x: 0, y: top, toJSON: () => ({}) } as DOMRect;
    };
    try {
      await inAct(() => typeInto($(root, 'session-search')!, 'deploy'));
      await waitForSearch(fake, 1);
      expect(titles(root)).toEqual(['Deploy the site']);
      const before = $$(root, 'session-item')[0].getBoundingClientRect().top;
      await inAct(() => $(root, 'session-search-clear')!.click());
      expect(titles(root).length).toBe(12);
      const row = $$(root, 'session-item').find((r) => r.dataset.sessionId === 's8')!;
      expect(row.getBoundingClientRect().top).toBe(before);
      expect(scrolled).toBe(240);
    } finally {
      HTMLElement.prototype.getBoundingClientRect = rects;
    }
  });
});

describe('the session list feed', () => {
  it('keeps the sidebar from the feed: new, renamed and removed sessions without asking for the list', async () => {
    const fake = workspacePlatform([info('a', { title: 'First' })]);
    let push: ((e: SessionListEvent) => void) | null = null;
    const subscribed: string[] = [];
    Object.assign(fake, {
      subscribeSessions(workspace: string, onEvent: (e: SessionListEvent) => void) {
        subscribed.push(workspace);
        push = onEvent;
        return () => {
          push = null;
        };
      },
    });
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    await settle();
    expect(subscribed).toEqual(['/ws']);
    const asked = fake.callsOf('list_sessions').length;
    await inAct(() => push!({ type: 'listed', sessions: [info('a', { title: 'First' })] }));
    await inAct(() => push!({ type: 'changed', session: info('b', { title: 'Second' }) }));
    expect(titles(root)).toContain('Second');
    await inAct(() => push!({ type: 'changed', session: info('b', { title: 'Renamed' }) }));
    expect(titles(root)).toContain('Renamed');
    expect(titles(root)).not.toContain('Second');
    await inAct(() => push!({ type: 'removed', session_id: 'a' }));
    expect(titles(root)).not.toContain('First');
    // Session events that used to make the list be asked for again do not, with the feed.
    fake.emit('a', { type: 'result', session_id: 'a', content: 'done' });
    await settle(40);
    expect(fake.callsOf('list_sessions').length).toBe(asked);
    unmount();
    unmount = null;
    expect(push).toBeNull();
  });
});

describe('archive (E23)', () => {
  it('says what was archived with an Undo, and the archived list marks the archived rows', async () => {
    const list: (SessionInfo & { archived?: boolean })[] = [
      info('a', { title: 'Fix the tests', created_at: '2025-01-02T00:00:00Z' }),
      info('b', { title: 'Refactor auth' }),
    ];
    const fake = workspacePlatform(list);
    fake.handlers.archive_session = ({ session_id, archived }) => Object.assign(list.find((s) => s.session_id === session_id)!, { archived });
    fake.handlers.list_sessions = () => list.map((s) => ({ ...s }));
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => $$(root, 'session-archive')[1].click());
    await settle(20);
    expect(titles(root)).toEqual(['Fix the tests']);
    expect($(root, 'archive-toast')!.textContent).toContain('Archived “Refactor auth”');
    await inAct(() => $(root, 'archive-undo')!.click());
    await settle(20);
    expect(fake.callsOf('archive_session')).toEqual([
      { session_id: 'b', archived: true },
      { session_id: 'b', archived: false },
    ]);
    expect(titles(root)).toEqual(['Fix the tests', 'Refactor auth']);
    expect($(root, 'archive-toast')).toBeNull();
    // Archived again: the list of all shows which rows are archived.
    await inAct(() => $$(root, 'session-archive')[1].click());
    await settle(20);
    await inAct(() => $(root, 'show-archived')!.click());
    const marks = $$(root, 'session-item').map((i) => [i.dataset.sessionId, i.dataset.archived ?? null, $(i, 'archived-mark')?.textContent ?? null]);
    expect(marks).toEqual([
      ['a', null, null],
      ['b', 'true', 'archived'],
    ]);
  });
});
