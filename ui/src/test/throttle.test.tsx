// A figure that changes at every frame while nine streams grow is handed on a few times a
// second (issue 31: the status line's live token count re-rendered the whole app about
// 45 times a second).
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { useThrottled } from '../throttle';

let renders = 0;
function Shown({ value }: { value: number }) {
  const shown = useThrottled(value, 250);
  renders++;
  return <p>{shown}</p>;
}

describe('useThrottled', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('hands a change on at once, then at most every 250 ms, and the latest value always arrives', async () => {
    const root = document.createElement('div');
    const show = (value: number) => act(() => render(<Shown value={value} />, root));
    await show(0);
    expect(root.textContent).toBe('0');
    await show(1);
    expect(root.textContent).toBe('1');
    // Many changes within 250 ms: none is shown until the time is up, then the latest.
    for (let n = 2; n <= 40; n++) {
      await show(n);
      await act(() => {
        vi.advanceTimersByTime(5);
      });
    }
    expect(root.textContent).toBe('1');
    const before = renders;
    await act(() => {
      vi.advanceTimersByTime(250);
    });
    expect(root.textContent).toBe('40');
    expect(renders - before).toBe(1);
    // Quiet for longer than 250 ms: the next change shows at once.
    await act(() => {
      vi.advanceTimersByTime(300);
    });
    await show(41);
    expect(root.textContent).toBe('41');
  });
});
