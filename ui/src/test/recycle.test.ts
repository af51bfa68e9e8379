// Recycling the desktop's web process (issue 31): the page asks only after the person has been
// away for the whole delay, never while anything of theirs lives only in the page, and again
// later while they stay away and the shell said no.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { nothingOnlyHere, watchAway } from '../recycle';

let focused = true;
let hidden = false;
beforeEach(() => {
  vi.useFakeTimers();
  focused = true;
  hidden = false;
  vi.spyOn(document, 'hasFocus').mockImplementation(() => focused);
  vi.spyOn(document, 'visibilityState', 'get').mockImplementation(() => (hidden ? 'hidden' : 'visible'));
});
afterEach(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
  document.body.innerHTML = '';
});

const leave = () => {
  focused = false;
  window.dispatchEvent(new Event('blur'));
};
const comeBack = () => {
  focused = true;
  window.dispatchEvent(new Event('focus'));
};

describe('recycling the web process when the person is away', () => {
  it('asks once the person has been away for the whole delay, not before', async () => {
    const recycle = vi.fn(async () => true);
    const stop = watchAway(window, document, { afterMs: 1000, mayRecycle: () => true, recycle });
    await vi.advanceTimersByTimeAsync(5000);
    expect(recycle).not.toHaveBeenCalled();
    leave();
    await vi.advanceTimersByTimeAsync(999);
    expect(recycle).not.toHaveBeenCalled();
    await vi.advanceTimersByTimeAsync(1);
    expect(recycle).toHaveBeenCalledTimes(1);
    await vi.advanceTimersByTimeAsync(5000);
    expect(recycle).toHaveBeenCalledTimes(1);
    stop();
  });

  it('a person back before the delay ends starts it over; a hidden window counts as away', async () => {
    const recycle = vi.fn(async () => true);
    const stop = watchAway(window, document, { afterMs: 1000, mayRecycle: () => true, recycle });
    leave();
    await vi.advanceTimersByTimeAsync(900);
    comeBack();
    leave();
    await vi.advanceTimersByTimeAsync(900);
    expect(recycle).not.toHaveBeenCalled();
    comeBack();
    hidden = true;
    document.dispatchEvent(new Event('visibilitychange'));
    await vi.advanceTimersByTimeAsync(1000);
    expect(recycle).toHaveBeenCalledTimes(1);
    stop();
  });

  it('never with something only in the page; asks again later while the person stays away', async () => {
    let draft = true;
    const recycle = vi.fn(async () => false);
    const stop = watchAway(window, document, { afterMs: 1000, mayRecycle: () => !draft, recycle });
    leave();
    await vi.advanceTimersByTimeAsync(3000);
    expect(recycle).not.toHaveBeenCalled();
    draft = false;
    await vi.advanceTimersByTimeAsync(1000);
    expect(recycle).toHaveBeenCalledTimes(1);
    // The shell said no (a run going, not grown): asked again a delay later.
    await vi.advanceTimersByTimeAsync(1000);
    expect(recycle).toHaveBeenCalledTimes(2);
    stop();
    await vi.advanceTimersByTimeAsync(5000);
    expect(recycle).toHaveBeenCalledTimes(2);
  });

  it('the page holds nothing of the person only with no draft, no dialog and no typed field', () => {
    expect(nothingOnlyHere(document, 0)).toBe(true);
    expect(nothingOnlyHere(document, 1)).toBe(false);
    document.body.innerHTML = '<input type="checkbox" checked><textarea></textarea><input type="text">';
    expect(nothingOnlyHere(document, 0)).toBe(true);
    document.body.innerHTML = '<div role="dialog"></div>';
    expect(nothingOnlyHere(document, 0)).toBe(false);
    document.body.innerHTML = '<input type="text" value="renamed half way">';
    expect(nothingOnlyHere(document, 0)).toBe(false);
    document.body.innerHTML = '<textarea>typed</textarea>';
    expect(nothingOnlyHere(document, 0)).toBe(false);
  });
});
