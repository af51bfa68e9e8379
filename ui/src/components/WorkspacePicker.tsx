import { useState } from 'preact/hooks';
import type { WorkspaceInfo } from '../bindings/WorkspaceInfo';
import { basename } from '../util';
import { ErrorBox } from './ErrorBox';

/** A workspace the picker lists: remembered here, known to the backend, or both. */
export interface PickerEntry {
  path: string;
  /** Remembered by this window or browser (it can be forgotten). */
  remembered: boolean;
  /** The backend's facts, when it has sessions there. */
  sessions?: number;
  lastActivity?: string;
}

const same = (a: string, b: string) => a.replace(/\/+$/, '') === b.replace(/\/+$/, '');

/**
 * The remembered recents (in their order) and then the backend's workspaces (most recent
 * first), each folder once: a new browser still lists the server's workspaces (D27).
 */
export function mergeWorkspaces(recents: string[], known: WorkspaceInfo[]): PickerEntry[] {
  const facts = (path: string) => known.find((k) => same(k.path, path));
  const entries: PickerEntry[] = recents.map((path) => {
    const k = facts(path);
    return { path, remembered: true, sessions: k?.sessions, lastActivity: k?.last_activity };
  });
  for (const k of known) {
    if (!entries.some((e) => same(e.path, k.path))) entries.push({ path: k.path, remembered: false, sessions: k.sessions, lastActivity: k.last_activity });
  }
  return entries;
}

function sessionsLabel(entry: PickerEntry): string | null {
  if (entry.sessions == null) return null;
  const count = `${entry.sessions} session${entry.sessions === 1 ? '' : 's'}`;
  const when = entry.lastActivity ? new Date(entry.lastActivity) : null;
  return when && !Number.isNaN(when.getTime()) ? `${count}, last ${when.toLocaleString()}` : count;
}

/** The first screen: recent workspaces, a folder picker, or a typed path. */
export function WorkspacePicker(props: {
  recents: string[];
  /** The backend's workspaces (`list_workspaces`); empty when it has none or cannot say. */
  known?: WorkspaceInfo[];
  error: string | null;
  onOpen: (path: string) => void;
  onPick: () => void;
  onForget: (path: string) => void;
  /** Opens the model set-up (reachable before any workspace is open). */
  onSetup?: () => void;
  /** No provider is configured yet: say so here, on the first screen. */
  needsSetup?: boolean;
}) {
  const [path, setPath] = useState('');
  const entries = mergeWorkspaces(props.recents, props.known ?? []);
  return (
    <div class="workspace-picker" data-testid="workspace-picker">
      <h1>Bumblehive</h1>
      <p class="muted">Choose the folder the agent will work in.</p>
      {props.error && <ErrorBox message={props.error} testid="pick-error" />}
      {props.needsSetup && props.onSetup && (
        <div class="banner setup-banner" data-testid="picker-setup">
          <span>No model is set up yet.</span>
          <button type="button" data-testid="picker-setup-open" onClick={props.onSetup}>
            Set up a model…
          </button>
        </div>
      )}
      <button type="button" class="primary" data-testid="workspace-open" onClick={props.onPick}>
        Open folder…
      </button>
      <form
        class="row"
        onSubmit={(e) => {
          e.preventDefault();
          if (path.trim()) props.onOpen(path.trim());
        }}
      >
        <input
          type="text"
          placeholder="/absolute/path/to/project"
          value={path}
          aria-label="Workspace path"
          data-testid="workspace-path-input"
          onInput={(e) => setPath((e.target as HTMLInputElement).value)}
        />
        <button type="submit" data-testid="workspace-path-submit" disabled={!path.trim()}>
          Open
        </button>
      </form>
      {entries.length > 0 && (
        <>
          <h2>Recent</h2>
          <ul class="recents">
            {entries.map((r) => (
              <li key={r.path}>
                <button
                  type="button"
                  class="recent"
                  data-testid="workspace-recent"
                  data-path={r.path}
                  data-remembered={r.remembered ? 'true' : 'false'}
                  onClick={() => props.onOpen(r.path)}
                >
                  <strong>{basename(r.path)}</strong>
                  <span class="muted">{r.path}</span>
                  {sessionsLabel(r) && (
                    <span class="muted" data-testid="workspace-sessions">
                      {sessionsLabel(r)}
                    </span>
                  )}
                </button>
                {r.remembered && (
                  <button type="button" class="quiet" aria-label={`Forget ${r.path}`} onClick={() => props.onForget(r.path)}>
                    ×
                  </button>
                )}
              </li>
            ))}
          </ul>
        </>
      )}
    </div>
  );
}
