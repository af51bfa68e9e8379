import { ConfirmButton } from './ConfirmButton';
import type { SessionInfo } from '../bindings/SessionInfo';
import { basename } from '../util';

const BADGE: Record<string, string> = { running: '●', paused: '⏸', idle: '✓' };

interface Node {
  info: SessionInfo;
  children: Node[];
}

/** Sessions as a tree: children nested under their parent, newest conversations first. */
export function sessionTree(sessions: SessionInfo[]): Node[] {
  const nodes = new Map(sessions.map((s) => [s.session_id, { info: s, children: [] as Node[] }]));
  const roots: Node[] = [];
  for (const node of nodes.values()) {
    const parent = node.info.parent_session_id ? nodes.get(node.info.parent_session_id) : undefined;
    if (parent) parent.children.push(node);
    else roots.push(node);
  }
  const byTime = (a: Node, b: Node) => a.info.created_at.localeCompare(b.info.created_at) || a.info.session_id.localeCompare(b.info.session_id);
  for (const node of nodes.values()) node.children.sort(byTime);
  return roots.sort((a, b) => byTime(b, a));
}

export function Sidebar(props: {
  workspace: string;
  sessions: SessionInfo[];
  selected: string | null;
  error: string | null;
  onRetry: () => void;
  /** Opens a top-level session, and for a child its tab. */
  onSelect: (sessionId: string, childId?: string) => void;
  onNew: () => void;
  onDelete: (session: SessionInfo) => void;
  onOpenFolder: () => void;
  onSwitchWorkspace: () => void;
  onSettings: () => void;
}) {
  const renderNode = (node: Node, depth: number) => {
    const s = node.info;
    return (
      <li key={s.session_id}>
        <div
          class={`session-item depth-${Math.min(depth, 3)} ${props.selected === s.session_id ? 'selected' : ''}`}
          data-testid="session-item"
          data-session-id={s.session_id}
          data-state={s.state}
          data-parent-id={s.parent_session_id ?? undefined}
        >
          <button type="button" class="session-open" onClick={() => (depth === 0 ? props.onSelect(s.session_id) : props.onSelect(rootOf(s), s.session_id))} title={s.title}>
            <span class={`badge badge-${s.state}`} data-testid="session-state" aria-label={s.state}>
              {BADGE[s.state] ?? '·'}
            </span>
            <span class="session-title">{s.title || 'Untitled'}</span>
          </button>
          {depth === 0 && (
            <ConfirmButton
              class="quiet session-delete"
              testid="session-delete"
              label="✕"
              confirmLabel="Delete?"
              ariaLabel={`Delete ${s.title}`}
              title="Delete this session and its sub-agents (running work stops, nothing is reported)"
              onConfirm={() => props.onDelete(s)}
            />
          )}
        </div>
        {node.children.length > 0 && <ul>{node.children.map((c) => renderNode(c, depth + 1))}</ul>}
      </li>
    );
  };
  // A child opens its top-level conversation (its tab lives there).
  const parents = new Map(props.sessions.map((s) => [s.session_id, s.parent_session_id]));
  const rootOf = (s: SessionInfo) => {
    let id = s.session_id;
    for (let i = 0; i < 16 && parents.get(id); i++) id = parents.get(id)!;
    return id;
  };

  return (
    <nav class="sidebar" data-testid="sidebar">
      <div class="workspace" title={props.workspace}>
        <button type="button" class="quiet workspace-name" onClick={props.onSwitchWorkspace} data-testid="workspace-switch" title="Choose another workspace">
          ▾ {basename(props.workspace)}
        </button>
        <div class="workspace-path muted">{props.workspace}</div>
        <button type="button" class="link" onClick={props.onOpenFolder} data-testid="open-folder">
          Open folder…
        </button>
      </div>
      <div class="sessions-head">
        <span>Sessions</span>
        <button type="button" data-testid="new-session" onClick={props.onNew}>
          + New
        </button>
      </div>
      {props.error && (
        <div class="error-box small" role="alert">
          {props.error}{' '}
          <button type="button" data-testid="retry" onClick={props.onRetry}>
            Retry
          </button>
        </div>
      )}
      <ul class="sessions" data-testid="session-list">
        {sessionTree(props.sessions).map((n) => renderNode(n, 0))}
      </ul>
      <button type="button" class="quiet settings-button" data-testid="settings-button" onClick={props.onSettings}>
        ⚙ Settings
      </button>
    </nav>
  );
}
