// The state of one open (parent) session and its sub-agents, built from `get_session`, the
// snapshot and the live event stream. Pure TypeScript (no DOM): the components only read it.

import type { ApprovalInfo } from './bindings/ApprovalInfo';
import type { Compaction } from './bindings/Compaction';
import type { ContextMeter } from './bindings/ContextMeter';
import type { InstructionFile } from './bindings/InstructionFile';
import type { Event as WireEvent } from './bindings/Event';
import type { Progress } from './bindings/Progress';
import type { Message } from './bindings/Message';
import type { MessageStatus } from './bindings/MessageStatus';
import type { PendingMessage } from './bindings/PendingMessage';
import type { SessionInfo } from './bindings/SessionInfo';
import type { SessionWithMessages } from './bindings/SessionWithMessages';
import type { Snapshot } from './bindings/Snapshot';
import type { SubagentInfo } from './bindings/SubagentInfo';
import type { SubagentState } from './bindings/SubagentState';
import type { Usage } from './bindings/Usage';
import type { DecideApproval } from './bindings/DecideApproval';
import type { MessageRef } from './bindings/MessageRef';
import type { SessionRef } from './bindings/SessionRef';
import type { GetSession } from './bindings/GetSession';
import type { Steered } from './bindings/Steered';
import type { Submit } from './bindings/Submit';
import type { RunConfig } from './bindings/RunConfig';
import type { RuntimeSettings } from './bindings/RuntimeSettings';
import type { ImagePart } from './bindings/ImagePart';
import type { Submitted } from './bindings/Submitted';
import { CommandError, toCommandError, type Platform, type StreamStatus } from './platform';

/** Token counts as plain numbers (the wire carries JSON numbers; see `tokens`). */
export interface Tokens {
  input: number;
  output: number;
}

/** `Usage` is generated with `bigint` fields (u64) but JSON gives numbers: accept both. */
export function tokens(usage: Usage | null | undefined): Tokens {
  return { input: Number(usage?.input_tokens ?? 0), output: Number(usage?.output_tokens ?? 0) };
}

export const totalTokens = (t: Tokens) => t.input + t.output;

export interface ToolLive {
  running: boolean;
  result?: string;
  isError?: boolean;
}

/** Something that happened in a transcript but is not a message: a stop or a failed run. */
export interface Note {
  kind: 'stopped' | 'error' | 'notice';
  text: string;
  /** What the model had streamed when it was stopped (kept on screen, not thrown away). */
  partial?: string;
  /** Shown after this many messages of the whole history (a history index, not a page's). */
  at: number;
  /** A button the note offers (the MCP trust question is answered in Settings). */
  action?: 'open-settings';
}

export interface Transcript {
  sessionId: string;
  /** The loaded part of the history: its end, from history index `first` on. */
  messages: Message[];
  /**
   * The history index of `messages[0]`: a long session is opened by its tail and earlier
   * pages are read as the person scrolls up (`loadEarlier`). Every index that leaves the UI
   * (fork, undo) or comes from the runtime (`first_kept`, a note's `at`) counts from the start
   * of the whole history, so it is `first` + the position in `messages`.
   */
  first: number;
  /** An earlier page is being read. */
  loadingEarlier: boolean;
  /** idle: not loaded (events still collect); loading: `get_session` in flight. */
  status: 'idle' | 'loading' | 'loaded' | 'error';
  loadError: string | null;
  notice: string | null;
  /** Text of the model's answer as it streams, until the message is appended. */
  streaming: string;
  tools: Record<string, ToolLive>;
  notes: Note[];
  retry: { attempt: number; delay_ms: number; reason: string } | null;
  /** The next model call waits for a request slot of its server (`slot.waiting`). */
  slot: { server: string; ahead: number } | null;
  running: boolean;
  /** Messages appended by events while the transcript was idle or loading (merge input). */
  live: Message[] | null;
  /**
   * After a load: the end of the history read, whose events may still arrive (a message is
   * saved, then read by us, then announced). `echoing` once the first echo matched.
   */
  echo: Message[] | null;
  echoing: boolean;
  /** How full the model's window was at this session's last model call (null before one). */
  context: ContextMeter | null;
  /** The history's compactions, oldest first: each is a divider before `first_kept`. */
  compactions: Compaction[];
}

export interface ChildTab {
  sessionId: string;
  parentSessionId: string | null;
  taskId: string | null;
  title: string;
  state: SubagentState;
  /** Cut off by a crash or restart: the person resumes it or cancels it. */
  interrupted?: boolean;
  /** The model server it runs on (what it waits for a slot of). */
  server?: string | null;
}

/** A message handed to the session that is not in the transcript yet (steered or started). */
export interface Inflight {
  messageId: string;
  content: string | null;
  status: MessageStatus;
  /** The images sent with it (shown until the message is appended). */
  images?: ImagePart[];
}

export interface ViewState {
  sessionId: string;
  info: SessionInfo | null;
  stream: 'connecting' | StreamStatus;
  /** Set once the first snapshot arrived. */
  synced: boolean;
  running: boolean;
  paused: boolean;
  /** Queued messages only (steered ones are in `inflight`). */
  pending: PendingMessage[];
  approvals: ApprovalInfo[];
  children: ChildTab[];
  statuses: Record<string, MessageStatus>;
  inflight: Inflight[];
  usage: Tokens;
  treeUsage: Tokens;
  transcripts: Record<string, Transcript>;
  /** The instruction files (AGENTS.md, CLAUDE.md, the user's) the last run loaded. */
  instructions: InstructionFile[];
  /** Task ids of children the person deleted here (their `sub_agent` cards say "deleted"). */
  deleted: string[];
}

export const REPORT_PREFIX = 'subagent:';
/** The id prefix of a note the app added to the conversation (an undo, a rewind: UX E7). */
export const NOTE_PREFIX = 'note:';

/** Whether a history message is such a note (a `user` message the model reads, not the person's). */
export function isNote(m: { role: string; id?: string | null }): boolean {
  return m.role === 'user' && !!m.id && m.id.startsWith(NOTE_PREFIX);
}

/** A note as the chat says it to the person ("Note: the person undid …" → "You undid …"). */
export function noteText(content: string | null | undefined): string {
  return (content ?? '').replace(/^Note: the person /, 'You ');
}

/** The task id of a report message id (`subagent:<task_id>`), or null. */
export function reportTaskId(messageId: string | null | undefined): string | null {
  if (!messageId || !messageId.startsWith(REPORT_PREFIX)) return null;
  // A follow-up's report is `subagent:<task_id>:<n>`: it belongs to the same child.
  return messageId.slice(REPORT_PREFIX.length).replace(/:\d+$/, '');
}

/** The body of a report without its `[Background tool result]` header. */
export function reportBody(text: string): string {
  const match = /^\[Background tool result\]\nTask ID: [^\n]*\n\n?/.exec(text);
  return match ? text.slice(match[0].length) : text;
}

function emptyTranscript(sessionId: string, status: Transcript['status'] = 'idle'): Transcript {
  return {
    sessionId,
    messages: [],
    first: 0,
    loadingEarlier: false,
    status,
    loadError: null,
    notice: null,
    streaming: '',
    tools: {},
    notes: [],
    retry: null,
    slot: null,
    running: false,
    live: status === 'idle' ? [] : null,
    echo: null,
    echoing: false,
    context: null,
    compactions: [],
  };
}

/**
 * Joins the compactions a load read with those events announced meanwhile (by id), oldest
 * first: a compaction made while `get_session` was in flight must not vanish with the load.
 */
/** How many messages a session opens with (its tail); `get_session`'s `last`. */
export const HISTORY_TAIL = 100;
/** How many earlier messages one scroll-up page reads. */
export const HISTORY_PAGE = 100;

