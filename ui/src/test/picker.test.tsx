// The workspace picker of both adapters: the backend's workspaces beside the remembered
// recents (D27), and the web UI's in-app folder dialog.
import { afterEach, describe, expect, it } from 'vitest';
import { mergeWorkspaces } from '../components/WorkspacePicker';
import { act } from 'preact/test-utils';
import { CommandError } from '../platform';
import { $, $$, FakePlatform, inAct, key, settle, typeInto, workspacePlatform } from './fake';
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

/** A platform like the web one: no native dialog; `list_folders` answers from a small tree. */
function webLike() {
  const fake = workspacePlatform([]);
  fake.workspace = null;
  (fake as { pickFolder?: unknown }).pickFolder = undefined;
  const tree: Record<string, string[]> = {
    '/': ['home'],
    '/home': ['me'],
    '/home/me': ['notes', 'proj', 'projects2'],
    '/home/me/proj': ['src'],
    '/home/me/notes': [],
  };
  fake.handlers.list_folders = ({ path, hidden }) => {
    const at = path ?? '/home/me';
    if (!tree[at]) throw new CommandError('not_found', `folder ${at} does not exist`);
    const parent = at === '/' ? null : at.slice(0, at.lastIndexOf('/')) || '/';
    // As the server does: dot-folders only when asked for, after the others.
    const folders = hidden && at === '/home/me' ? [...tree[at], '.config'] : tree[at];
    return { path: at, parent, home: '/home/me', folders, truncated: false };
  };
  return fake;
}

const entries = (root: HTMLElement) => $$(root, 'folder-entry').map((e) => e.dataset.name);
const field = (root: HTMLElement) => $(root, 'folder-path') as HTMLInputElement;
/** Past the dialog's wait before it lists a typed folder. */
const typed = async (root: HTMLElement, value: string) => {
  await inAct(() => typeInto(field(root), value));
  await act(async () => {
    await new Promise((r) => setTimeout(r, 200));
  });
  await settle();
};

describe('the in-app folder dialog (web UI, D27)', () => {
  it('Open folder… shows the dialog in the home folder, never a prompt; Up, Home and a click go around; Enter opens the checked folder', async () => {
    const fake = webLike();
    fake.folders = { '/home/me/proj': '/home/me/proj' };
    const root = await open(fake);
    await inAct(() => $(root, 'workspace-open')!.click());
    expect($(root, 'folder-dialog')).not.toBeNull();
    expect(fake.callsOf('list_folders')[0]).toEqual({ path: '/home/me' });
    expect(field(root).value).toBe('/home/me/');
    expect(document.activeElement).toBe(field(root));
    expect(entries(root)).toEqual(['notes', 'proj', 'projects2']);
    // Hidden folders on demand, after the others.
    await inAct(() => $(root, 'folder-hidden')!.click());
    expect(fake.callsOf('list_folders').at(-1)).toEqual({ path: '/home/me', hidden: true });
    expect(entries(root)).toEqual(['notes', 'proj', 'projects2', '.config']);
    await inAct(() => $(root, 'folder-hidden')!.click());
    expect(entries(root)).toEqual(['notes', 'proj', 'projects2']);
    await inAct(() => $(root, 'folder-up')!.click());
    expect(field(root).value).toBe('/home/');
    expect(entries(root)).toEqual(['me']);
    await inAct(() => $(root, 'folder-home')!.click());
    expect(field(root).value).toBe('/home/me/');
    await inAct(() => root.querySelector<HTMLElement>('[data-testid="folder-entry"][data-name="proj"]')!.click());
    expect(field(root).value).toBe('/home/me/proj/');
    expect(entries(root)).toEqual(['src']);
    await inAct(() => key(field(root), 'Enter'));
    expect($(root, 'folder-dialog')).toBeNull();
    expect(fake.callsOf('list_sessions')).toEqual([{ workspace: '/home/me/proj' }]);
  });

  it('typing lists the typed folder and Tab completes; a missing folder and a refused choice say why and keep the dialog; Escape cancels', async () => {
    const fake = webLike();
    fake.folders = {};
    const root = await open(fake);
    await inAct(() => $(root, 'workspace-open')!.click());
    await typed(root, '/home/me/pro');
    expect(entries(root)).toEqual(['proj', 'projects2']);
    await inAct(() => key(field(root), 'Tab'));
    expect(field(root).value).toBe('/home/me/proj');
    await typed(root, '/home/me/n');
    const tab = key(field(root), 'Tab');
    await settle();
    expect(tab.defaultPrevented).toBe(true);
    expect(field(root).value).toBe('/home/me/notes/');
    await typed(root, '~/proj/');
    expect(field(root).value).toBe('/home/me/proj/');
    expect(entries(root)).toEqual(['src']);
    await typed(root, '/home/me/gone/');
    expect($(root, 'folder-list-error')!.textContent).toContain('folder /home/me/gone does not exist');
    // Enter checks the folder first: refused, the dialog stays open and says why.
    await inAct(() => key(field(root), 'Enter'));
    expect($(root, 'folder-choose-error')!.textContent).toContain('/home/me/gone does not exist');
    expect($(root, 'folder-dialog')).not.toBeNull();
    expect(fake.callsOf('list_sessions')).toEqual([]);
    await inAct(() => key(field(root), 'Escape'));
    expect($(root, 'folder-dialog')).toBeNull();
    expect(fake.callsOf('list_sessions')).toEqual([]);
    expect($(root, 'workspace-picker')).not.toBeNull();
  });

  it('starts in the last workspace when one is open (the sidebar\'s Open folder…)', async () => {
    const fake = webLike();
    fake.workspace = '/home/me/proj';
    const root = await open(fake);
    await inAct(() => $(root, 'open-folder')!.click());
    expect(fake.callsOf('list_folders')[0]).toEqual({ path: '/home/me/proj' });
    expect(entries(root)).toEqual(['src']);
    await inAct(() => $(root, 'folder-cancel')!.click());
    expect($(root, 'folder-dialog')).toBeNull();
  });
});

