// A fake platform adapter for tests: records every command, answers from handlers, and lets
// a test push events into a session's stream.

import { act } from 'preact/test-utils';
import type { ImagePart } from '../bindings/ImagePart';
import type { Event as WireEvent } from '../bindings/Event';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { Snapshot } from '../bindings/Snapshot';
import {
  type CommandArgs,
  CommandError,
  type CommandName,
  type CommandResults,
  type HostInfo,
  type Platform,
  type ProbeResult,
  type StreamStatus,
} from '../platform';

export interface Call {
  command: string;
  args: Record<string, any>;
}

type Handler = (args: Record<string, any>) => unknown;

export class FakePlatform implements Platform {
  readonly kind = 'fake' as const;
  initialWorkspaceIsLink = false;
  calls: Call[] = [];
  handlers: Record<string, Handler> = {};
  streams = new Map<string, { onEvent: (e: WireEvent) => void; onStatus?: (s: StreamStatus) => void }>();
  workspace: string | null = null;
  folder: string | null = null;
  probe: ProbeResult[] | null = null;
  opened: string[] = [];
  /** Whether a subscription reports `open` at once (set false to open it by hand). */
  autoOpen = true;
  // Desktop integration, recorded.
  pickedFrom: (string | null | undefined)[] = [];
  /** Folders that `checkFolder` accepts, mapped to their real path (unset: any). */
  folders: Record<string, string> | null = null;
  uiState: Record<string, unknown> = {};
  saved: Record<string, unknown>[] = [];
  host: HostInfo = { home_dir: '/home/me', provider_configured: true };
  notified: { title: string; body: string }[] = [];
  /** What clicking each notification does (the browser tells; a test clicks). */
  notificationClicks: (() => void)[] = [];
  titles: string[] = [];
  guard: boolean[] = [];
  closeHandler: (() => void) | null = null;
  quitCalls = 0;

  constructor(handlers: Record<string, Handler> = {}) {
    this.handlers = { ...handlers };
  }

