import { afterEach, describe, expect, it } from 'vitest';
import { renderMarkdown } from '../markdown';
import { $, $$, appended, info, inAct, kind, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

const EVIL = [
  'Hello <img src=x onerror="window.__pwned=1">',
  '<script>window.__pwned=2</script>',
  '[click me](javascript:window.__pwned=3)',
  '<a href="javascript:alert(1)">raw link</a>',
  '<iframe src="https://example.com"></iframe>',
  '<svg><script>window.__pwned=4</script></svg>',
  '<div onclick="window.__pwned=5" style="background:url(https://x)">styled</div>',
  '<form action="https://x"><input name=a><button>go</button></form>',
  '![tracker](https://example.com/t.png)',
  '[ok](https://example.com/docs)',
  '```js\nconsole.log("<b>code</b>")\n```',
].join('\n\n');

function assertInert(root: Element) {
  expect(root.querySelector('script')).toBeNull();
  expect(root.querySelector('img')).toBeNull();
  expect(root.querySelector('iframe')).toBeNull();
  expect(root.querySelector('form')).toBeNull();
  // The UI's own icons are inline SVG (class "icon"); the model's never survive.
  expect(Array.from(root.querySelectorAll('svg')).filter((svg) => !svg.classList.contains('icon'))).toEqual([]);
  for (const md of Array.from(root.querySelectorAll('.markdown'))) expect(md.querySelector('svg')).toBeNull();
  for (const el of Array.from(root.querySelectorAll('*'))) {
    for (const attr of Array.from(el.attributes)) {
      expect(attr.name.startsWith('on'), `${el.tagName} ${attr.name}`).toBe(false);
      expect(attr.name).not.toBe('style');
      expect(attr.value.toLowerCase()).not.toContain('javascript:');
    }
  }
  expect((window as any).__pwned).toBeUndefined();
}

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

describe('sanitising model output', () => {
  it('renderMarkdown keeps markup but nothing that runs or loads', () => {
    const holder = document.createElement('div');
    holder.innerHTML = renderMarkdown(EVIL);
    assertInert(holder);
    const links = Array.from(holder.querySelectorAll('a'));
    expect(links.find((a) => a.textContent === 'ok')?.getAttribute('href')).toBe('https://example.com/docs');
    expect(links.find((a) => a.textContent === 'click me')?.hasAttribute('href')).toBe(false);
    expect(holder.textContent).toContain('[image: tracker]');
    expect(holder.querySelector('pre code')?.textContent).toContain('console.log("<b>code</b>")');
  });

  it('model output in the chat (final and streaming) stays inert; links open outside', async () => {
    const fake = workspacePlatform([info('p')]);
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() =>
      fake.emit('p', snapshot('p', { running: true }), appended('p', { role: 'assistant', content: EVIL }), kind('p', 'content.delta', { text: EVIL })),
    );
    const chat = $(mounted.root, 'chat')!;
    expect($$(chat, 'chat-message').length).toBe(2);
    assertInert(chat);
    // Code blocks have a copy button (added by the UI, not by the model).
    expect($$(chat, 'copy-code').length).toBe(2);
    const ok = Array.from(chat.querySelectorAll('a')).find((a) => a.textContent === 'ok')!;
    const click = new MouseEvent('click', { bubbles: true, cancelable: true });
    ok.dispatchEvent(click);
    expect(click.defaultPrevented).toBe(true);
    expect(fake.opened).toEqual(['https://example.com/docs']);
  });

  it('tool arguments and results are text, never HTML', async () => {
    const fake = workspacePlatform([info('p')]);
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() =>
      fake.emit(
        'p',
        snapshot('p'),
        appended('p', { role: 'assistant', content: null, tool_calls: [{ id: 'c', name: 'read_file', arguments: { path: '<img src=x onerror=alert(1)>' } }] }),
        appended('p', { role: 'tool', content: '<script>window.__pwned=9</script>', tool_call_id: 'c' }),
      ),
    );
    const card = $(mounted.root, 'tool-card')!;
    assertInert(card);
    expect($(card, 'tool-result')!.textContent).toBe('<script>window.__pwned=9</script>');
  });
});