export function mergeCompactions(loaded: Compaction[], known: Compaction[]): Compaction[] {
  const ids = new Set(loaded.map((c) => c.id));
  const all = [...loaded, ...known.filter((c) => !ids.has(c.id))];
  return all.sort((a, b) => a.at - b.at);
}

/** The meter a compaction leaves: its estimate after, in the window the last meter named. */
function meterAfter(meter: ContextMeter | null, compaction: Compaction): ContextMeter | null {
  if (!meter || meter.window <= 0) return meter;
  const used = Number(compaction.tokens_after);
  return { used, window: meter.window, percent: Math.min(100, Math.floor((used * 100) / meter.window)) };
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/**
 * Joins a fetched history with the messages events appended meanwhile. Messages are saved
 * before they are announced, so the first few live ones may already be in the fetched list:
 * skip the longest prefix of `live` that `fetched` ends with.
 */
export function mergeHistory(fetched: Message[], live: Message[]): Message[] {
  for (let j = Math.min(live.length, fetched.length); j >= 0; j--) {
    let ok = true;
    for (let k = 0; k < j; k++) {
      if (!same(fetched[fetched.length - j + k], live[k])) {
        ok = false;
        break;
      }
    }
    if (ok) return fetched.concat(live.slice(j));
  }
  return fetched.concat(live);
}

// A paused child failed, or the person stopped it: the stored `failed` says which (an
// older backend without it: failed, as before).
const childStateFromInfo = (info: SessionInfo): SubagentState =>
  info.state === 'running'
    ? 'running'
    : info.state === 'paused'
      ? info.failed === false
        ? 'cancelled'
        : 'failed'
      : 'done';

/**
 * Joins consecutive `content.delta` events of the same session into one (their texts in
 * order); every other event, and the order of all, is kept. Applying a frame's batch then
 * costs one string join per streaming session instead of one state update per delta.
 */
export function mergeDeltas(events: WireEvent[]): WireEvent[] {
  const out: WireEvent[] = [];
  for (const event of events) {
    const prev = out[out.length - 1];
    if (
      prev &&
      event.type === 'event' &&
      event.kind === 'content.delta' &&
      prev.type === 'event' &&
      prev.kind === 'content.delta' &&
      prev.session_id === event.session_id
    ) {
      const text = String((prev.data as any)?.text ?? '') + String((event.data as any)?.text ?? '');
      out[out.length - 1] = { ...prev, data: { ...(prev.data as object), text } } as WireEvent;
    } else {
      out.push(event);
    }
  }
  return out;
}

/** Runs `run` once before the next paint (or soon, where no frame comes: a hidden window). */
export function nextFrame(run: () => void): void {
  let done = false;
  const once = () => {
    if (done) return;
    done = true;
    run();
  };
  const raf = (globalThis as any).requestAnimationFrame as ((cb: () => void) => number) | undefined;
  if (raf) raf(once);
  // A window that is not shown gets no frames: events must not wait for it.
  setTimeout(once, raf ? 100 : 16);
}

/**
 * Time the UI spends applying events and rendering them (ms, since load), read by
 * `ui/e2e/bench-stream.mjs` as `window.__bumblehivePerf`: WebKit has no long-task
 * observer, so the UI accounts for its own work.
 */
export const uiPerf = {
  applyMs: 0,
  renderMs: 0,
  frames: 0,
  events: 0,
  /**
   * Delay from a shown session's `content.delta` reaching the page to its text painted (ms;
   * issue 31): per frame, the oldest such delta it applied, until the task after that
   * frame's paint. The newest `DELTA_PAINT_KEPT` frames are kept.
   */
  deltaToPaint: [] as number[],
};
(globalThis as any).__bumblehivePerf = uiPerf;
const DELTA_PAINT_KEPT = 20_000;

const now = () => (globalThis.performance?.now?.() ?? Date.now());

/**
 * Runs `run` as the first task after the frame being drawn now has painted: a message
 * posted from a frame callback is handled once the engine has rendered that frame, the
 * way schedulers measure paint without a paint event.
 */
function afterPaint(run: () => void): void {
  const Channel = (globalThis as any).MessageChannel as typeof MessageChannel | undefined;
  if (!Channel) return void setTimeout(run, 0);
  const channel = new Channel();
  channel.port1.onmessage = () => {
    channel.port1.close();
    run();
  };
  channel.port2.postMessage(null);
}

export interface ModelOptions {
  /** Called when something that the sessions list shows may have changed. */
  onSessionsChanged?: () => void;
  /**
   * Render coalescing: 0 applies each event and tells listeners at once (tests); otherwise
   * events wait for the next animation frame, are applied as one batch (consecutive deltas
   * merged) and listeners are told once per frame.
   */
  notifyDelay?: number;
  /** Schedules a frame (default `nextFrame`); tests pass their own to step frames by hand. */
  schedule?: (run: () => void) => void;
  /** Every event of the feed, as it arrives (the app-wide attention state reads them). */
  onEvent?: (event: WireEvent) => void;
}

export class SessionModel {
  state: ViewState;
  private listeners = new Set<() => void>();
  private unsubscribe: (() => void) | null = null;
  /** The transcripts on screen (null: assume all): a hidden one's text streams silently. */
  private shown: Set<string> | null = null;
  /** When the oldest shown `content.delta` not yet applied reached the page (`uiPerf`). */
  private deltaSince: number | null = null;
  /** Whether a frame is scheduled (events queued or listeners to tell). */
  private framePending = false;
  private queue: WireEvent[] = [];
  /** While a batch is applied: listeners are told once, at its end. */
  private batching = false;
  private inFrame = false;
  private dirty = false;
  private snapshots = 0;
  private appended = new Set<string>();
  private disposed = false;
  /** Whether this run's instruction files were read (once per run, after its first call). */
  private instructionsRead = false;
  /** Children deleted here: a sessions list read before the deletion must not bring them back. */
  private deletedSessions = new Set<string>();

  constructor(
    readonly platform: Platform,
    readonly sessionId: string,
    private options: ModelOptions = {},
  ) {
    this.state = {
      sessionId,
      info: null,
      stream: 'connecting',
      synced: false,
      running: false,
      paused: false,
      pending: [],
      approvals: [],
      children: [],
      statuses: {},
      inflight: [],
      usage: { input: 0, output: 0 },
      treeUsage: { input: 0, output: 0 },
      transcripts: { [sessionId]: emptyTranscript(sessionId) },
      instructions: [],
      deleted: [],
    };
  }

  // ------------------------------------------------------------------ life cycle

  /** Subscribes first (so nothing is missed), then reads the transcript and merges. */
  start(): void {
    this.unsubscribe = this.platform.subscribe(
      this.sessionId,
      (event) => this.receive(event),
      (status) => this.set({ stream: status }),
    );
    void this.loadTranscript(this.sessionId);
  }

  /**
   * Resolves once the event stream is open, i.e. the backend has subscribed this model (or
   * after `timeoutMs`). Both transports subscribe asynchronously: a command sent before
   * that (the first message of a new conversation) could finish before the subscription
   * exists, and its events (the message, an early error) would never reach the chat.
   */
  whenStreaming(timeoutMs = 5000): Promise<void> {
    if (this.state.stream !== 'connecting' || this.disposed) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        off();
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      const off = this.listen(() => {
        if (this.state.stream !== 'connecting') done();
      });
    });
  }

  dispose(): void {
    this.disposed = true;
    this.unsubscribe?.();
    this.unsubscribe = null;
    this.listeners.clear();
    this.queue = [];
  }

  /**
   * Says which transcripts the window shows. A delta of another one only grows its
   * streaming text (shown by its own chat alone): it tells no listener, so 8 children
   * streaming behind the parent's tab do not re-render the parent's pane every frame.
   */
  setShown(sessionIds: string[] | null): void {
    this.shown = sessionIds ? new Set(sessionIds) : null;
  }

  listen(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private set(patch: Partial<ViewState>): void {
    this.state = { ...this.state, ...patch };
    this.changed();
  }

  private get immediate(): boolean {
    return (this.options.notifyDelay ?? 16) <= 0;
  }

  private changed(): void {
    if (this.disposed) return;
    if (this.batching) {
      this.dirty = true;
      return;
    }
    if (this.immediate) return this.notify();
    this.dirty = true;
    this.scheduleFrame();
  }

  private notify(): void {
    for (const l of [...this.listeners]) l();
  }

  private scheduleFrame(): void {
    if (this.framePending) return;
    this.framePending = true;
    (this.options.schedule ?? nextFrame)(() => this.frame());
  }

  /** One frame: apply what arrived since the last one, then tell listeners once. */
  private frame(): void {
    this.framePending = false;
    if (this.disposed) return;
    const start = now();
    const deltaSince = this.deltaSince;
    this.deltaSince = null;
    const events = this.queue;
    this.queue = [];
    this.inFrame = true;
    try {
      if (events.length) this.applyBatch(events);
    } finally {
      this.inFrame = false;
    }
    const applied = now();
    const dirty = this.dirty;
    this.dirty = false;
    if (dirty) this.notify();
    uiPerf.frames++;
    uiPerf.applyMs += applied - start;
    // Preact renders in a microtask queued by the listeners' state updates: this one runs
    // after it, so the render is counted too.
    void Promise.resolve().then(() => (uiPerf.renderMs += now() - applied));
    if (deltaSince !== null) {
      afterPaint(() => {
        const kept = uiPerf.deltaToPaint;
        kept.push(now() - deltaSince);
        if (kept.length > DELTA_PAINT_KEPT) kept.splice(0, kept.length - DELTA_PAINT_KEPT);
      });
    }
  }

  /** Applies what is queued now, ahead of the frame (listeners are still told at the frame). */
  private drain(): void {
    if (!this.queue.length) return;
    const events = this.queue;
    this.queue = [];
    this.applyBatch(events);
  }

  /** An event from the feed: applied at the next frame (at once with `notifyDelay: 0`). */
  receive(event: WireEvent): void {
    if (this.disposed) return;
    if (this.immediate) return this.apply(event);
    if (
      this.deltaSince === null &&
      event.type === 'event' &&
      event.kind === 'content.delta' &&
      (!this.shown || this.shown.has(event.session_id))
    ) {
      this.deltaSince = now();
    }
    this.queue.push(event);
    this.scheduleFrame();
  }

  /** Applies a frame's events in order (consecutive deltas merged); listeners are told once. */
  applyBatch(events: WireEvent[]): void {
    if (this.disposed) return;
    uiPerf.events += events.length;
    const outer = this.batching;
    this.batching = true;
    try {
      // Every event reaches `onEvent` as it was sent; the merge is for our own state.
      for (const event of events) this.options.onEvent?.(event);
      for (const event of mergeDeltas(events)) this.applyOne(event);
    } finally {
      this.batching = outer;
    }
    if (outer || !this.dirty || this.inFrame) return;
    if (this.immediate) {
      this.dirty = false;
      this.notify();
    } else {
      this.scheduleFrame();
    }
  }

  private transcript(sessionId: string): Transcript {
    return this.state.transcripts[sessionId] ?? emptyTranscript(sessionId);
  }

  private patchTranscript(sessionId: string, patch: (t: Transcript) => Partial<Transcript>): void {
    const current = this.transcript(sessionId);
    const next = { ...current, ...patch(current) };
    this.state = { ...this.state, transcripts: { ...this.state.transcripts, [sessionId]: next } };
    this.changed();
  }

  /** Reads a session's history (`get_session`) and merges what events appended meanwhile. */
  async loadTranscript(sessionId: string): Promise<void> {
    this.patchTranscript(sessionId, (t) => ({
      status: 'loading',
      loadError: null,
      live: t.status === 'idle' || t.status === 'error' ? (t.live ?? []) : [],
      echo: null,
      echoing: false,
    }));
    try {
      // The open session is read by its tail (most of opening a long one was sending all of
      // it); a re-read keeps as much as was loaded. Sub-agents' histories are read whole:
      // they are short, and their tab's usage is summed over all of their messages.
      const before = this.state.transcripts[sessionId];
      const args: GetSession = { session_id: sessionId };
      if (sessionId === this.sessionId) args.last = Math.max(HISTORY_TAIL, before?.status === 'loaded' ? before.messages.length : 0);
      const loaded: SessionWithMessages = await this.platform.invoke('get_session', args);
      if (this.disposed) return;
      // Events that came before the answer must be applied before it is merged (they may
      // be in what was read): the merge and the echo check see them in order.
      this.drain();
      for (const m of loaded.messages) if (m.role === 'user' && m.id) this.appended.add(m.id);
      this.patchTranscript(sessionId, (t) => {
        const live = t.live ?? [];
        return {
          status: 'loaded',
          messages: mergeHistory(loaded.messages, live),
          first: loaded.first_index ?? 0,
          loadingEarlier: false,
          live: null,
          // Nothing arrived yet: the next events may still be echoes of what was read.
          echo: live.length === 0 && loaded.messages.length > 0 ? loaded.messages.slice(-64) : null,
          echoing: false,
          notice: loaded.notice ?? null,
          compactions: mergeCompactions(loaded.compactions ?? [], t.compactions),
        };
      });
      if (sessionId === this.sessionId) {
        this.set({
          info: loaded.info,
          inflight: this.state.inflight.filter((m) => !this.appended.has(m.messageId)),
        });
        // Reports discarded earlier, after a reload too: their marks where they were.
        for (const mark of loaded.discarded ?? []) this.noteDiscard(mark.message_id, mark.at);
      } else {
        const child = this.state.children.find((c) => c.sessionId === sessionId);
        if (!child) this.addChildFromInfo(loaded.info);
      }
    } catch (err) {
      if (this.disposed) return;
      const error = toCommandError(err);
      this.patchTranscript(sessionId, (t) => ({
        status: 'error',
        loadError: error.message,
        // Keep collecting so a retry still merges correctly.
        live: t.live ?? [],
      }));
    }
  }

  /**
   * Reads the page of history before what is loaded (`HISTORY_PAGE` messages) and puts it
   * in front: the person scrolled up or asked for earlier messages. Nothing when all is
   * loaded or a page is already being read. A failure is returned (the chat shows it) and
   * leaves what was loaded as it was.
   */
  async loadEarlier(sessionId: string): Promise<void> {
    const t = this.state.transcripts[sessionId];
    if (!t || t.status !== 'loaded' || t.first <= 0 || t.loadingEarlier) return;
    const first = t.first;
    this.patchTranscript(sessionId, () => ({ loadingEarlier: true }));
    try {
      const args: GetSession = { session_id: sessionId, before: first, last: HISTORY_PAGE };
      const page: SessionWithMessages = await this.platform.invoke('get_session', args);
      if (this.disposed) return;
      this.patchTranscript(sessionId, (now) => {
        // Re-read meanwhile (a gap in the stream): that read is the truth; drop this page.
        if (now.status !== 'loaded' || now.first !== first) return { loadingEarlier: false };
        const pageFirst = page.first_index ?? 0;
        // A page that does not end where the loaded part starts (the history was rewritten
        // meanwhile) is dropped too: the indexes would be wrong.
        if (pageFirst + page.messages.length !== first) return { loadingEarlier: false };
        return {
          messages: page.messages.concat(now.messages),
          first: pageFirst,
          loadingEarlier: false,
          compactions: mergeCompactions(page.compactions ?? [], now.compactions),
        };
      });
      for (const m of page.messages) if (m.role === 'user' && m.id) this.appended.add(m.id);
    } catch (err) {
      if (this.disposed) return;
      this.patchTranscript(sessionId, () => ({ loadingEarlier: false }));
      throw toCommandError(err);
    }
  }

  /** Opens a child's tab: its history is read on first view. */
  ensureTranscript(sessionId: string): void {
    const t = this.state.transcripts[sessionId];
    if (!t || t.status === 'idle') void this.loadTranscript(sessionId);
  }

  /** Re-reads the snapshot (e.g. to learn the text of a report that was just queued). */
  async refreshSnapshot(): Promise<void> {
    try {
      const args: SessionRef = { session_id: this.sessionId };
      const snapshot: Snapshot = await this.platform.invoke('snapshot', args);
      if (!this.disposed) this.applySnapshot(snapshot, false);
    } catch {
      /* the stream will bring it */
    }
  }

  /** Reads the loaded instruction files from the snapshot (only they are taken). */
  private async readInstructions(): Promise<void> {
    try {
      const args: SessionRef = { session_id: this.sessionId };
      const snapshot: Snapshot = await this.platform.invoke('snapshot', args);
      if (this.disposed || !snapshot) return;
      this.set({ instructions: snapshot.instructions ?? [] });
    } catch {
      /* the next snapshot brings them */
    }
  }

  /** Reads the text of an in-flight report from the snapshot (only that text is taken). */
  private async fillReportText(messageId: string): Promise<void> {
    try {
      const args: SessionRef = { session_id: this.sessionId };
      const snapshot: Snapshot = await this.platform.invoke('snapshot', args);
      const text = snapshot.pending.find((p) => p.message_id === messageId)?.content;
      if (this.disposed || text == null) return;
      if (!this.state.inflight.some((m) => m.messageId === messageId && m.content == null)) return;
      this.set({ inflight: this.state.inflight.map((m) => (m.messageId === messageId && m.content == null ? { ...m, content: text } : m)) });
    } catch {
      /* the card says the text comes with the history */
    }
  }

  /** Adds tabs for children that the sessions list knows (finished ones are not in the snapshot). */
  mergeChildren(sessions: SessionInfo[]): void {
    const mine = new Set([this.sessionId, ...this.state.children.map((c) => c.sessionId)]);
    let changed = false;
    const children = [...this.state.children];
    // Children of children too, in list order.
    for (let pass = 0; pass < 4; pass++) {
      for (const info of sessions) {
        if (!info.parent_session_id || !mine.has(info.parent_session_id) || this.deletedSessions.has(info.session_id)) continue;
        const index = children.findIndex((c) => c.sessionId === info.session_id);
        if (index < 0) {
          children.push({
            sessionId: info.session_id,
            parentSessionId: info.parent_session_id,
            taskId: info.task_id ?? null,
            title: info.title,
            state: childStateFromInfo(info),
            interrupted: info.interrupted,
          });
          mine.add(info.session_id);
          changed = true;
        }
      }
    }
    if (changed) this.set({ children });
  }

  private addChildFromInfo(info: SessionInfo): void {
    if (!info.parent_session_id) return;
    this.set({
      children: [
        ...this.state.children,
        {
          sessionId: info.session_id,
          parentSessionId: info.parent_session_id,
          taskId: info.task_id ?? null,
          title: info.title,
          state: childStateFromInfo(info),
          interrupted: info.interrupted,
        },
      ],
    });
  }

  // ------------------------------------------------------------------ events

  apply(event: WireEvent): void {
    if (this.disposed) return;
    this.options.onEvent?.(event);
    this.applyOne(event);
  }

  private applyOne(event: WireEvent): void {
    switch (event.type) {
      case 'snapshot':
        return this.applySnapshot(event as Snapshot, true);
      case 'session_created':
        return this.onSessionCreated(event);
      case 'message_status':
        return this.onStatus(event.session_id, event.message_id, event.status);
      case 'approval_request': {
        const { type: _type, ...info } = event as { type: string } & ApprovalInfo;
        if (this.state.approvals.some((a) => a.approval_id === info.approval_id)) return;
        this.set({ approvals: [...this.state.approvals, info] });
        return;
      }
      case 'approval_resolved':
        this.set({ approvals: this.state.approvals.filter((a) => a.approval_id !== event.approval_id) });
        return;
      case 'event':
        // `data` by `kind`, as the runtime's `Progress` type says (generated from Rust).
        return this.onProgress(event.session_id, { kind: event.kind, data: event.data ?? {} } as Progress);
      case 'result':
        return this.onRunEnd(event.session_id, null);
      case 'error':
        return this.onRunEnd(event.session_id, event.message);
    }
  }

  private applySnapshot(snapshot: Snapshot, fromStream: boolean): void {
    if (snapshot.session_id !== this.sessionId) return;
    const resync = fromStream && this.snapshots++ > 0;
    const queued = snapshot.pending.filter((p) => p.status === 'queued');
    const steered: Inflight[] = snapshot.pending
      .filter((p) => p.status !== 'queued')
      .map((p) => ({ messageId: p.message_id, content: p.content, status: p.status, ...(p.images?.length ? { images: p.images } : {}) }));
    const statuses = { ...this.state.statuses };
    for (const p of snapshot.pending) statuses[p.message_id] = p.status;
    // Started messages of a run in flight are not in the snapshot: keep them until appended.
    const started = this.state.inflight.filter(
      (m) => m.status === 'started' && snapshot.running && !steered.some((s) => s.messageId === m.messageId),
    );
    let children = [...this.state.children];
    for (const info of snapshot.subagents) if (!this.deletedSessions.has(info.session_id)) children = upsertChild(children, info);
    this.state = {
      ...this.state,
      synced: true,
      stream: 'open',
      running: snapshot.running,
      paused: snapshot.paused,
      pending: queued,
      approvals: snapshot.approvals,
      children,
      statuses,
      inflight: [...started, ...steered],
      usage: tokens(snapshot.usage),
      treeUsage: tokens(snapshot.tree_usage),
      instructions: snapshot.instructions ?? [],
    };
    const own = this.transcript(this.sessionId);
    this.patchTranscript(this.sessionId, () => ({
      running: snapshot.running,
      streaming: snapshot.running ? own.streaming : '',
      // Before the first model call of this process the runtime knows no meter: keep ours.
      context: snapshot.context ?? own.context,
    }));
    if (resync) {
      // We missed events: read every transcript we show again.
      for (const t of Object.values(this.state.transcripts)) {
        if (t.status === 'loaded' || t.status === 'error') void this.loadTranscript(t.sessionId);
      }
      this.options.onSessionsChanged?.();
    }
  }

  private onSessionCreated(event: Extract<WireEvent, { type: 'session_created' }>): void {
    if (event.session_id === this.sessionId) return;
    const exists = this.state.children.some((c) => c.sessionId === event.session_id);
    if (!exists) {
      this.set({
        children: [
          ...this.state.children,
          {
            sessionId: event.session_id,
            parentSessionId: event.parent_session_id,
            taskId: event.task_id,
            title: event.title,
            state: 'waiting_for_slot',
          },
        ],
      });
      // A new session has no history but what its events bring.
      if (!this.state.transcripts[event.session_id]) {
        this.state = {
          ...this.state,
          transcripts: { ...this.state.transcripts, [event.session_id]: emptyTranscript(event.session_id, 'loaded') },
        };
      }
    }
    this.options.onSessionsChanged?.();
  }

  /**
   * A report means its child finished, whatever state events said or missed (a child's
   * last state event can be lost when its controller goes first): its tab says so.
   */
  private reportArrived(messageId: string, content: string | null | undefined): void {
    const taskId = reportTaskId(messageId);
    if (!taskId) return;
    const failed = content != null && reportBody(content).startsWith('Error:');
    const stale = this.state.children.some((c) => c.taskId === taskId && (c.state === 'running' || c.state === 'waiting_for_slot'));
    if (!stale) return;
    this.set({
      children: this.state.children.map((c) =>
        c.taskId === taskId && (c.state === 'running' || c.state === 'waiting_for_slot') ? { ...c, state: failed ? 'failed' : 'done' } : c,
      ),
    });
  }

  private onStatus(sessionId: string, messageId: string, status: MessageStatus): void {
    if (sessionId === this.sessionId) this.reportArrived(messageId, this.state.pending.find((p) => p.message_id === messageId)?.content);
    if (sessionId !== this.sessionId) {
      if (status !== 'queued') this.patchTranscript(sessionId, () => ({ running: true }));
      return;
    }
    const statuses = { ...this.state.statuses, [messageId]: status };
    const known =
      this.state.pending.find((p) => p.message_id === messageId)?.content ??
      this.state.inflight.find((m) => m.messageId === messageId)?.content ??
      null;
    let pending = this.state.pending;
    let inflight = this.state.inflight.filter((m) => m.messageId !== messageId);
    const patch: Partial<ViewState> = { statuses };
    if (status === 'queued') {
      if (!pending.some((p) => p.message_id === messageId)) {
        pending = [
          ...pending,
          { message_id: messageId, content: known ?? '', status, config: { runtime: {} } as PendingMessage['config'] },
        ];
        // The event has no text: the snapshot has it.
        if (known == null) void this.refreshSnapshot();
      }
    } else {
      pending = pending.filter((p) => p.message_id !== messageId);
      if (!this.appended.has(messageId)) inflight = [...inflight, { messageId, content: known, status }];
      // A report the runtime steered in by itself: the snapshot has its text (D19).
      if (known == null && reportTaskId(messageId) && !this.appended.has(messageId)) void this.fillReportText(messageId);
      patch.running = true;
      if (status === 'started') patch.paused = false;
    }
    this.set({ ...patch, pending, inflight });
    if (status === 'started') {
      this.patchTranscript(sessionId, () => ({ running: true }));
      this.options.onSessionsChanged?.();
    }
  }

  private onProgress(sessionId: string, progress: Progress): void {
    const own = sessionId === this.sessionId;
    switch (progress.kind) {
      case 'content.delta': {
        const t = this.state.transcripts[sessionId];
        if (this.shown && !this.shown.has(sessionId) && t && t.running && !t.retry) {
          const next = { ...t, streaming: t.streaming + String(progress.data.text ?? '') };
          this.state = { ...this.state, transcripts: { ...this.state.transcripts, [sessionId]: next } };
          return;
        }
        this.patchTranscript(sessionId, (t) => ({
          streaming: t.streaming + String(progress.data.text ?? ''),
          running: true,
          retry: null,
          slot: null,
        }));
        return;
      }
      case 'message.appended': {
        const message = progress.data.message as Message | undefined;
        if (!message) return;
        if (this.isEcho(sessionId, message)) return;
        this.patchTranscript(sessionId, (t) => ({
          messages: [...t.messages, message],
          live: t.live ? [...t.live, message] : null,
          streaming: message.role === 'assistant' ? '' : t.streaming,
          retry: null,
          slot: null,
        }));
        if (message.role === 'user' && message.id) {
          this.reportArrived(message.id, message.content);
          this.appended.add(message.id);
          if (own) this.set({ inflight: this.state.inflight.filter((m) => m.messageId !== message.id) });
        }
        if (message.usage) {
          const add = tokens(message.usage);
          const sum = (a: Tokens) => ({ input: a.input + add.input, output: a.output + add.output });
          this.set({
            treeUsage: sum(this.state.treeUsage),
            usage: own ? sum(this.state.usage) : this.state.usage,
          });
        }
        return;
      }
      case 'tool.call.started':
        this.patchTranscript(sessionId, (t) => ({
          tools: { ...t.tools, [progress.data.call_id]: { running: true } },
          running: true,
        }));
        return;
      case 'tool.call.finished':
        this.patchTranscript(sessionId, (t) => ({
          tools: {
            ...t.tools,
            [progress.data.call_id]: { running: false, result: String(progress.data.result ?? ''), isError: Boolean(progress.data.is_error) },
          },
        }));
        return;
      case 'run.cancelled':
        this.patchTranscript(sessionId, (t) => ({
          running: false,
          streaming: '',
          retry: null,
          slot: null,
          // Text streamed before the stop stays visible (the runtime saves it as the
          // stopped answer when it can; until then it is only here).
          notes: [...t.notes, { kind: 'stopped', text: 'Stopped.', at: t.first + t.messages.length, partial: t.streaming || undefined }],
        }));
        if (own) this.set({ running: false, paused: true });
        this.options.onSessionsChanged?.();
        return;
      case 'run.interrupted':
        // Cut off without the person's Stop (an ACP agent's process died): the sub-agent is
        // interrupted, and the list (refreshed below) offers Resume and Cancel.
        this.patchTranscript(sessionId, (t) => ({
          running: false,
          streaming: '',
          retry: null,
          slot: null,
          notes: [...t.notes, { kind: 'notice', text: `Interrupted: ${progress.data.message}. Resume the sub-agent to go on, or cancel it.`, at: t.first + t.messages.length }],
        }));
        if (own) this.set({ running: false, paused: true });
        this.options.onSessionsChanged?.();
        return;
      case 'message.discarded': {
        if (!own) return;
        const id = progress.data.message_id;
        const item = this.state.pending.find((p) => p.message_id === id);
        this.set({ pending: this.state.pending.filter((p) => p.message_id !== id) });
        if (item) this.noteDiscard(id);
        return;
      }
      case 'subagent.state':
        this.set({
          children: this.state.children.map((c) =>
            c.sessionId === sessionId || (progress.data.task_id && c.taskId === progress.data.task_id)
              ? { ...c, state: progress.data.state as SubagentState }
              : c,
          ),
        });
        if (progress.data.state !== 'running' && progress.data.state !== 'waiting_for_slot') this.options.onSessionsChanged?.();
        return;
      case 'loop.warning':
        this.patchTranscript(sessionId, (t) => ({
          notes: [
            ...t.notes,
            {
              kind: 'notice',
              text: `The agent made the same ${progress.data.name} call ${progress.data.repeats} times in a row; Bumblehive told it to try something else.`,
              at: t.first + t.messages.length,
            },
          ],
        }));
        return;
      case 'mcp.trust_needed': {
        const text = `This workspace's .mcp.json wants to start ${progress.data.servers.join(', ')}: programs the repository chose. This turn runs without them; trust or refuse them in Settings.`;
        this.patchTranscript(sessionId, (t) => ({
          // Asked again each turn until answered: one note for the same question.
          notes: t.notes.some((n) => n.text === text) ? t.notes : [...t.notes, { kind: 'notice', text, at: t.first + t.messages.length, action: 'open-settings' }],
        }));
        return;
      }
      case 'slot.waiting':
        this.patchTranscript(sessionId, () => ({
          slot: { server: String(progress.data.server ?? ''), ahead: Number(progress.data.ahead ?? 0) },
        }));
        return;
      case 'provider.retry':
        this.patchTranscript(sessionId, () => ({
          retry: { attempt: Number(progress.data.attempt ?? 0), delay_ms: Number(progress.data.delay_ms ?? 0), reason: String(progress.data.reason ?? '') },
        }));
        return;
      case 'context.usage': {
        const meter = progress.data.meter;
        if (!meter) return;
        this.patchTranscript(sessionId, () => ({ context: meter }));
        // The run that made this call has loaded its instruction files: the snapshot lists them.
        if (own && !this.instructionsRead) {
          this.instructionsRead = true;
          void this.readInstructions();
        }
        return;
      }
      case 'context.compacted': {
        const compaction = progress.data.compaction;
        if (!compaction?.id) return;
        this.patchTranscript(sessionId, (t) =>
          t.compactions.some((c) => c.id === compaction.id)
            ? {}
            : { compactions: mergeCompactions(t.compactions, [compaction]), context: meterAfter(t.context, compaction) },
        );
        return;
      }
    }
  }

  /** Whether an appended message is one the last load already read (see `Transcript.echo`). */
  private isEcho(sessionId: string, message: Message): boolean {
    const t = this.state.transcripts[sessionId];
    if (!t?.echo) return false;
    const echo = t.echo;
    let index = -1;
    if (t.echoing) index = same(echo[0], message) ? 0 : -1;
    else for (let k = echo.length - 1; k >= 0 && index < 0; k--) if (same(echo[k], message)) index = k;
    if (index < 0) {
      this.state = { ...this.state, transcripts: { ...this.state.transcripts, [sessionId]: { ...t, echo: null, echoing: false } } };
      return false;
    }
    const rest = echo.slice(index + 1);
    this.state = {
      ...this.state,
      transcripts: { ...this.state.transcripts, [sessionId]: { ...t, echo: rest.length ? rest : null, echoing: rest.length > 0 } },
    };
    return true;
  }

  private onRunEnd(sessionId: string, error: string | null): void {
    this.patchTranscript(sessionId, (t) => ({
      running: false,
      streaming: '',
      retry: null,
      slot: null,
      notes: error == null ? t.notes : [...t.notes, { kind: 'error', text: error, at: t.first + t.messages.length }],
    }));
    if (sessionId === this.sessionId) {
      this.instructionsRead = false;
      this.set({ running: false, paused: error != null });
    }
    this.options.onSessionsChanged?.();
  }

  /**
   * Sends a message to a sub-agent (typed into its tab, or Retry): a finished or failed child
   * runs again and reports again to its parent, so its tab shows it running at once.
   */
  async submitToChild(sessionId: string, content: string, images: ImagePart[] = []): Promise<void> {
    const args: Submit = { session_id: sessionId, content, config: null };
    if (images.length) args.images = images;
    await this.platform.invoke('submit', args);
    if (this.disposed) return;
    this.set({ children: this.state.children.map((c) => (c.sessionId === sessionId ? { ...c, state: 'running', interrupted: false } : c)) });
    this.patchTranscript(sessionId, () => ({ running: true }));
  }

  /**
   * Drops a child's tab (after `delete_session`). A deleted child never reports (SPEC), so the
   * parent's chat says so where it happened, and its `sub_agent` card says "deleted".
   */
  removeChild(sessionId: string): void {
    const child = this.state.children.find((c) => c.sessionId === sessionId);
    const { [sessionId]: _gone, ...transcripts } = this.state.transcripts;
    this.deletedSessions.add(sessionId);
    this.set({
      children: this.state.children.filter((c) => c.sessionId !== sessionId),
      transcripts,
      deleted: child?.taskId ? [...this.state.deleted, child.taskId] : this.state.deleted,
    });
    if (!child) return;
    const parent = child.parentSessionId && this.state.transcripts[child.parentSessionId] ? child.parentSessionId : this.sessionId;
    const active = child.state === 'running' || child.state === 'waiting_for_slot' || child.interrupted;
    const text = active ? `Sub-agent “${child.title}” was deleted; it will not report.` : `Sub-agent “${child.title}” was deleted.`;
    this.patchTranscript(parent, (t) => ({ notes: [...t.notes, { kind: 'notice', text, at: t.first + t.messages.length }] }));
  }

  // ------------------------------------------------------------------ derived

  childFor(taskId: string | null | undefined): ChildTab | undefined {
    if (!taskId) return undefined;
    return this.state.children.find((c) => c.taskId === taskId);
  }

  childUsage(sessionId: string): Tokens {
    const t = this.state.transcripts[sessionId];
    const sum = { input: 0, output: 0 };
    for (const m of t?.messages ?? []) {
      const u = tokens(m.usage);
      sum.input += u.input;
      sum.output += u.output;
    }
    return sum;
  }

  // ------------------------------------------------------------------ actions

  /** `runtime`: this turn's own choices (a custom command's model and tools). */
  async submit(content: string, images: ImagePart[] = [], runtime?: Partial<RuntimeSettings>): Promise<void> {
    const args: Submit = { session_id: this.sessionId, content, config: runtime ? ({ runtime } as RunConfig) : null };
    if (images.length) args.images = images;
    const result: Submitted = await this.platform.invoke('submit', args);
    if (this.disposed) return;
    const id = result.message_id;
    const statuses = { ...this.state.statuses, [id]: result.status };
    if (result.status === 'queued') {
      const pending = this.state.pending.filter((p) => p.message_id !== id);
      pending.push({ message_id: id, content, status: 'queued', config: { runtime: {} } as PendingMessage['config'], ...(images.length ? { images } : {}) });
      this.set({ statuses, pending });
    } else {
      const inflight = this.state.inflight.filter((m) => m.messageId !== id);
      if (!this.appended.has(id)) inflight.push({ messageId: id, content, status: result.status, ...(images.length ? { images } : {}) });
      this.set({ statuses, inflight, running: true, paused: false });
    }
  }

  /** Compacts the history now (a running session does it before its next model call). */
  async compact(sessionId: string = this.sessionId): Promise<void> {
    const args: SessionRef = { session_id: sessionId };
    await this.platform.invoke('compact', args);
  }

  async cancel(sessionId: string = this.sessionId): Promise<void> {
    const args: SessionRef = { session_id: sessionId };
    await this.platform.invoke('cancel', args);
  }

  /** Continues a child that a crash or restart cut off, from its own history. */
  async resumeChild(sessionId: string): Promise<void> {
    const args: SessionRef = { session_id: sessionId };
    await this.platform.invoke('resume_subagent', args);
    this.set({
      children: this.state.children.map((c) => (c.sessionId === sessionId ? { ...c, interrupted: false, state: 'running' } : c)),
    });
  }

  /** Cancels an interrupted child: its parent gets an error report instead of waiting. */
  async cancelInterrupted(sessionId: string): Promise<void> {
    await this.cancel(sessionId);
    this.set({
      children: this.state.children.map((c) => (c.sessionId === sessionId ? { ...c, interrupted: false, state: 'cancelled' } : c)),
    });
  }

  async steer(messageId: string): Promise<void> {
    const item = this.state.pending.find((p) => p.message_id === messageId);
    const args: MessageRef = { session_id: this.sessionId, message_id: messageId };
    const result: Steered = await this.platform.invoke('steer', args);
    if (this.disposed) return;
    const pending = this.state.pending.filter((p) => p.message_id !== messageId);
    const inflight = this.state.inflight.filter((m) => m.messageId !== messageId);
    if (!this.appended.has(messageId)) inflight.push({ messageId, content: item?.content ?? null, status: result.status, ...(item?.images?.length ? { images: item.images } : {}) });
    this.set({
      pending,
      inflight,
      statuses: { ...this.state.statuses, [messageId]: result.status },
      running: true,
      paused: false,
    });
  }

  /** Resumes every waiting message, oldest first (the first starts the run, the rest steer in). */
  async steerAll(): Promise<void> {
    for (const p of [...this.state.pending]) await this.steer(p.message_id);
  }

  async discard(messageId: string): Promise<void> {
    const args: MessageRef = { session_id: this.sessionId, message_id: messageId };
    await this.platform.invoke('discard', args);
    if (this.disposed) return;
    this.set({ pending: this.state.pending.filter((p) => p.message_id !== messageId) });
    this.noteDiscard(messageId);
  }

  /** Discards already marked in the chat (the answer and the event both say it). */
  private discardsNoted = new Set<string>();

  /**
   * A mark in the chat where the discarded message would have gone, so a discard leaves a
   * trace (D22): at once when it happens, and from `get_session`'s `discarded` (the
   * runtime's ledger keeps each report's discard and where it was) after a reload.
   */
  private noteDiscard(messageId: string, at?: number): void {
    if (this.discardsNoted.has(messageId)) return;
    this.discardsNoted.add(messageId);
    const taskId = reportTaskId(messageId);
    const title = taskId ? (this.state.children.find((c) => c.taskId === taskId)?.title ?? 'a sub-agent') : null;
    const text = title ? `You discarded the report from “${title}”: the agent will not see it.` : 'You discarded a waiting message: the agent will not see it.';
    this.patchTranscript(this.sessionId, (t) => ({ notes: [...t.notes, { kind: 'notice', text, at: at ?? t.first + t.messages.length }] }));
  }

  async decide(approval: ApprovalInfo, approved: boolean, remember = false, reason: string | null = null): Promise<void> {
    await decideApproval(this.platform, approval, approved, remember, reason);
    if (this.disposed) return;
    this.set({ approvals: this.state.approvals.filter((a) => a.approval_id !== approval.approval_id) });
  }
}

