import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import { ConfirmButton } from './ConfirmButton';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { SessionNeeds } from '../model';
import { agentLabel } from '../usage';
import { basename, formatTokens } from '../util';
import { Icon } from './Icon';
import { childState, LIVE, rootState, type LiveState } from '../status';

/** A session's state from the list alone (when no live state is given). */
export function listedState(s: SessionInfo): LiveState {
  return s.parent_session_id ? childState({}, s) : rootState({}, s);
}

/** "2 approvals", "failed", "1 report": what a session's badge says. */
export function needsLabel(n: SessionNeeds | undefined): string | null {
  if (!n) return null;
  const parts: string[] = [];
  if (n.approvals) parts.push(`${n.approvals} approval${n.approvals === 1 ? '' : 's'}`);
  if (n.failed) parts.push('failed');
  if (n.reports) parts.push(`${n.reports} report${n.reports === 1 ? '' : 's'}`);
  return parts.length ? parts.join(', ') : null;
}

export function NeedsBadge({ needs, testid = 'needs-badge' }: { needs: SessionNeeds | undefined; testid?: string }) {
  const label = needsLabel(needs);
  if (!label) return null;
  const kind = needs!.approvals ? 'approval' : needs!.failed ? 'failed' : 'reports';
  return (
    <span class={`needs-badge needs-${kind}`} data-testid={testid} data-kind={kind} title={`Needs you: ${label}`} aria-label={`needs you: ${label}`}>
      {needs!.approvals ? <Icon name="bell" /> : needs!.failed ? <Icon name="failed" /> : <Icon name="paused" />}
      <span class="needs-text">{needs!.approvals || needs!.reports || '!'}</span>
    </span>
  );
}

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
  roots.sort((a, b) => byTime(b, a));
  // A fork (Rewind, Fork from here) is listed right under its original, oldest first.
  const listed = new Set(roots.map((r) => r.info.session_id));
  const forksOf = new Map<string, Node[]>();
  for (const root of roots) {
    const from = root.info.forked_from;
    if (from && listed.has(from)) forksOf.set(from, [...(forksOf.get(from) ?? []), root]);
  }
  const ordered: Node[] = [];
  const place = (node: Node) => {
    ordered.push(node);
    for (const fork of (forksOf.get(node.info.session_id) ?? []).sort(byTime)) place(fork);
  };
  for (const root of roots) if (!(root.info.forked_from && listed.has(root.info.forked_from))) place(root);
  return ordered;
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
  /** What needs the person, per session id. */
  needs?: Record<string, SessionNeeds>;
  /** The live state of each session (status.ts): the icon and its word. */
  states?: Record<string, LiveState>;
  needCount?: number;
  onInbox?: () => void;
  /** Session tools; each is hidden when the backend lacks its command (it rejects). */
  onRename?: (session: SessionInfo, title: string) => Promise<void>;
  onArchive?: (session: SessionInfo, archived: boolean) => Promise<void>;
  /** Sessions whose titles or messages match (null: the backend cannot search content). */
  onSearch?: (query: string) => Promise<SessionInfo[] | null>;
}) {
  const [editing, setEditing] = useState<{ id: string; title: string } | null>(null);
  const [toolError, setToolError] = useState<string | null>(null);
  const [query, setQuery] = useState('');
  const [found, setFound] = useState<SessionInfo[] | null>(null);
  const [showArchived, setShowArchived] = useState(false);
  /** The session just archived: a toast offers to undo it for a while (E23). */
  const [archived, setArchived] = useState<SessionInfo | null>(null);
  const toastTimer = useRef<ReturnType<typeof setTimeout> | null>(null);
  useEffect(() => () => {
    if (toastTimer.current) clearTimeout(toastTimer.current);
  }, []);
  const list = useRef<HTMLUListElement>(null);
  /** The row the person was at when the search cleared, and where it was: it stays there,
   * so the rows do not shift under the pointer (ux review 2, E23: a wrong row archived). */
  const anchor = useRef<{ id: string; top: number } | null>(null);
  const changeQuery = (value: string) => {
    if (query.trim() && !value.trim()) {
      const rows = Array.from(list.current?.querySelectorAll<HTMLElement>('[data-testid=session-item]') ?? []);
      const row = rows.find((r) => r.matches(':hover')) ?? rows.find((r) => r.classList.contains('selected')) ?? rows[0];
      anchor.current = row?.dataset.sessionId ? { id: row.dataset.sessionId, top: row.getBoundingClientRect().top } : null;
    }
    setQuery(value);
  };
  useLayoutEffect(() => {
    const at = anchor.current;
    if (!at || query.trim()) return;
    anchor.current = null;
    const row = Array.from(list.current?.querySelectorAll<HTMLElement>('[data-testid=session-item]') ?? []).find((r) => r.dataset.sessionId === at.id);
    if (row && list.current) list.current.scrollTop += row.getBoundingClientRect().top - at.top;
  }, [query]);
  const searchSeq = useRef(0);
  const search = useRef(props.onSearch);
  search.current = props.onSearch;
  const canSearch = Boolean(props.onSearch);
  const archivedOf = (s: SessionInfo) => Boolean((s as SessionInfo & { archived?: boolean }).archived);

  // Titles filter at once; message content is searched by the backend (debounced).
  useEffect(() => {
    const q = query.trim();
    setFound(null);
    if (!q || !search.current) return;
    const seq = ++searchSeq.current;
    const timer = setTimeout(() => {
      void (search.current?.(q) ?? Promise.resolve(null))
        .then((list) => seq === searchSeq.current && setFound(list))
        .catch(() => seq === searchSeq.current && setFound(null));
    }, 250);
    return () => clearTimeout(timer);
  }, [query, canSearch]);

  const rename = async (s: SessionInfo, title: string) => {
    setEditing(null);
    if (!title.trim() || title.trim() === s.title) return;
    try {
      await props.onRename?.(s, title.trim());
      setToolError(null);
    } catch (err) {
      setToolError(`Cannot rename: ${(err as Error).message ?? err}`);
    }
  };
  const archive = async (s: SessionInfo, archive: boolean) => {
    try {
      await props.onArchive?.(s, archive);
      setToolError(null);
      if (toastTimer.current) clearTimeout(toastTimer.current);
      setArchived(archive ? s : null);
      if (archive) toastTimer.current = setTimeout(() => setArchived(null), 10000);
    } catch (err) {
      setToolError(`Cannot ${archive ? 'archive' : 'take it out of the archive'}: ${(err as Error).message ?? err}`);
    }
  };
  const renderNode = (node: Node, depth: number) => {
    const s = node.info;
    // A child shows its profile and the model it ran on last ("explore · qwen2.5-coder").
    const agent = depth > 0 ? agentLabel(s) : '';
    const own = Number(s.usage?.input_tokens ?? 0) + Number(s.usage?.output_tokens ?? 0);
    const live = props.states?.[s.session_id] ?? listedState(s);
    const tip = [s.title, LIVE[live].label, agent, depth > 0 ? `${formatTokens(own)} tokens` : ''].filter(Boolean).join(' · ');
    return (
      <li key={s.session_id}>
        <div
          class={`session-item depth-${Math.min(depth, 3)} ${s.forked_from ? 'forked' : ''} ${props.selected === s.session_id ? 'selected' : ''} ${archivedOf(s) ? 'archived' : ''}`}
          data-archived={archivedOf(s) ? 'true' : undefined}
          data-testid="session-item"
          data-session-id={s.session_id}
          data-state={s.state}
          data-status={live}
          data-parent-id={s.parent_session_id ?? undefined}
        >
          {editing?.id === s.session_id ? (
            <form
              class="session-rename"
              onSubmit={(e) => {
                e.preventDefault();
                void rename(s, editing.title);
              }}
            >
              <input
                type="text"
                value={editing.title}
                aria-label="Session title"
                data-testid="session-rename-input"
                ref={(el) => el?.focus()}
                onInput={(e) => setEditing({ id: s.session_id, title: (e.target as HTMLInputElement).value })}
                onKeyDown={(e) => e.key === 'Escape' && setEditing(null)}
                onBlur={(e) => {
                  // Leaving the field saves a new title; an emptied field stays open (a
                  // title cannot be empty, and WebDriver's clear blurs the field).
                  const value = (e.target as HTMLInputElement).value;
                  if (value.trim()) void rename(s, value);
                }}
              />
            </form>
          ) : (
          <button type="button" class="session-open" onClick={() => (depth === 0 ? props.onSelect(s.session_id) : props.onSelect(rootOf(s), s.session_id))} onDblClick={() => props.onRename && depth === 0 && setEditing({ id: s.session_id, title: s.title })} title={tip}>
            <span class={`badge status-${live}`} data-testid="session-state" data-state={live} title={LIVE[live].label}>
              <Icon name={LIVE[live].icon} label={LIVE[live].label} />
            </span>
            {s.forked_from && (
              <span class="fork-mark muted" data-testid="fork-mark" title="A fork of the conversation above">
                ↳
              </span>
            )}
            <span class="session-title">{s.title || 'Untitled'}</span>
            {depth === 0 && archivedOf(s) && (
              <span class="archived-mark muted" data-testid="archived-mark" title="Archived: hidden from the usual list">
                archived
              </span>
            )}
            {agent && (
              <span class="session-agent muted" data-testid="session-agent">
                {agent}
              </span>
            )}
            <NeedsBadge needs={props.needs?.[s.session_id]} />
          </button>
          )}
          {depth === 0 && props.onRename && editing?.id !== s.session_id && (
            <button type="button" class="quiet session-tool" data-testid="session-rename" title="Rename" aria-label={`Rename ${s.title}`} onClick={() => setEditing({ id: s.session_id, title: s.title })}>
              <Icon name="edit" />
            </button>
          )}
          {depth === 0 && props.onArchive && (
            <button
              type="button"
              class="quiet session-tool"
              data-testid="session-archive"
              title={archivedOf(s) ? 'Take out of the archive' : 'Archive (hide from the list; nothing is deleted)'}
              onClick={() => void archive(s, !archivedOf(s))}
            >
              {archivedOf(s) ? 'Unarchive' : 'Archive'}
            </button>
          )}
          {depth === 0 && (
            <ConfirmButton
              class="quiet session-delete"
              testid="session-delete"
              label="×"
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

  const archivedCount = props.sessions.filter((s) => !s.parent_session_id && archivedOf(s)).length;
  /** The roots to list: archived ones only on request; a search shows what matches. */
  function visibleTree(): Node[] {
    const q = query.trim().toLowerCase();
    const matches = new Set((found ?? []).map((s) => rootOf(s)));
    return sessionTree(props.sessions).filter((n) => {
      if (q) return n.info.title.toLowerCase().includes(q) || matches.has(n.info.session_id);
      return showArchived || !archivedOf(n.info);
    });
  }

  return (
    <nav class="sidebar" data-testid="sidebar">
      {/* The full path is the path line's own tooltip, not the block's: a tooltip inherited
          by "Open folder…" (which opens the OS dialog and then replaces the workspace) is
          one the webview may leave on screen (D30). */}
      <div class="workspace">
        <button type="button" class="quiet workspace-name" onClick={props.onSwitchWorkspace} data-testid="workspace-switch" title="Choose another workspace">
          <Icon name="chevron" /> {basename(props.workspace)}
        </button>
        <div class="workspace-path muted" data-testid="workspace-path" title={props.workspace}>
          {props.workspace}
        </div>
        <button type="button" class="link" onClick={props.onOpenFolder} data-testid="open-folder">
          Open folder…
        </button>
      </div>
      {(props.needCount ?? 0) > 0 && (
        <button type="button" class="inbox-button" data-testid="inbox-button" onClick={props.onInbox} title="Everything that waits for you, in every session">
          <Icon name="bell" /> {props.needCount} need{props.needCount === 1 ? 's' : ''} you
        </button>
      )}
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
      <div class="session-search-row">
      <input
        type="search"
        class="session-search"
        placeholder={props.onSearch ? 'Search titles and messages' : 'Search titles'}
        aria-label="Search sessions"
        data-testid="session-search"
        value={query}
        onInput={(e) => changeQuery((e.target as HTMLInputElement).value)}
        onKeyDown={(e) => e.key === 'Escape' && changeQuery('')}
      />
      {query && (
        <button type="button" class="quiet icon-button" data-testid="session-search-clear" aria-label="Clear the search" onClick={() => changeQuery('')}>
          <Icon name="close" />
        </button>
      )}
      </div>
      {toolError && (
        <div class="error-box small" role="alert" data-testid="session-tool-error">
          {toolError}
        </div>
      )}
      <ul class="sessions" data-testid="session-list" ref={list}>
        {visibleTree().map((n) => renderNode(n, 0))}
      </ul>
      {query.trim() && visibleTree().length === 0 && <div class="muted empty-search">No session matches “{query.trim()}”.</div>}
      {!query.trim() && archivedCount > 0 && (
        <button type="button" class="link" data-testid="show-archived" onClick={() => setShowArchived(!showArchived)}>
          {showArchived ? 'Hide archived' : `Archived (${archivedCount})`}
        </button>
      )}
      {archived && (
        <div class="toast" role="status" data-testid="archive-toast">
          <span>
            Archived “{archived.title || 'Untitled'}”.
          </span>
          <button type="button" class="link" data-testid="archive-undo" onClick={() => void archive(archived, false)}>
            Undo
          </button>
        </div>
      )}
      <button type="button" class="quiet settings-button" data-testid="settings-button" onClick={props.onSettings}>
        <Icon name="gear" /> Settings
      </button>
    </nav>
  );
}
