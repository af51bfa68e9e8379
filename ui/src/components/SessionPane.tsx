import { useEffect, useLayoutEffect, useMemo, useReducer, useRef, useState } from 'preact/hooks';
import type { CreateSession } from '../bindings/CreateSession';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { Message } from '../bindings/Message';
import type { SessionRef } from '../bindings/SessionRef';
import type { ContextMeter } from '../bindings/ContextMeter';
import type { InstructionFile } from '../bindings/InstructionFile';
import type { Event as WireEvent } from '../bindings/Event';
import { SessionModel, tokens, totalTokens, type ChildTab, type SessionNeeds, type Tokens } from '../model';
import { agentLabel, modelLine, sessionModels, streamingEstimate } from '../usage';
import { CommandError, toCommandError, type Platform } from '../platform';
import { formatTokens } from '../util';
import { ApprovalDialog } from './ApprovalDialog';
import { ChangesView } from './ChangesView';
import { Chat } from './Chat';
import { Composer } from './Composer';
import { ConfirmButton } from './ConfirmButton';
import { ErrorBox } from './ErrorBox';
import { PendingTray } from './PendingTray';
import { Progress } from './Progress';
import { Icon } from './Icon';
import { NeedsBadge } from './Sidebar';
import { Meter } from './StatusLine';
import { focusComposer } from './focus';
import { typedText } from '../mentions';
import { useThrottled } from '../throttle';
import { childState, isActive, LIVE, rootState, type LiveState } from '../status';
import { namesSkill, type SlashCommand } from '../commands';
import type { SkillCatalog } from '../bindings/SkillCatalog';
import type { ListSkills } from '../bindings/ListSkills';
import type { ExpandCommand } from '../bindings/ExpandCommand';
import type { ExpandedCommand } from '../bindings/ExpandedCommand';
import type { RuntimeSettings } from '../bindings/RuntimeSettings';
import type { ImagePart } from '../bindings/ImagePart';
import type { Profiles } from '../bindings/Profiles';
import type { Profile } from '../bindings/Profile';
import type { ListAgents } from '../bindings/ListAgents';
import type { SetAgent } from '../bindings/SetAgent';

export interface PaneStats {
  treeTokens: number;
  /** Estimated tokens of the answers streaming now, not counted in `treeTokens` yet (E23). */
  streamingTokens: number;
  /** The open session's own context meter (the status line shows it). */
  context: ContextMeter | null;
  instructions: InstructionFile[];
}

/** A child tab's state from the model alone (when the app gives no live state). */
function tabState(tab: ChildTab, info: SessionInfo | undefined): LiveState {
  return tab.interrupted ? 'interrupted' : childState({ sub: tab.state }, info);
}

/** The composer's slash commands; those the runtime cannot do yet show as "coming". */
export const SLASH_COMMANDS: SlashCommand[] = [
  { name: 'new', description: 'Start a new conversation', available: true },
  { name: 'clear', description: 'Start over in a new session (this one stays in the list)', available: true },
  { name: 'compact', description: 'Summarise the earlier conversation to make room in the window', available: true },
  { name: 'model', description: 'Choose the model for this session', available: true },
  { name: 'agent', description: 'Run this session as a profile: /agent NAME, /agent none; /agent lists them', available: true },
];

/**
 * The composer's entries for a workspace's custom commands and skills (`list_skills`), after
 * the built-in ones: a built-in name wins over a file's, a command's over a skill's.
 */
export function customCommands(catalog: SkillCatalog | null, builtIn: SlashCommand[]): SlashCommand[] {
  if (!catalog) return [];
  const taken = new Set(builtIn.map((c) => c.name));
  const out: SlashCommand[] = [];
  for (const c of catalog.commands) {
    if (taken.has(c.name)) continue;
    taken.add(c.name);
    const hint = c.argument_hint ? ` (${c.argument_hint})` : '';
    out.push({ name: c.name, description: `${c.description}${hint}`, available: true, kind: 'command' });
  }
  for (const s of catalog.skills) {
    if (taken.has(s.name)) continue;
    taken.add(s.name);
    out.push({ name: s.name, description: `skill: ${s.description}`, available: true, kind: 'skill' });
  }
  return out;
}

/** The per-turn choices a command file asks for, as the run config's `runtime`. */
function turnChoice(expanded: ExpandedCommand): Partial<RuntimeSettings> | undefined {
  const runtime: Partial<RuntimeSettings> = {};
  if (expanded.model) runtime.model = expanded.model;
  if (expanded.allowed_tools) runtime.tools = expanded.allowed_tools;
  return Object.keys(runtime).length ? runtime : undefined;
}

/** A profile's line in the /agent menu: its description, and an external ACP agent named
 * (with "not installed" when its command is missing, #29). */
export function profileHint(p: Profile): string {
  if (!p.acp) return p.description;
  const missing = p.notices.some((n) => n.includes('not installed')) ? ' (not installed)' : '';
  return [p.description, `ACP agent ${p.acp.command}${missing}`].filter(Boolean).join(' · ');
}