  invoke<N extends CommandName>(command: N, args: CommandArgs[N]): Promise<CommandResults[N]> {
    this.calls.push({ command, args: (args ?? {}) as Record<string, any> });
    const handler = this.handlers[command];
    if (!handler) return Promise.reject(new CommandError('unknown_command', `unknown command "${command}"`));
    try {
      return Promise.resolve(handler((args ?? {}) as Record<string, any>) as CommandResults[N]);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  subscribe(sessionId: string, onEvent: (e: WireEvent) => void, onStatus?: (s: StreamStatus) => void) {
    this.streams.set(sessionId, { onEvent, onStatus });
    // Like the real transports once the backend has subscribed.
    if (this.autoOpen) onStatus?.('open');
    return () => {
      if (this.streams.get(sessionId)?.onEvent === onEvent) this.streams.delete(sessionId);
    };
  }

  /** Pushes events into a session's stream, as the backend would. */
  emit(sessionId: string, ...events: unknown[]): void {
    const stream = this.streams.get(sessionId);
    if (!stream) throw new Error(`nobody subscribed to ${sessionId}`);
    for (const e of events) stream.onEvent(e as WireEvent);
  }

  callsOf(command: string): Record<string, any>[] {
    return this.calls.filter((c) => c.command === command).map((c) => c.args);
  }

  pickFolder(defaultPath?: string | null) {
    this.pickedFrom.push(defaultPath);
    return Promise.resolve(this.folder);
  }
  checkFolder(path: string) {
    if (!this.folders) return Promise.resolve(path);
    const real = this.folders[path];
    return real ? Promise.resolve(real) : Promise.reject(new CommandError('invalid_argument', `${path} does not exist`));
  }
  loadUiState() {
    return Promise.resolve(this.uiState);
  }
  saveUiState(state: Record<string, unknown>) {
    this.uiState = state;
    this.saved.push(state);
    return Promise.resolve();
  }
  hostInfo() {
    return Promise.resolve(this.host);
  }
  notify(title: string, body: string, onClick?: () => void) {
    this.notified.push({ title, body });
    if (onClick) this.notificationClicks.push(onClick);
  }
  setTitle(title: string) {
    if (this.titles.at(-1) !== title) this.titles.push(title);
  }
  setCloseGuard(active: boolean) {
    this.guard.push(active);
  }
  onCloseRequested(handler: () => void) {
    this.closeHandler = handler;
    return () => {
      if (this.closeHandler === handler) this.closeHandler = null;
    };
  }
  quit() {
    this.quitCalls++;
  }
  openHandler: ((workspace: string) => void) | null = null;
  onOpenRequested(handler: (workspace: string) => void) {
    this.openHandler = handler;
    return () => {
      if (this.openHandler === handler) this.openHandler = null;
    };
  }
  initialWorkspace() {
    return Promise.resolve(this.workspace);
  }
  openExternal(url: string) {
    this.opened.push(url);
  }
  probeProviders() {
    return Promise.resolve(this.probe);
  }
  /** What the clipboard's image reads as (a test sets it; unset: the platform has no such read). */
  clipboardImage?: () => Promise<ImagePart | null>;
}

export const usage = (input: number, output: number) => ({ input_tokens: input, output_tokens: output }) as any;

export function info(id: string, extra: Partial<SessionInfo> = {}): SessionInfo {
  return {
    session_id: id,
    workspace: '/ws',
    title: `Session ${id}`,
    archived: false,
    failed: false,
    models: [],
    parent_session_id: null,
    created_at: '2025-01-01T00:00:00Z',
    updated_at: '2025-01-01T00:00:00Z',
    state: 'idle',
    usage: usage(0, 0),
    interrupted: false,
    ...extra,
  };
}

export function snapshot(sessionId: string, extra: Partial<Snapshot> = {}): WireEvent {
  return {
    type: 'snapshot',
    session_id: sessionId,
    running: false,
    paused: false,
    pending: [],
    approvals: [],
    subagents: [],
    usage: usage(0, 0),
    tree_usage: usage(0, 0),
    ...extra,
  } as WireEvent;
}

export const kind = (session_id: string, k: string, data: unknown) => ({ type: 'event', session_id, kind: k, data });
export const appended = (session_id: string, message: unknown) => kind(session_id, 'message.appended', { message });

/** `get_session`'s answer as the runtime gives it: the last `last` messages before `before`. */
export function historyPage(found: SessionInfo, all: unknown[], last?: number, before?: number, extra: Record<string, unknown> = {}) {
  const end = Math.min(before ?? all.length, all.length);
  const start = last == null ? 0 : Math.max(0, end - last);
  return { info: found, messages: all.slice(start, end), first_index: start, total: all.length, ...extra };
}

/** A platform with one workspace `/ws` holding the given sessions (empty histories). */
export function workspacePlatform(sessions: SessionInfo[], histories: Record<string, unknown[]> = {}) {
  const fake = new FakePlatform({
    list_sessions: () => sessions,
    get_session: ({ session_id, last, before }) => {
      const found = sessions.find((s) => s.session_id === session_id) ?? info(session_id);
      return historyPage(found, histories[session_id] ?? [], last, before);
    },
    get_config: () => ({ provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'qwen2.5-coder' } }),
    submit: () => ({ message_id: 'msg-1', status: 'started' }),
    cancel: () => ({}),
    steer: () => ({ status: 'started' }),
    discard: () => ({}),
    decide_approval: () => ({}),
    snapshot: ({ session_id }) => {
      const { type: _t, ...rest } = snapshot(session_id) as any;
      return rest;
    },
  });
  fake.workspace = '/ws';
  return fake;
}

/** Lets promises, timers and Preact renders run. */
export async function settle(rounds = 4): Promise<void> {
  for (let i = 0; i < rounds; i++) {
    await act(async () => {
      await new Promise((r) => setTimeout(r, 1));
    });
  }
}

export async function inAct(fn: () => void): Promise<void> {
  await act(async () => {
    fn();
  });
  await settle(2);
}

export const $ = (root: ParentNode, testid: string) => root.querySelector(`[data-testid="${testid}"]`) as HTMLElement | null;
export const $$ = (root: ParentNode, testid: string) => Array.from(root.querySelectorAll(`[data-testid="${testid}"]`)) as HTMLElement[];

export function typeInto(el: HTMLElement, value: string): void {
  (el as HTMLTextAreaElement).value = value;
  el.dispatchEvent(new Event('input', { bubbles: true }));
}

export function key(el: HTMLElement, key: string, init: KeyboardEventInit = {}): KeyboardEvent {
  const event = new KeyboardEvent('keydown', { key, bubbles: true, cancelable: true, ...init });
  el.dispatchEvent(event);
  return event;
}
