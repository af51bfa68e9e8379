// The one platform adapter: everything the UI needs from the outside world goes through
// `Platform`. Two implementations: Tauri (the desktop shell) and Web (`bumblehive serve`).
// The rest of the UI never touches Tauri's API, `fetch` or `EventSource`.

import { invoke as tauriInvoke } from '@tauri-apps/api/core';
import { listen as tauriListen } from '@tauri-apps/api/event';
import { open as tauriOpen } from '@tauri-apps/plugin-dialog';
import type { CommandArgs } from './bindings/CommandArgs';
import type { CommandResults } from './bindings/CommandResults';
import type { DesktopCommandArgs } from './bindings/DesktopCommandArgs';
import type { DesktopCommandResults } from './bindings/DesktopCommandResults';
import type { OpenRequested } from './bindings/OpenRequested';
import type { Event as WireEvent } from './bindings/Event';
import type { FoundServer } from './bindings/FoundServer';
import type { ImagePart } from './bindings/ImagePart';
import type { SessionListEvent } from './bindings/SessionListEvent';
import { watchAway } from './recycle';

/** A command of the command table (SPEC §9). Names, arguments and results are generated
 * from the Rust table (`protocol::commands::command_table!`), so a renamed field fails to
 * compile here too. */
export type CommandName = keyof CommandArgs & keyof CommandResults;

/** A command of the desktop shell's own table (`protocol::desktop`): typed there once,
 * called as `invoke(name, {args})`. */
export type DesktopCommandName = keyof DesktopCommandArgs & keyof DesktopCommandResults;
export type { CommandArgs, CommandResults };

/** Connection state of an event stream, for the "reconnecting…" banner. */
export type StreamStatus = 'open' | 'reconnecting';

export interface Platform {
  readonly kind: 'tauri' | 'web' | 'fake';
  /** Runs a command of the command table (SPEC §9). Rejects with a `CommandError`. */
  invoke<N extends CommandName>(command: N, args: CommandArgs[N]): Promise<CommandResults[N]>;
  /** Live events of a session (its children's included); the first event is a `snapshot`. */
  subscribe(
    sessionId: string,
    onEvent: (event: WireEvent) => void,
    onStatus?: (status: StreamStatus) => void,
  ): () => void;
  /**
   * The session list of a workspace as a feed: the whole list first (and again after a
   * gap), then each session that changed or was removed. Optional: without it the UI asks
   * for the list again when events hint at a change.
   */
  subscribeSessions?(workspace: string, onEvent: (event: SessionListEvent) => void): () => void;
  /**
   * Asks the person for a folder with the OS's own dialog, starting in `defaultPath`; null
   * when they cancel. Optional: without it (the web UI) the app shows its own folder
   * dialog, which browses the backend's folders (`list_folders`).
   */
  pickFolder?(defaultPath?: string | null): Promise<string | null>;
  /** A workspace handed to the app at start (command line, environment, `?workspace=`). */
  initialWorkspace(): Promise<string | null>;
  /**
   * The initial workspace came from a link anyone could have made (the web UI's
   * `?workspace=`), not from the person's own command line: a folder not opened here
   * before is asked about first.
   */
  readonly initialWorkspaceIsLink?: boolean;
  /** Opens a link outside the app window (never navigates the app itself). */
  openExternal(url: string): void;
  /**
   * Probes local model servers (Ollama, LM Studio). Returns null when this backend has no
   * probe: see `probeProviders` below.
   */
  probeProviders(): Promise<ProbeResult[] | null>;
  // Desktop integration (optional: a backend without it simply does without).
  /** Checks a folder before use; resolves to its real path, rejects with a clear error. */
  checkFolder?(path: string): Promise<string>;
  /** The UI's remembered choices (last workspace and session, recents): `{}` when none. */
  loadUiState?(): Promise<Record<string, unknown>>;
  saveUiState?(state: Record<string, unknown>): Promise<void>;
  /** Facts of the host: the home folder, whether the config names a provider. */
  hostInfo?(): Promise<HostInfo>;
  /** An OS notification (callers ask only while the window is not focused). */
  /**
   * An OS notification. `onClick`: the person clicked it (where the platform can tell: the
   * browser's; the desktop's daemon cannot, so the app opens it when the window is focused).
   */
  notify?(title: string, body: string, onClick?: () => void): void;
  setTitle?(title: string): void;
  /** While true, closing the window calls the `onCloseRequested` handler instead. */
  setCloseGuard?(active: boolean): void;
  onCloseRequested?(handler: () => void): () => void;
  /**
   * The clipboard's image, null when it holds none. Optional: only for engines whose paste
   * event does not carry a pasted image (WebKitGTK, in the desktop shell; E14).
   */
  clipboardImage?(): Promise<ImagePart | null>;
  /** Quits the app (after the person confirmed). */
  quit?(): void;
  /**
   * Asks for a new web process once the person has been away a while and `mayRecycle` says
   * nothing would be lost (`recycle.ts`). Returns the stop. Only the desktop has it.
   */
  recycleWhenAway?(mayRecycle: () => boolean): () => void;
  /** A later start of the app handed this window a workspace to open (one app per data
   * folder: the second start ends, this window opens it). */
  onOpenRequested?(handler: (workspace: string) => void): () => void;
}