/** What `/agent` alone answers: the profiles, and the one this session runs as. */
export function describeProfiles(profiles: Profiles, current: string | null): string {
  const lines = profiles.profiles.map((p) => {
    const hint = profileHint(p);
    return `${p.name}${p.name === current ? ' (current)' : ''}${hint ? ` — ${hint}` : ''}`;
  });
  const head = profiles.profiles.length ? 'Profiles (/agent NAME runs this session as one from its next turn; /agent none clears):' : 'No profiles are defined.';
  const errors = profiles.errors.length ? ['', 'Could not be read:', ...profiles.errors] : [];
  return [head, ...lines, '', `This session runs as ${current ? `“${current}”` : 'no profile'}.`, ...errors].join('\n');
}

const FAILED_RETRY = 'The last attempt failed. Try the task again.';

/** The named model servers of the config (`default` is the `provider` block). */
export function providerChoices(config: any): { name: string; model: string }[] {
  if (!config || typeof config !== 'object') return [];
  const list = [{ name: 'default', model: String(config.provider?.model ?? '') }];
  for (const [name, block] of Object.entries((config.providers ?? {}) as Record<string, any>)) {
    if (name !== 'default') list.push({ name, model: String(block?.model ?? '') });
  }
  return list;
}

/** The config's default server: `default_provider` when it names a server, else `default`. */
function defaultChoice(config: any): string {
  const named = config?.default_provider;
  return typeof named === 'string' && named ? named : 'default';
}

/**
 * The composer's model picker: applies to the session's next turn (`set_model`). Each
 * server once (E19): the default server is the first option, "Default", which follows
 * the config; it is listed by its own name only while the session names it explicitly.
 */
function ModelPicker(props: { config: any; value: string | null; onChange: (provider: string | null) => void; busy?: boolean }) {
  const choices = providerChoices(props.config);
  if (choices.length < 2) return null;
  const fallback = defaultChoice(props.config);
  const first = choices.find((c) => c.name === fallback);
  const others = choices.filter((c) => c.name !== fallback || props.value === fallback);
  return (
    <select
      class="model-picker"
      data-testid="model-picker"
      aria-label="Model for this session's next turn"
      title="Model for this session's next turn"
      disabled={props.busy}
      value={props.value ?? ''}
      onChange={(e) => props.onChange((e.target as HTMLSelectElement).value || null)}
    >
      <option value="">
        Default · {fallback}
        {first?.model ? ` · ${first.model}` : ''}
      </option>
      {others.map((c) => (
        <option key={c.name} value={c.name}>
          {c.name}
          {c.model ? ` · ${c.model}` : ''}
        </option>
      ))}
    </select>
  );
}

const NO_FILES: InstructionFile[] = [];

/** Backends without `list_files` get no @-mentions (remembered per platform). */
const noFileList = new WeakSet<Platform>();

/**
 * The isolated sub-agents under a conversation (its descendants whose worktree is still
 * there), in list order: the conversation's Changes view offers their Apply and Discard.
 */
export function worktreesUnder(sessions: SessionInfo[], rootId: string) {
  const under = new Set([rootId]);
  const found: { sessionId: string; title: string; worktree: NonNullable<SessionInfo['worktree']> }[] = [];
  // Parents are listed before their children, so one pass finds every depth.
  for (const s of sessions) {
    if (!s.parent_session_id || !under.has(s.parent_session_id)) continue;
    under.add(s.session_id);
    if (s.worktree) found.push({ sessionId: s.session_id, title: s.title, worktree: s.worktree });
  }
  return found;
}

function filesOf(platform: Platform, workspace: string) {
  if (noFileList.has(platform)) return undefined;
  return async (query: string): Promise<string[] | null> => {
    try {
      const result: { files?: string[] } = await platform.invoke('list_files', { workspace, query, limit: 20 });
      return Array.isArray(result?.files) ? result.files : [];
    } catch (err) {
      const error = toCommandError(err);
      if (error.code === 'unknown_command' || error.status === 404) noFileList.add(platform);
      return null;
    }
  };
}

function useModelState(model: SessionModel | null) {
  const [, force] = useReducer((n: number, _: void) => n + 1, 0);
  useEffect(() => (model ? model.listen(() => force(undefined)) : undefined), [model]);
  return model?.state ?? null;
}

/** A child's own tokens: what the session list says, or (before it lists them) its transcript's. */
function childTokens(model: SessionModel, info: SessionInfo | undefined, sessionId: string): Tokens {
  const listed = tokens(info?.usage);
  return totalTokens(listed) > 0 ? listed : model.childUsage(sessionId);
}

/** A child tab's tooltip: title and state, profile and model, its own tokens by model. */
function childTip(tab: ChildTab, info: SessionInfo | undefined, usage: Tokens, state: string): string {
  const lines = [`${tab.title} (${state})`];
  const agent = agentLabel(info);
  if (agent) lines.push(agent);
  lines.push(`${formatTokens(totalTokens(usage))} tokens (${usage.input} in, ${usage.output} out)`);
  const models = sessionModels(info);
  if (models.length > 1) lines.push(...models.map(modelLine));
  return lines.join('\n');
}

