import { useCallback, useEffect, useMemo, useRef, useState } from 'preact/hooks';
import type { ListSessions } from '../bindings/ListSessions';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { SessionRef } from '../bindings/SessionRef';
import type { WorkspaceInfo } from '../bindings/WorkspaceInfo';
import { useAttention } from '../attention';
import { toCommandError, type HostInfo, type Platform } from '../platform';
import { parseUiState, withSession, withWorkspace, withoutLast, withoutWorkspace, type UiState } from '../uistate';
import { SANDBOX_KEY, SETUP_KEY, flag, forgetWorkspace, lastSession, readRecents, rememberSession, rememberWorkspace, setFlag } from '../util';
import { ContextMenu } from './ContextMenu';
import { PlatformContext } from './context';
import { FolderDialog } from './FolderDialog';
import { Inbox } from './Inbox';
import { QuitConfirm } from './QuitConfirm';
import { QuickSwitcher } from './QuickSwitcher';
import { focusComposer } from './focus';
import { unsentCount } from './Composer';
import { nothingOnlyHere } from '../recycle';
import { SessionPane, type PaneStats } from './SessionPane';
import { Settings } from './Settings';
import { Sidebar } from './Sidebar';
import { StatusLine } from './StatusLine';
import { decideApproval } from '../model';
import { applyListEvent } from '../sessionlist';
import { countStates, liveStates } from '../status';
import { treeModels } from '../usage';
import { WorkspacePicker } from './WorkspacePicker';