export interface HostInfo {
  home_dir?: string | null;
  /** Whether the config file names a provider (null: unknown). */
  provider_configured?: boolean | null;
}

/** One local model server found by `probe_providers`. */
export type ProbeResult = FoundServer;

/** A failed command, with the stable code of SPEC §9 (`busy`, `not_found`, …). */
export class CommandError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status?: number,
  ) {
    super(message);
    this.name = 'CommandError';
  }
}

/**
 * An error's words for people: the runtime's error kinds ("invalid argument: …") are for
 * programs (the `code` says them); the person reads what is wrong (E18).
 */
export function forPeople(message: string): string {
  return message.replace(/\binvalid argument: /gi, '');
}

/** Turns whatever a transport rejected with into a `CommandError` (its message for people). */
export function toCommandError(err: unknown, status?: number): CommandError {
  const error = rawCommandError(err, status);
  const text = forPeople(error.message);
  return text === error.message ? error : new CommandError(error.code, text, error.status);
}

function rawCommandError(err: unknown, status?: number): CommandError {
  if (err instanceof CommandError) return err;
  let value: any = err;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch {
      return new CommandError('error', value, status);
    }
  }
  if (value && typeof value === 'object') {
    const body = value.error && typeof value.error === 'object' ? value.error : value;
    if (typeof body.message === 'string') {
      return new CommandError(typeof body.code === 'string' ? body.code : 'error', body.message, status);
    }
  }
  if (err instanceof Error) return new CommandError('error', err.message, status);
  return new CommandError('error', String(err), status);
}

function parseEvent(data: unknown, name?: string): WireEvent | null {
  let value: any = data;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch {
      return null;
    }
  }
  if (!value || typeof value !== 'object') return null;
  if (typeof value.type !== 'string' && name && name !== 'message') value = { ...value, type: name };
  return typeof value.type === 'string' ? (value as WireEvent) : null;
}

/**
 * The backend's `probe_providers` command (arguments `{}`, result a `ProbeResult[]` of the
 * servers that answered). A backend without it makes the UI ask for the address by hand.
 * The probe runs in the backend: the UI makes no network request of its own besides the
 * backend (and a browser page could not reach another port anyway).
 */
async function probeThroughBackend(invoke: Platform['invoke']): Promise<ProbeResult[] | null> {
  try {
    const result = await invoke('probe_providers', {});
    return Array.isArray(result) ? result : [];
  } catch (err) {
    const error = toCommandError(err);
    if (error.code === 'unknown_command' || error.status === 404) return null;
    throw error;
  }
}

// ---------------------------------------------------------------------------------------
// Tauri

interface TauriGlobals {
  core: { invoke(cmd: string, args?: Record<string, unknown>): Promise<any> };
  event: {
    listen(name: string, handler: (event: { payload: any }) => void): Promise<() => void>;
  };
  dialog?: { open(options: Record<string, unknown>): Promise<string | string[] | null> };
}

/** The Tauri event every subscription's events arrive on: payload `{subscription, events}`. */
export const TAURI_EVENT = 'bumblehive://event';
/** The session list feed's events (`subscribe_sessions`): payload `{subscription, event}`. */
export const TAURI_SESSIONS_EVENT = 'bumblehive://sessions';
/** Sent by the shell when the window is closed while the close guard is set. */
export const TAURI_CLOSE_EVENT = 'bumblehive://close-requested';
/** Sent by the shell when a later start of the app handed over a workspace to open. */
export const TAURI_OPEN_EVENT = 'bumblehive://open';
/** Sent by the shell when the person clicks a notification: the payload is its id. */
export const TAURI_NOTIFICATION_CLICKED_EVENT = 'bumblehive://notification-clicked';
/** How many shown notifications keep their click handler (older ones open nothing). */
const NOTIFICATIONS_KEPT = 50;

