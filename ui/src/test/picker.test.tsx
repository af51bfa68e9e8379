// The workspace picker of both adapters: the backend's workspaces beside the remembered
// recents (D27), and the web UI's in-app folder dialog.
import { afterEach, describe, expect, it } from 'vitest';
import { mergeWorkspaces } from '../components/WorkspacePicker';
import { $, $$, FakePlatform, inAct, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

async function open(fake: FakePlatform) {
  const mounted = await mountApp(fake, null);
  unmount = mounted.unmount;
  return mounted.root;
}

const ws = (path: string, sessions: number, last_activity: string) => ({ path, sessions, last_activity });

describe("the server's workspaces in the picker (D27)", () => {
  it('a new browser lists the backend workspaces after the remembered ones, each folder once, with its session count', async () => {
    const fake = workspacePlatform([]);
    fake.workspace = null;
    fake.uiState = { recents: ['/home/me/a', '/home/me/mine'] };
    fake.handlers.list_workspaces = () => [ws('/home/me/b', 3, '2026-11-30T10:00:00.000Z'), ws('/home/me/a/', 1, '2026-11-01T10:00:00.000Z')];
    const root = await open(fake);
    const rows = $$(root, 'workspace-recent');
    expect(rows.map((r) => r.dataset.path)).toEqual(['/home/me/a', '/home/me/mine', '/home/me/b']);
    expect(rows.map((r) => r.dataset.remembered)).toEqual(['true', 'true', 'false']);
    expect(rows[0].querySelector('[data-testid="workspace-sessions"]')!.textContent).toMatch(/^1 session, last /);
    expect(rows[1].querySelector('[data-testid="workspace-sessions"]')).toBeNull();
    expect(rows[2].querySelector('[data-testid="workspace-sessions"]')!.textContent).toMatch(/^3 sessions/);
    // Only remembered ones can be forgotten (the server's would come straight back).
    expect(root.querySelector('[aria-label="Forget /home/me/b"]')).toBeNull();
    expect(root.querySelector('[aria-label="Forget /home/me/mine"]')).not.toBeNull();
    await inAct(() => rows[2].click());
    expect(fake.callsOf('list_sessions')).toEqual([{ workspace: '/home/me/b' }]);
    expect(fake.callsOf('list_workspaces')).toEqual([{}]);
  });

  it('a backend without list_workspaces lists only the remembered recents', async () => {
    const fake = workspacePlatform([]);
    fake.workspace = null;
    fake.uiState = { recents: ['/home/me/a'] };
    const root = await open(fake);
    expect($$(root, 'workspace-recent').map((r) => r.dataset.path)).toEqual(['/home/me/a']);
    expect($(root, 'pick-error')).toBeNull();
  });

  it('asks again when the person goes back to the picker', async () => {
    const fake = workspacePlatform([]);
    let listed = [ws('/ws', 1, '2026-11-30T10:00:00.000Z')];
    fake.handlers.list_workspaces = () => listed;
    const root = await open(fake);
    expect($(root, 'workspace-picker')).toBeNull();
    listed = [ws('/home/me/new', 2, '2026-12-01T10:00:00.000Z'), ...listed];
    await inAct(() => $(root, 'workspace-switch')!.click());
    expect($$(root, 'workspace-recent').map((r) => r.dataset.path)).toEqual(['/ws', '/home/me/new']);
  });

  it('mergeWorkspaces keeps recents first and drops duplicates that differ by a trailing slash', () => {
    expect(mergeWorkspaces(['/x/'], [ws('/x', 2, 't'), ws('/y', 1, 't')]).map((e) => [e.path, e.remembered, e.sessions])).toEqual([
      ['/x/', true, 2],
      ['/y', false, 1],
    ]);
  });
});
