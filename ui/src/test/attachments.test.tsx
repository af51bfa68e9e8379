// Pasted and dropped files in the composer (images attach, text files are inserted, others are
// refused with a reason), images in the person's messages, and /agent (#17).
import { afterEach, describe, expect, it } from 'vitest';
import { fencedBlock, imageRefusal, MAX_IMAGE_BYTES, pastedImages } from '../attachments';
import { CommandError } from '../platform';
import { $, $$, info, inAct, key, settle, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

// The 8 bytes every PNG starts with, and their base64.
const PNG = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const PNG_BASE64 = 'iVBORw0KGgo=';

async function openSession(histories: Record<string, unknown[]> = {}) {
  const fake = workspacePlatform([info('p')], histories);
  fake.handlers.list_agents = () => ({
    profiles: [
      { name: 'explore', description: 'Reads and searches, changes nothing', provider: null, model: null, tools: null, disallowed_tools: [], max_turns: null, instructions: '', source: 'built-in', notices: [] },
      { name: 'review', description: 'Reviews a change', provider: null, model: null, tools: null, disallowed_tools: [], max_turns: null, instructions: '', source: 'built-in', notices: [] },
    ],
    errors: [],
  });
  const mounted = await mountApp(fake, 'p');
  unmount = mounted.unmount;
  await inAct(() => fake.emit('p', snapshot('p')));
  return { fake, root: mounted.root };
}

/** A paste event carrying files, as a browser fires it (jsdom has no ClipboardEvent). */
function paste(el: HTMLElement, files: File[]) {
  const event = new Event('paste', { bubbles: true, cancelable: true });
  Object.defineProperty(event, 'clipboardData', { value: { files, items: [], types: ['Files'] } });
  el.dispatchEvent(event);
  return event;
}

function drop(el: HTMLElement, files: File[]) {
  const event = new Event('drop', { bubbles: true, cancelable: true });
  Object.defineProperty(event, 'dataTransfer', { value: { files, types: ['Files'] } });
  el.dispatchEvent(event);
  return event;
}

describe('pasting and dropping images', () => {
  it('a pasted image shows as a thumbnail and goes with the next message as images; × removes one', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input')!;
    let event: Event | null = null;
    await inAct(() => {
      event = paste(input, [new File([PNG], 'shot.png', { type: 'image/png' })]);
    });
    await settle();
    expect(event!.defaultPrevented).toBe(true);
    const thumbs = $$(root, 'attachment-thumb') as HTMLImageElement[];
    expect(thumbs.map((t) => t.getAttribute('src'))).toEqual([`data:image/png;base64,${PNG_BASE64}`]);
    // A second one, removed again with its ×.
    await inAct(() => void paste(input, [new File([PNG], 'other.png', { type: 'image/png' })]));
    await settle();
    expect($$(root, 'attachment')).toHaveLength(2);
    await inAct(() => $$(root, 'attachment-remove')[1].click());
    expect($$(root, 'attachment')).toHaveLength(1);
    // An image alone can be sent (no text needed).
    expect(($(root, 'send-button') as HTMLButtonElement).disabled).toBe(false);
    await inAct(() => typeInto(input, 'what is this?'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit')).toEqual([
      { session_id: 'p', content: 'what is this?', config: null, images: [{ media_type: 'image/png', data: PNG_BASE64 }] },
    ]);
    // Sent: the attachments are gone from the composer, and the message in flight shows its image.
    expect($$(root, 'attachment')).toHaveLength(0);
    const sent = $$(root, 'chat-message').find((m) => m.dataset.messageId === 'msg-1')!;
    expect($$(sent, 'message-image')).toHaveLength(1);
  });

  it('text pasted together with an image still goes into the field', async () => {
    const { root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => typeInto(input, 'see: '));
    input.setSelectionRange(5, 5);
    const event = new Event('paste', { bubbles: true, cancelable: true });
    Object.defineProperty(event, 'clipboardData', {
      value: { files: [new File([PNG], 'a.png', { type: 'image/png' })], items: [], types: ['Files', 'text/plain'], getData: (t: string) => (t === 'text/plain' ? 'the chart' : '') },
    });
    await inAct(() => void input.dispatchEvent(event));
    await settle();
    expect(input.value).toBe('see: the chart');
    expect($$(root, 'attachment')).toHaveLength(1);
  });

  it('a file dropped beside the composer does not make the page navigate to it', async () => {
    await openSession();
    const event = new Event('drop', { bubbles: true, cancelable: true });
    Object.defineProperty(event, 'dataTransfer', { value: { files: [], types: ['Files'] } });
    window.dispatchEvent(event);
    expect(event.defaultPrevented).toBe(true);
  });

  it('a dropped PNG and JPEG are attached (a refused file beside them is not) and go with the next message (E14)', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input')!;
    const JPEG = new Uint8Array([0xff, 0xd8, 0xff, 0xe0]);
    let event: Event | null = null;
    await inAct(() => {
      event = drop($(root, 'composer')!, [
        new File([PNG], 'chart.png', { type: 'image/png' }),
        new File([PNG], 'old.bmp', { type: 'image/bmp' }),
        new File([JPEG], 'photo.jpg', { type: 'image/jpeg' }),
      ]);
    });
    await settle();
    // Taken by the composer: the window does not navigate to the file.
    expect(event!.defaultPrevented).toBe(true);
    expect($$(root, 'attachment').map((a) => a.title)).toEqual(['chart.png', 'photo.jpg']);
    expect($(root, 'attach-error')!.textContent).toContain('Cannot attach old.bmp');
    await inAct(() => typeInto(input, 'compare these'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit')).toEqual([
      {
        session_id: 'p',
        content: 'compare these',
        config: null,
        images: [
          { media_type: 'image/png', data: PNG_BASE64 },
          { media_type: 'image/jpeg', data: '/9j/4A==' },
        ],
      },
    ]);
    expect($$(root, 'attachment')).toHaveLength(0);
  });

  it('refuses a too-big image and an unknown type, saying why, and attaches nothing', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input')!;
    const big = new File([new Uint8Array(MAX_IMAGE_BYTES + 1)], 'huge.png', { type: 'image/png' });
    const bmp = new File([PNG], 'old.bmp', { type: 'image/bmp' });
    await inAct(() => void drop($(root, 'composer')!, [big, bmp]));
    await settle();
    expect($$(root, 'attachment')).toHaveLength(0);
    const error = $(root, 'attach-error')!.textContent!;
    expect(error).toContain('Cannot attach huge.png: it is 5.0 MiB; an image may be at most 5 MiB.');
    expect(error).toContain('Cannot attach old.bmp: image/bmp; only PNG, JPEG, GIF and WebP images can be sent.');
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit')).toEqual([]);
  });

  it('a message carries at most 8 images', () => {
    const file = { name: 'n.png', type: 'image/png', size: 10 };
    expect(imageRefusal(file, 7)).toBeNull();
    expect(imageRefusal(file, 8)).toContain('at most 8 images');
  });
});