function ChildView(props: {
  model: SessionModel;
  tab: ChildTab;
  /** Its live state (status.ts): the header, the notices and what can be done follow it. */
  status: LiveState;
  info?: SessionInfo;
  onDeleted: () => void;
  onSessionsChanged: () => void;
  childStates: Record<string, LiveState>;
}) {
  const { model, tab, info, status } = props;
  const t = model.state.transcripts[tab.sessionId];
  const [error, setError] = useState<{ message: string; retry: () => void } | null>(null);
  const [busy, setBusy] = useState(false);
  const [changes, setChanges] = useState(false);
  useEffect(() => model.ensureTranscript(tab.sessionId), [model, tab.sessionId]);
  const usage = childTokens(model, info, tab.sessionId);
  const agent = agentLabel(info);
  const models = sessionModels(info);
  const active = isActive(status);
  const interrupted = status === 'interrupted';

  const act = async (run: () => Promise<void>) => {
    setBusy(true);
    setError(null);
    try {
      await run();
      // The list says what the runtime stored (resumed, cancelled): the states follow it.
      props.onSessionsChanged();
    } catch (err) {
      setError({ message: toCommandError(err).message, retry: () => void act(run) });
    } finally {
      setBusy(false);
    }
  };
  const cancel = () => act(() => (interrupted ? model.cancelInterrupted(tab.sessionId) : model.cancel(tab.sessionId)));
  const resume = () => act(() => model.resumeChild(tab.sessionId));
  const retry = () => act(() => model.submitToChild(tab.sessionId, FAILED_RETRY));
  // A finished or failed child takes a message typed into its tab: it runs again and reports again.
  // Done, failed, or stopped by the person: writing to it runs it again (the person's
  // message starts even a child the person stopped).
  const canMessage = status === 'done' || status === 'failed' || status === 'stopped';
  // Who wrote each of its messages: its task and its parent's `message_subagent`s come from
  // the parent agent; anything else was typed here by the person (a follow-up, Retry) (E18).
  const parentTranscript = model.state.transcripts[tab.parentSessionId ?? model.sessionId];
  const fromParent = new Set<string>();
  for (const m of parentTranscript?.messages ?? []) {
    for (const call of m.tool_calls ?? []) {
      const args = call.arguments as { task_id?: unknown; message?: unknown } | null;
      if (call.name === 'message_subagent' && args?.task_id === tab.taskId && typeof args?.message === 'string') fromParent.add(args.message.trim());
    }
  }
  const firstUser = t?.messages.findIndex((m) => m.role === 'user') ?? -1;
  const senderOf = (m: Message, index: number): string => {
    if (m.id?.startsWith('task:') || (t && index === t.first + firstUser && !m.id?.startsWith('msg-'))) return 'Task from the parent agent';
    if (fromParent.has((m.content ?? '').trim())) return 'From the parent agent';
    return 'You';
  };
  const remove = () =>
    void act(async () => {
      const args: SessionRef = { session_id: tab.sessionId };
      await model.platform.invoke('delete_session', args);
      props.onDeleted();
    });

  return (
    <div class="child-view" data-testid="child-view" data-session-id={tab.sessionId}>
      <div class="child-head">
        <strong class="child-title">{tab.title}</strong>
        <span class={`badge status-${status}`} data-testid="child-state" data-state={status}>
          <Icon name={LIVE[status].icon} /> {LIVE[status].label}
        </span>
        {agent && (
          <span class="child-agent" data-testid="child-agent" title="The sub-agent's profile, and the model and server it ran on last">
            {agent}
          </span>
        )}
        <span class="muted" data-testid="child-usage" title={[`${usage.input} in, ${usage.output} out`, ...models.map(modelLine)].join('\n')}>
          {formatTokens(totalTokens(usage))} tokens
        </span>
        <Meter meter={t?.context} testid="child-context" />
        <span class="spacer" />
        <button type="button" aria-pressed={changes} data-testid="child-changes" onClick={() => setChanges(!changes)}>
          {changes ? 'Conversation' : 'Changes'}
        </button>
        <button type="button" disabled={!(active || interrupted) || busy} data-testid="child-cancel" onClick={() => void cancel()}>
          Cancel
        </button>
        <ConfirmButton
          class="quiet"
          disabled={busy}
          testid="child-delete"
          label="Delete…"
          confirmLabel={canMessage ? 'Delete it' : 'Delete it (no report)'}
          title="Delete this sub-agent session and its history; its report will not be delivered"
          onConfirm={remove}
        />
      </div>
      {status === 'failed' && (
        <div class="notice" data-testid="child-failed">
          This sub-agent failed; its parent got the error as its report. Retry runs it again (it reports again to its parent),
          or write to it below.
          <button type="button" class="primary" disabled={busy} data-testid="child-retry" title={`Sends it: “${FAILED_RETRY}”`} onClick={() => void retry()}>
            Retry
          </button>
        </div>
      )}
      {interrupted && (
        <div class="notice" data-testid="child-interrupted">
          This sub-agent was cut off before it finished (Bumblehive stopped, or its agent's process ended). Resume it from where it was, or cancel it (its parent
          then gets an error report).
          <button type="button" class="primary" disabled={busy} data-testid="child-resume" onClick={() => void resume()}>
            Resume
          </button>
        </div>
      )}
      {error && <ErrorBox message={error.message} onRetry={error.retry} onDismiss={() => setError(null)} />}
      {t?.status === 'error' && <ErrorBox message={`Cannot read this sub-agent's history: ${t.loadError}`} onRetry={() => void model.loadTranscript(tab.sessionId)} />}
      {changes ? (
        <ChangesView platform={model.platform} sessionId={tab.sessionId} child worktree={props.info?.worktree ?? null} onWorktreeChanged={props.onSessionsChanged} />
      ) : t ? (
        <Chat
          key={tab.sessionId}
          transcript={t}
          canSend={false}
          tabs={model.state.children}
          childStates={props.childStates}
          senderOf={senderOf}
          footer={t.running ? <Progress transcript={t} approvals={model.state.approvals.filter((a) => a.session_id === tab.sessionId).length} /> : null}
          empty={<div class="empty">{status === 'waiting' ? (tab.server ? `Waiting for a free slot on ${tab.server}…` : 'Waiting for a free slot…') : 'Nothing yet.'}</div>}
        />
      ) : (
        <div class="empty">Loading…</div>
      )}
      {canMessage && (
        <Composer
          key={tab.sessionId}
          draftKey={tab.sessionId}
          running={!!t?.running}
          onSend={(text, images) => model.submitToChild(tab.sessionId, text, images)}
          onStop={() => model.cancel(tab.sessionId)}
          placeholder="Message this sub-agent… it runs again and reports again to its parent"
        />
      )}
    </div>
  );
}

