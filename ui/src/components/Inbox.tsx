import type { SessionInfo } from '../bindings/SessionInfo';
import type { AttentionSummary } from '../model';
import { argumentHint } from '../util';
import { Icon } from './Icon';

/** Everything that needs the person, across every session: approvals, failures, trays. */
export function Inbox(props: {
  summary: AttentionSummary;
  sessions: SessionInfo[];
  onOpen: (sessionId: string) => void;
  onClose: () => void;
}) {
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
  const { approvals, failed, trays } = props.summary;
  const empty = props.summary.count === 0;
  return (
    <div class="overlay" data-testid="inbox" onClick={(e) => e.target === e.currentTarget && props.onClose()} onKeyDown={(e) => e.key === 'Escape' && props.onClose()}>
      <div class="dialog inbox" role="dialog" aria-labelledby="inbox-title" tabIndex={-1}>
        <h2 id="inbox-title">Needs you</h2>
        {empty && <p class="muted">Nothing waits for you.</p>}
        <ul class="inbox-list">
          {approvals.map((a) => (
            <li key={a.approval_id}>
              <button type="button" class="inbox-item" data-testid="inbox-approval" data-session-id={a.session_id} onClick={() => props.onOpen(a.session_id)}>
                <Icon name="bell" />
                <span>
                  <strong>{a.title ?? title(a.session_id)}</strong> wants to run {a.tool}
                  {argumentHint(a.arguments) ? ` on ${argumentHint(a.arguments)}` : ''}
                  {inConversation(a.session_id)}
                </span>
              </button>
            </li>
          ))}
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
          <button type="button" data-testid="inbox-close" onClick={props.onClose}>
            Close
          </button>
        </div>
      </div>
    </div>
  );
}
