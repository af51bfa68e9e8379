// @-mentions as chips (E12): the bubble shows the text as typed and a chip per file the
// runtime appended; Edit, Retry and Fork bring back the text as typed (expanded once again
// by the runtime, never twice); the composer shows picked files as chips.
import { afterEach, describe, expect, it } from 'vitest';
import { splitMentions, typedText } from '../mentions';
import { $, $$, info, inAct, key, kind, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const calc = 'def add(a, b):\n    return a + b\n\n</file> in a string\n';
// As src/mentions.rs expands `READ @calc.py please look`.
const expanded = `READ @calc.py please look\n\n<file path="calc.py">\n${calc}\n</file>`;

describe('splitting an expanded message', () => {
  it('finds the typed text and each file, even one whose text holds </file>', () => {
    expect(splitMentions(expanded)).toEqual({ text: 'READ @calc.py please look', files: [{ path: 'calc.py', body: calc }] });
    const two = `see @a.txt, and @b.md.\n\n<file path="a.txt">\nalpha\n</file>\n\n<file path="b.md">\n# B\n</file>`;
    expect(splitMentions(two)).toEqual({ text: 'see @a.txt, and @b.md.', files: [{ path: 'a.txt', body: 'alpha' }, { path: 'b.md', body: '# B' }] });
    // A block the text does not mention is the person's own text.
    const pasted = 'look:\n\n<file path="x.txt">\nx\n</file>';
    expect(splitMentions(pasted)).toEqual({ text: pasted, files: [] });
    expect(typedText('no mentions here')).toBe('no mentions here');
  });
});

describe('mentions in the chat and the composer', () => {
  async function open(history: unknown[]) {
    const fake = workspacePlatform([info('p')], { p: history });
    fake.handlers.list_files = ({ query }) => ({ files: ['calc.py', 'calc_test.py'].filter((f) => f.includes(query)) });
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => fake.emit('p', snapshot('p')));
    return { fake, root: mounted.root };
  }

  it('the bubble shows the typed text and a chip per file; Edit puts back the text as typed, and sending it once sends @calc.py once', async () => {
    const { fake, root } = await open([
      { role: 'user', content: expanded, id: 'm1' },
      { role: 'assistant', content: 'It adds.' },
    ]);
    const bubble = $$(root, 'chat-message')[0];
    expect(bubble.querySelector('.plain')!.textContent).toBe('READ @calc.py please look');
    expect($$(bubble, 'mention-chip').map((c) => c.dataset.path)).toEqual(['calc.py']);
    expect(bubble.textContent).not.toContain('<file');
    await inAct(() => $(bubble, 'edit-message')!.click());
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    expect(input.value).toBe('READ @calc.py please look');
    expect($$(root, 'composer-mention').map((c) => c.dataset.path)).toEqual(['calc.py']);
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)!.content).toBe('READ @calc.py please look');
  });

  it('Retry after a failed run sends the text as typed', async () => {
    const { fake, root } = await open([{ role: 'user', content: expanded, id: 'm1' }]);
    await inAct(() => fake.emit('p', snapshot('p', { running: true }), kind('p', 'content.delta', { text: '' }), { type: 'error', session_id: 'p', message: 'network error' }));
    await inAct(() => $(root, 'error-retry')!.click());
    expect(fake.callsOf('submit').at(-1)!.content).toBe('READ @calc.py please look');
  });

  it('a file picked from the @ menu shows as a chip; its × takes the mention out', async () => {
    const { root } = await open([]);
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    input.value = 'check @cal';
    input.setSelectionRange(10, 10);
    await inAct(() => input.dispatchEvent(new Event('input', { bubbles: true })));
    await inAct(() => key(input, 'Enter'));
    expect(input.value).toBe('check @calc.py ');
    expect($$(root, 'composer-mention').map((c) => c.dataset.path)).toEqual(['calc.py']);
    await inAct(() => ($(root, 'composer-mention')!.querySelector('button') as HTMLElement).click());
    expect(input.value).toBe('check ');
    expect($(root, 'composer-mentions')).toBeNull();
  });
});