export function App(props: { platform: Platform; notifyDelay?: number }) {
  const { platform } = props;
  const [booting, setBooting] = useState(true);
  const [workspace, setWorkspace] = useState<string | null>(null);
  const [recents, setRecents] = useState<string[]>(() => readRecents());
  const [pickError, setPickError] = useState<string | null>(null);
  /** The backend's workspaces, for the picker (a new browser lists them too). */
  const [knownWorkspaces, setKnownWorkspaces] = useState<WorkspaceInfo[]>([]);
  /** The app's own folder dialog, open (for a platform without a native one). */
  const [folderDialog, setFolderDialog] = useState<{ start: string | null } | null>(null);
  // A `?workspace=` link of the web UI naming a folder the person never opened here: asked
  // first (a link from anywhere must not open a folder of the machine by itself).
  const [linked, setLinked] = useState<string | null>(null);
  const [sessions, setSessions] = useState<SessionInfo[]>([]);
  const [listError, setListError] = useState<{ code: string; message: string } | null>(null);
  const [selected, setSelected] = useState<string | null>(null);
  const [settings, setSettings] = useState<null | 'open' | 'welcome'>(null);
  const [offerSetup, setOfferSetup] = useState(false);
  const [sandboxNotice, setSandboxNotice] = useState<string | null>(null);
  const [config, setConfig] = useState<any>(null);
  const [stats, setStats] = useState<PaneStats | null>(null);
  const [token, setToken] = useState('');
  const [focusTab, setFocusTab] = useState<{ sessionId: string } | null>(null);
  const refreshTimer = useRef<ReturnType<typeof setTimeout> | null>(null);
  const workspaceRef = useRef<string | null>(null);
  const uiState = useRef<UiState>(parseUiState({}, { recents: readRecents() }));
  const host = useRef<HostInfo | null>(null);
  /** Whether a provider is configured: from the host, null when nobody can tell. */
  const [configured, setConfigured] = useState<boolean | null>(null);
  const [inbox, setInbox] = useState(false);
  /** The Ctrl+K session switcher, open. */
  const [switcher, setSwitcher] = useState(false);
  const [setupDeclined, setSetupDeclined] = useState(false);
  // Session tools the backend may not have yet: a command it does not know hides its control.
  const [tools, setTools] = useState({ rename: true, archive: true, search: true });
  const tool = <T,>(name: keyof typeof tools, run: () => Promise<T>) =>
    run().catch((err) => {
      const e = toCommandError(err);
      if (e.code === 'unknown_command' || e.status === 404) {
        setTools((t) => ({ ...t, [name]: false }));
        return null;
      }
      throw e;
    });
  const compactSession = async (sessionId: string) => {
    const args: SessionRef = { session_id: sessionId };
    await platform.invoke('compact', args);
  };
  // A notification clicked (or the window focused after one) opens what it announced.
  const goToRef = useRef<(sessionId: string) => void>(() => undefined);
  const attention = useAttention(platform, sessions, selected, () => refreshSoonRef.current(), undefined, (id) => goToRef.current(id));
  const forgetRef = useRef(attention.forget);
  forgetRef.current = attention.forget;
  const refreshSoonRef = useRef<() => void>(() => undefined);
  // One live state per session: every indicator and count reads this (E4, E5).
  const states = useMemo(() => liveStates(sessions, attention.roots), [sessions, attention.roots]);
  const counts = countStates(states);
  const busy = counts.running + counts.waiting;
  useEffect(() => {
    platform.setCloseGuard?.(busy > 0);
  }, [platform, busy > 0]);
  // A person away a while with nothing typed anywhere: the desktop may give the page a new
  // web process, which hands back what a day of streaming left in the old one (recycle.ts).
  useEffect(() => platform.recycleWhenAway?.(() => nothingOnlyHere(document, unsentCount())), [platform]);

  const remember = (next: UiState) => {
    uiState.current = next;
    setRecents(next.recents);
    void platform.saveUiState?.(next as unknown as Record<string, unknown>);
  };

  const loadSessions = useCallback(async (ws: string | null = workspaceRef.current) => {
    if (!ws) return [];
    try {
      const args: ListSessions = { workspace: ws };
      const list: SessionInfo[] = await platform.invoke('list_sessions', args);
      if (workspaceRef.current !== ws) return list;
      setSessions(list);
      setListError(null);
      return list;
    } catch (err) {
      const e = toCommandError(err);
      setListError({ code: e.code, message: `Cannot list sessions: ${e.message}` });
      return null;
    }
  }, [platform]);

  // While the list feed runs, the list follows it and events need not ask.
  const listFeedLive = useRef(false);
  useEffect(() => {
    if (!workspace || !platform.subscribeSessions) return;
    const ws = workspace;
    listFeedLive.current = true;
    const stop = platform.subscribeSessions(ws, (event) => {
      if (workspaceRef.current !== ws) return;
      if (event.type === 'removed') forgetRef.current(event.session_id);
      setSessions((list) => applyListEvent(list, event));
      setListError(null);
    });
    return () => {
      listFeedLive.current = false;
      stop();
    };
  }, [workspace, platform]);

  // Without a list feed: events say "the list may have changed" often; read it at most
  // every 300 ms.
  const refreshSoon = useCallback(() => {
    if (listFeedLive.current || refreshTimer.current) return;
    refreshTimer.current = setTimeout(() => {
      refreshTimer.current = null;
      void loadSessions();
    }, 300);
  }, [loadSessions]);
  refreshSoonRef.current = refreshSoon;
  useEffect(() => () => {
    if (refreshTimer.current) clearTimeout(refreshTimer.current);
  }, []);

  /**
   * Opens a workspace once the folder is checked (a typed or picked folder may be missing
   * or a file: that is said on the spot, nothing is opened and nothing is remembered).
   */
  const openWorkspace = useCallback(
    async (path: string, check = true): Promise<boolean> => {
      setPickError(null);
      let real = path;
      if (check && platform.checkFolder) {
        try {
          real = await platform.checkFolder(path);
        } catch (err) {
          setPickError(`Cannot open ${path}: ${toCommandError(err).message}`);
          return false;
        }
      }
      workspaceRef.current = real;
      setWorkspace(real);
      setSessions([]);
      setSelected(null);
      rememberWorkspace(real);
      remember(withWorkspace(uiState.current, real));
      // Its MCP servers start now rather than with its first turn (E13); not awaited, and
      // a failure here is the server list's to show, not the opening's.
      platform.invoke('warm_workspace', { workspace: real }).catch(() => undefined);
      const list = await loadSessions(real);
      const last = uiState.current.lastSessions[real] ?? lastSession(real);
      if (list && last && list.some((s) => s.session_id === last && !s.parent_session_id)) setSelected(last);
      return true;
    },
    [loadSessions, platform],
  );

  useEffect(() => {
    let live = true;
    (async () => {
      const [saved, info, initial, cfg] = await Promise.all([
        platform.loadUiState?.().catch(() => ({})) ?? Promise.resolve({}),
        platform.hostInfo?.().catch(() => null) ?? Promise.resolve(null),
        platform.initialWorkspace().catch(() => null),
        platform.invoke('get_config', {}).catch(() => null),
      ]);
      // The sandbox's state: where commands cannot be sandboxed, say so once, clearly.
      platform
        .invoke('app_info', {})
        .then((about) => {
          const sandbox = about?.sandbox;
          if (live && sandbox && !sandbox.available && !flag(SANDBOX_KEY)) {
            setSandboxNotice(sandbox.reason ?? 'the sandbox is not available here');
          }
        })
        .catch(() => undefined);
      if (!live) return;
      uiState.current = parseUiState(saved, { recents: readRecents() });
      setRecents(uiState.current.recents);
      host.current = info;
      if (cfg) {
        setConfig(cfg);
        // Driven by the config, not by this browser's memory: a config that names a
        // provider is set up; without one the default is not presented as a choice.
        const c = cfg as { provider_configured?: unknown };
        const known = typeof c.provider_configured === 'boolean' ? c.provider_configured : (info?.provider_configured ?? null);
        setConfigured(known);
        if (known === false || (known == null && !flag(SETUP_KEY))) setOfferSetup(true);
      }
      // The command line wins; else the last workspace (a start from the menu goes on
      // where the person was). A last workspace that is gone shows the picker and says so.
      const known = initial != null && uiState.current.recents.includes(initial);
      if (initial && platform.initialWorkspaceIsLink && !known) setLinked(initial);
      else if (initial) await openWorkspace(initial, false);
      else if (uiState.current.lastWorkspace) await openWorkspace(uiState.current.lastWorkspace);
      if (!live) return;
      setBooting(false);
    })();
    return () => {
      live = false;
    };
  }, [platform]);

  // A later start of the app (the menu entry again, `bumblehive-desktop --workspace DIR`)
  // hands its workspace to this window and ends: open it here, checked like a picked one.
  useEffect(() => platform.onOpenRequested?.((path) => void openWorkspace(path)), [platform, openWorkspace]);

  // Whenever the picker shows, ask the backend which workspaces have sessions (a backend
  // without the command lists only the remembered ones).
  const showingPicker = !booting && !workspace;
  useEffect(() => {
    if (!showingPicker) return;
    let live = true;
    platform
      .invoke('list_workspaces', {})
      .then((list) => {
        if (live && Array.isArray(list)) setKnownWorkspaces(list);
      })
      .catch(() => undefined);
    return () => {
      live = false;
    };
  }, [showingPicker, platform]);

  const pick = async () => {
    try {
      // Start in the last workspace (or home): GTK's "Recent" view ignores a typed path.
      const start = workspaceRef.current ?? uiState.current.lastWorkspace ?? host.current?.home_dir ?? null;
      if (!platform.pickFolder) {
        setFolderDialog({ start });
        return;
      }
      const path = await platform.pickFolder(start);
      if (path) await openWorkspace(path);
    } catch (err) {
      setPickError(toCommandError(err).message);
    }
  };

  const select = (id: string | null) => {
    setSelected(id);
    if (id) attention.seen(id, id);
    if (workspaceRef.current) {
      rememberSession(workspaceRef.current, id);
      remember(withSession(uiState.current, workspaceRef.current, id));
    }
  };

  const rootOf = (id: string) => {
    const parents = new Map(sessions.map((s) => [s.session_id, s.parent_session_id]));
    let cur = id;
    for (let i = 0; i < 16 && parents.get(cur); i++) cur = parents.get(cur)!;
    return cur;
  };
  /** Opens a session, and for a descendant its tab in its top-level session. */
  const goTo = (sessionId: string) => {
    const root = rootOf(sessionId);
    select(root);
    setFocusTab(root === sessionId ? null : { sessionId });
    if (root !== sessionId) attention.seen(root, sessionId);
  };

  // Window keys (E17): Ctrl+N a new conversation, Ctrl+K the session switcher, Ctrl+,
  // Settings (the pane has Ctrl+Tab and Ctrl+1…9 for its tabs). Not while a dialog is open.
  const keys = useRef({ open: false, newSession: () => undefined as void, settings: () => undefined as void });
  keys.current = {
    open: Boolean(workspace && !booting),
    newSession: () => {
      select(null);
      setFocusTab(null);
    },
    settings: () => setSettings('open'),
  };
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      if (!(e.ctrlKey || e.metaKey) || e.altKey || e.defaultPrevented) return;
      if (document.querySelector('.overlay') || !keys.current.open) return;
      const k = e.key.toLowerCase();
      if (k === 'n' && !e.shiftKey) {
        e.preventDefault();
        keys.current.newSession();
      } else if (k === 'k' && !e.shiftKey) {
        e.preventDefault();
        setSwitcher(true);
      } else if (e.key === ',') {
        e.preventDefault();
        keys.current.settings();
      }
    };
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  }, []);
  // A dialog closed: focus goes back to the composer, unless it went somewhere on purpose (E16).
  const dialogOpen = Boolean(settings || inbox || switcher || folderDialog || linked);
  useEffect(() => {
    if (!dialogOpen) focusComposer(true);
  }, [dialogOpen]);

  goToRef.current = (id) => {
    setInbox(false);
    goTo(id);
  };

  const remove = async (s: SessionInfo) => {
    try {
      const args: SessionRef = { session_id: s.session_id };
      await platform.invoke('delete_session', args);
      attention.forget(s.session_id);
      if (selected === s.session_id) select(null);
      void loadSessions();
    } catch (err) {
      setListError({ code: 'error', message: `Cannot delete: ${toCommandError(err).message}` });
    }
  };

  const closeSettings = () => {
    if (settings === 'welcome') {
      // "Later": the runtime's default address is used; the set-up is not forced again.
      setSetupDeclined(true);
      setFlag(SETUP_KEY);
      setOfferSetup(false);
    }
    setSettings(null);
  };
  const needsSetup = configured === false && !setupDeclined;

  const transport = platform.kind === 'tauri' ? 'desktop' : platform.kind === 'web' ? 'web' : platform.kind;

  let body;
  if (booting) body = <div class="empty">Starting…</div>;
  else if (!workspace)
    body = (
      <WorkspacePicker
        recents={recents}
        known={knownWorkspaces}
        error={pickError}
        onOpen={(p) => void openWorkspace(p)}
        onPick={() => void pick()}
        onForget={(p) => {
          forgetWorkspace(p);
          remember(withoutWorkspace(uiState.current, p));
        }}
        onSetup={() => setSettings('welcome')}
        needsSetup={needsSetup}
      />
    );
  else
    body = (
      <>
        <Sidebar
          workspace={workspace}
          sessions={sessions}
          selected={selected}
          error={listError?.message ?? pickError}
          needs={attention.summary.sessions}
          needCount={attention.summary.count}
          states={states}
          onInbox={() => setInbox(true)}
          onRename={
            tools.rename
              ? async (s, title) => {
                  await tool('rename', () => platform.invoke('rename_session', { session_id: s.session_id, title }));
                  void loadSessions();
                }
              : undefined
          }
          onArchive={
            tools.archive
              ? async (s, archived) => {
                  await tool('archive', () => platform.invoke('archive_session', { session_id: s.session_id, archived }));
                  void loadSessions();
                }
              : undefined
          }
          onSearch={
            tools.search
              ? async (query) => {
                  const found = await tool('search', () => platform.invoke('search_sessions', { query, workspace }));
                  return Array.isArray(found) ? found : null;
                }
              : undefined
          }
          onRetry={() => void loadSessions()}
          onSelect={(id, child) => {
            select(id);
            setFocusTab(child ? { sessionId: child } : null);
            if (child) attention.seen(id, child);
          }}
          onNew={() => select(null)}
          onDelete={(s) => void remove(s)}
          onOpenFolder={() => void pick()}
          onSwitchWorkspace={() => {
            remember(withoutLast(uiState.current));
            workspaceRef.current = null;
            setWorkspace(null);
            setStats(null);
          }}
          onSettings={() => setSettings('open')}
        />
        <main class="main">
          {sandboxNotice && (
            <div class="banner" data-testid="sandbox-banner" role="status">
              <span>
                Shell commands cannot run in the sandbox on this machine ({sandboxNotice}). Every command will ask for your approval first.
              </span>
              <button
                type="button"
                class="quiet"
                data-testid="sandbox-dismiss"
                onClick={() => {
                  setFlag(SANDBOX_KEY);
                  setSandboxNotice(null);
                }}
              >
                Understood
              </button>
            </div>
          )}
          {offerSetup && (
            <div class="banner setup-banner" data-testid="setup-banner">
              <span>No model provider chosen yet. Bumblehive can look for a local Ollama, LM Studio or llama.cpp server, or you enter one.</span>
              <button type="button" class="primary" data-testid="setup-open" onClick={() => setSettings('welcome')}>
                Set up a model…
              </button>
              <button
                type="button"
                class="quiet"
                data-testid="setup-dismiss"
                onClick={() => {
                  setFlag(SETUP_KEY);
                  setOfferSetup(false);
                }}
              >
                Not now
              </button>
            </div>
          )}
          {listError?.code === 'unauthorized' && (
            <form
              class="banner"
              onSubmit={(e) => {
                e.preventDefault();
                (platform as Platform & { setToken?: (t: string) => void }).setToken?.(token.trim());
                void loadSessions();
              }}
            >
              Access token:{' '}
              <input type="password" value={token} data-testid="token-input" onInput={(e) => setToken((e.target as HTMLInputElement).value)} />
              <button type="submit">Use</button>
            </form>
          )}
          <SessionPane
            key={workspace}
            platform={platform}
            workspace={workspace}
            sessionId={selected}
            focusTab={focusTab}
            sessions={sessions}
            onCreated={(id) => {
              select(id);
              void loadSessions();
            }}
            onSessionsChanged={refreshSoon}
            onStats={setStats}
            notifyDelay={props.notifyDelay}
            onEvent={attention.feed}
            onTabSeen={(root, id) => attention.seen(root, id)}
            needs={attention.summary.sessions}
            states={states}
            onSessionDeleted={attention.forget}
            needsSetup={needsSetup}
            onOpenSettings={() => setSettings(needsSetup ? 'welcome' : 'open')}
            onNew={() => select(null)}
            config={config}
          />
        </main>
      </>
    );

  return (
    <PlatformContext.Provider value={platform}>
      <div class={`app ${workspace && !booting ? 'with-sidebar' : 'centered'}`}>
        {body}
        <StatusLine
          config={configured === false ? null : config}
          treeTokens={selected ? stats?.treeTokens ?? null : null}
          streamingTokens={selected ? stats?.streamingTokens ?? 0 : 0}
          models={selected ? treeModels(sessions, selected) : []}
          runs={counts.running}
          waiting={counts.waiting}
          transport={transport}
          context={selected ? stats?.context ?? null : null}
          instructions={selected ? stats?.instructions ?? [] : []}
          onCompact={workspace && !booting ? (selected ? () => compactSession(selected) : null) : undefined}
          session={selected ? sessions.find((s) => s.session_id === selected) ?? null : null}
        />
        {inbox && (
          <Inbox
            summary={attention.summary}
            sessions={sessions}
            onOpen={(id) => {
              setInbox(false);
              goTo(id);
            }}
            onDecide={(a, approved, remember, reason) => decideApproval(platform, a, approved, remember, reason)}
            onClose={() => setInbox(false)}
          />
        )}
        {switcher && (
          <QuickSwitcher
            sessions={sessions}
            selected={selected}
            onOpen={(id) => {
              setSwitcher(false);
              goTo(id);
            }}
            onClose={() => setSwitcher(false)}
          />
        )}
        {linked && (
          <div class="overlay">
            <div class="dialog" role="alertdialog" aria-labelledby="linked-title" data-testid="linked-workspace">
              <h2 id="linked-title">Open this folder?</h2>
              <p>
                A link asks to open <code>{linked}</code> as the workspace. The agent can read and change what is in it.
              </p>
              <div class="dialog-buttons">
                <button type="button" data-testid="linked-cancel" autoFocus onClick={() => setLinked(null)}>
                  Cancel
                </button>
                <button
                  type="button"
                  class="primary"
                  data-testid="linked-open"
                  onClick={() => {
                    const path = linked;
                    setLinked(null);
                    void openWorkspace(path, false);
                  }}
                >
                  Open it
                </button>
              </div>
            </div>
          </div>
        )}
        {folderDialog && (
          <FolderDialog
            platform={platform}
            start={folderDialog.start}
            onCancel={() => setFolderDialog(null)}
            onChoose={async (path) => {
              // Checked here, so a refused folder keeps the dialog open with the reason.
              let real = path;
              if (platform.checkFolder) {
                try {
                  real = await platform.checkFolder(path);
                } catch (err) {
                  return `Cannot open ${path}: ${toCommandError(err).message}`;
                }
              }
              setFolderDialog(null);
              await openWorkspace(real, false);
              return null;
            }}
          />
        )}
        <QuitConfirm platform={platform} running={busy} />
        <ContextMenu platform={platform} />
        {settings && (
          <Settings
            platform={platform}
            welcome={settings === 'welcome'}
            workspace={workspace}
            configured={configured}
            running={sessions
              .filter((s) => states[s.session_id] === 'running' || states[s.session_id] === 'waiting')
              .map((s) => ({ id: s.session_id, title: s.title || 'Untitled session' }))}
            onStop={(id) => {
              const args: SessionRef = { session_id: id };
              platform.invoke('cancel', args).catch(() => undefined);
            }}
            onClose={closeSettings}
            onSaved={(cfg) => {
              setConfig(cfg);
              setConfigured(true);
              setFlag(SETUP_KEY);
              setOfferSetup(false);
            }}
          />
        )}
      </div>
    </PlatformContext.Provider>
  );
}
