// Desktop integration: links, the context menu, quitting while work runs, reopening the
// last workspace and session, and checked folders.
import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, appended, FakePlatform, info, inAct, settle, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

async function open(fake: FakePlatform, session: string | null = 'p') {
  const mounted = await mountApp(fake, session);
  unmount = mounted.unmount;
  return mounted.root;
}

describe('links and the context menu', () => {
  it('hands a link click to the opener and never navigates; a disarmed link is inert (D5, D28)', async () => {
    const fake = workspacePlatform([info('p')]);
    const root = await open(fake);
    await inAct(() => fake.emit('p', snapshot('p'), appended('p', { role: 'assistant', content: 'See [docs](https://example.com/d) and [bad](javascript:alert(1)).' })));
    const links = Array.from($(root, 'chat')!.querySelectorAll('.markdown a')) as HTMLAnchorElement[];
    const click = new MouseEvent('click', { bubbles: true, cancelable: true });
    links[0].dispatchEvent(click);
    expect(click.defaultPrevented).toBe(true);
    expect(fake.opened).toEqual(['https://example.com/d']);
    // The middle button too (it would open a new webview window).
    links[0].dispatchEvent(new MouseEvent('auxclick', { bubbles: true, cancelable: true, button: 1 }));
    expect(fake.opened).toEqual(['https://example.com/d', 'https://example.com/d']);
    // The stripped link has no href (styled as text) and does nothing.
    expect(links[1].hasAttribute('href')).toBe(false);
    links[1].dispatchEvent(new MouseEvent('click', { bubbles: true, cancelable: true }));
    expect(fake.opened.length).toBe(2);
  });

  it('replaces the webview menu with Copy link / Open link; text fields keep theirs (D16)', async () => {
    const fake = workspacePlatform([info('p')]);
    const root = await open(fake);
    await inAct(() => fake.emit('p', snapshot('p'), appended('p', { role: 'assistant', content: '[docs](https://example.com/d)' })));
    const link = $(root, 'chat')!.querySelector('.markdown a')!;
    const menuEvent = new MouseEvent('contextmenu', { bubbles: true, cancelable: true, clientX: 10, clientY: 10 });
    await inAct(() => link.dispatchEvent(menuEvent));
    expect(menuEvent.defaultPrevented).toBe(true);
    const menu = $(document.body, 'context-menu')!;
    expect($$(menu, 'menu-open-link').length).toBe(1);
    expect($$(menu, 'menu-copy-link').length).toBe(1);
    expect(menu.textContent).not.toMatch(/Reload|Back/);
    await inAct(() => $(menu, 'menu-open-link')!.click());
    expect(fake.opened).toEqual(['https://example.com/d']);
    expect($(document.body, 'context-menu')).toBeNull();
    // Anywhere else (no selection, no link): no menu at all, and never the webview's.
    const plain = new MouseEvent('contextmenu', { bubbles: true, cancelable: true });
    await inAct(() => $(root, 'chat')!.dispatchEvent(plain));
    expect(plain.defaultPrevented).toBe(true);
    expect($(document.body, 'context-menu')).toBeNull();
    const inField = new MouseEvent('contextmenu', { bubbles: true, cancelable: true });
    $(root, 'prompt-input')!.dispatchEvent(inField);
    expect(inField.defaultPrevented).toBe(false);
  });
});

describe('no reload in the desktop window (D16)', () => {
  it('F5 and Ctrl+R do nothing in the desktop app; a browser tab keeps them', async () => {
    const fake = workspacePlatform([info('p')]);
    Object.defineProperty(fake, 'kind', { value: 'tauri' });
    const root = await open(fake);
    for (const init of [{ key: 'F5' }, { key: 'r', ctrlKey: true }]) {
      const e = new KeyboardEvent('keydown', { bubbles: true, cancelable: true, ...init });
      $(root, 'chat')!.dispatchEvent(e);
      expect(e.defaultPrevented).toBe(true);
    }
    unmount?.();
    const web = workspacePlatform([info('p')]);
    const again = await open(web);
    const e = new KeyboardEvent('keydown', { bubbles: true, cancelable: true, key: 'F5' });
    $(again, 'chat')!.dispatchEvent(e);
    expect(e.defaultPrevented).toBe(false);
  });
});

describe('quitting while work runs (D12)', () => {
  it('guards the close while anything runs, asks, and quits only when confirmed', async () => {
    const fake = workspacePlatform([info('p')]);
    const root = await open(fake);
    await inAct(() => fake.emit('p', snapshot('p', { running: true })));
    expect(fake.guard.at(-1)).toBe(true);
    await inAct(() => fake.closeHandler!());
    const dialog = $(root, 'quit-confirm')!;
    expect(dialog.textContent).toContain('1 run is still working');
    await inAct(() => $(dialog, 'quit-cancel')!.click());
    expect($(root, 'quit-confirm')).toBeNull();
    expect(fake.quitCalls).toBe(0);
    await inAct(() => fake.closeHandler!());
    await inAct(() => $(root, 'quit-confirm-button')!.click());
    expect(fake.quitCalls).toBe(1);
    // Once nothing runs, closing is not guarded.
    await inAct(() => fake.emit('p', { type: 'result', session_id: 'p', content: 'ok' }));
    expect(fake.guard.at(-1)).toBe(false);
  });
});