describe('dropping files that are not images', () => {
  it('a text file goes into the message as a fenced block named after it; a binary one is refused', async () => {
    const { root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => typeInto(input, 'look at this'));
    const text = new File(['fn main() {}\n'], 'main.rs', { type: '' });
    const binary = new File([new Uint8Array([1, 2, 3])], 'tool.exe', { type: 'application/x-msdownload' });
    await inAct(() => void drop($(root, 'composer')!, [text, binary]));
    await settle();
    expect(input.value).toBe('look at this\n\nmain.rs:\n```rs\nfn main() {}\n```\n');
    expect($(root, 'attach-error')!.textContent).toContain('Cannot attach tool.exe: only images (PNG, JPEG, GIF, WebP) and text files can be added');
    expect($$(root, 'attachment')).toHaveLength(0);
  });

  it('a long text file is cut, and says so; backticks inside cannot close the fence', () => {
    const long = fencedBlock('big.txt', 'x'.repeat(300), 100);
    expect(long.cut).toBe(true);
    expect(long.block).toBe(`big.txt:\n\`\`\`txt\n${'x'.repeat(100)}\n\`\`\`\n(big.txt was cut: only its first 100 characters are here.)`);
    const fenced = fencedBlock('a.md', 'before\n```\ncode\n```\n');
    expect(fenced.block).toBe('a.md:\n````md\nbefore\n```\ncode\n```\n````');
  });

  it('a file without a type is read, and refused when its bytes are not text', async () => {
    const { root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    const blob = new File([new Uint8Array([0x7f, 0x45, 0x4c, 0x46, 0, 0, 1])], 'a.out', { type: '' });
    await inAct(() => void drop($(root, 'composer')!, [blob]));
    await settle();
    expect(input.value).toBe('');
    expect($(root, 'attach-error')!.textContent).toContain('Cannot attach a.out: it is not a text file');
  });

  it('a dropped text file over 100 KB is cut and the composer says so', async () => {
    const { root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => void drop($(root, 'composer')!, [new File(['y'.repeat(150 * 1024)], 'log.txt', { type: 'text/plain' })]));
    await settle();
    expect(input.value.length).toBeLessThan(101 * 1024);
    expect(input.value).toContain('(log.txt was cut: only its first 100 KB are here.)');
    expect($(root, 'attach-error')!.textContent).toContain('log.txt is longer than 100 KB: only its first 100 KB were inserted.');
  });
});

describe('images in the transcript', () => {
  it("shows a message's images as thumbnails; a click shows one larger, Esc closes it", async () => {
    const { root } = await openSession({ p: [{ role: 'user', content: '', id: 'm1', images: [{ media_type: 'image/png', data: PNG_BASE64 }, { media_type: 'text/html', data: 'PGI+' }] }] });
    const message = $$(root, 'chat-message')[0];
    // Only the types the runtime stores are shown.
    const images = $$(message, 'message-image');
    expect(images).toHaveLength(1);
    await inAct(() => images[0].click());
    expect($(root, 'image-viewer')!.querySelector('img')!.getAttribute('src')).toBe(`data:image/png;base64,${PNG_BASE64}`);
    await inAct(() => void window.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true, cancelable: true })));
    expect($(root, 'image-viewer')).toBeNull();
  });
});

