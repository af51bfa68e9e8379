// The composer: slash commands, @-mentions of workspace files, copy and edit-and-resend.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { insertMention, mentionAt, parseSlash, slashQuery } from '../commands';
import { $, $$, info, inAct, key, kind, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
  vi.restoreAllMocks();
});

async function openSession(histories: Record<string, unknown[]> = {}) {
  const fake = workspacePlatform([info('p')], histories);
  const mounted = await mountApp(fake, 'p');
  unmount = mounted.unmount;
  await inAct(() => fake.emit('p', snapshot('p')));
  return { fake, root: mounted.root };
}

describe('parsing', () => {
  it('reads slash commands and the @word at the caret', () => {
    expect(slashQuery('/ne')).toBe('ne');
    expect(slashQuery('/new now')).toBeNull();
    expect(parseSlash('/agent  Reviewer ')).toEqual({ name: 'agent', arg: 'Reviewer' });
    expect(parseSlash('not /a command')).toBeNull();
    expect(mentionAt('look at @src/ma', 15)).toEqual({ query: 'src/ma', start: 8 });
    expect(mentionAt('mail a@b', 8)).toBeNull();
    expect(insertMention('look at @src/ma please', 8, 15, 'src/main.rs')).toEqual({ text: 'look at @src/main.rs please', caret: 21 });
  });
});

describe('slash commands', () => {
  it('/new starts a new conversation; /model says why it cannot run and sends nothing', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input')!;
    await inAct(() => typeInto(input, '/'));
    const items = $$(root, 'slash-item').map((i) => [i.dataset.name, i.classList.contains('coming')]);
    expect(items).toEqual([
      ['new', false],
      ['clear', false],
      ['compact', false],
      ['model', true],
      ['agent', false],
    ]);
    await inAct(() => typeInto(input, '/model'));
    await inAct(() => key(input, 'Enter'));
    expect($(root, 'composer-error')!.textContent).toContain('one model server is configured');
    expect(fake.callsOf('submit')).toEqual([]);
    await inAct(() => typeInto(input, '/ne'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit')).toEqual([]);
    // A new conversation: no session selected, an empty composer.
    expect($(root, 'session-pane')).toBeNull();
    expect(($(root, 'prompt-input') as HTMLTextAreaElement).value).toBe('');
  });
});

describe('@-mentions', () => {
  it('lists matching workspace files and puts @path into the message', async () => {
    const { fake, root } = await openSession();
    fake.handlers.list_files = ({ query }) => ({ files: ['src/main.rs', 'src/model.rs'].filter((f) => f.includes(query)) });
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    input.value = 'look at @src/m';
    input.setSelectionRange(14, 14);
    await inAct(() => input.dispatchEvent(new Event('input', { bubbles: true })));
    expect(fake.callsOf('list_files').at(-1)).toEqual({ workspace: '/ws', query: 'src/m', limit: 20 });
    expect($$(root, 'mention-item').map((i) => i.dataset.name)).toEqual(['src/main.rs', 'src/model.rs']);
    await inAct(() => key(input, 'ArrowDown'));
    await inAct(() => key(input, 'Enter'));
    expect(input.value).toBe('look at @src/model.rs ');
    expect(fake.callsOf('submit')).toEqual([]);
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit')).toEqual([{ session_id: 'p', content: 'look at @src/model.rs ', config: null }]);
  });

  it('a backend without list_files shows no mention menu and sends the text as typed', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => typeInto(input, '@src'));
    expect($(root, 'mention-menu')).toBeNull();
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)!.content).toBe('@src');
  });
});

describe('message actions (D23)', () => {
  it('copies a message, and Edit puts the last one back into the composer to send as a new message', async () => {
    const writes: string[] = [];
    Object.defineProperty(navigator, 'clipboard', { value: { writeText: (t: string) => (writes.push(t), Promise.resolve()) }, configurable: true });
    const { fake, root } = await openSession({
      p: [
        { role: 'user', content: 'first', id: 'm1' },
        { role: 'assistant', content: 'answer **one**' },
        { role: 'user', content: 'second try', id: 'm2' },
        { role: 'assistant', content: 'answer two' },
      ],
    });
    const messages = $$(root, 'chat-message');
    await inAct(() => $(messages[1], 'copy-message')!.click());
    expect(writes).toEqual(['answer **one**']);
    expect($(messages[1], 'copied')!.textContent).toBe('Copied');
    // The person's messages have one too.
    await inAct(() => $(messages[0], 'copy-message')!.click());
    expect(writes).toEqual(['answer **one**', 'first']);
    // Only the last message of the person can be edited.
    expect($(messages[0], 'edit-message')).toBeNull();
    await inAct(() => $(messages[2], 'edit-message')!.click());
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    expect(input.value).toBe('second try');
    await inAct(() => typeInto(input, 'second try, better'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'p', content: 'second try, better', config: null });
  });
});

describe('copying a tool result (D23)', () => {
  it('a tool card offers Copy for its result; the card does not fold on that click', async () => {
    const writes: string[] = [];
    Object.defineProperty(navigator, 'clipboard', { value: { writeText: (t: string) => (writes.push(t), Promise.resolve()) }, configurable: true });
    const { root } = await openSession({
      p: [
        { role: 'user', content: 'read it', id: 'm1' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'r1', name: 'read_file', arguments: { path: 'a.txt' } }] },
        { role: 'tool', content: 'line one\nline two', tool_call_id: 'r1' },
        { role: 'assistant', content: 'done' },
      ],
    });
    const card = $(root, 'tool-card') as HTMLDetailsElement;
    card.open = true;
    const copy = $(card, 'copy-result')!;
    expect(copy.getAttribute('aria-label')).toBe('Copy the result');
    await inAct(() => copy.click());
    expect(writes).toEqual(['line one\nline two']);
    expect(card.open).toBe(true);
  });
});

