// The Changes view of a session: the files the agent changed in each turn with their diffs,
// and the ways back (undo a turn, rewind to it, fork from it; a sub-agent's undo; an isolated
// sub-agent's Apply to workspace and Discard).
import { useEffect, useState } from 'preact/hooks';
import type { ChildChanges } from '../bindings/ChildChanges';
import type { FileChange } from '../bindings/FileChange';
import type { Forked } from '../bindings/Forked';
import type { TurnChange } from '../bindings/TurnChange';
import type { TurnChanges } from '../bindings/TurnChanges';
import type { UndoResult } from '../bindings/UndoResult';
import type { WorktreeInfo } from '../bindings/WorktreeInfo';
import type { SessionWithMessages } from '../bindings/SessionWithMessages';
import { reportTaskId } from '../model';
import { toCommandError, type Platform } from '../platform';
import { DiffView } from './DiffView';
import { ErrorBox } from './ErrorBox';

/** An undo waiting for the person to confirm, after its preview. */
interface Pending {
  messageIndex: number;
  /** Undo only, or rewind (undo and fork). */
  rewind: boolean;
  preview: UndoResult;
  /** Sub-agents started from that turn on changed files: the undo may include them (UX E6). */
  children: number;
  includeChildren: boolean;
}

function FileList(props: { files: FileChange[]; testid: string }) {
  return (
    <ul class="changes-files" data-testid={props.testid}>
      {props.files.map((f) => (
        <li key={f.path} data-testid="change-file" data-path={f.path} data-status={f.status}>
          <details>
            <summary>
              <span class={`change-status change-${f.status.replace(' ', '-')}`}>{f.status}</span> <code>{f.path}</code>
            </summary>
            <DiffView diff={f.diff} />
          </details>
        </li>
      ))}
    </ul>
  );
}

