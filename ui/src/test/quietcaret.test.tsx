// The composer's caret stops blinking after a quiet while (the field lets its selection go
// and keeps the focus) and anything the person does puts the selection back first.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { QUIET_MS, quietCaret } from '../quietcaret';
import { $, inAct, info, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

afterEach(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
  document.body.innerHTML = '';
});

function field(text = '') {
  const area = document.createElement('textarea');
  area.value = text;
  document.body.append(area);
  return area;
}

/** Counts the selection let go (the caret gone) and set again. */
function watch(area: HTMLTextAreaElement) {
  const released = vi.spyOn(document.getSelection()!, 'removeAllRanges');
  const restored = vi.spyOn(area, 'setSelectionRange');
  return { released, restored };
}

describe('quietCaret', () => {
  it('lets the selection go after the quiet while, keeping the focus, the text and the field editable', () => {
    vi.useFakeTimers();
    const area = field('half a sentence');
    const { released } = watch(area);
    const stop = quietCaret(area);
    area.focus();
    vi.advanceTimersByTime(QUIET_MS - 1);
    expect(released).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1);
    expect(released).toHaveBeenCalledTimes(1);
    expect(document.activeElement).toBe(area);
    expect(area.value).toBe('half a sentence');
    expect(area.readOnly).toBe(false);
    // Once at rest it stays so: no timer left running.
    vi.advanceTimersByTime(QUIET_MS * 3);
    expect(released).toHaveBeenCalledTimes(1);
    stop();
  });

  it('a key, a click, a paste, a drop or a composition puts the selection back before anything else sees it', () => {
    vi.useFakeTimers();
    const area = field('hello world');
    area.focus();
    area.setSelectionRange(6, 11, 'backward');
    const { restored } = watch(area);
    quietCaret(area);
    const seen: unknown[] = [];
    for (const kind of ['keydown', 'mousedown', 'paste', 'dragenter', 'compositionstart']) {
      // What a later listener (the composer's own, or the browser's default action) finds.
      const later = () => seen.push(restored.mock.calls.at(-1));
      area.addEventListener(kind, later);
      vi.advanceTimersByTime(QUIET_MS);
      restored.mockClear();
      area.dispatchEvent(new Event(kind, { bubbles: true }));
      area.removeEventListener(kind, later);
      // And it rests again only after a whole quiet while.
      vi.advanceTimersByTime(QUIET_MS - 1);
      expect(restored).toHaveBeenCalledTimes(1);
    }
    expect(seen).toEqual(Array(5).fill([6, 11, 'backward']));
  });

  it('leaves an unfocused or disabled field alone; a blur forgets the rest', () => {
    vi.useFakeTimers();
    const area = field();
    const { released, restored } = watch(area);
    quietCaret(area);
    vi.advanceTimersByTime(QUIET_MS * 2);
    expect(released).not.toHaveBeenCalled();
    area.focus();
    vi.advanceTimersByTime(QUIET_MS);
    expect(released).toHaveBeenCalledTimes(1);
    area.blur();
    area.dispatchEvent(new Event('keydown'));
    expect(restored).not.toHaveBeenCalled();
    area.disabled = true;
    area.focus();
    vi.advanceTimersByTime(QUIET_MS);
    expect(released).toHaveBeenCalledTimes(1);
  });
});

describe('the composer', () => {
  it('rests its caret after a quiet while and takes the next keystrokes', async () => {
    const fake = workspacePlatform([info('p')], {});
    const mounted = await mountApp(fake, 'p');
    try {
      await inAct(() => fake.emit('p', snapshot('p')));
      const input = $(mounted.root, 'prompt-input') as HTMLTextAreaElement;
      const { released, restored } = watch(input);
      vi.useFakeTimers();
      // Focused afresh under the fake clock (the composer may have taken the focus at start).
      input.blur();
      input.focus();
      vi.advanceTimersByTime(QUIET_MS);
      expect(released).toHaveBeenCalledTimes(1);
      expect(document.activeElement).toBe(input);
      input.dispatchEvent(new KeyboardEvent('keydown', { key: 'h', bubbles: true }));
      expect(restored).toHaveBeenCalledTimes(1);
      vi.useRealTimers();
      await inAct(() => typeInto(input, 'hello'));
      expect(input.value).toBe('hello');
    } finally {
      mounted.unmount();
    }
  });
});
