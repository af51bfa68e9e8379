import { useEffect, useState } from 'preact/hooks';
import type { Platform } from '../platform';

/**
 * "Quit while agents work?" The shell asks only while the close guard is set (the app
 * sets it while anything runs); Quit stops every run, Keep working closes this.
 */
export function QuitConfirm({ platform, running }: { platform: Platform; running: number }) {
  const [asking, setAsking] = useState(false);
  useEffect(() => platform.onCloseRequested?.(() => setAsking(true)), [platform]);
  if (!asking) return null;
  return (
    <div class="overlay" data-testid="quit-confirm">
      <div class="dialog" role="alertdialog" aria-labelledby="quit-title">
        <h2 id="quit-title">Quit while agents work?</h2>
        <p>
          {running > 0 ? `${running} run${running === 1 ? ' is' : 's are'} still working.` : 'Work is still running.'} Quitting stops
          {running === 1 ? ' it' : ' them'}; what was written stays, and sub-agents cut off can be resumed at the next start.
        </p>
        <div class="dialog-buttons">
          <button type="button" class="primary" data-testid="quit-cancel" autoFocus onClick={() => setAsking(false)}>
            Keep working
          </button>
          <button type="button" class="danger" data-testid="quit-confirm-button" onClick={() => platform.quit?.()}>
            Quit
          </button>
        </div>
      </div>
    </div>
  );
}