describe('images survive Retry and Edit (#17)', () => {
  const png = { media_type: 'image/png', data: 'iVBORw0KGgo=' };
  const gif = { media_type: 'image/gif', data: 'R0lGODlh' };
  const history = [
    { role: 'user', content: 'what is on these?', id: 'm1', images: [png, gif] },
    { role: 'assistant', content: 'a cat and a dog' },
  ];

  it('Retry after a failed run sends the last message again with its images', async () => {
    const { fake, root } = await openSession({ p: [{ role: 'user', content: 'describe this', id: 'm1', images: [png] }] });
    await inAct(() => fake.emit('p', snapshot('p', { running: true }), kind('p', 'content.delta', { text: '' }), { type: 'error', session_id: 'p', message: 'network error: connection refused' }));
    await inAct(() => $(root, 'error-retry')!.click());
    expect(fake.callsOf('submit')).toEqual([{ session_id: 'p', content: 'describe this', config: null, images: [png] }]);
  });

  it('Fork from here puts the message back into the new session\'s composer with its images, removable, as Edit does', async () => {
    const { fake, root } = await openSession({ p: history });
    // As the runtime answers: the fork's draft is the message's text and its images.
    fake.handlers.fork_session = ({ session_id, message_index }) => {
      const message = history[message_index] as { content: string; images?: unknown[] };
      return { session: info('f', { forked_from: session_id, forked_at: message_index }), draft: message.content, draft_images: message.images };
    };
    await inAct(() => $($$(root, 'chat-message')[0], 'fork-message')!.click());
    expect(fake.callsOf('fork_session')).toEqual([{ session_id: 'p', message_index: 0, rewind: false }]);
    await inAct(() => fake.emit('f', snapshot('f')));
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    expect(input.value).toBe('what is on these?');
    const thumbs = $$(root, 'attachment-thumb') as HTMLImageElement[];
    expect(thumbs.map((i) => i.getAttribute('src'))).toEqual([`data:image/png;base64,${png.data}`, `data:image/gif;base64,${gif.data}`]);
    await inAct(() => $$(root, 'attachment-remove')[0].click());
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'f', content: 'what is on these?', config: null, images: [gif] });
  });

  it('Edit puts the images back into the composer, removable, and sends what is left', async () => {
    const { fake, root } = await openSession({ p: history });
    await inAct(() => $($$(root, 'chat-message')[0], 'edit-message')!.click());
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    expect(input.value).toBe('what is on these?');
    const thumbs = $$(root, 'attachment-thumb') as HTMLImageElement[];
    expect(thumbs.map((i) => i.getAttribute('src'))).toEqual([`data:image/png;base64,${png.data}`, `data:image/gif;base64,${gif.data}`]);
    // The person removes the second one and sends.
    await inAct(() => $$(root, 'attachment-remove')[1].click());
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'p', content: 'what is on these?', config: null, images: [png] });
    expect($$(root, 'attachment')).toHaveLength(0);
  });
});

describe('the model picker', () => {
  it('lists the configured servers and applies the choice to the session (set_model); hidden with one server', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.handlers.get_config = () => ({
      provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'qwen' },
      providers: { claude: { kind: 'anthropic', base_url: 'https://api.anthropic.com', model: 'claude-sonnet-4-5' } },
    });
    fake.handlers.set_model = ({ session_id, provider }) => info(session_id, { provider });
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => fake.emit('p', snapshot('p')));
    const picker = $(root, 'model-picker') as HTMLSelectElement;
    // Each server once (E19): the default is "Default", not also listed by its name.
    expect(Array.from(picker.options).map((o) => o.textContent)).toEqual(['Default · default · qwen', 'claude · claude-sonnet-4-5']);
    picker.value = 'claude';
    await inAct(() => picker.dispatchEvent(new Event('change', { bubbles: true })));
    expect(fake.callsOf('set_model')).toEqual([{ session_id: 'p', provider: 'claude', model: null }]);
    // /model is available now and focuses the picker.
    const input = $(root, 'prompt-input')!;
    await inAct(() => typeInto(input, '/model'));
    await inAct(() => key(input, 'Enter'));
    expect(document.activeElement).toBe($(root, 'model-picker'));
  });

  it('one configured server: no picker, and /model says why', async () => {
    const { root } = await openSession();
    expect($(root, 'model-picker')).toBeNull();
    const input = $(root, 'prompt-input')!;
    await inAct(() => typeInto(input, '/model'));
    await inAct(() => key(input, 'Enter'));
    expect($(root, 'composer-error')!.textContent).toContain('one model server is configured');
  });
});

describe('a stopped answer from the history', () => {
  it('is marked as stopped', async () => {
    const { root } = await openSession({ p: [{ role: 'user', content: 'go', id: 'm1' }, { role: 'assistant', content: 'Half of it', stopped: true }] });
    const answer = $$(root, 'chat-message').find((m) => m.dataset.role === 'assistant')!;
    expect(answer.dataset.stopped).toBe('true');
    expect($(answer, 'stopped-answer')!.textContent).toContain('Stopped here');
  });

  it('shows the estimated tokens a stopped answer kept, said to be an estimate (E23)', async () => {
    const { root } = await openSession({
      p: [
        { role: 'user', content: 'go', id: 'm1' },
        { role: 'assistant', content: 'Half of it', stopped: true, usage: { input_tokens: 1200, output_tokens: 40 }, usage_estimated: true },
      ],
    });
    const answer = $$(root, 'chat-message').find((m) => m.dataset.role === 'assistant')!;
    expect($(answer, 'stopped-usage')!.textContent).toBe(' · ≈1.2k tokens (estimated)');
  });
});