export function createTauriPlatform(tauri: TauriGlobals): Platform {
  const handlers = new Map<string, (event: WireEvent) => void>();
  // Events whose subscription id the UI does not know yet (the shell answered `subscribe`
  // with an id of its own and emitted before the answer arrived).
  const unclaimed = new Map<string, unknown[]>();
  let listening: Promise<unknown> | null = null;
  let counter = 0;
  const listHandlers = new Map<string, (event: SessionListEvent) => void>();
  let listListening: Promise<unknown> | null = null;
  // The click handlers of the notifications shown, by the id the shell reports back.
  const clicks = new Map<number, () => void>();
  let notificationCounter = 0;
  let notificationListening: Promise<unknown> | null = null;

  // The shell sends one frame's events of a subscription together (`events`, in order);
  // a single `event` is still understood.
  const dispatch = (payload: any) => {
    if (!payload || typeof payload !== 'object') return;
    const id = String(payload.subscription);
    const raws: unknown[] = Array.isArray(payload.events) ? payload.events : [payload.event];
    const handler = handlers.get(id);
    if (handler) {
      for (const raw of raws) {
        const event = parseEvent(raw);
        if (event) handler(event);
      }
    } else {
      const list = unclaimed.get(id) ?? [];
      for (const raw of raws) if (list.length < 10000) list.push(raw);
      unclaimed.set(id, list);
    }
  };
  const listen = () => {
    listening ??= tauri.event.listen(TAURI_EVENT, (e) => dispatch(e.payload));
    return listening;
  };

  const invoke = async <N extends CommandName>(command: N, args: CommandArgs[N]): Promise<CommandResults[N]> => {
    try {
      return await tauri.core.invoke('command', { name: command, args });
    } catch (err) {
      throw toCommandError(err);
    }
  };
  /** The shell's own commands, typed by `DesktopCommandArgs` / `DesktopCommandResults`. */
  const shell = <N extends DesktopCommandName>(command: N, args: DesktopCommandArgs[N]): Promise<DesktopCommandResults[N]> =>
    tauri.core.invoke(command, { args });
  // The shell's facts are fixed for the window's life: asked once (the start and the
  // recycle's delay both read them); a failed ask is asked again next time.
  let facts: Promise<DesktopCommandResults['app_info'] | null> | null = null;
  const appInfo = () =>
    (facts ??= shell('app_info', {}).catch(() => {
      facts = null;
      return null;
    }));

  return {
    kind: 'tauri',
    invoke,
    subscribe(sessionId, onEvent, onStatus) {
      const clientId = `ui-${Date.now().toString(36)}-${++counter}`;
      let closed = false;
      let ids = [clientId];
      const unsubscribeIds = (list: string[]) => {
        for (const id of list) handlers.delete(id);
        for (const id of new Set(list)) {
          shell('unsubscribe', { subscription: id }).catch(() => undefined);
        }
      };
      handlers.set(clientId, onEvent);
      const attempt = async () => {
        await listen();
        if (closed) return;
        const answer: unknown = await shell('subscribe', { session_id: sessionId, subscription: clientId });
        const id = answer == null || typeof answer === 'object' ? clientId : String(answer);
        if (id !== clientId) {
          ids = [clientId, id];
          handlers.set(id, onEvent);
        }
        if (closed) return void unsubscribeIds([id]);
        onStatus?.('open');
        for (const raw of unclaimed.get(id) ?? []) {
          const event = parseEvent(raw);
          if (event) onEvent(event);
        }
        unclaimed.delete(id);
      };
      let tries = 0;
      const run = () =>
        attempt().catch((err) => {
          console.error('subscribe failed', err);
          onStatus?.('reconnecting');
          if (!closed && ++tries < 5) setTimeout(run, 1000 * tries);
        });
      void run();
      return () => {
        if (closed) return;
        closed = true;
        unsubscribeIds(ids);
      };
    },
    subscribeSessions(workspace, onEvent) {
      const id = `list-${Date.now().toString(36)}-${++counter}`;
      let closed = false;
      listHandlers.set(id, onEvent);
      listListening ??= tauri.event.listen(TAURI_SESSIONS_EVENT, (e) => {
        const payload = e.payload;
        if (payload && typeof payload === 'object' && payload.event) {
          listHandlers.get(String(payload.subscription))?.(payload.event as SessionListEvent);
        }
      });
      void listListening
        .then(() => (closed ? undefined : shell('subscribe_sessions', { workspace, subscription: id })))
        .catch((err) => console.error('subscribe_sessions failed', err));
      return () => {
        if (closed) return;
        closed = true;
        listHandlers.delete(id);
        shell('unsubscribe', { subscription: id }).catch(() => undefined);
      };
    },
    async pickFolder(defaultPath) {
      if (!tauri.dialog) throw new CommandError('unavailable', 'the dialog plugin is not available');
      // A default path keeps GTK's dialog out of "Recent", where a typed path does nothing.
      const options: Record<string, unknown> = { directory: true, multiple: false };
      if (defaultPath) options.defaultPath = defaultPath;
      const chosen = await tauri.dialog.open(options);
      if (Array.isArray(chosen)) return chosen[0] ?? null;
      return chosen ?? null;
    },
    async initialWorkspace() {
      try {
        const value = await shell('initial_workspace', {});
        return typeof value === 'string' && value ? value : null;
      } catch {
        return null;
      }
    },
    openExternal(url) {
      // The shell checks the scheme again and hands the link to the system (opener plugin).
      shell('open_url', { url }).catch((err) => console.warn('cannot open the link', toCommandError(err).message));
    },
    probeProviders: () => probeThroughBackend(invoke),
    async checkFolder(path) {
      // The runtime's check (`check_workspace`: exists, a folder, and one that may be a
      // workspace, so the home folder itself is refused here, not at the first send);
      // a shell without it checks only that the folder exists.
      try {
        const checked = await invoke('check_workspace', { path });
        if (checked && typeof checked.path === 'string') return checked.path;
      } catch (err) {
        const error = toCommandError(err);
        if (error.code !== 'unknown_command') throw error;
      }
      try {
        return String(await shell('check_folder', { path }));
      } catch (err) {
        throw toCommandError(err);
      }
    },
    async loadUiState() {
      try {
        const value = await shell('load_ui_state', {});
        return value && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : {};
      } catch {
        return {};
      }
    },
    async saveUiState(state) {
      await shell('save_ui_state', { value: state as DesktopCommandArgs['save_ui_state']['value'] }).catch((err) => console.warn('cannot save the UI state', toCommandError(err).message));
    },
    async hostInfo() {
      const info: Partial<DesktopCommandResults['app_info']> | null = await appInfo();
      return { home_dir: info?.home_dir ?? null, provider_configured: info?.provider_configured ?? null };
    },
    notify(title, body, onClick) {
      let id: number | null = null;
      if (onClick) {
        id = ++notificationCounter;
        clicks.set(id, onClick);
        // Oldest first in a Map's order: a day's notifications do not pile up.
        while (clicks.size > NOTIFICATIONS_KEPT) clicks.delete(clicks.keys().next().value as number);
        notificationListening ??= tauri.event.listen(TAURI_NOTIFICATION_CLICKED_EVENT, (e) => {
          const clicked = clicks.get(Number(e.payload));
          if (!clicked) return;
          clicks.delete(Number(e.payload));
          clicked();
        });
      }
      // Listening before the notification is shown: a click cannot come before the listener.
      void Promise.resolve(notificationListening)
        .then(() => shell('notify', { title, body, id }))
        .catch((err) => console.warn('cannot notify', toCommandError(err).message));
    },
    setTitle(title) {
      if (globalThis.document) document.title = title;
      shell('set_title', { title }).catch(() => undefined);
    },
    setCloseGuard(active) {
      shell('set_close_guard', { active }).catch(() => undefined);
    },
    onCloseRequested(handler) {
      let off: (() => void) | null = null;
      let gone = false;
      void tauri.event.listen(TAURI_CLOSE_EVENT, () => handler()).then((u) => {
        if (gone) u();
        else off = u;
      });
      return () => {
        gone = true;
        off?.();
      };
    },
    quit() {
      shell('quit', {}).catch(() => undefined);
    },
    recycleWhenAway(mayRecycle) {
      let stop: (() => void) | null = null;
      let gone = false;
      void appInfo().then((info) => {
        const afterMs = Number(info?.recycle_after_ms ?? 0);
        if (gone || !afterMs || !globalThis.document) return;
        stop = watchAway(window, document, { afterMs, mayRecycle, recycle: () => shell('recycle_web_process', {}).then(Boolean) });
      });
      return () => {
        gone = true;
        stop?.();
      };
    },
    async clipboardImage() {
      try {
        return (await shell('clipboard_image', {})) ?? null;
      } catch (err) {
        throw toCommandError(err);
      }
    },
    onOpenRequested(handler) {
      let off: (() => void) | null = null;
      let gone = false;
      void tauri.event
        .listen(TAURI_OPEN_EVENT, (e) => {
          const open = e.payload as Partial<OpenRequested> | null;
          if (open && typeof open.workspace === 'string' && open.workspace) handler(open.workspace);
        })
        .then((u) => {
          if (gone) u();
          else off = u;
        });
      return () => {
        gone = true;
        off?.();
      };
    },
  };
}