/**
 * Decides an approval: the one path of the approval dock and of the inbox (E21). A denial
 * may carry the person's reason (told to the agent); "remember" only with an approval.
 * An approval already decided (the run stopped meanwhile, another window) counts as done.
 */
export async function decideApproval(
  platform: Platform,
  approval: ApprovalInfo,
  approved: boolean,
  remember = false,
  reason: string | null = null,
): Promise<void> {
  try {
    const args: DecideApproval = {
      // The asking session (a child's id when a sub-agent asks); its ancestors may decide too.
      session_id: approval.session_id,
      approval_id: approval.approval_id,
      approved,
      remember: approved && remember,
      reason: approved ? null : reason && reason.trim() ? reason.trim() : null,
    };
    await platform.invoke('decide_approval', args);
  } catch (err) {
    const error = toCommandError(err);
    if (error.code !== 'not_found') throw error;
  }
}

function upsertChild(children: ChildTab[], info: SubagentInfo): ChildTab[] {
  const index = children.findIndex((c) => c.sessionId === info.session_id);
  const tab: ChildTab = {
    sessionId: info.session_id,
    parentSessionId: info.parent_session_id,
    taskId: info.task_id,
    title: info.title,
    state: info.state,
    server: info.server ?? children[index]?.server ?? null,
  };
  if (index < 0) return [...children, tab];
  const next = [...children];
  next[index] = tab;
  return next;
}

