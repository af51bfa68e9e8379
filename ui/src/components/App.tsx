import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import type { ListSessions } from '../bindings/ListSessions';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { SessionRef } from '../bindings/SessionRef';
import { toCommandError, type Platform } from '../platform';
import { SETUP_KEY, flag, forgetWorkspace, lastSession, readRecents, rememberSession, rememberWorkspace, setFlag } from '../util';
import { PlatformContext } from './context';
import { SessionPane, type PaneStats } from './SessionPane';
import { Settings } from './Settings';
import { Sidebar } from './Sidebar';
import { StatusLine } from './StatusLine';
import { WorkspacePicker } from './WorkspacePicker';

export function App(props: { platform: Platform; notifyDelay?: number }) {
  const { platform } = props;
  const [booting, setBooting] = useState(true);
  const [workspace, setWorkspace] = useState<string | null>(null);
  const [recents, setRecents] = useState<string[]>(() => readRecents());
  const [pickError, setPickError] = useState<string | null>(null);
  const [sessions, setSessions] = useState<SessionInfo[]>([]);
  const [listError, setListError] = useState<{ code: string; message: string } | null>(null);
  const [selected, setSelected] = useState<string | null>(null);
  const [settings, setSettings] = useState<null | 'open' | 'welcome'>(null);
  const [offerSetup, setOfferSetup] = useState(false);
  const [config, setConfig] = useState<any>(null);
  const [stats, setStats] = useState<PaneStats | null>(null);
  const [token, setToken] = useState('');
  const [focusTab, setFocusTab] = useState<{ sessionId: string } | null>(null);
  const refreshTimer = useRef<ReturnType<typeof setTimeout> | null>(null);
  const workspaceRef = useRef<string | null>(null);

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

  // Events say "the list may have changed" often; read it at most every 300 ms.
  const refreshSoon = useCallback(() => {
    if (refreshTimer.current) return;
    refreshTimer.current = setTimeout(() => {
      refreshTimer.current = null;
      void loadSessions();
    }, 300);
  }, [loadSessions]);
  useEffect(() => () => {
    if (refreshTimer.current) clearTimeout(refreshTimer.current);
  }, []);

  const openWorkspace = useCallback(
    async (path: string) => {
      setPickError(null);
      workspaceRef.current = path;
      setWorkspace(path);
      setSessions([]);
      setSelected(null);
      setRecents(rememberWorkspace(path));
      const list = await loadSessions(path);
      const last = lastSession(path);
      if (list && last && list.some((s) => s.session_id === last && !s.parent_session_id)) setSelected(last);
    },
    [loadSessions],
  );

  useEffect(() => {
    let live = true;
    (async () => {
      const initial = await platform.initialWorkspace().catch(() => null);
      if (!live) return;
      if (initial) await openWorkspace(initial);
      setBooting(false);
      try {
        const cfg = await platform.invoke('get_config', {});
        if (!live) return;
        setConfig(cfg);
        // First start: offer (without blocking anything) to look for a local model server.
        if (!flag(SETUP_KEY)) setOfferSetup(true);
      } catch {
        /* shown when settings open */
      }
    })();
    return () => {
      live = false;
    };
  }, [platform]);

  const pick = async () => {
    try {
      const path = await platform.pickFolder();
      if (path) await openWorkspace(path);
    } catch (err) {
      setPickError(toCommandError(err).message);
    }
  };

  const select = (id: string | null) => {
    setSelected(id);
    if (workspaceRef.current) rememberSession(workspaceRef.current, id);
  };

  const remove = async (s: SessionInfo) => {
    try {
      const args: SessionRef = { session_id: s.session_id };
      await platform.invoke('delete_session', args);
      if (selected === s.session_id) select(null);
      void loadSessions();
    } catch (err) {
      setListError({ code: 'error', message: `Cannot delete: ${toCommandError(err).message}` });
    }
  };

  const closeSettings = () => {
    if (settings === 'welcome') {
      setFlag(SETUP_KEY);
      setOfferSetup(false);
    }
    setSettings(null);
  };

  const transport = platform.kind === 'tauri' ? 'desktop' : platform.kind === 'web' ? 'web' : platform.kind;

  let body;
  if (booting) body = <div class="empty">Starting…</div>;
  else if (!workspace)
    body = (
      <WorkspacePicker
        recents={recents}
        error={pickError}
        onOpen={(p) => void openWorkspace(p)}
        onPick={() => void pick()}
        onForget={(p) => setRecents(forgetWorkspace(p))}
      />
    );
  else
    body = (
      <>
        <Sidebar
          workspace={workspace}
          sessions={sessions}
          selected={selected}
          error={listError?.message ?? null}
          onRetry={() => void loadSessions()}
          onSelect={(id, child) => {
            select(id);
            setFocusTab(child ? { sessionId: child } : null);
          }}
          onNew={() => select(null)}
          onDelete={(s) => void remove(s)}
          onOpenFolder={() => void pick()}
          onSwitchWorkspace={() => {
            workspaceRef.current = null;
            setWorkspace(null);
            setStats(null);
          }}
          onSettings={() => setSettings('open')}
        />
        <main class="main">
          {offerSetup && (
            <div class="banner setup-banner" data-testid="setup-banner">
              <span>No model provider chosen yet. Bumblehive can look for a local Ollama or LM Studio.</span>
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
          />
        </main>
      </>
    );

  return (
    <PlatformContext.Provider value={platform}>
      <div class={`app ${workspace && !booting ? 'with-sidebar' : 'centered'}`}>
        {body}
        <StatusLine config={config} treeTokens={selected ? stats?.treeTokens ?? null : null} runs={selected ? stats?.runs ?? null : null} transport={transport} />
        {settings && (
          <Settings
            platform={platform}
            welcome={settings === 'welcome'}
            onClose={closeSettings}
            onSaved={(cfg) => {
              setConfig(cfg);
              setFlag(SETUP_KEY);
              setOfferSetup(false);
            }}
          />
        )}
      </div>
    </PlatformContext.Provider>
  );
}