// ---------------------------------------------------------------------------------------
// Web (`bumblehive serve`)

export const TOKEN_KEY = 'bumblehive.token';
const UI_STATE_KEY = 'bumblehive.uiState';

export interface WebOptions {
  /** Where the server is; '' means the page's own origin. */
  base?: string;
  token?: string | null;
  fetch?: typeof fetch;
  EventSource?: typeof EventSource;
  location?: { search: string };
}

const EVENT_NAMES = [
  'snapshot',
  'session_created',
  'message_status',
  'approval_request',
  'approval_resolved',
  'event',
  'result',
  'error',
];

/** The token from `?token=` (remembered for next time) or from localStorage. */
export function readToken(location: { search: string }, storage: Storage | null): string | null {
  const fromUrl = new URLSearchParams(location.search).get('token');
  if (fromUrl) {
    try {
      storage?.setItem(TOKEN_KEY, fromUrl);
    } catch {
      /* private mode */
    }
    return fromUrl;
  }
  try {
    return storage?.getItem(TOKEN_KEY) ?? null;
  } catch {
    return null;
  }
}

export function createWebPlatform(options: WebOptions = {}): Platform {
  const base = (options.base ?? '').replace(/\/$/, '');
  const doFetch = options.fetch ?? ((...a: Parameters<typeof fetch>) => fetch(...a));
  const Source = options.EventSource ?? globalThis.EventSource;
  const location = options.location ?? globalThis.location ?? { search: '' };
  let token = options.token ?? null;

  const invoke = async <N extends CommandName>(command: N, args: CommandArgs[N]): Promise<CommandResults[N]> => {
    const headers: Record<string, string> = { 'Content-Type': 'application/json' };
    if (token) headers.Authorization = `Bearer ${token}`;
    let response: Response;
    try {
      response = await doFetch(`${base}/api/${encodeURIComponent(command)}`, {
        method: 'POST',
        headers,
        body: JSON.stringify(args ?? {}),
      });
    } catch (err) {
      throw new CommandError('network', `cannot reach the Bumblehive server: ${(err as Error).message ?? err}`);
    }
    const text = await response.text();
    let body: any = null;
    if (text) {
      try {
        body = JSON.parse(text);
      } catch {
        body = text;
      }
    }
    if (!response.ok) {
      if (response.status === 401 || response.status === 403) {
        throw new CommandError(
          'unauthorized',
          'The server refused the access token. Open the address that `bumblehive serve` printed (it ends in ?token=…).',
          response.status,
        );
      }
      const error = toCommandError(body ?? `${response.status} ${response.statusText}`, response.status);
      throw error;
    }
    return (body ?? {}) as CommandResults[N];
  };

  return {
    kind: 'web',
    invoke,
    subscribe(sessionId, onEvent, onStatus) {
      const query = token ? `?token=${encodeURIComponent(token)}` : '';
      const source = new Source(`${base}/api/sessions/${encodeURIComponent(sessionId)}/events${query}`);
      const handle = (name: string) => (message: MessageEvent) => {
        const event = parseEvent(message.data, name);
        if (event) onEvent(event);
      };
      // Unnamed events arrive as `message`; named ones (event: snapshot …) under their name.
      source.onmessage = handle('message');
      for (const name of EVENT_NAMES) source.addEventListener(name, handle(name) as EventListener);
      source.onopen = () => onStatus?.('open');
      // EventSource reconnects by itself; the server then sends a fresh snapshot first.
      source.onerror = () => onStatus?.('reconnecting');
      return () => source.close();
    },
    subscribeSessions(workspace, onEvent) {
      const params = new URLSearchParams({ workspace });
      if (token) params.set('token', token);
      const source = new Source(`${base}/api/sessions/events?${params}`);
      // The server sends the whole list first on every (re)connection.
      source.onmessage = (message: MessageEvent) => {
        try {
          const event = JSON.parse(message.data);
          if (event && typeof event.type === 'string') onEvent(event as SessionListEvent);
        } catch {
          // Not ours: ignore.
        }
      };
      return () => source.close();
    },
    // No `pickFolder`: a page cannot browse the server's disk, so the app's own folder
    // dialog does (list_folders).
    async initialWorkspace() {
      return new URLSearchParams(location.search).get('workspace');
    },
    initialWorkspaceIsLink: true,
    openExternal(url) {
      globalThis.open?.(url, '_blank', 'noopener,noreferrer');
    },
    probeProviders: () => probeThroughBackend(invoke),
    async hostInfo() {
      // The server's app_info, once it says whether the config names a provider.
      const info: any = await invoke('app_info', {}).catch(() => ({}));
      return { home_dir: null, provider_configured: typeof info?.provider_configured === 'boolean' ? info.provider_configured : null };
    },
    async checkFolder(path) {
      // The server's workspace check (the same rules as `create_session`, D8).
      try {
        const checked = await invoke('check_workspace', { path });
        if (checked && typeof checked.path === 'string') return checked.path;
      } catch (err) {
        const error = toCommandError(err);
        if (error.code !== 'unknown_command' && error.status !== 404) throw error;
      }
      // An older server: it checks a folder when it lists its files; without that command
      // the first `create_session` checks it.
      try {
        await invoke('list_files', { workspace: path, limit: 1 });
      } catch (err) {
        const error = toCommandError(err);
        if (error.code !== 'unknown_command' && error.status !== 404) throw error;
      }
      return path;
    },
    async loadUiState() {
      try {
        const value = JSON.parse(globalThis.localStorage?.getItem(UI_STATE_KEY) ?? '{}');
        return value && typeof value === 'object' && !Array.isArray(value) ? value : {};
      } catch {
        return {};
      }
    },
    async saveUiState(state) {
      try {
        globalThis.localStorage?.setItem(UI_STATE_KEY, JSON.stringify(state));
      } catch {
        /* private mode */
      }
    },
    notify(title, body, onClick) {
      const N = (globalThis as any).Notification;
      if (!N || N.permission !== 'granted') return;
      const shown = new N(title, { body });
      shown.onclick = () => {
        globalThis.focus?.();
        onClick?.();
        shown.close?.();
      };
    },
    setTitle(title) {
      if (globalThis.document) document.title = title;
    },
    setCloseGuard(active) {
      // The browser asks "Leave site?" itself; it shows no text of ours.
      globalThis.onbeforeunload = active ? (e: BeforeUnloadEvent) => (e.preventDefault(), '') : null;
    },
    // Lets the UI ask for a token when the server refuses the one it has.
    setToken(next: string | null) {
      token = next;
      try {
        if (next) localStorage.setItem(TOKEN_KEY, next);
        else localStorage.removeItem(TOKEN_KEY);
      } catch {
        /* ignore */
      }
    },
  } as Platform & { setToken(token: string | null): void };
}

