// Stops a focused text field's caret from blinking after a quiet while, keeping the focus.
//
// Why: WebKitGTK blinks a focused field's caret for as long as it has the focus (GTK's own
// fields stop after 10 s, `gtk-cursor-blink-timeout`; WebKit has no such timeout), and
// every blink keeps its display link running for a third of a second: an idle window with
// the composer focused used ≈ 4–6 ms/s of CPU in the shell and as much in the web process
// (BENCHMARKS.md, "The composer's caret at rest"). Without a selection there is no caret,
// so after the quiet while the field lets its selection go: it keeps the focus and what
// was typed, and the next key, click, paste, drop or IME composition puts the selection
// back where it was before the browser acts on it (the listeners are captured, so they
// run before the default action). The field stays editable throughout: a screen reader
// hears no change, and automation that clears the field still can. Making the field
// read-only was tried first: WebKit kept blinking the caret of a field that could no
// longer be edited until the selection changed.

/** GTK's own `gtk-cursor-blink-timeout`. */
export const QUIET_MS = 10_000;

/** What wakes the field: anything the person does to it. */
const WAKERS = ['keydown', 'mousedown', 'pointerdown', 'touchstart', 'paste', 'dragenter', 'compositionstart', 'contextmenu', 'input'] as const;

type Kept = { start: number; end: number; direction: 'forward' | 'backward' | 'none' };

/** Starts watching `field`; returns what stops it (and gives the selection back). */
export function quietCaret(field: HTMLTextAreaElement | HTMLInputElement, quietMs = QUIET_MS): () => void {
  const doc = field.ownerDocument;
  let timer: ReturnType<typeof setTimeout> | undefined;
  /** The selection the field had when it went quiet; null while its caret is shown. */
  let kept: Kept | null = null;
  const wakeUp = () => {
    if (!kept) return;
    const { start, end, direction } = kept;
    kept = null;
    if (doc.activeElement === field) field.setSelectionRange(start, end, direction);
  };
  const rest = () => {
    timer = undefined;
    if (doc.activeElement !== field || field.disabled) return;
    kept = { start: field.selectionStart ?? 0, end: field.selectionEnd ?? 0, direction: field.selectionDirection ?? 'none' };
    doc.getSelection()?.removeAllRanges();
  };
  const wake = () => {
    wakeUp();
    if (timer !== undefined) clearTimeout(timer);
    timer = doc.activeElement === field ? setTimeout(rest, quietMs) : undefined;
  };
  const blur = () => {
    if (timer !== undefined) clearTimeout(timer);
    timer = undefined;
    kept = null;
  };
  field.addEventListener('focus', wake);
  field.addEventListener('blur', blur);
  for (const kind of WAKERS) field.addEventListener(kind, wake, true);
  if (doc.activeElement === field) wake();
  return () => {
    wakeUp();
    blur();
    field.removeEventListener('focus', wake);
    field.removeEventListener('blur', blur);
    for (const kind of WAKERS) field.removeEventListener(kind, wake, true);
  };
}