describe('/agent (profiles)', () => {
  it('/agent explore runs the session as that profile (set_agent) and the composer shows it; /agent none clears', async () => {
    const { fake, root } = await openSession();
    fake.handlers.set_agent = ({ session_id, agent }) => info(session_id, { agent });
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    // Names complete from list_agents.
    await inAct(() => typeInto(input, '/agent ex'));
    expect($$(root, 'argument-item').map((i) => i.dataset.name)).toEqual(['explore']);
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('set_agent')).toEqual([{ session_id: 'p', agent: 'explore' }]);
    expect($(root, 'agent-chip')!.textContent).toBe('as explore');
    expect($(root, 'composer-info')!.textContent).toContain('runs as “explore” from its next turn');
    expect(fake.callsOf('submit')).toEqual([]);
    await inAct(() => typeInto(input, '/agent none'));
    await inAct(() => key(input, 'Escape'));
    await inAct(() => typeInto(input, '/agent none'));
    await inAct(() => $(root, 'send-button')!.click());
    expect(fake.callsOf('set_agent').at(-1)).toEqual({ session_id: 'p', agent: null });
    expect($(root, 'agent-chip')).toBeNull();
  });

  it('/agent alone lists the profiles and the current one', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => typeInto(input, '/agent '));
    // Every name is offered, but Enter on no name yet lists them instead of picking one.
    expect($$(root, 'argument-item').map((i) => i.dataset.name)).toEqual(['explore', 'review', 'none']);
    await inAct(() => key(input, 'Enter'));
    const text = $(root, 'composer-info')!.textContent!;
    expect(text).toContain('explore — Reads and searches, changes nothing');
    expect(text).toContain('review — Reviews a change');
    expect(text).toContain('This session runs as no profile.');
    expect(fake.callsOf('set_agent')).toEqual([]);
  });

  it("an unknown name: the runtime's refusal shows in the composer", async () => {
    const { fake, root } = await openSession();
    fake.handlers.set_agent = ({ agent }) => {
      throw new CommandError('invalid_argument', `no profile named "${agent}"`);
    };
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => typeInto(input, '/agent nobody'));
    await inAct(() => key(input, 'Enter'));
    expect($(root, 'composer-error')!.textContent).toContain('/agent failed: no profile named "nobody"');
    expect($(root, 'agent-chip')).toBeNull();
  });
});

