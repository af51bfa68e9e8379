import { useEffect, useRef, useState } from 'preact/hooks';
import type { SessionInfo } from '../bindings/SessionInfo';

/** The sessions a switcher lists for a query: titles containing it, most recently updated first. */
export function switcherMatches(sessions: SessionInfo[], query: string, limit = 12): SessionInfo[] {
  const q = query.trim().toLowerCase();
  const archived = (s: SessionInfo) => Boolean((s as SessionInfo & { archived?: boolean }).archived);
  return sessions
    .filter((s) => (q ? (s.title || 'Untitled').toLowerCase().includes(q) : !archived(s) && !s.parent_session_id))
    .sort((a, b) => b.updated_at.localeCompare(a.updated_at))
    .slice(0, limit);
}

/**
 * Ctrl+K: switch to a session by typing part of its title (sub-agents too: they open their
 * tab in their conversation). Arrows move, Enter opens, Esc closes (E17).
 */
export function QuickSwitcher(props: { sessions: SessionInfo[]; selected: string | null; onOpen: (sessionId: string) => void; onClose: () => void }) {
  const [query, setQuery] = useState('');
  const [choice, setChoice] = useState(0);
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => input.current?.focus(), []);
  const list = switcherMatches(props.sessions, query);
  const titleOf = (id: string | null) => props.sessions.find((s) => s.session_id === id)?.title || 'Untitled';
  const open = (s: SessionInfo | undefined) => s && props.onOpen(s.session_id);
  const onKeyDown = (e: KeyboardEvent) => {
    if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
      e.preventDefault();
      if (list.length) setChoice((c) => (c + (e.key === 'ArrowDown' ? 1 : list.length - 1)) % list.length);
    } else if (e.key === 'Enter' && !e.isComposing) {
      e.preventDefault();
      open(list[Math.min(choice, list.length - 1)]);
    } else if (e.key === 'Escape' || (e.key.toLowerCase() === 'k' && (e.ctrlKey || e.metaKey))) {
      e.preventDefault();
      e.stopPropagation();
      props.onClose();
    }
  };
  return (
    <div class="overlay" data-testid="quick-switcher" onClick={(e) => e.target === e.currentTarget && props.onClose()}>
      <div class="dialog switcher" role="dialog" aria-label="Switch to a session" onKeyDown={onKeyDown}>
        <input
          ref={input}
          type="text"
          class="switcher-input"
          placeholder="Switch to a session… (type part of its title)"
          aria-label="Session title"
          data-testid="switcher-input"
          value={query}
          onInput={(e) => {
            setQuery((e.target as HTMLInputElement).value);
            setChoice(0);
          }}
        />
        <ul class="switcher-list" role="listbox">
          {list.map((s, i) => (
            <li key={s.session_id}>
              <button
                type="button"
                role="option"
                tabIndex={-1}
                aria-selected={i === choice}
                class={`switcher-item ${i === choice ? 'active' : ''} ${s.session_id === props.selected ? 'current' : ''}`}
                data-testid="switcher-item"
                data-session-id={s.session_id}
                onMouseDown={(e) => e.preventDefault()}
                onClick={() => open(s)}
              >
                <span class="switcher-title">{s.title || 'Untitled'}</span>
                {s.parent_session_id && <span class="muted">sub-agent of {titleOf(s.parent_session_id)}</span>}
              </button>
            </li>
          ))}
        </ul>
        {list.length === 0 && <div class="muted">No session matches “{query.trim()}”.</div>}
        <div class="muted small">↑↓ choose · Enter opens · Esc closes</div>
      </div>
    </div>
  );
}
