// The page's side of recycling the desktop's web process (issue 31; the shell's side is
// src-tauri/src/web_process.rs). WebKit's web process keeps what a day of streaming churned
// through (about 200 MiB after a scripted day), and only a new process gives it back. So once
// the person has been away from the window for a while (it lost the focus or was hidden) and
// nothing of theirs lives only in this page, the page asks the shell for a new process, which
// loads the page again: the workspace and session come back from the shell, every run, child
// and approval from the runtime. The shell does it only when no run goes and the process grew.

export interface AwayWatch {
  /** How long the person must be away before the page asks. */
  afterMs: number;
  /** Whether a new page would lose nothing of the person's (see `nothingOnlyHere`). */
  mayRecycle: () => boolean;
  /** Asks the shell; true when the process is being replaced (this page goes with it). */
  recycle: () => Promise<boolean>;
}

/**
 * Watches for the person being away and asks once `afterMs` have passed; asks again every
 * `afterMs` while they stay away (the shell may have said no: a run going, not grown yet).
 * Returns the stop.
 */
export function watchAway(win: Window, doc: Document, { afterMs, mayRecycle, recycle }: AwayWatch): () => void {
  let timer: ReturnType<typeof setTimeout> | null = null;
  let stopped = false;
  const away = () => doc.visibilityState === 'hidden' || !doc.hasFocus();
  const disarm = () => {
    if (timer !== null) clearTimeout(timer);
    timer = null;
  };
  const arm = () => {
    if (timer === null && !stopped) timer = setTimeout(() => void fire(), afterMs);
  };
  const fire = async () => {
    timer = null;
    if (stopped || !away()) return;
    if (mayRecycle() && (await recycle().catch(() => false))) return;
    if (away()) arm();
  };
  const changed = () => (away() ? arm() : disarm());
  win.addEventListener('blur', changed);
  win.addEventListener('focus', changed);
  doc.addEventListener('visibilitychange', changed);
  changed();
  return () => {
    stopped = true;
    disarm();
    win.removeEventListener('blur', changed);
    win.removeEventListener('focus', changed);
    doc.removeEventListener('visibilitychange', changed);
  };
}

/**
 * Whether loading the page again would lose nothing of the person's: no unsent draft in any
 * session's composer (`unsentDrafts`), no dialog open (settings being edited, an approval
 * being read), no text typed into any field of the page (a rename, a search).
 */
export function nothingOnlyHere(doc: Document, unsentDrafts: number): boolean {
  if (unsentDrafts > 0) return false;
  if (doc.querySelector('[role=dialog]')) return false;
  for (const field of doc.querySelectorAll<HTMLInputElement | HTMLTextAreaElement>('textarea, input')) {
    if (field instanceof HTMLInputElement && ['checkbox', 'radio', 'button', 'submit', 'range', 'color'].includes(field.type)) continue;
    if (field.value) return false;
  }
  return true;
}