export { CommandError };

// ---------------------------------------------------------------------------------------
// Attention across sessions: what needs the person in every top-level session of the open
// workspace, built from each root's feed (a descendant's events reach its root's feed).
// Pure: `reduceRoot` folds one event into a root's state and says what to notify about;
// `summarize` counts what the badges, the inbox, the title and the status line show. An
// app-wide feed can later replace the per-root subscriptions without changing either.

export interface RootAttention {
  rootId: string;
  /** The root's own run. */
  running: boolean;
  approvals: ApprovalInfo[];
  /** Sub-agents of the tree by session id. */
  children: Record<string, { state: SubagentState; title: string; parent: string | null; taskId?: string | null }>;
  /** Queued reports waiting in the root's tray (the root is paused). */
  waitingReports: string[];
  /** Sessions of the tree whose run failed and which the person has not looked at since. */
  failed: string[];
  /** Sessions of the tree whose next model call waits for a slot of its server (`slot.waiting`). */
  slots: string[];
}

export type AlertKind = 'approval' | 'failed' | 'reports';

/** Something worth an OS notification when the window is not focused. */
export interface Alert {
  kind: AlertKind;
  rootId: string;
  sessionId: string;
  text: string;
}

export function emptyRoot(rootId: string): RootAttention {
  return { rootId, running: false, approvals: [], children: {}, waitingReports: [], failed: [], slots: [] };
}

