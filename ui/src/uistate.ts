// What the app remembers between starts: the last workspace and, per workspace, the last
// session, and the recent workspaces. Kept by the platform (the desktop shell writes
// `<data dir>/ui-state.json`, so a start from the menu with no arguments reopens where the
// person was; the browser keeps it in localStorage). Pure functions; App saves the result.

export interface UiState {
  lastWorkspace: string | null;
  recents: string[];
  lastSessions: Record<string, string>;
}

const MAX_RECENTS = 8;

const strings = (value: unknown): string[] => (Array.isArray(value) ? value.filter((x): x is string => typeof x === 'string' && x.length > 0) : []);

/** Reads whatever was stored, dropping what is not of the expected shape. */
export function parseUiState(raw: unknown, fallback: Partial<UiState> = {}): UiState {
  const value = raw && typeof raw === 'object' && !Array.isArray(raw) ? (raw as Record<string, unknown>) : {};
  const lastSessions: Record<string, string> = { ...(fallback.lastSessions ?? {}) };
  if (value.lastSessions && typeof value.lastSessions === 'object') {
    for (const [ws, id] of Object.entries(value.lastSessions as Record<string, unknown>)) if (typeof id === 'string') lastSessions[ws] = id;
  }
  const recents = [...new Set([...strings(value.recents), ...(fallback.recents ?? [])])].slice(0, MAX_RECENTS);
  const last = typeof value.lastWorkspace === 'string' && value.lastWorkspace ? value.lastWorkspace : (fallback.lastWorkspace ?? null);
  return { lastWorkspace: last, recents, lastSessions };
}

export function withWorkspace(state: UiState, workspace: string): UiState {
  return { ...state, lastWorkspace: workspace, recents: [workspace, ...state.recents.filter((p) => p !== workspace)].slice(0, MAX_RECENTS) };
}

export function withoutWorkspace(state: UiState, workspace: string): UiState {
  const { [workspace]: _gone, ...lastSessions } = state.lastSessions;
  return {
    lastWorkspace: state.lastWorkspace === workspace ? null : state.lastWorkspace,
    recents: state.recents.filter((p) => p !== workspace),
    lastSessions,
  };
}

export function withSession(state: UiState, workspace: string, sessionId: string | null): UiState {
  const { [workspace]: _old, ...rest } = state.lastSessions;
  return { ...state, lastSessions: sessionId ? { ...rest, [workspace]: sessionId } : rest };
}

/** The workspace picker was shown on purpose: the next start shows it too. */
export function withoutLast(state: UiState): UiState {
  return { ...state, lastWorkspace: null };
}