/** One parent session: tabs (Main + one per sub-agent), chat, pending tray, composer, approvals. */
export function SessionPane(props: {
  platform: Platform;
  workspace: string;
  sessionId: string | null;
  /** A child tab to show (e.g. a child clicked in the sidebar). */
  focusTab?: { sessionId: string } | null;
  sessions: SessionInfo[];
  onCreated: (sessionId: string) => void;
  onSessionsChanged: () => void;
  onStats?: (stats: PaneStats) => void;
  /** Render coalescing delay for the model (tests use 0). */
  notifyDelay?: number;
  /** Every event of this session's feed, with its (root) session id. */
  onEvent?: (rootId: string, event: WireEvent) => void;
  /** The person opened a child's tab. */
  onTabSeen?: (rootId: string, sessionId: string) => void;
  needs?: Record<string, SessionNeeds>;
  /** The live state of every session (status.ts), as the sidebar shows it. */
  states?: Record<string, LiveState>;
  /** A session was deleted here (a child's Delete). */
  onSessionDeleted?: (sessionId: string) => void;
  /** No provider is configured: the first send opens the set-up instead. */
  needsSetup?: boolean;
  onOpenSettings?: () => void;
  /** `/new` and `/clear`: a new conversation in this workspace. */
  onNew?: () => void;
  /** The config (`get_config`), for the model picker. */
  config?: any;
}) {
  const { platform, sessionId } = props;
  const modelRef = useRef<SessionModel | null>(null);
  const callbacks = useRef(props);
  callbacks.current = props;
  const [model, setModel] = useState<SessionModel | null>(null);
  const [tab, setTab] = useState<string>('main');
  const [resuming, setResuming] = useState(false);
  const [resumeError, setResumeError] = useState<string | null>(null);
  // A draft to put in a composer (Edit, Rewind, Fork), for the session it was made for (E8).
  const [draft, setDraft] = useState<{ for: string | null; text: string; images?: ImagePart[] } | null>(null);
  // The model picker: the session's choice (from the list), or one made before it exists.
  const [chosen, setChosen] = useState<{ provider: string | null } | null>(null);
  const [pickError, setPickError] = useState<string | null>(null);
  const [picking, setPicking] = useState(false);
  const [forkError, setForkError] = useState<string | null>(null);
  // The profile the session runs as: set here (`/agent`), else the session's, else none.
  const [agentChoice, setAgentChoice] = useState<{ agent: string | null } | null>(null);
  const [profiles, setProfiles] = useState<Profiles | null>(null);

  const makeModel = (id: string) => {
    const m = new SessionModel(platform, id, {
      onSessionsChanged: () => callbacks.current.onSessionsChanged(),
      notifyDelay: props.notifyDelay,
      onEvent: (event) => callbacks.current.onEvent?.(id, event),
    });
    m.start();
    return m;
  };

  useEffect(() => {
    if (modelRef.current && modelRef.current.sessionId === sessionId) return;
    modelRef.current?.dispose();
    modelRef.current = sessionId ? makeModel(sessionId) : null;
    setModel(modelRef.current);
    setTab('main');
  }, [sessionId, platform]);
  useEffect(() => () => modelRef.current?.dispose(), []);
  useEffect(() => {
    if (props.focusTab) setTab(props.focusTab.sessionId);
  }, [props.focusTab]);
  useEffect(() => {
    if (model && tab !== 'main') callbacks.current.onTabSeen?.(model.sessionId, tab);
  }, [model, tab]);
  // The open tab is scrolled into the strip's view (opened from a menu, a key, a card):
  // sideways only. scrollIntoView also scrolled the strip 1px down (the active tab sits
  // 1px low, over the strip's border), after which WebKitGTK no longer hit-tested the
  // tabs at their centre (a click on Main did nothing; desktop e2e).
  useEffect(() => {
    const open = document.querySelector('.tabs [role="tab"][aria-selected="true"]') as HTMLElement | null;
    const strip = open?.parentElement;
    if (open && strip) strip.scrollLeft = tabScrollLeft(strip, open);
  }, [tab]);
  // Only the shown chat's deltas re-render this pane (the others stream into the model).
  useLayoutEffect(() => {
    model?.setShown(tab === 'main' || tab === 'changes' ? [model.sessionId] : [tab]);
  }, [model, tab]);

  const state = useModelState(model);
  // The children's live states, one object while they stay the same (the chat's rows are
  // memoised on it).
  const childKey = (state?.children ?? [])
    .map((c) => `${c.sessionId}\n${props.states?.[c.sessionId] ?? tabState(c, props.sessions.find((s) => s.session_id === c.sessionId))}`)
    .join('\n');
  const childStates = useMemo(() => {
    const parts = childKey ? childKey.split('\n') : [];
    const out: Record<string, LiveState> = {};
    for (let k = 0; k + 1 < parts.length; k += 2) out[parts[k]] = parts[k + 1] as LiveState;
    return out;
  }, [childKey]);

  useEffect(() => {
    if (model) model.mergeChildren(props.sessions);
  }, [model, props.sessions]);

  const treeTokens = state ? totalTokens(state.treeUsage) : 0;
  const context = (model && state?.transcripts[model.sessionId]?.context) || null;
  const instructions = state?.instructions ?? NO_FILES;
  // Handed to the status line four times a second, not at every frame: it lives in the
  // app's state, and each change re-rendered the whole app (#31: nine streams changed it
  // about 45 times a second).
  const streamingTokens = useThrottled(
    state ? streamingEstimate(Object.values(state.transcripts).reduce((n, t) => n + t.streaming.length, 0)) : 0,
    250,
  );
  useEffect(() => {
    props.onStats?.({ treeTokens, streamingTokens, context, instructions });
  }, [treeTokens, streamingTokens, context?.used, context?.window, context?.percent, instructions]);

  // Esc stops the run from anywhere in the window (the approval dialog swallows it).
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      if (e.key !== 'Escape' || e.defaultPrevented || !model?.state.running) return;
      if (document.querySelector('.overlay')) return; // Esc closes the settings instead
      void model.cancel().catch(() => undefined);
    };
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  }, [model]);

  // Ctrl+Tab / Ctrl+Shift+Tab go round the tabs, Ctrl+1…8 open the nth, Ctrl+9 the last (E17).
  const tabOrder = useRef<string[]>(['main']);
  tabOrder.current = model && state ? ['main', 'changes', ...state.children.map((c) => c.sessionId)] : ['main'];
  const tabNow = useRef(tab);
  tabNow.current = tab;
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      if (!(e.ctrlKey || e.metaKey) || e.altKey || e.defaultPrevented || document.querySelector('.overlay')) return;
      const order = tabOrder.current;
      if (order.length < 2) return;
      const at = Math.max(0, order.indexOf(tabNow.current));
      let next: string | undefined;
      // The code too: WebKitGTK names Shift+Tab's key (ISO_Left_Tab) "Unidentified".
      if (e.key === 'Tab' || e.code === 'Tab') next = order[(at + (e.shiftKey ? order.length - 1 : 1)) % order.length];
      else if (/^[1-9]$/.test(e.key) && !e.shiftKey) next = e.key === '9' ? order[order.length - 1] : order[Number(e.key) - 1];
      else return;
      e.preventDefault();
      if (!next) return;
      setTab(next);
      // The tab's composer (its own, or none) takes the keys next.
      requestAnimationFrame(() => focusComposer(false));
    };
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  }, []);
  // The last approval decided: the dock is gone, and focus with it; the composer takes it (E16).
  const approvalsWaiting = state?.approvals.length ?? 0;
  useEffect(() => {
    if (approvalsWaiting === 0) focusComposer(true);
  }, [approvalsWaiting]);

  const sessionInfo = props.sessions.find((s) => s.session_id === sessionId);
  const current = chosen ? chosen.provider : (sessionInfo?.provider ?? null);
  const canPick = providerChoices(props.config).length > 1;
  const pick = async (provider: string | null) => {
    setPickError(null);
    setChosen({ provider });
    if (!sessionId) return; // applied when the conversation starts
    setPicking(true);
    try {
      await platform.invoke('set_model', { session_id: sessionId, provider, model: null });
      callbacks.current.onSessionsChanged();
    } catch (err) {
      setChosen(null);
      setPickError(`Cannot switch the model: ${toCommandError(err).message}`);
    } finally {
      setPicking(false);
    }
  };
  useEffect(() => setChosen(null), [sessionId]);
  useEffect(() => setAgentChoice(null), [sessionId]);
  const loadProfiles = async (): Promise<Profiles> => {
    const args: ListAgents = { workspace: props.workspace };
    const list: Profiles = await platform.invoke('list_agents', args);
    setProfiles(list);
    return list;
  };
  useEffect(() => {
    setProfiles(null);
    // Only for completing names; /agent reads them again and shows any error.
    loadProfiles().catch(() => undefined);
  }, [platform, props.workspace]);
  const [catalog, setCatalog] = useState<SkillCatalog | null>(null);
  useEffect(() => {
    setCatalog(null);
    const args: ListSkills = { workspace: props.workspace };
    // Only for completion: a backend without skills offers none.
    platform.invoke('list_skills', args).then((found: SkillCatalog) => setCatalog(found), () => undefined);
  }, [platform, props.workspace]);
  const expand = async (text: string): Promise<ExpandedCommand> => {
    const args: ExpandCommand = { workspace: props.workspace, text };
    return platform.invoke('expand_command', args);
  };
  const skillNames = (catalog?.skills ?? []).map((s) => s.name);
  /** `/name args` of a custom command or a skill: sent as what it expands to, with its choices for that turn. */
  const runCustom = async (name: string, arg: string): Promise<string | void> => {
    const expanded = await expand(arg ? `/${name} ${arg}` : `/${name}`);
    await send(expanded.content, [], turnChoice(expanded));
    if (expanded.notices.length) return expanded.notices.join('\n');
  };
  /** A message naming `$skill`s goes with their instructions. */
  const sendTyped = async (text: string, images: ImagePart[]) => {
    if (namesSkill(text, skillNames)) return send((await expand(text)).content, images);
    return send(text, images);
  };
  const agent = agentChoice ? agentChoice.agent : (sessionInfo?.agent ?? null);
  const runAgent = async (arg: string): Promise<string> => {
    if (!arg) return describeProfiles(await loadProfiles(), agent);
    const name = arg.toLowerCase() === 'none' ? null : arg;
    if (!sessionId) {
      // No session to ask yet: check the name against the list the runtime gave.
      if (name && profiles && !profiles.profiles.some((p) => p.name === name)) {
        const known = profiles.profiles.map((p) => p.name).join(', ') || 'none are defined';
        throw new CommandError('invalid_argument', `no profile named “${name}” (profiles: ${known})`);
      }
      // Applied when the conversation starts, like the model picker.
      setAgentChoice({ agent: name });
      return name ? `The new conversation will run as “${name}”.` : 'The new conversation will run as no profile.';
    }
    const args: SetAgent = { session_id: sessionId, agent: name };
    const updated: SessionInfo = await platform.invoke('set_agent', args);
    setAgentChoice({ agent: updated?.agent ?? name });
    callbacks.current.onSessionsChanged();
    return name ? `This session runs as “${name}” from its next turn.` : 'This session runs as no profile from its next turn.';
  };
  const custom = customCommands(catalog, SLASH_COMMANDS);
  const composerProps = {
    commands: [...SLASH_COMMANDS.map((c) =>
      c.name === 'model'
        ? { ...c, available: canPick, reason: canPick ? undefined : 'one model server is configured; name more under "providers" in the config' }
        : c.name === 'agent'
          ? { ...c, choices: [...(profiles?.profiles ?? []).map((p) => ({ value: p.name, hint: profileHint(p) })), { value: 'none', hint: 'run as no profile' }] }
          : c,
    ), ...custom],
    onCommand: (name: string, arg: string) => {
      if (custom.some((c) => c.name === name)) return runCustom(name, arg);
      if (name === 'agent') return runAgent(arg);
      if (name === 'new' || name === 'clear') callbacks.current.onNew?.();
      // Its error shows in the composer, like a failed send.
      if (name === 'compact') {
        if (!modelRef.current) return Promise.reject(new CommandError('no_session', 'Nothing to compact yet: this conversation has no messages.'));
        return modelRef.current.compact();
      }
      if (name === 'model') (document.querySelector('[data-testid=model-picker]') as HTMLElement | null)?.focus();
    },
    findFiles: filesOf(platform, props.workspace),
    extra: (
      <>
        {agent && (
          <span class="chip agent-chip" data-testid="agent-chip" title="The profile this session runs as (/agent none clears it)">
            as {agent}
          </span>
        )}
        <ModelPicker config={props.config} value={current} onChange={(p) => void pick(p)} busy={picking} />
        {pickError && (
          <span class="error-text small" role="alert" data-testid="model-picker-error">
            {pickError}
          </span>
        )}
      </>
    ),
  };

  const send = async (text: string, images: ImagePart[], runtime?: Partial<RuntimeSettings>) => {
    if (props.needsSetup) {
      // Nothing is configured: sending would only fail after retries. Set up first; the
      // text stays in the composer.
      props.onOpenSettings?.();
      throw new CommandError('setup', 'Choose a model first: the set-up opened. Your message is kept; send it once a model is chosen.');
    }
    if (model) return model.submit(text, images, runtime);
    // A new conversation: the session is created with the first message.
    const title = text.trim().split('\n')[0].slice(0, 60) || (images.length ? 'Image' : 'New conversation');
    const args: CreateSession = { workspace: props.workspace, title };
    const info: SessionInfo = await platform.invoke('create_session', args);
    // A model picked before the conversation existed applies to its first turn.
    if (chosen?.provider) await platform.invoke('set_model', { session_id: info.session_id, provider: chosen.provider, model: null });
    if (agentChoice?.agent) {
      const agentArgs: SetAgent = { session_id: info.session_id, agent: agentChoice.agent };
      await platform.invoke('set_agent', agentArgs);
    }
    const created = makeModel(info.session_id);
    modelRef.current = created;
    setModel(created);
    callbacks.current.onCreated(info.session_id);
    // Send only once the new session's events reach us, or they could be missed.
    await created.whenStreaming();
    await created.submit(text, images, runtime);
  };

  if (!model || !state) {
    return (
      <div class="session-pane">
        <div class="tabs" role="tablist">
          <button type="button" class="tab active" role="tab" data-testid="tab-main">
            Main
          </button>
        </div>
        <div class="chat">
          <div class="empty welcome">
            <h2>New conversation</h2>
            <p>Ask the agent about the files in this workspace. It can delegate pieces of work to sub-agents that run in their own tabs.</p>
          </div>
        </div>
        <Composer key="new" draftKey="new" running={false} onSend={sendTyped} onStop={async () => undefined} autoFocus {...composerProps} />
      </div>
    );
  }

  const main = state.transcripts[model.sessionId];
  const infoOf = (id: string) => props.sessions.find((s) => s.session_id === id);
  const statusOf = (c: ChildTab): LiveState => props.states?.[c.sessionId] ?? tabState(c, infoOf(c.sessionId));
  const rootStatus: LiveState = props.states?.[model.sessionId] ?? rootState({ running: state.running }, sessionInfo);
  const interrupted = state.children.filter((c) => statusOf(c) === 'interrupted');
  const resumeAll = async () => {
    setResuming(true);
    setResumeError(null);
    const failed: string[] = [];
    for (const c of interrupted) {
      try {
        await model.resumeChild(c.sessionId);
      } catch (err) {
        failed.push(`“${c.title}”: ${toCommandError(err).message}`);
      }
    }
    setResuming(false);
    if (failed.length) setResumeError(`Cannot resume ${failed.join('; ')}`);
  };
  const childTab = tab === 'main' || tab === 'changes' ? undefined : state.children.find((c) => c.sessionId === tab);
  const showChanges = tab === 'changes';
  const approval = state.approvals[0];
  const approvalPanel = approval ? (
    <ApprovalDialog approval={approval} queued={state.approvals.length} onDecide={(a, ok, remember, reason) => model.decide(a, ok, remember, reason)} />
  ) : null;

  return (
    <div class="session-pane" data-testid="session-pane" data-session-id={model.sessionId} data-running={state.running} data-paused={state.paused}>
      <div class="tabs" role="tablist" onWheel={wheelSideways}>
        <button
          type="button"
          role="tab"
          aria-selected={!childTab && !showChanges}
          class={`tab ${!childTab && !showChanges ? 'active' : ''}`}
          data-testid="tab-main"
          data-status={rootStatus}
          onClick={() => setTab('main')}
        >
          Main
          {isActive(rootStatus) && <span class={`dot status-${rootStatus}`} aria-label={LIVE[rootStatus].label} title={LIVE[rootStatus].label} />}
        </button>
        <button type="button" role="tab" aria-selected={showChanges} class={`tab ${showChanges ? 'active' : ''}`} data-testid="tab-changes" onClick={() => setTab('changes')}>
          Changes
        </button>
        {state.children.map((c) => {
          const info = infoOf(c.sessionId);
          const agent = agentLabel(info);
          const live = statusOf(c);
          const stateText = live === 'waiting' && c.server ? `waiting for a slot on ${c.server}` : LIVE[live].label;
          return (
          <button
            key={c.sessionId}
            type="button"
            role="tab"
            aria-selected={childTab?.sessionId === c.sessionId}
            class={`tab child-tab status-${live} ${childTab?.sessionId === c.sessionId ? 'active' : ''}`}
            data-testid="child-tab"
            data-title={c.title}
            data-state={live}
            data-session-id={c.sessionId}
            title={childTip(c, info, childTokens(model, info, c.sessionId), stateText)}
            onClick={() => setTab(c.sessionId)}
          >
            <span class="tab-icon">
              <Icon name={LIVE[live].icon} />
            </span>
            <span class="tab-title">{c.title}</span>
            {agent && (
              <span class="tab-agent" data-testid="tab-agent">
                {agent}
              </span>
            )}
            <span class="tab-state">{stateText}</span>
            <Meter meter={state.transcripts[c.sessionId]?.context} testid="tab-context" short />
            <NeedsBadge needs={props.needs?.[c.sessionId]} testid="tab-needs" />
          </button>
          );
        })}
        {state.children.length > 0 && (
          <select
            class="tab-menu"
            data-testid="tab-menu"
            aria-label="All tabs"
            title="All tabs (the strip scrolls when they do not fit)"
            value={childTab ? childTab.sessionId : showChanges ? 'changes' : 'main'}
            onChange={(e) => setTab((e.target as HTMLSelectElement).value)}
          >
            <option value="main">Main</option>
            <option value="changes">Changes</option>
            {state.children.map((c) => (
              <option key={c.sessionId} value={c.sessionId}>
                {c.title} — {LIVE[statusOf(c)].label}
              </option>
            ))}
          </select>
        )}
      </div>
      {state.stream === 'reconnecting' && <div class="banner" data-testid="reconnecting">Connection lost; reconnecting…</div>}
      {showChanges ? (
        <ChangesView
          key={model.sessionId}
          platform={platform}
          sessionId={model.sessionId}
          worktrees={worktreesUnder(props.sessions, model.sessionId)}
          onWorktreeChanged={props.onSessionsChanged}
          messageText={(i) => main.messages?.[i - (main.first ?? 0)]?.content ?? undefined}
          onForked={(forked) => {
            setDraft({ for: forked.session.session_id, text: typedText(forked.draft), images: forked.draft_images ?? [] });
            callbacks.current.onCreated(forked.session.session_id);
          }}
        />
      ) : childTab ? (
        <>
          <ChildView
            model={model}
            tab={childTab}
            status={statusOf(childTab)}
            childStates={childStates}
            info={infoOf(childTab.sessionId)}
            onSessionsChanged={props.onSessionsChanged}
            onDeleted={() => {
              setTab('main');
              model.removeChild(childTab.sessionId);
              props.onSessionDeleted?.(childTab.sessionId);
              props.onSessionsChanged();
            }}
          />
          {approvalPanel}
        </>
      ) : (
        <>
          {main.status === 'error' && (
            <ErrorBox message={`Cannot open this session: ${main.loadError}`} onRetry={() => void model.loadTranscript(model.sessionId)} testid="load-error" />
          )}
          {state.paused && !state.running && main.status === 'loaded' && main.notes.length === 0 && state.pending.length === 0 && (
            <div class="notice" data-testid="paused-notice">
              {sessionInfo?.failed
                ? 'This session is paused: its last run failed. Send a message to try again.'
                : sessionInfo?.state === 'paused'
                  ? 'This session is paused: its last run was stopped. Send a message to go on.'
                  : 'This session is paused: its last run was stopped or failed. Send a message to go on.'}
            </div>
          )}
          {forkError && <ErrorBox message={forkError} onDismiss={() => setForkError(null)} testid="fork-error" />}
          {interrupted.length > 0 && (
            <div class="notice" data-testid="interrupted-banner">
              {interrupted.length === 1 ? `Sub-agent “${interrupted[0].title}” was` : `${interrupted.length} sub-agents were`} cut off when Bumblehive
              stopped.
              <button type="button" class="primary" disabled={resuming} data-testid="resume-all-interrupted" onClick={() => void resumeAll()}>
                Resume all interrupted sub-agents
              </button>
              {resumeError && <ErrorBox message={resumeError} onDismiss={() => setResumeError(null)} />}
            </div>
          )}
          <Chat
            key={model.sessionId}
            onRetry={(text, images) => model.submit(text, images)}
            onOpenSettings={props.onOpenSettings}
            onEdit={(text, images) => setDraft({ for: model.sessionId, text, images })}
            onLoadEarlier={() => model.loadEarlier(model.sessionId)}
            onFork={(index) =>
              void platform
                .invoke('fork_session', { session_id: model.sessionId, message_index: index, rewind: false })
                .then((forked) => {
                  // The message's images come back too (removable), as Edit does.
                  setDraft({ for: forked.session.session_id, text: typedText(forked.draft), images: forked.draft_images ?? [] });
                  callbacks.current.onCreated(forked.session.session_id);
                })
                .catch((err) => setForkError(`Cannot fork: ${toCommandError(err).message}`))
            }
            transcript={main}
            statuses={state.statuses}
            inflight={state.inflight}
            tabs={state.children}
            childStates={childStates}
            onOpenChild={(id) => setTab(id)}
            deleted={state.deleted}
            footer={state.running || main.running ? <Progress transcript={main} approvals={state.approvals.length} /> : null}
            empty={main.status === 'loaded' ? <div class="empty">No messages yet.</div> : <div class="empty">Loading…</div>}
          />
          {approvalPanel}
          <PendingTray
            pending={state.pending}
            tabs={state.children}
            onResume={(id) => model.steer(id)}
            onResumeAll={() => model.steerAll()}
            onDiscard={(id) => model.discard(id)}
          />
          <Composer
            key={model.sessionId}
            draftKey={model.sessionId}
            running={state.running}
            onSend={sendTyped}
            onStop={() => model.cancel()}
            autoFocus
            draft={draft?.for === model.sessionId ? draft : null}
            onDraftTaken={() => setDraft(null)}
            {...composerProps}
          />
        </>
      )}
    </div>
  );
}