const withFailed = (list: string[], id: string) => (list.includes(id) ? list : [...list, id]);

/** A session's wait for a slot is over (it streams, calls a tool, or its run ended). */
function slotOver(root: RootAttention, sessionId: string): RootAttention {
  return root.slots.includes(sessionId) ? { ...root, slots: root.slots.filter((id) => id !== sessionId) } : root;
}

/**
 * A session was deleted: it and everything below it leave the tree, so nothing counts it
 * as running or waiting any more (a deleted running child must not keep "1 running" and the
 * quit question, E4).
 */
export function forgetSession(root: RootAttention, sessionId: string): RootAttention {
  const gone = new Set([sessionId]);
  for (let pass = 0; pass < 8; pass++) {
    for (const [id, c] of Object.entries(root.children)) if (c.parent && gone.has(c.parent)) gone.add(id);
  }
  if (![...gone].some((id) => id in root.children || root.slots.includes(id) || root.failed.includes(id) || root.approvals.some((a) => a.session_id === id))) return root;
  return {
    ...root,
    children: Object.fromEntries(Object.entries(root.children).filter(([id]) => !gone.has(id))),
    approvals: root.approvals.filter((a) => !gone.has(a.session_id)),
    failed: root.failed.filter((id) => !gone.has(id)),
    slots: root.slots.filter((id) => !gone.has(id)),
  };
}