export function ChangesView(props: {
  platform: Platform;
  sessionId: string;
  /** A sub-agent's tab: one "Undo this sub-agent's changes" for all its turns. */
  child?: boolean;
  /** An isolated sub-agent's worktree: Apply to workspace and Discard. */
  worktree?: WorktreeInfo | null;
  /**
   * A conversation's isolated sub-agents (its descendants with a worktree): each with its
   * Apply and Discard here too, so their work is reachable from the conversation (UX E2).
   */
  worktrees?: { sessionId: string; title: string; worktree: WorktreeInfo }[];
  /** The text of each of the person's messages, by index (turn titles). */
  messageText?: (index: number) => string | undefined;
  /** A fork was made (Rewind or Fork from here): open it, with its draft in the composer. */
  onForked?: (forked: Forked) => void;
  /** The worktree was applied or discarded: the session's info changed. */
  onWorktreeChanged?: () => void;
}) {
  const { platform, sessionId } = props;
  const [changes, setChanges] = useState<TurnChanges | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [pending, setPending] = useState<Pending | null>(null);
  const [done, setDone] = useState<string | null>(null);
  /** The person's prompts by history index: their number from 1 and their text (E18). */
  const [prompts, setPrompts] = useState<Map<number, { n: number; text: string }> | null>(null);

  const readPrompts = async () => {
    try {
      const whole: SessionWithMessages = await platform.invoke('get_session', { session_id: sessionId });
      const found = new Map<number, { n: number; text: string }>();
      let n = 0;
      whole.messages.forEach((m, k) => {
        // A report from a sub-agent is not a prompt of the person's.
        if (m.role !== 'user' || reportTaskId(m.id)) return;
        found.set((whole.first_index ?? 0) + k, { n: ++n, text: m.content ?? '' });
      });
      setPrompts(found);
    } catch {
      setPrompts(null); // numbered by their place in the list instead
    }
  };

  const load = async () => {
    try {
      setChanges(await platform.invoke('turn_changes', { session_id: sessionId }));
      setError(null);
    } catch (err) {
      setError(`Cannot read the changes: ${toCommandError(err).message}`);
    }
  };
  useEffect(() => {
    setChanges(null);
    setPending(null);
    setDone(null);
    setPrompts(null);
    void load();
    void readPrompts();
  }, [sessionId]);

  const run = async (work: () => Promise<void>) => {
    setBusy(true);
    setError(null);
    try {
      await work();
    } catch (err) {
      setError(toCommandError(err).message);
    } finally {
      setBusy(false);
    }
  };

  /** Sub-agents with changes not undone yet, started from the turn at `messageIndex` on. */
  const childrenFrom = (messageIndex: number) =>
    (changes?.children ?? []).filter((c) => c.message_index >= messageIndex && c.turns.some((t) => !t.undone && t.files.length > 0)).length;

  /** First the preview: the person sees what changes back, then confirms. */
  const ask = (messageIndex: number, rewind: boolean, includeChildren?: boolean) =>
    run(async () => {
      setDone(null);
      const children = props.child ? 0 : childrenFrom(messageIndex);
      // The sub-agents' changes are offered, and included unless the person unticks them.
      const include = children > 0 && (includeChildren ?? true);
      const preview = await platform.invoke('undo_turn', {
        session_id: sessionId,
        message_index: messageIndex,
        preview: true,
        ...(include ? { include_children: true } : {}),
      });
      setPending({ messageIndex, rewind, preview, children, includeChildren: include });
    });

  const confirm = (force: boolean) =>
    run(async () => {
      if (!pending) return;
      const { messageIndex, rewind, includeChildren } = pending;
      const include = includeChildren ? { include_children: true } : {};
      if (rewind) {
        const forked = await platform.invoke('fork_session', { session_id: sessionId, message_index: messageIndex, rewind: true, force, ...include });
        setPending(null);
        setDone(`Rewound: ${forked.undo?.files.length ?? 0} file(s) restored; the conversation goes on in a fork.`);
        props.onForked?.(forked);
      } else {
        const result = await platform.invoke('undo_turn', { session_id: sessionId, message_index: messageIndex, force, ...include });
        setPending(null);
        setDone(`Undone: ${result.files.length} file(s) restored.`);
      }
      await load();
    });

  const fork = (messageIndex: number) =>
    run(async () => {
      const forked = await platform.invoke('fork_session', { session_id: sessionId, message_index: messageIndex, rewind: false });
      setDone('Forked: the new conversation starts from that message; no file was touched.');
      props.onForked?.(forked);
    });

  const apply = (id: string) =>
    run(async () => {
      const applied = await platform.invoke('apply_worktree', { session_id: id });
      setDone(applied.stat ? `Applied to the workspace:\n${applied.stat}` : 'Nothing to apply: the sub-agent changed nothing.');
      props.onWorktreeChanged?.();
    });
  const discard = (id: string) =>
    run(async () => {
      await platform.invoke('discard_worktree', { session_id: id });
      setDone('Discarded: the worktree and its branch are removed.');
      props.onWorktreeChanged?.();
    });
  /** Apply and Discard of one isolated sub-agent's worktree. */
  const worktreeActions = (id: string, worktree: WorktreeInfo, who: string) => (
    <div class="notice worktree" data-testid="worktree-actions" data-session-id={id} key={id}>
      {/* One text: in the notice's flex row, loose text and the branch would each be a column. */}
      <span class="worktree-text">
        {who} works in its own worktree (branch <code>{worktree.branch}</code>); its changes reach the workspace only when applied.
        {worktree.applied && <strong> Applied.</strong>}
      </span>
      <button type="button" class="primary" disabled={busy || worktree.applied} data-testid="worktree-apply" onClick={() => void apply(id)}>
        Apply to workspace
      </button>
      <button type="button" disabled={busy} data-testid="worktree-discard" onClick={() => void discard(id)}>
        Discard
      </button>
    </div>
  );

  const turnText = (index: number) => props.messageText?.(index) ?? (prompts?.get(index)?.text || undefined);
  const own = changes?.turns ?? [];
  const open = own.filter((t) => !t.undone && t.files.length > 0);
  const children = changes?.children ?? [];
  // A turn whose only changes are its sub-agents' is a turn of the view too.
  const turns: TurnChange[] = [...own];
  for (const c of children)
    if (!turns.some((t) => t.message_index === c.message_index))
      turns.push({ message_index: c.message_index, files: [], skipped: [], undone: c.turns.every((t) => t.undone), pruned: false });
  turns.sort((a, b) => a.message_index - b.message_index);
  const childrenOf = (index: number) => children.filter((c) => c.message_index === index);

  return (
    <div class="changes-view" data-testid="changes-view" data-session-id={sessionId}>
      {error && <ErrorBox message={error} onDismiss={() => setError(null)} testid="changes-error" />}
      {done && (
        <div class="notice" data-testid="changes-done" style="white-space: pre-wrap">
          {done}
        </div>
      )}
      {props.worktree && worktreeActions(sessionId, props.worktree, 'This sub-agent')}
      {props.worktrees?.map((w) => worktreeActions(w.sessionId, w.worktree, `Sub-agent “${w.title}”`))}
      {changes && !changes.available && (
        <div class="notice" data-testid="changes-off">
          {changes.notice ?? 'Checkpoints are off.'}
        </div>
      )}
      {pending && (
        <div class="undo-preview" data-testid="undo-preview">
          <strong>
            {pending.rewind ? 'Rewind to here' : 'Undo changes'}: {pending.preview.files.length} file(s) change back
          </strong>
          {pending.children > 0 && (
            <label class="row" data-testid="undo-include-children">
              <input
                type="checkbox"
                checked={pending.includeChildren}
                disabled={busy}
                data-testid="undo-include-children-box"
                onChange={(e) => void ask(pending.messageIndex, pending.rewind, (e.target as HTMLInputElement).checked)}
              />
              Include what its {pending.children === 1 ? 'sub-agent' : `${pending.children} sub-agents`} changed
            </label>
          )}
          <FileList files={pending.preview.files} testid="undo-preview-files" />
          {pending.preview.skipped.length > 0 && (
            <div class="muted" data-testid="undo-preview-skipped">
              Not covered (cannot be restored): {pending.preview.skipped.join(', ')}
            </div>
          )}
          {pending.preview.conflicts.length > 0 && (
            <div class="notice warn" data-testid="undo-preview-conflicts">
              Changed since the agent wrote them (your edits would be lost): {pending.preview.conflicts.join(', ')}
            </div>
          )}
          <div class="row">
            {pending.preview.conflicts.length === 0 ? (
              <button type="button" class="primary" disabled={busy} data-testid="undo-confirm" onClick={() => void confirm(false)}>
                {pending.rewind ? 'Rewind' : 'Undo'}
              </button>
            ) : (
              <button type="button" class="danger" disabled={busy} data-testid="undo-confirm-force" onClick={() => void confirm(true)}>
                Overwrite my edits and {pending.rewind ? 'rewind' : 'undo'}
              </button>
            )}
            <button type="button" disabled={busy} data-testid="undo-cancel" onClick={() => setPending(null)}>
              Cancel
            </button>
          </div>
        </div>
      )}
      {props.child && open.length > 0 && !pending && (
        <button type="button" disabled={busy} data-testid="child-undo" onClick={() => void ask(open[0].message_index, false)}>
          Undo this sub-agent's changes
        </button>
      )}
      {changes && turns.length === 0 && (
        <div class="empty" data-testid="changes-empty">
          {/* A worktree sub-agent's files are in its worktree, above, not among this session's. */}
          {props.worktrees?.length
            ? 'Nothing else changed: the sub-agents above worked in their own worktrees.'
            : 'The agent has changed no file in this session.'}
        </div>
      )}
      {turns.map((turn: TurnChange, position: number) => (
        <section key={turn.message_index} class={`changes-turn ${turn.undone ? 'undone' : ''}`} data-testid="changes-turn" data-index={turn.message_index}>
          <header>
            <strong data-testid="turn-number">Turn {prompts?.get(turn.message_index)?.n ?? position + 1}</strong>
            {turnText(turn.message_index) && <span class="muted"> — {turnText(turn.message_index)!.slice(0, 80)}</span>}
            {/* A space outside the badge: one inside an inline box is dropped ("worldundone"). */}
            {turn.undone && (
              <>
                {' '}
                <span class="badge turn-undone" data-testid="turn-undone">
                  undone
                </span>
              </>
            )}
          </header>
          {turn.pruned && (
            <div class="muted small" data-testid="turn-pruned">
              This turn's undo history was cleared (Settings' Clear, or the store's bound: <code>checkpoints.max_store_mb</code>, <code>checkpoints.max_age_days</code>): its changes can no longer be shown or undone.
            </div>
          )}
          <FileList files={turn.files} testid="turn-files" />
          {childrenOf(turn.message_index).map((c: ChildChanges) => (
            <div key={c.session_id} class={`changes-child ${c.turns.every((t) => t.undone) ? 'undone' : ''}`} data-testid="changes-child" data-session-id={c.session_id}>
              <div class="muted">
                Sub-agent “{c.title}”{c.turns.every((t) => t.undone) ? ' (undone)' : ''}
              </div>
              <FileList files={c.turns.flatMap((t) => t.files)} testid="child-files" />
            </div>
          ))}
          {turn.skipped.length > 0 && (
            <div class="muted small" data-testid="turn-skipped">
              Not recorded: {turn.skipped.join(', ')}
            </div>
          )}
          {!props.child && (
            <div class="row">
              <button type="button" disabled={busy || turn.pruned || (turn.undone && childrenFrom(turn.message_index) === 0)} data-testid="turn-undo" onClick={() => void ask(turn.message_index, false)}>
                Undo changes
              </button>
              <button type="button" disabled={busy} data-testid="turn-rewind" onClick={() => void ask(turn.message_index, true)}>
                Rewind to here
              </button>
              <button type="button" disabled={busy} data-testid="turn-fork" onClick={() => void fork(turn.message_index)}>
                Fork from here
              </button>
            </div>
          )}
        </section>
      ))}
    </div>
  );
}
