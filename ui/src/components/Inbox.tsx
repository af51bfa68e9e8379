import { useEffect, useRef, useState } from 'preact/hooks';
import type { ApprovalInfo } from '../bindings/ApprovalInfo';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { AttentionSummary } from '../model';
import { toCommandError } from '../platform';
import { argumentHint } from '../util';
import { alwaysLabel, runsOn, type Decide } from './ApprovalDialog';
import { ErrorBox } from './ErrorBox';
import { Icon } from './Icon';

/**
 * Everything that needs the person, across every session: approvals, failures, trays.
 * An approval can be decided right here (E21), through the approval dock's own path
 * (`onDecide`); its item still opens the session for a closer look.
 */
export function Inbox(props: {
  summary: AttentionSummary;
  sessions: SessionInfo[];
  onOpen: (sessionId: string) => void;
  onDecide: Decide;
  onClose: () => void;
}) {
  // Approvals decided here: hidden at once, before the runtime's `approval_resolved`
  // reaches the feed that listed them.
  const [decided, setDecided] = useState<ReadonlySet<string>>(new Set());
  // After a decision, the index of the approval whose place focus goes back to (the item
  // that moved up into it, else the last one left, else Close).
  const [refocus, setRefocus] = useState<number | null>(null);
  const list = useRef<HTMLUListElement>(null);
  const closeButton = useRef<HTMLButtonElement>(null);
  const title = (id: string) => props.sessions.find((s) => s.session_id === id)?.title || 'Untitled';
  const parents = new Map(props.sessions.map((s) => [s.session_id, s.parent_session_id]));
  const rootOf = (id: string) => {
    let cur = id;
    for (let i = 0; i < 16 && parents.get(cur); i++) cur = parents.get(cur)!;
    return cur;
  };
  /** " in “Conversation”" for something of a sub-agent: which conversation it belongs to (E21). */
  const inConversation = (id: string) => {
    const root = rootOf(id);
    return root === id ? null : (
      <span class="muted inbox-where" data-testid="inbox-where">
        {' '}
        in “{title(root)}”
      </span>
    );
  };
  const { failed, trays } = props.summary;
  const approvals = props.summary.approvals.filter((a) => !decided.has(a.approval_id));
  const empty = approvals.length + failed.length + trays.length === 0;

  const onDecided = (approval: ApprovalInfo, index: number) => {
    setDecided((d) => new Set(d).add(approval.approval_id));
    setRefocus(index);
  };
  // The last thing that waited was decided here: the inbox has done its job and closes;
  // App's dialog effect then gives the composer its focus back (focus.ts, E16).
  useEffect(() => {
    if (refocus != null && empty) props.onClose();
  }, [refocus, empty]);
  // Otherwise focus goes to the item now in the decided one's place: never to a decision
  // button (a stray Space must not approve the next request), but to its item, which opens.
  useEffect(() => {
    if (refocus == null || empty) return;
    const items = Array.from(list.current?.querySelectorAll<HTMLElement>('.inbox-item') ?? []);
    (items[Math.min(refocus, items.length - 1)] ?? closeButton.current)?.focus();
    setRefocus(null);
  }, [refocus, empty]);

  return (
    <div class="overlay" data-testid="inbox" onClick={(e) => e.target === e.currentTarget && props.onClose()} onKeyDown={(e) => e.key === 'Escape' && props.onClose()}>
      <div class="dialog inbox" role="dialog" aria-labelledby="inbox-title" tabIndex={-1}>
        <h2 id="inbox-title">Needs you</h2>
        {empty && <p class="muted">Nothing waits for you.</p>}
        <ul class="inbox-list" ref={list}>
          {approvals.map((a, index) => {
            const where = runsOn(a);
            return (
              <li key={a.approval_id} class="inbox-approval-row" data-testid="inbox-approval-row" data-approval-id={a.approval_id}>
                <button type="button" class="inbox-item" data-testid="inbox-approval" data-session-id={a.session_id} title="Open its session" onClick={() => props.onOpen(a.session_id)}>
                  <Icon name="bell" />
                  <span>
                    <strong>{a.title ?? title(a.session_id)}</strong>
                    {where && (
                      <span class="muted" data-testid="inbox-runs-on">
                        {' '}
                        · {where}
                      </span>
                    )}{' '}
                    wants to run {a.tool}
                    {argumentHint(a.arguments) ? ` on ${argumentHint(a.arguments)}` : ''}
                    {inConversation(a.session_id)}
                  </span>
                </button>
                <InboxDecision approval={a} onDecide={props.onDecide} onDecided={() => onDecided(a, index)} />
              </li>
            );
          })}
          {failed.map(({ sessionId: id }) => (
            <li key={`f-${id}`}>
              <button type="button" class="inbox-item" data-testid="inbox-failed" data-session-id={id} onClick={() => props.onOpen(id)}>
                <Icon name="failed" />
                <span>
                  <strong>{title(id)}</strong> failed
                  {inConversation(id)}
                </span>
              </button>
            </li>
          ))}
          {trays.map(({ rootId: id, count }) => (
            <li key={`r-${id}`}>
              <button type="button" class="inbox-item" data-testid="inbox-reports" data-session-id={id} onClick={() => props.onOpen(id)}>
                <Icon name="paused" />
                <span>
                  <strong>{title(id)}</strong>: {count} report{count === 1 ? '' : 's'} waiting
                </span>
              </button>
            </li>
          ))}
        </ul>
        <div class="dialog-buttons">
          <button type="button" data-testid="inbox-close" ref={closeButton} onClick={props.onClose}>
            Close
          </button>
        </div>
      </div>
    </div>
  );
}

