// Drafts are per session (E8): an "Edit and send again" draft, or text typed and not sent,
// belongs to the session it was made in and never shows in another one's composer.
import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, info, inAct, key, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const input = (root: HTMLElement) => $(root, 'prompt-input') as HTMLTextAreaElement;
const openInSidebar = (root: HTMLElement, id: string) =>
  (root.querySelector(`[data-testid="session-item"][data-session-id="${id}"] .session-open`) as HTMLElement).click();

describe('drafts per session (E8)', () => {
  it('an edited and resent message does not come back in the next new conversation', async () => {
    const fake = workspacePlatform([info('a')], {
      a: [
        { role: 'user', content: 'first draft', id: 'm1' },
        { role: 'assistant', content: 'ok' },
      ],
    });
    fake.handlers.create_session = () => info('b');
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => fake.emit('a', snapshot('a')));
    await inAct(() => $($$(root, 'chat-message')[0], 'edit-message')!.click());
    expect(input(root).value).toBe('first draft');
    await inAct(() => typeInto(input(root), 'first draft test'));
    await inAct(() => key(input(root), 'Enter'));
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'a', content: 'first draft test', config: null });
    expect(input(root).value).toBe('');

    // + New, and a message in session B.
    await inAct(() => $(root, 'new-session')!.click());
    expect(input(root).value).toBe('');
    await inAct(() => typeInto(input(root), 'hello b'));
    await inAct(() => key(input(root), 'Enter'));
    await inAct(() => fake.emit('b', snapshot('b')));
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'b', content: 'hello b', config: null });
    expect(root.querySelector('[data-testid="session-pane"]')!.getAttribute('data-session-id')).toBe('b');
    // B's composer is empty: A's edited text is not there.
    expect(input(root).value).toBe('');
  });

  it('text typed and not sent stays with its session when the person switches', async () => {
    const fake = workspacePlatform([info('a', { created_at: '2025-01-02T00:00:00Z' }), info('b')]);
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => fake.emit('a', snapshot('a')));
    await inAct(() => typeInto(input(root), 'half a thought for a'));
    await inAct(() => openInSidebar(root, 'b'));
    await inAct(() => fake.emit('b', snapshot('b')));
    expect(input(root).value).toBe('');
    await inAct(() => typeInto(input(root), 'for b'));
    await inAct(() => openInSidebar(root, 'a'));
    expect(input(root).value).toBe('half a thought for a');
    await inAct(() => openInSidebar(root, 'b'));
    expect(input(root).value).toBe('for b');
    // + New starts empty, and its own text stays with it too.
    await inAct(() => $(root, 'new-session')!.click());
    expect(input(root).value).toBe('');
    // An edit draft is taken once: back in A after sending, nothing refills.
    await inAct(() => openInSidebar(root, 'a'));
    await inAct(() => key(input(root), 'Enter'));
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'a', content: 'half a thought for a', config: null });
    expect(input(root).value).toBe('');
    await inAct(() => openInSidebar(root, 'b'));
    await inAct(() => openInSidebar(root, 'a'));
    expect(input(root).value).toBe('');
  });
});