/**
 * Tauri's API as the UI uses it, from the npm packages: only these few functions are in the
 * bundle. Not the window's `__TAURI__` global (`withGlobalTauri`), which has Tauri inject its
 * whole API and each plugin's (about 50 kB of script) into the page before anything of ours
 * runs, on the way to the first paint (BENCHMARKS.md, issue #31).
 */
const tauriModules: TauriGlobals = {
  core: { invoke: tauriInvoke },
  event: { listen: (name, handler) => tauriListen(name, handler) },
  dialog: { open: (options) => tauriOpen(options) },
};

/** Picks the implementation for this window: the Tauri shell, or a page served over HTTP. */
export function detectPlatform(win: any = window): Platform {
  // Tauri's IPC bridge, which Tauri puts in every window it opens.
  if ('__TAURI_INTERNALS__' in win) return createTauriPlatform(tauriModules);
  if ('__TAURI__' in win && win.__TAURI__?.core) return createTauriPlatform(win.__TAURI__);
  let storage: Storage | null = null;
  try {
    storage = win.localStorage;
  } catch {
    storage = null;
  }
  const token = readToken(win.location, storage);
  // Keep the token out of the address bar (and out of screenshots and history).
  try {
    const url = new URL(win.location.href);
    if (url.searchParams.has('token')) {
      url.searchParams.delete('token');
      win.history.replaceState(null, '', url.toString());
    }
  } catch {
    /* ignore */
  }
  return createWebPlatform({ token, location: win.location });
}
