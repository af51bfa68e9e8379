import { describe, expect, it, vi } from 'vitest';
import { CommandError, TAURI_EVENT, TAURI_NOTIFICATION_CLICKED_EVENT, TAURI_OPEN_EVENT, createTauriPlatform, createWebPlatform, detectPlatform, readToken, toCommandError } from '../platform';

class FakeEventSource {
  static last: FakeEventSource | null = null;
  listeners = new Map<string, (e: MessageEvent) => void>();
  onmessage: ((e: MessageEvent) => void) | null = null;
  onopen: (() => void) | null = null;
  onerror: (() => void) | null = null;
  closed = false;
  constructor(readonly url: string) {
    FakeEventSource.last = this;
  }
  addEventListener(name: string, fn: (e: MessageEvent) => void) {
    this.listeners.set(name, fn);
  }
  close() {
    this.closed = true;
  }
}

const response = (status: number, body: unknown) =>
  new Response(body === undefined ? '' : JSON.stringify(body), { status, headers: { 'Content-Type': 'application/json' } });

describe('web platform', () => {
  it('POSTs /api/<command> with the bearer token and returns the JSON result', async () => {
    const fetch = vi.fn(async () => response(200, { message_id: 'm', status: 'started' }));
    const web = createWebPlatform({ token: 'tok', fetch: fetch as any, location: { search: '' } });
    const result = await web.invoke('submit', { session_id: 's', content: 'hi', config: null });
    expect(result).toEqual({ message_id: 'm', status: 'started' });
    const [url, init] = fetch.mock.calls[0] as unknown as [string, RequestInit];
    expect(url).toBe('/api/submit');
    expect(init.method).toBe('POST');
    expect((init.headers as Record<string, string>).Authorization).toBe('Bearer tok');
    expect(JSON.parse(init.body as string)).toEqual({ session_id: 's', content: 'hi', config: null });
  });

  it('turns error envelopes into CommandError with the code', async () => {
    const fetch = vi.fn(async () => response(409, { error: { code: 'busy', message: 'the runtime is busy: 1 run(s)' } }));
    const web = createWebPlatform({ token: 't', fetch: fetch as any, location: { search: '' } });
    const err = await web.invoke('update_config', { patch: {} }).catch((e) => e);
    expect(err).toBeInstanceOf(CommandError);
    expect(err.code).toBe('busy');
    expect(err.status).toBe(409);
    expect(err.message).toContain('busy');
    const unauthorized = createWebPlatform({ fetch: (async () => response(401, '')) as any, location: { search: '' } });
    expect((await unauthorized.invoke('list_sessions', {}).catch((e) => e)).code).toBe('unauthorized');
    const down = createWebPlatform({ fetch: (async () => Promise.reject(new TypeError('Failed to fetch'))) as any, location: { search: '' } });
    expect((await down.invoke('list_sessions', {}).catch((e) => e)).code).toBe('network');
  });

  it('streams events over SSE with ?token=, named or unnamed', () => {
    const web = createWebPlatform({ token: 'a b', EventSource: FakeEventSource as any, location: { search: '' } });
    const events: unknown[] = [];
    const statuses: string[] = [];
    const stop = web.subscribe('s/1', (e) => events.push(e), (s) => statuses.push(s));
    const source = FakeEventSource.last!;
    expect(source.url).toBe('/api/sessions/s%2F1/events?token=a%20b');
    source.onopen?.();
    source.onmessage?.(new MessageEvent('message', { data: JSON.stringify({ type: 'snapshot', session_id: 's/1' }) }));
    source.listeners.get('result')!(new MessageEvent('result', { data: JSON.stringify({ session_id: 's/1', content: 'x' }) }));
    source.onmessage?.(new MessageEvent('message', { data: 'not json' }));
    source.onerror?.();
    expect(events).toEqual([
      { type: 'snapshot', session_id: 's/1' },
      { type: 'result', session_id: 's/1', content: 'x' },
    ]);
    expect(statuses).toEqual(['open', 'reconnecting']);
    stop();
    expect(source.closed).toBe(true);
  });

  it('reads the token from ?token= (remembering it) or localStorage; ?workspace= is the initial workspace', async () => {
    localStorage.clear();
    expect(readToken({ search: '?token=abc' }, localStorage)).toBe('abc');
    expect(readToken({ search: '' }, localStorage)).toBe('abc');
    const web = createWebPlatform({ location: { search: '?workspace=%2Fhome%2Fme%2Fproj' } });
    expect(await web.initialWorkspace()).toBe('/home/me/proj');
    // The web adapter has no native folder dialog (never a window.prompt): the app's own one browses.
    expect(createWebPlatform({ location: { search: '' } }).pickFolder).toBeUndefined();
  });

  it("checks a folder with the server's check_workspace (the home folder is refused at once, D8); an older server's list_files; none: accepted. UI state in localStorage", async () => {
    let server: 'new' | 'old' | 'oldest' = 'new';
    const unknown = (name: string) => response(404, { error: { code: 'unknown_command', message: `unknown command "${name}"` } });
    const fetch = vi.fn(async (url: string, init: any) => {
      const body = JSON.parse(init.body);
      if (url.endsWith('/check_workspace')) {
        if (server !== 'new') return unknown('check_workspace');
        return body.path === '~'
          ? response(400, { error: { code: 'invalid_argument', message: 'workspace ~ (/home/me) is your home folder itself' } })
          : response(200, { path: `/real${body.path}` });
      }
      if (url.endsWith('/list_files')) {
        if (server === 'oldest') return unknown('list_files');
        return response(400, { error: { code: 'invalid_argument', message: 'workspace /x is not a folder' } });
      }
      return response(200, {});
    });
    const web = createWebPlatform({ token: 't', fetch: fetch as any, location: { search: '' } });
    expect((await web.checkFolder!('~').catch((e) => e)).message).toContain('your home folder itself');
    expect(await web.checkFolder!('/p')).toBe('/real/p');
    server = 'old';
    const err = await web.checkFolder!('/x').catch((e) => e);
    expect(err.message).toBe('workspace /x is not a folder');
    server = 'oldest';
    expect(await web.checkFolder!('/y')).toBe('/y');
    localStorage.clear();
    expect(await web.loadUiState!()).toEqual({});
    await web.saveUiState!({ lastWorkspace: '/w' });
    expect(await web.loadUiState!()).toEqual({ lastWorkspace: '/w' });
  });

  it('probe_providers: unknown to the backend means "not supported" (null)', async () => {
    const web = createWebPlatform({ fetch: (async () => response(404, { error: { code: 'unknown_command', message: 'unknown command' } })) as any, location: { search: '' } });
    expect(await web.probeProviders()).toBeNull();
    const found = [{ name: 'Ollama', kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', ok: true, models: ['qwen'] }];
    const web2 = createWebPlatform({ fetch: (async () => response(200, found)) as any, location: { search: '' } });
    expect(await web2.probeProviders()).toEqual(found);
  });
});

describe('tauri platform', () => {
  function fakeTauri() {
    let listener: ((e: { payload: any }) => void) | null = null;
    const invoke = vi.fn(async (cmd: string, args?: any): Promise<any> => {
      if (cmd === 'command') {
        if (args.name === 'get_session') throw { error: { code: 'not_found', message: 'session x not found' } };
        return { ok: args.name, args: args.args };
      }
      if (cmd === 'subscribe') {
        // Emits before answering: the UI must not lose it.
        listener?.({ payload: { subscription: args.args.subscription, event: { type: 'snapshot', session_id: args.args.session_id } } });
        return args.args.subscription;
      }
      if (cmd === 'initial_workspace') return '/from/cli';
      return null;
    });
    const tauri = {
      core: { invoke },
      event: {
        listen: vi.fn(async (name: string, fn: (e: { payload: any }) => void) => {
          expect(name).toBe(TAURI_EVENT);
          listener = fn;
          return () => undefined;
        }),
      },
      dialog: { open: vi.fn(async () => '/picked') },
    };
    return { tauri, invoke, emit: (payload: unknown) => listener?.({ payload }) };
  }

  it('sends every command through the one `command` command', async () => {
    const { tauri, invoke } = fakeTauri();
    const platform = createTauriPlatform(tauri);
    expect(await platform.invoke('list_sessions', { workspace: '/w' })).toEqual({ ok: 'list_sessions', args: { workspace: '/w' } });
    expect(invoke).toHaveBeenCalledWith('command', { name: 'list_sessions', args: { workspace: '/w' } });
    const err = await platform.invoke('get_session', { session_id: 'x' }).catch((e) => e);
    expect(err).toBeInstanceOf(CommandError);
    expect(err.code).toBe('not_found');
    expect(await platform.pickFolder!()).toBe('/picked');
    expect(tauri.dialog.open).toHaveBeenCalledWith({ directory: true, multiple: false });
    expect(await platform.initialWorkspace()).toBe('/from/cli');
  });

  it('desktop integration goes through the shell: links, folders, UI state, title, quit', async () => {
    const { tauri, invoke } = fakeTauri();
    invoke.mockImplementation(async (cmd: string, args: any) => {
      if (cmd === 'check_folder') {
        if (args.args.path === '/nope') throw { code: 'invalid_argument', message: '/nope does not exist' };
        return '/real';
      }
      if (cmd === 'load_ui_state') return { lastWorkspace: '/w' };
      if (cmd === 'app_info') return { home_dir: '/home/me', provider_configured: false };
      // A shell whose runtime has no check_workspace: its own check_folder is used.
      if (cmd === 'command' && args.name === 'check_workspace') throw { error: { code: 'unknown_command', message: 'unknown command' } };
      return null;
    });
    const platform = createTauriPlatform(tauri);
    platform.openExternal('https://example.com/x');
    // The shell's own commands take their typed arguments as one `args` (protocol::desktop).
    expect(invoke).toHaveBeenCalledWith('open_url', { args: { url: 'https://example.com/x' } });
    await platform.pickFolder!('/last');
    expect(tauri.dialog.open).toHaveBeenCalledWith({ directory: true, multiple: false, defaultPath: '/last' });
    expect(await platform.checkFolder!('~/x')).toBe('/real');
    const err = await platform.checkFolder!('/nope').catch((e) => e);
    expect(err).toBeInstanceOf(CommandError);
    expect(err.message).toBe('/nope does not exist');
    expect(await platform.loadUiState!()).toEqual({ lastWorkspace: '/w' });
    await platform.saveUiState!({ lastWorkspace: '/v' });
    expect(invoke).toHaveBeenCalledWith('save_ui_state', { args: { value: { lastWorkspace: '/v' } } });
    expect(await platform.hostInfo!()).toEqual({ home_dir: '/home/me', provider_configured: false });
    platform.setTitle!('Bumblehive — 2 need you');
    expect(invoke).toHaveBeenCalledWith('set_title', { args: { title: 'Bumblehive — 2 need you' } });
    platform.setCloseGuard!(true);
    expect(invoke).toHaveBeenCalledWith('set_close_guard', { args: { active: true } });
    platform.notify!('t', 'b');
    await vi.waitFor(() => expect(invoke).toHaveBeenCalledWith('notify', { args: { title: 't', body: 'b', id: null } }));
    platform.quit!();
    expect(invoke).toHaveBeenCalledWith('quit', { args: {} });
  });

  it('a click on a desktop notification runs what the UI asked for that one, once (E21)', async () => {
    let clicked: ((e: { payload: any }) => void) | null = null;
    const invoke = vi.fn(async (): Promise<any> => null);
    const tauri = {
      core: { invoke },
      event: {
        listen: vi.fn(async (name: string, fn: (e: { payload: any }) => void) => {
          if (name === TAURI_NOTIFICATION_CLICKED_EVENT) clicked = fn;
          return () => undefined;
        }),
      },
    };
    const platform = createTauriPlatform(tauri as any);
    const opened: string[] = [];
    platform.notify!('Bumblehive needs your approval', 'Writer asks', () => opened.push('writer'));
    platform.notify!('Bumblehive: reports are in', 'Reader reported', () => opened.push('reader'));
    await vi.waitFor(() => expect(invoke).toHaveBeenCalledTimes(2));
    // Each notification carries its own id; the shell reports the clicked one's id back.
    const ids = invoke.mock.calls.map((c: any[]) => c[1].args.id);
    expect(new Set(ids).size).toBe(2);
    expect(invoke).toHaveBeenCalledWith('notify', { args: { title: 'Bumblehive needs your approval', body: 'Writer asks', id: ids[0] } });
    clicked!({ payload: ids[1] });
    clicked!({ payload: ids[1] });
    clicked!({ payload: 999 });
    expect(opened).toEqual(['reader']);
    clicked!({ payload: ids[0] });
    expect(opened).toEqual(['reader', 'writer']);
  });

  it("checks a folder with the runtime's check_workspace through the command table (refusals said at once, D8)", async () => {
    const { tauri, invoke } = fakeTauri();
    invoke.mockImplementation(async (cmd: string, args: any) => {
      if (cmd !== 'command' || args.name !== 'check_workspace') return null;
      if (args.args.path === '~') throw { error: { code: 'invalid_argument', message: 'workspace ~ (/home/me) is your home folder itself; choose a project folder inside it' } };
      return { path: '/home/me/proj' };
    });
    const platform = createTauriPlatform(tauri);
    expect(await platform.checkFolder!('~/proj')).toBe('/home/me/proj');
    const err = await platform.checkFolder!('~').catch((e) => e);
    expect(err).toBeInstanceOf(CommandError);
    expect(err.code).toBe('invalid_argument');
    expect(err.message).toContain('your home folder itself');
    expect(invoke).not.toHaveBeenCalledWith('check_folder', expect.anything());
  });

  it('subscribes, routes `bumblehive://event` payloads by subscription, and unsubscribes', async () => {
    const { tauri, invoke, emit } = fakeTauri();
    const platform = createTauriPlatform(tauri);
    const events: any[] = [];
    const stop = platform.subscribe('s1', (e) => events.push(e));
    await new Promise((r) => setTimeout(r, 0));
    const subscribeCall = invoke.mock.calls.find((c) => c[0] === 'subscribe')!;
    const id = (subscribeCall[1] as any).args.subscription;
    expect(subscribeCall[1]).toMatchObject({ args: { session_id: 's1' } });
    expect(events).toEqual([{ type: 'snapshot', session_id: 's1' }]);
    emit({ subscription: id, event: JSON.stringify({ type: 'result', session_id: 's1', content: 'ok' }) });
    emit({ subscription: 'someone-else', event: { type: 'result', session_id: 'other', content: 'no' } });
    expect(events.map((e) => e.type)).toEqual(['snapshot', 'result']);
    stop();
    expect(invoke).toHaveBeenCalledWith('unsubscribe', { args: { subscription: id } });
    emit({ subscription: id, event: { type: 'result', session_id: 's1', content: 'late' } });
    expect(events.length).toBe(2);
  });

  it('opens the workspace a later start of the app handed over (bumblehive://open)', async () => {
    let opened: ((e: { payload: any }) => void) | null = null;
    const tauri = {
      core: { invoke: vi.fn(async () => null) },
      event: {
        listen: vi.fn(async (name: string, fn: (e: { payload: any }) => void) => {
          if (name === TAURI_OPEN_EVENT) opened = fn;
          return () => undefined;
        }),
      },
    };
    const platform = createTauriPlatform(tauri);
    const asked: string[] = [];
    const off = platform.onOpenRequested!((w) => asked.push(w));
    await new Promise((r) => setTimeout(r, 0));
    opened!({ payload: { workspace: '/home/me/other' } });
    opened!({ payload: { workspace: '' } });
    opened!({ payload: null });
    expect(asked).toEqual(['/home/me/other']);
    off();
  });

  it('is chosen in a Tauri window (its IPC bridge) or where window.__TAURI__ exists', () => {
    const { tauri } = fakeTauri();
    expect(detectPlatform({ __TAURI_INTERNALS__: {} }).kind).toBe('tauri');
    expect(detectPlatform({ __TAURI__: tauri }).kind).toBe('tauri');
    expect(detectPlatform({ location: new URL('http://x/?token=t'), history: { replaceState() {} }, localStorage }).kind).toBe('web');
  });

  it('toCommandError reads envelopes, bodies, strings and errors', () => {
    expect(toCommandError('{"error":{"code":"busy","message":"m"}}').code).toBe('busy');
    expect(toCommandError({ code: 'x', message: 'y' }).message).toBe('y');
    expect(toCommandError('plain text').message).toBe('plain text');
    expect(toCommandError(new Error('boom')).message).toBe('boom');
  });
});