/** Folds one event of a root's feed into its attention state. */
export function reduceRoot(root: RootAttention, event: WireEvent, titles: Record<string, string> = {}): { root: RootAttention; alerts: Alert[] } {
  const alerts: Alert[] = [];
  const name = (id: string) => root.children[id]?.title ?? titles[id] ?? 'a session';
  // Which conversation it is about, when the list knows its title (E21).
  const where = titles[root.rootId] ? ` in “${titles[root.rootId]}”` : '';
  let next = root;
  switch (event.type) {
    case 'snapshot': {
      const snap = event as unknown as Snapshot;
      if (snap.session_id !== root.rootId) break;
      const children = { ...root.children };
      for (const s of snap.subagents) children[s.session_id] = { state: s.state, title: s.title, parent: s.parent_session_id, taskId: s.task_id };
      next = {
        ...root,
        running: snap.running,
        approvals: snap.approvals,
        children,
        waitingReports: snap.pending.filter((p) => p.status === 'queued' && reportTaskId(p.message_id)).map((p) => p.message_id),
      };
      break;
    }
    case 'session_created':
      if (event.session_id !== root.rootId) {
        next = {
          ...root,
          children: { ...root.children, [event.session_id]: { state: 'waiting_for_slot', title: event.title, parent: event.parent_session_id, taskId: event.task_id } },
        };
      }
      break;
    case 'approval_request': {
      const { type: _t, ...info } = event as { type: string } & ApprovalInfo;
      if (root.approvals.some((a) => a.approval_id === info.approval_id)) break;
      next = { ...root, approvals: [...root.approvals, info] };
      const who = info.session_id === root.rootId ? 'The agent' : `Sub-agent “${info.title ?? name(info.session_id)}”`;
      alerts.push({ kind: 'approval', rootId: root.rootId, sessionId: info.session_id, text: `${who} asks to run ${info.tool}${where}` });
      break;
    }
    case 'approval_resolved':
      next = { ...root, approvals: root.approvals.filter((a) => a.approval_id !== event.approval_id) };
      break;
    case 'message_status': {
      if (event.session_id !== root.rootId) {
        // A follow-up or Retry started a finished sub-agent again: it runs.
        const known = root.children[event.session_id];
        if (event.status === 'started' && known && known.state !== 'running' && known.state !== 'waiting_for_slot') {
          next = { ...root, children: { ...root.children, [event.session_id]: { ...known, state: 'running' } } };
        }
        break;
      }
      if (event.status === 'started' && !root.running) next = { ...root, running: true };
      if (!reportTaskId(event.message_id)) break;
      next = reported(next, reportTaskId(event.message_id)!, false, alerts, titles);
      const waiting = next.waitingReports.filter((id) => id !== event.message_id);
      next = { ...next, waitingReports: event.status === 'queued' ? [...waiting, event.message_id] : waiting };
      break;
    }
    case 'event': {
      const data = (event.data ?? {}) as any;
      if (event.kind === 'slot.waiting') {
        if (!root.slots.includes(event.session_id)) next = { ...root, slots: [...root.slots, event.session_id] };
        break;
      }
      // The model answers (or the run ended): the wait for a slot is over.
      const answered = event.kind === 'message.appended' && (data.message as Message | undefined)?.role === 'assistant';
      if (answered || event.kind === 'content.delta' || event.kind === 'tool.call.started' || event.kind === 'run.cancelled' || event.kind === 'run.interrupted') root = slotOver(root, event.session_id);
      next = root;
      if (event.kind === 'message.discarded' && event.session_id === root.rootId) {
        // The person discarded a waiting report: the tray's count follows (E4).
        const id = String(data.message_id ?? '');
        if (root.waitingReports.includes(id)) next = { ...root, waitingReports: root.waitingReports.filter((m) => m !== id) };
      } else if (event.kind === 'subagent.state' && event.session_id !== root.rootId) {
        const state = data.state as SubagentState;
        if (state !== 'running' && state !== 'waiting_for_slot') root = slotOver(root, event.session_id);
        const known = root.children[event.session_id];
        const children = {
          ...root.children,
          [event.session_id]: { state, title: known?.title ?? titles[event.session_id] ?? '', parent: known?.parent ?? null, taskId: known?.taskId ?? data.task_id ?? null },
        };
        next = { ...root, children, failed: state === 'failed' ? withFailed(root.failed, event.session_id) : root.failed };
        if (state === 'failed') alerts.push({ kind: 'failed', rootId: root.rootId, sessionId: event.session_id, text: `Sub-agent “${name(event.session_id)}” failed${where}` });
        const busy = Object.values(children).some((c) => c.state === 'running' || c.state === 'waiting_for_slot');
        const wasBusy = Object.values(root.children).some((c) => c.state === 'running' || c.state === 'waiting_for_slot');
        if ((state === 'done' || state === 'failed') && wasBusy && !busy) {
          alerts.push({ kind: 'reports', rootId: root.rootId, sessionId: root.rootId, text: `Every sub-agent of “${titles[root.rootId] ?? 'a session'}” has reported` });
        }
      } else if (event.kind === 'message.appended' && event.session_id === root.rootId) {
        const m = data.message as Message | undefined;
        const taskId = m?.role === 'user' ? reportTaskId(m.id) : null;
        if (taskId) next = reported(root, taskId, reportBody(m?.content ?? '').startsWith('Error:'), alerts, titles);
      } else if ((event.kind === 'run.cancelled' || event.kind === 'run.interrupted') && event.session_id === root.rootId) {
        next = { ...root, running: false };
      }
      break;
    }
    case 'result':
      root = next = slotOver(root, event.session_id);
      if (event.session_id === root.rootId) next = { ...root, running: false };
      break;
    case 'error':
      root = slotOver(root, event.session_id);
      next = { ...root, running: event.session_id === root.rootId ? false : root.running, failed: withFailed(root.failed, event.session_id) };
      if (event.session_id === root.rootId) alerts.push({ kind: 'failed', rootId: root.rootId, sessionId: event.session_id, text: `“${name(event.session_id)}” failed: ${event.message}` });
      break;
  }
  return { root: next, alerts };
}