describe('images from the clipboard as WebKitGTK gives them, and the attach button (E14)', () => {
  it('a screenshot pasted as a clipboard item only (no files) is attached', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    const shot = new File([PNG], '', { type: 'image/png' });
    const event = new Event('paste', { bubbles: true, cancelable: true });
    Object.defineProperty(event, 'clipboardData', {
      value: { files: [], items: [{ kind: 'file', type: 'image/png', getAsFile: () => shot }], types: ['image/png'], getData: () => '' },
    });
    await inAct(() => void input.dispatchEvent(event));
    await settle();
    expect(event.defaultPrevented).toBe(true);
    expect($$(root, 'attachment')).toHaveLength(1);
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)!.images).toEqual([{ media_type: 'image/png', data: PNG_BASE64 }]);
  });

  it('+ Image opens the file chooser; chosen PNG and JPEG files are attached, other files refused', async () => {
    const { root } = await openSession();
    const chooser = $(root, 'attach-input') as HTMLInputElement;
    let opened = 0;
    chooser.click = () => void opened++;
    await inAct(() => $(root, 'attach-button')!.click());
    expect(opened).toBe(1);
    expect(chooser.accept).toBe('image/png,image/jpeg,image/gif,image/webp');
    const choose = (files: File[]) => {
      Object.defineProperty(chooser, 'files', { value: files, configurable: true });
      chooser.dispatchEvent(new Event('change', { bubbles: true }));
    };
    await inAct(() => choose([new File([PNG], 'a.png', { type: 'image/png' }), new File([new Uint8Array([0xff, 0xd8, 0xff])], 'b.jpg', { type: 'image/jpeg' })]));
    await settle();
    expect($$(root, 'attachment').map((a) => a.title)).toEqual(['a.png', 'b.jpg']);
    await inAct(() => choose([new File([new Uint8Array([0, 1, 2, 0])], 'c.bin', { type: 'application/octet-stream' })]));
    await settle();
    expect($(root, 'attach-error')!.textContent).toContain('Cannot attach c.bin');
  });

  it('a paste with neither an image nor text asks the clipboard (WebKitGTK); one with text never does', () => {
    const shot = new File([PNG], '', { type: 'image/png' });
    // What WebKitGTK's paste event holds when the clipboard has only a picture: nothing.
    expect(pastedImages({ files: [], items: [], getData: () => '' })).toEqual({ files: [], askClipboard: true });
    expect(pastedImages(null)).toEqual({ files: [], askClipboard: true });
    // Text is the field's own paste, unchanged.
    expect(pastedImages({ files: [], items: [], getData: (t) => (t === 'text/plain' ? 'hello' : '') })).toEqual({ files: [], askClipboard: false });
    // An image the event carries is taken from it: no need to ask.
    expect(pastedImages({ files: [shot], items: [], getData: () => '' })).toEqual({ files: [shot], askClipboard: false });
    expect(pastedImages({ files: [], items: [{ kind: 'file', type: 'image/png', getAsFile: () => shot }], getData: () => '' }).files).toEqual([shot]);
  });

  it("Ctrl+V whose event carries nothing attaches the clipboard's image as the platform reads it (WebKitGTK, E14)", async () => {
    const { fake, root } = await openSession();
    let asked = 0;
    fake.clipboardImage = () => {
      asked++;
      return Promise.resolve({ media_type: 'image/jpeg', data: PNG_BASE64 });
    };
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    const empty = () => {
      const event = new Event('paste', { bubbles: true, cancelable: true });
      Object.defineProperty(event, 'clipboardData', { value: { files: [], items: [], types: [], getData: () => '' } });
      return event;
    };
    const event = empty();
    await inAct(() => void input.dispatchEvent(event));
    await settle();
    expect(asked).toBe(1);
    // The field's own paste is left alone (it had nothing to insert).
    expect(event.defaultPrevented).toBe(false);
    expect($$(root, 'attachment').map((a) => a.title)).toEqual(['pasted image']);
    expect(($(root, 'attachment-thumb') as HTMLImageElement).getAttribute('src')).toBe(`data:image/jpeg;base64,${PNG_BASE64}`);
    await inAct(() => typeInto(input, 'and this?'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)!.images).toEqual([{ media_type: 'image/jpeg', data: PNG_BASE64 }]);

    // A clipboard with no image: nothing attached, nothing said.
    fake.clipboardImage = () => Promise.resolve(null);
    await inAct(() => void input.dispatchEvent(empty()));
    await settle();
    expect($$(root, 'attachment')).toHaveLength(0);
    expect($(root, 'attach-error')).toBeNull();

    // The platform could not read it: the composer says why.
    fake.clipboardImage = () => Promise.reject(new CommandError('unavailable', "the clipboard's image is 9.0 MiB; an image may be at most 5 MiB"));
    await inAct(() => void input.dispatchEvent(empty()));
    await settle();
    expect($(root, 'attach-error')!.textContent).toContain('at most 5 MiB');
  });

  it('pasted text never asks the platform for an image and goes into the field as before', async () => {
    const { fake, root } = await openSession();
    let asked = 0;
    fake.clipboardImage = () => {
      asked++;
      return Promise.resolve({ media_type: 'image/png', data: PNG_BASE64 });
    };
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    const event = new Event('paste', { bubbles: true, cancelable: true });
    Object.defineProperty(event, 'clipboardData', { value: { files: [], items: [], types: ['text/plain'], getData: (t: string) => (t === 'text/plain' ? 'some text' : '') } });
    await inAct(() => void input.dispatchEvent(event));
    await settle();
    expect(asked).toBe(0);
    // Not taken: the browser's own paste inserts the text.
    expect(event.defaultPrevented).toBe(false);
    expect($$(root, 'attachment')).toHaveLength(0);
  });
});
