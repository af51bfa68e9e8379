// Settings' undo history section (#27): how much of the data folder this workspace's undo
// history takes, against the bound past which its oldest turns lose theirs, and "Clear".
import { useEffect, useState } from 'preact/hooks';
import type { UndoHistory as History } from '../bindings/UndoHistory';
import { toCommandError, type Platform } from '../platform';
import { ConfirmButton } from './ConfirmButton';

/** Bytes as a person reads them (1 decimal below 10). */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  const shown = unit === 0 || value >= 10 ? Math.round(value).toString() : value.toFixed(1);
  return `${shown} ${units[unit]}`;
}

export function UndoHistory(props: { platform: Platform; workspace: string | null }) {
  const { platform, workspace } = props;
  const [history, setHistory] = useState<History | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [cleared, setCleared] = useState(false);

  useEffect(() => {
    if (!workspace) return;
    let live = true;
    setCleared(false);
    platform
      .invoke('undo_history', { workspace })
      .then((h) => {
        if (live) {
          setHistory(h);
          setError(null);
        }
      })
      .catch((err) => live && setError(toCommandError(err).message));
    return () => {
      live = false;
    };
  }, [workspace, platform]);

  if (!workspace) return null;
  const clear = async () => {
    try {
      setHistory(await platform.invoke('clear_undo_history', { workspace }));
      setCleared(true);
      setError(null);
    } catch (err) {
      setError(toCommandError(err).message);
    }
  };
  return (
    <section class="undo-history" data-testid="undo-history">
      <div class="row">
        <span>Undo history of this workspace</span>
        {history && !history.off && (
          <span data-testid="undo-history-size">
            {formatBytes(history.bytes)} of {formatBytes(history.max_bytes)}, turns kept up to {history.max_age_days} days
          </span>
        )}
        {history && !history.off && history.bytes > 0 && (
          <ConfirmButton label="Clear" confirmLabel="Clear undo history" testid="undo-history-clear" onConfirm={() => void clear()} />
        )}
      </div>
      {history?.off && (
        <div class="muted small" data-testid="undo-history-off">
          No undo history: {history.off}
        </div>
      )}
      {cleared && (
        <div class="muted small" data-testid="undo-history-cleared">
          Cleared: the turns before now can no longer be undone; what the files hold now is kept.
        </div>
      )}
      {error && (
        <div class="muted small" role="alert" data-testid="undo-history-error">
          {error}
        </div>
      )}
      <div class="muted small">
        Kept in the data folder; past the bound (<code>checkpoints.max_store_mb</code>, <code>checkpoints.max_age_days</code>) the oldest turns lose theirs first.
      </div>
    </section>
  );
}