/**
 * A report of a task arrived: its child finished even if its last state event was lost.
 * Announces "every sub-agent has reported" when that was the last one working.
 */
function reported(root: RootAttention, taskId: string, failed: boolean, alerts: Alert[], titles: Record<string, string>): RootAttention {
  const entry = Object.entries(root.children).find(([, c]) => c.taskId === taskId);
  if (!entry || (entry[1].state !== 'running' && entry[1].state !== 'waiting_for_slot')) return root;
  const children = { ...root.children, [entry[0]]: { ...entry[1], state: (failed ? 'failed' : 'done') as SubagentState } };
  const busy = Object.values(children).some((c) => c.state === 'running' || c.state === 'waiting_for_slot');
  if (!busy) alerts.push({ kind: 'reports', rootId: root.rootId, sessionId: root.rootId, text: `Every sub-agent of “${titles[root.rootId] ?? 'a session'}” has reported` });
  return { ...root, children, failed: failed ? withFailed(root.failed, entry[0]) : root.failed };
}

/** The person looked at a session: its failure no longer asks for attention. */
export function acknowledge(root: RootAttention, sessionId: string): RootAttention {
  return root.failed.includes(sessionId) ? { ...root, failed: root.failed.filter((id) => id !== sessionId) } : root;
}

export interface SessionNeeds {
  approvals: number;
  failed: boolean;
  reports: number;
}