describe('no tooltip is left behind by a view that goes away (D30)', () => {
  /** The tooltip an element shows: its own `title` or the nearest ancestor's. */
  const tooltipOf = (el: HTMLElement | null): string | null => {
    for (let cur = el; cur; cur = cur.parentElement) if (cur.hasAttribute('title')) return cur.getAttribute('title');
    return null;
  };

  it('Open folder… and the picker\'s entries carry no tooltip (own or inherited); the path line has its own', async () => {
    const fake = workspacePlatform([]);
    const root = await open(fake);
    expect(tooltipOf($(root, 'open-folder'))).toBeNull();
    expect($(root, 'workspace-path')!.getAttribute('title')).toBe('/ws');
    await inAct(() => $(root, 'workspace-switch')!.click());
    const picker = $(root, 'workspace-picker')!;
    for (const el of Array.from(picker.querySelectorAll<HTMLElement>('button, input'))) expect(tooltipOf(el)).toBeNull();
  });
});

describe('a ?workspace= link (web UI)', () => {
  it('asks before it opens a folder not opened here before; Cancel leaves the picker', async () => {
    const fake = workspacePlatform([]);
    fake.initialWorkspaceIsLink = true;
    const mounted = await mountApp(fake, null);
    unmount = mounted.unmount;
    const ask = $(mounted.root, 'linked-workspace')!;
    expect(ask.textContent).toContain('/ws');
    expect(fake.callsOf('list_sessions')).toEqual([]);
    await inAct(() => $(ask, 'linked-cancel')!.click());
    expect($(mounted.root, 'linked-workspace')).toBeNull();
    expect($(mounted.root, 'workspace-picker')).not.toBeNull();
    expect(fake.callsOf('list_sessions')).toEqual([]);
  });

  it('Open it opens the folder; the command line (not a link) opens it at once', async () => {
    const fake = workspacePlatform([]);
    fake.initialWorkspaceIsLink = true;
    const mounted = await mountApp(fake, null);
    await inAct(() => $(mounted.root, 'linked-open')!.click());
    await settle();
    expect($(mounted.root, 'linked-workspace')).toBeNull();
    expect(fake.callsOf('list_sessions').length).toBeGreaterThan(0);
    mounted.unmount();
    const direct = workspacePlatform([]);
    const again = await mountApp(direct, null);
    unmount = again.unmount;
    expect($(again.root, 'linked-workspace')).toBeNull();
    expect(direct.callsOf('list_sessions').length).toBeGreaterThan(0);
  });
});