/**
 * Approve, Always (when the dock offers it, saying as there exactly what it covers) and Deny with an optional reason, for one
 * approval in the inbox. As in the dock, Enter never approves: on Approve and Always it is
 * swallowed, in the reason field it denies.
 */
function InboxDecision(props: { approval: ApprovalInfo; onDecide: Decide; onDecided: () => void }) {
  const { approval } = props;
  const [reason, setReason] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [last, setLast] = useState<[boolean, boolean] | null>(null);

  const decide = async (approved: boolean, remember: boolean) => {
    if (busy) return;
    setBusy(true);
    setError(null);
    setLast([approved, remember]);
    try {
      await props.onDecide(approval, approved, remember, approved ? null : reason.trim() || null);
      props.onDecided();
    } catch (err) {
      setError(toCommandError(err).message);
      setBusy(false);
    }
  };
  const noEnter = (e: KeyboardEvent) => {
    if (e.key === 'Enter') e.preventDefault();
  };
  const always = alwaysLabel(approval);
  return (
    <div class="inbox-decision">
      <button type="button" class="primary" disabled={busy} data-testid="inbox-approve" onKeyDown={noEnter} onClick={() => void decide(true, false)}>
        Approve
      </button>
      {approval.rememberable && (
        <button type="button" class="approval-always" disabled={busy} data-testid="inbox-always" title={always} onKeyDown={noEnter} onClick={() => void decide(true, true)}>
          {always}
        </button>
      )}
      <input
        type="text"
        value={reason}
        placeholder="Reason for denying (optional)"
        aria-label="Reason for denying (optional, told to the agent)"
        data-testid="inbox-reason"
        onInput={(e) => setReason((e.target as HTMLInputElement).value)}
        onKeyDown={(e) => {
          if (e.key !== 'Enter' || e.isComposing) return;
          e.preventDefault();
          void decide(false, false);
        }}
      />
      <button type="button" class="danger" disabled={busy} data-testid="inbox-deny" onClick={() => void decide(false, false)}>
        Deny
      </button>
      {error && <ErrorBox message={error} onRetry={last ? () => void decide(last[0], last[1]) : undefined} onDismiss={() => setError(null)} />}
    </div>
  );
}