export interface AttentionSummary {
  /** How many things need the person (approvals, unseen failures, trays with reports). */
  count: number;
  /** Per session id (roots also count their whole tree). */
  sessions: Record<string, SessionNeeds>;
  approvals: ApprovalInfo[];
  /** Unseen failures (a root's own run, or a sub-agent of it). */
  failed: { rootId: string; sessionId: string }[];
  /** Roots with reports waiting in their tray. */
  trays: { rootId: string; count: number }[];
}

export function summarize(roots: RootAttention[]): AttentionSummary {
  const sessions: Record<string, SessionNeeds> = {};
  const at = (id: string) => (sessions[id] ??= { approvals: 0, failed: false, reports: 0 });
  let count = 0;
  const approvals: ApprovalInfo[] = [];
  const failed: AttentionSummary['failed'] = [];
  const trays: AttentionSummary['trays'] = [];
  for (const root of roots) {
    for (const a of root.approvals) {
      approvals.push(a);
      at(a.session_id).approvals++;
      if (a.session_id !== root.rootId) at(root.rootId).approvals++;
      count++;
    }
    for (const id of root.failed) {
      failed.push({ rootId: root.rootId, sessionId: id });
      at(id).failed = true;
      if (id !== root.rootId) at(root.rootId).failed = true;
      count++;
    }
    if (root.waitingReports.length) {
      at(root.rootId).reports = root.waitingReports.length;
      trays.push({ rootId: root.rootId, count: root.waitingReports.length });
      count++;
    }
  }
  return { count, sessions, approvals, failed, trays };
}

/**
 * The window title: "Fix the parser — Bumblehive — 2 need you". It names the session on
 * screen first, so the taskbar and a window switcher tell windows and sessions apart
 * (D26); the count of what waits for the person stays at the end.
 */
export function windowTitle(count: number, session?: string | null): string {
  const base = count > 0 ? `Bumblehive — ${count} need${count === 1 ? 's' : ''} you` : 'Bumblehive';
  const name = session?.trim();
  return name ? `${name} — ${base}` : base;
}

/**
 * Which top-level sessions get a background feed: those whose tree runs or is paused
 * (idle trees cannot ask for anything), most recently updated first, at most `limit`.
 */
export function rootsToWatch(sessions: SessionInfo[], selected: string | null, limit: number): string[] {
  const parents = new Map(sessions.map((s) => [s.session_id, s.parent_session_id]));
  const rootOf = (id: string) => {
    let cur = id;
    for (let i = 0; i < 16 && parents.get(cur); i++) cur = parents.get(cur)!;
    return cur;
  };
  const live = new Map<string, string>();
  for (const s of sessions) {
    if (s.state === 'idle' && !s.interrupted) continue;
    const root = rootOf(s.session_id);
    const updated = live.get(root);
    if (!updated || s.updated_at > updated) live.set(root, s.updated_at);
  }
  live.delete(selected ?? '');
  return [...live.entries()]
    .filter(([id]) => parents.has(id))
    .sort((a, b) => b[1].localeCompare(a[1]))
    .slice(0, Math.max(0, limit))
    .map(([id]) => id);
}
