// Each session keeps its own scroll place; a session opened later follows its end (D10).
import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, info, inAct, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

/** jsdom has no layout: give the chat a size and a scroll position that sticks. */
function layout(chat: HTMLElement, height = 2000, client = 400) {
  let top = 0;
  Object.defineProperty(chat, 'scrollHeight', { configurable: true, get: () => height });
  Object.defineProperty(chat, 'clientHeight', { configurable: true, get: () => client });
  Object.defineProperty(chat, 'scrollTop', { configurable: true, get: () => top, set: (v: number) => (top = Math.max(0, Math.min(v, height - client))) });
}

describe('scroll position per session', () => {
  it('scrolling up in one session shows "Jump to latest" there only; each session keeps its place', async () => {
    const history = Array.from({ length: 40 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `m${i}`, id: `m${i}` }));
    const fake = workspacePlatform([info('a', { updated_at: '2025-01-02T00:00:00Z' }), info('b')], { a: history, b: history });
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    const select = (id: string) => ($$(root, 'session-item').find((i) => i.dataset.sessionId === id)!.querySelector('.session-open') as HTMLElement).click();
    await inAct(() => fake.emit('a', snapshot('a')));
    let chat = $(root, 'chat')!;
    layout(chat);
    chat.scrollTop = 300;
    await inAct(() => chat.dispatchEvent(new Event('scroll')));
    expect($(root, 'jump-latest')).not.toBeNull();

    await inAct(() => select('b'));
    await inAct(() => fake.emit('b', snapshot('b')));
    chat = $(root, 'chat')!;
    expect(chat.dataset.sessionId).toBe('b');
    // The other session's place does not carry over: b follows its end.
    expect($(root, 'jump-latest')).toBeNull();

    await inAct(() => select('a'));
    await inAct(() => fake.emit('a', snapshot('a')));
    chat = $(root, 'chat')!;
    expect($(root, 'jump-latest')).not.toBeNull();
    layout(chat);
    await inAct(() => $(root, 'jump-latest')!.click());
    expect(chat.scrollTop).toBe(1600);
    expect($(root, 'jump-latest')).toBeNull();
  });
});
