// Undo history kept within bounds, and shown (#27): Settings' section with the workspace's
// size against its bound and "Clear", and the Changes view's mark on a turn whose undo
// history was cleared.
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import { ChangesView } from '../components/ChangesView';
import { UndoHistory, formatBytes } from '../components/UndoHistory';
import { CommandError } from '../platform';
import { $, FakePlatform, inAct, settle } from './fake';

let root: HTMLElement | null = null;
afterEach(() => {
  if (root) render(null, root);
  root = null;
});

async function mount(node: preact.ComponentChild) {
  document.body.innerHTML = '';
  root = document.createElement('div');
  document.body.appendChild(root);
  await act(async () => {
    render(node, root!);
  });
  await settle();
  return root;
}

const history = (bytes: number) => ({ workspace: '/ws', bytes, max_bytes: 1024 ** 3, max_age_days: 30 });

describe('undo history in Settings', () => {
  it('shows the size against the bound, and Clear (asked twice) empties it', async () => {
    let bytes = 52 * 1024 * 1024;
    const fake = new FakePlatform({
      undo_history: () => history(bytes),
      clear_undo_history: () => {
        bytes = 4096;
        return history(bytes);
      },
    });
    const view = await mount(<UndoHistory platform={fake} workspace="/ws" />);
    expect(fake.callsOf('undo_history')).toEqual([{ workspace: '/ws' }]);
    expect($(view, 'undo-history-size')!.textContent).toBe('52 MB of 1.0 GB, turns kept up to 30 days');
    await inAct(() => $(view, 'undo-history-clear')!.click());
    expect(fake.callsOf('clear_undo_history')).toEqual([]);
    await inAct(() => $(view, 'undo-history-clear')!.click());
    expect(fake.callsOf('clear_undo_history')).toEqual([{ workspace: '/ws' }]);
    expect($(view, 'undo-history-size')!.textContent).toContain('4.0 KB of 1.0 GB');
    expect($(view, 'undo-history-cleared')!.textContent).toContain('can no longer be undone');
  });

  it('says why there is none, and a refusal (busy) in words', async () => {
    const off = new FakePlatform({ undo_history: () => ({ ...history(0), off: 'git is not installed' }) });
    let view = await mount(<UndoHistory platform={off} workspace="/ws" />);
    expect($(view, 'undo-history-off')!.textContent).toContain('git is not installed');
    expect($(view, 'undo-history-clear')).toBeNull();
    const busy = new FakePlatform({
      undo_history: () => history(2048),
      clear_undo_history: () => {
        throw new CommandError('busy', 'a change in /ws is being recorded now; clear its undo history once it is done');
      },
    });
    view = await mount(<UndoHistory platform={busy} workspace="/ws" />);
    await inAct(() => $(view, 'undo-history-clear')!.click());
    await inAct(() => $(view, 'undo-history-clear')!.click());
    expect($(view, 'undo-history-error')!.textContent).toContain('being recorded now');
    expect($(view, 'undo-history-cleared')).toBeNull();
  });

  it('formats sizes as people read them', () => {
    expect([0, 900, 1536, 10 * 1024, 1024 ** 3].map(formatBytes)).toEqual(['0 B', '900 B', '1.5 KB', '10 KB', '1.0 GB']);
  });
});

describe('a turn whose undo history was cleared', () => {
  it('says so, and cannot be undone', async () => {
    const fake = new FakePlatform({
      turn_changes: () => ({
        available: true,
        turns: [
          { message_index: 0, files: [], skipped: [], undone: false, pruned: true },
          { message_index: 4, files: [{ path: 'c.txt', status: 'added', diff: '' }], skipped: [], undone: false, pruned: false },
        ],
      }),
    });
    const view = await mount(<ChangesView platform={fake} sessionId="s1" />);
    const turns = Array.from(view.querySelectorAll('[data-testid=changes-turn]')) as HTMLElement[];
    expect($(turns[0], 'turn-pruned')!.textContent).toContain('can no longer be shown or undone');
    expect(($(turns[0], 'turn-undo') as HTMLButtonElement).disabled).toBe(true);
    expect($(turns[1], 'turn-pruned')).toBeNull();
    expect(($(turns[1], 'turn-undo') as HTMLButtonElement).disabled).toBe(false);
  });
});