describe('reopening where the person was (D16)', () => {
  it('a start with no workspace opens the last one and its last session, from the saved UI state', async () => {
    const fake = workspacePlatform([info('s1'), info('s2')]);
    fake.workspace = null;
    fake.uiState = { lastWorkspace: '/ws', lastSessions: { '/ws': 's2' }, recents: ['/ws', '/old'] };
    const root = await open(fake, null);
    expect(fake.callsOf('list_sessions')).toEqual([{ workspace: '/ws' }]);
    // Its MCP servers are started as it opens, not with its first turn (E13).
    expect(fake.callsOf('warm_workspace')).toEqual([{ workspace: '/ws' }]);
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('s2');
    // Choosing another session is remembered in the same file.
    await inAct(() => ($$(root, 'session-item').find((i) => i.dataset.sessionId === 's1')!.querySelector('.session-open') as HTMLElement).click());
    expect(fake.uiState).toMatchObject({ lastWorkspace: '/ws', lastSessions: { '/ws': 's1' } });
    expect((fake.uiState.recents as string[]).slice(0, 2)).toEqual(['/ws', '/old']);
  });

  it('a last workspace that is gone shows the picker and says why', async () => {
    const fake = workspacePlatform([]);
    fake.workspace = null;
    fake.folders = {};
    fake.uiState = { lastWorkspace: '/gone' };
    const root = await open(fake, null);
    expect($(root, 'workspace-picker')).not.toBeNull();
    expect($(root, 'pick-error')!.textContent).toContain('/gone does not exist');
    expect(fake.callsOf('list_sessions')).toEqual([]);
    expect(fake.callsOf('warm_workspace')).toEqual([]);
  });
});

describe('one app per data folder (E1)', () => {
  it('a workspace handed over by a later start of the app opens here, checked like a picked one', async () => {
    const fake = workspacePlatform([info('s1')]);
    fake.folders = { '/ws': '/ws', '/home/me/other': '/home/me/other' };
    const root = await open(fake, null);
    expect(fake.callsOf('list_sessions')).toEqual([{ workspace: '/ws' }]);
    await inAct(() => fake.openHandler!('/home/me/other'));
    expect(fake.callsOf('list_sessions').at(-1)).toEqual({ workspace: '/home/me/other' });
    expect(fake.callsOf('warm_workspace')).toEqual([{ workspace: '/ws' }, { workspace: '/home/me/other' }]);
    expect(fake.uiState).toMatchObject({ lastWorkspace: '/home/me/other' });
    // A folder that is gone by then is said (in the sidebar), and the open workspace stays.
    await inAct(() => fake.openHandler!('/gone'));
    const alerts = Array.from(root.querySelectorAll('[role=alert]')).map((a) => a.textContent ?? '');
    expect(alerts.join(' ')).toContain('/gone does not exist');
    expect(fake.callsOf('list_sessions').at(-1)).toEqual({ workspace: '/home/me/other' });
  });
});

describe('folders are checked before use (D8)', () => {
  it('a typed missing folder is refused with a clear error, not opened and not remembered', async () => {
    const fake = workspacePlatform([]);
    fake.workspace = null;
    fake.folders = { '~/proj': '/home/me/proj' };
    const root = await open(fake, null);
    await inAct(() => typeInto($(root, 'workspace-path-input')!, '/tmp/wss1'));
    await inAct(() => $(root, 'workspace-path-submit')!.click());
    expect($(root, 'pick-error')!.textContent).toContain('/tmp/wss1 does not exist');
    expect(fake.callsOf('list_sessions')).toEqual([]);
    expect(fake.saved.some((s) => JSON.stringify(s).includes('wss1'))).toBe(false);
    // A good one opens under its real path.
    await inAct(() => typeInto($(root, 'workspace-path-input')!, '~/proj'));
    await inAct(() => $(root, 'workspace-path-submit')!.click());
    expect(fake.callsOf('list_sessions')).toEqual([{ workspace: '/home/me/proj' }]);
  });

  it('the folder dialog starts in the last workspace, or home (so a typed path works)', async () => {
    const fake = workspacePlatform([]);
    fake.workspace = null;
    fake.folder = null;
    const root = await open(fake, null);
    await inAct(() => $(root, 'workspace-open')!.click());
    expect(fake.pickedFrom).toEqual(['/home/me']);
    fake.folder = '/ws';
    await inAct(() => $(root, 'workspace-open')!.click());
    await inAct(() => $(root, 'open-folder')!.click());
    expect(fake.pickedFrom.at(-1)).toBe('/ws');
    await settle();
  });
});
