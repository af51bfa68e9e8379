import { useState } from 'preact/hooks';
import { basename } from '../util';
import { ErrorBox } from './ErrorBox';

/** The first screen: recent workspaces, a folder picker, or a typed path. */
export function WorkspacePicker(props: {
  recents: string[];
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
      {props.recents.length > 0 && (
        <>
          <h2>Recent</h2>
          <ul class="recents">
            {props.recents.map((r) => (
              <li key={r}>
                <button type="button" class="recent" data-testid="workspace-recent" data-path={r} onClick={() => props.onOpen(r)}>
                  <strong>{basename(r)}</strong>
                  <span class="muted">{r}</span>
                </button>
                <button type="button" class="quiet" aria-label={`Forget ${r}`} onClick={() => props.onForget(r)}>
                  ×
                </button>
              </li>
            ))}
          </ul>
        </>
      )}
    </div>
  );
}