/** The tab strip has no scrollbar (WebKitGTK's overlay scrollbar lay over the tabs'
 * lower half, where a click then reached the scrollbar, not the tab): the wheel over it,
 * up/down or sideways, scrolls it sideways; the All tabs menu, Ctrl+Tab and Ctrl+1…9
 * reach every tab too. */
export function wheelSideways(e: WheelEvent): void {
  const strip = e.currentTarget as HTMLElement;
  if (strip.scrollWidth <= strip.clientWidth) return;
  const delta = Math.abs(e.deltaX) > Math.abs(e.deltaY) ? e.deltaX : e.deltaY;
  if (delta === 0) return;
  // Lines (Firefox-style deltaMode 1) and pages count as a tab's worth.
  strip.scrollLeft += e.deltaMode === 0 ? delta : Math.sign(delta) * 120;
  e.preventDefault();
}

/** Where the strip's horizontal scroll must be for `tab` to show whole, left of the
 * sticky "All tabs" menu (its `scroll-padding-inline-end`); unchanged when it shows. */
export function tabScrollLeft(strip: HTMLElement, tab: HTMLElement): number {
  const s = strip.getBoundingClientRect();
  const t = tab.getBoundingClientRect();
  const reserve = parseFloat(getComputedStyle(strip).scrollPaddingInlineEnd) || 0;
  const left = t.left - s.left + strip.scrollLeft;
  const right = left + t.width;
  if (left < strip.scrollLeft) return left;
  if (right > strip.scrollLeft + strip.clientWidth - reserve) return Math.max(0, right - strip.clientWidth + reserve);
  return strip.scrollLeft;
}
