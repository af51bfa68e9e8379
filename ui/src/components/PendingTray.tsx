import { useEffect, useRef, useState } from 'preact/hooks';
import type { PendingMessage } from '../bindings/PendingMessage';
import { reportBody, reportTaskId, type ChildTab } from '../model';
import { toCommandError } from '../platform';
import { ErrorBox } from './ErrorBox';

function describe(count: number, reports: number): string {
  if (reports === count) return `${count} report${count === 1 ? '' : 's'}`;
  return `${count} message${count === 1 ? '' : 's'}`;
}

/** "Waiting: N reports" — queued messages stay visible until the person resumes or discards them. */
export function PendingTray(props: {
  pending: PendingMessage[];
  tabs: ChildTab[];
  onResume: (messageId: string) => Promise<void>;
  onResumeAll: () => Promise<void>;
  onDiscard: (messageId: string) => Promise<void>;
  /** How long a Discard can be undone before it is sent (D22). */
  undoMs?: number;
}) {
  const [busy, setBusy] = useState<string | null>(null);
  const [error, setError] = useState<{ message: string; retry: () => void } | null>(null);
  // Discards wait a moment before they reach the runtime: Undo simply never sends them.
  const [leaving, setLeaving] = useState<string[]>([]);
  const timers = useRef(new Map<string, ReturnType<typeof setTimeout>>());
  const discard = useRef(props.onDiscard);
  discard.current = props.onDiscard;
  useEffect(
    () => () => {
      // Leaving the session: what the person discarded is discarded now.
      for (const [id, timer] of timers.current) {
        clearTimeout(timer);
        void discard.current(id).catch(() => undefined);
      }
      timers.current.clear();
    },
    [],
  );
  if (props.pending.length === 0) return null;
  const reports = props.pending.filter((p) => reportTaskId(p.message_id)).length;

  const act = async (key: string, run: () => Promise<void>) => {
    setBusy(key);
    setError(null);
    try {
      await run();
    } catch (err) {
      setError({ message: toCommandError(err).message, retry: () => void act(key, run) });
    } finally {
      setBusy(null);
    }
  };

  const send = (id: string) => {
    const timer = timers.current.get(id);
    if (timer) clearTimeout(timer);
    timers.current.delete(id);
    setLeaving((l) => l.filter((x) => x !== id));
    void act(id, () => props.onDiscard(id));
  };
  const startDiscard = (id: string) => {
    setLeaving((l) => [...l, id]);
    timers.current.set(
      id,
      setTimeout(() => send(id), props.undoMs ?? 8000),
    );
  };
  const undo = (id: string) => {
    const timer = timers.current.get(id);
    if (timer) clearTimeout(timer);
    timers.current.delete(id);
    setLeaving((l) => l.filter((x) => x !== id));
  };

  return (
    <div class="pending-tray" data-testid="pending-tray" data-count={props.pending.length}>
      <div class="tray-head">
        <strong data-testid="pending-count">Waiting: {describe(props.pending.length, reports)}</strong>
        {props.pending.length > 1 && (
          <button type="button" disabled={busy != null} data-testid="pending-resume-all" onClick={() => void act('all', props.onResumeAll)}>
            Resume all
          </button>
        )}
      </div>
      {props.pending.map((p) => {
        const taskId = reportTaskId(p.message_id);
        const child = taskId ? props.tabs.find((c) => c.taskId === taskId) : undefined;
        const label = taskId ? `Report from “${child?.title ?? taskId}”` : 'Your message';
        const preview = (taskId ? reportBody(p.content) : p.content).split('\n').find((l) => l.trim()) ?? '';
        if (leaving.includes(p.message_id)) {
          return (
            <div key={p.message_id} class="pending-item leaving" data-testid="pending-leaving" data-message-id={p.message_id}>
              <span class="pending-label">{label}</span>
              <span class="pending-preview muted">will be discarded</span>
              <button type="button" class="primary" data-testid="pending-undo" onClick={() => undo(p.message_id)}>
                Undo
              </button>
              <button type="button" data-testid="pending-discard-now" onClick={() => send(p.message_id)}>
                Discard now
              </button>
            </div>
          );
        }
        return (
          <div key={p.message_id} class="pending-item" data-testid="pending-item" data-message-id={p.message_id}>
            <span class="pending-label">{label}</span>
            <span class="pending-preview" title={p.content}>
              {preview}
              {p.images?.length ? (
                <span class="muted" data-testid="pending-images">
                  {' '}
                  (+{p.images.length} image{p.images.length === 1 ? '' : 's'})
                </span>
              ) : null}
            </span>
            <button type="button" class="primary" disabled={busy != null} data-testid="pending-resume" onClick={() => void act(p.message_id, () => props.onResume(p.message_id))}>
              Resume
            </button>
            <button type="button" disabled={busy != null} data-testid="pending-discard" onClick={() => startDiscard(p.message_id)}>
              Discard
            </button>
          </div>
        );
      })}
      {error && <ErrorBox message={error.message} onRetry={error.retry} onDismiss={() => setError(null)} />}
    </div>
  );
}
