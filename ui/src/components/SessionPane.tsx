import { useEffect, useReducer, useRef, useState } from 'preact/hooks';
import type { CreateSession } from '../bindings/CreateSession';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { SessionRef } from '../bindings/SessionRef';
import type { SubagentState } from '../bindings/SubagentState';
import { SessionModel, totalTokens, type ChildTab } from '../model';
import { toCommandError, type Platform } from '../platform';
import { formatTokens } from '../util';
import { ApprovalDialog } from './ApprovalDialog';
import { Chat } from './Chat';
import { Composer } from './Composer';
import { ConfirmButton } from './ConfirmButton';
import { ErrorBox } from './ErrorBox';
import { PendingTray } from './PendingTray';
import { Progress } from './Progress';

export interface PaneStats {
  treeTokens: number;
  runs: number;
}

const STATE_ICON: Record<SubagentState, string> = {
  waiting_for_slot: '◌',
  running: '●',
  done: '✓',
  failed: '!',
  cancelled: '✕',
};

const STATE_LABEL: Record<SubagentState, string> = {
  waiting_for_slot: 'waiting for a slot',
  running: 'running',
  done: 'done',
  failed: 'failed',
  cancelled: 'cancelled',
};

function useModelState(model: SessionModel | null) {
  const [, force] = useReducer((n: number, _: void) => n + 1, 0);
  useEffect(() => (model ? model.listen(() => force(undefined)) : undefined), [model]);
  return model?.state ?? null;
}

function ChildView(props: { model: SessionModel; tab: ChildTab; onDeleted: () => void }) {
  const { model, tab } = props;
  const t = model.state.transcripts[tab.sessionId];
  const [error, setError] = useState<{ message: string; retry: () => void } | null>(null);
  const [busy, setBusy] = useState(false);
  useEffect(() => model.ensureTranscript(tab.sessionId), [model, tab.sessionId]);
  const usage = model.childUsage(tab.sessionId);
  const active = tab.state === 'running' || tab.state === 'waiting_for_slot';

  const act = async (run: () => Promise<void>) => {
    setBusy(true);
    setError(null);
    try {
      await run();
    } catch (err) {
      setError({ message: toCommandError(err).message, retry: () => void act(run) });
    } finally {
      setBusy(false);
    }
  };
  const cancel = () => act(() => (tab.interrupted ? model.cancelInterrupted(tab.sessionId) : model.cancel(tab.sessionId)));
  const resume = () => act(() => model.resumeChild(tab.sessionId));
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
        <span class={`badge badge-${tab.state}`} data-testid="child-state" data-state={tab.state}>
          {STATE_LABEL[tab.state]}
        </span>
        <span class="muted" data-testid="child-usage" title={`${usage.input} in, ${usage.output} out`}>
          {formatTokens(totalTokens(usage))} tokens
        </span>
        <span class="spacer" />
        <button type="button" disabled={!(active || tab.interrupted) || busy} data-testid="child-cancel" onClick={() => void cancel()}>
          Cancel
        </button>
        <ConfirmButton
          class="quiet"
          disabled={busy}
          testid="child-delete"
          label="Delete…"
          confirmLabel="Delete it (no report)"
          title="Delete this sub-agent session and its history; its report will not be delivered"
          onConfirm={remove}
        />
      </div>
      {tab.interrupted && (
        <div class="notice" data-testid="child-interrupted">
          This sub-agent was cut off when Bumblehive stopped. Resume it from where it was, or cancel it (its parent
          then gets an error report).
          <button type="button" class="primary" disabled={busy} data-testid="child-resume" onClick={() => void resume()}>
            Resume
          </button>
        </div>
      )}
      {error && <ErrorBox message={error.message} onRetry={error.retry} onDismiss={() => setError(null)} />}
      {t?.status === 'error' && <ErrorBox message={`Cannot read this sub-agent's history: ${t.loadError}`} onRetry={() => void model.loadTranscript(tab.sessionId)} />}
      {t ? (
        <Chat
          transcript={t}
          tabs={model.state.children}
          footer={t.running ? <Progress transcript={t} approvals={model.state.approvals.filter((a) => a.session_id === tab.sessionId).length} /> : null}
          empty={<div class="empty">{tab.state === 'waiting_for_slot' ? 'Waiting for a free slot…' : 'Nothing yet.'}</div>}
        />
      ) : (
        <div class="empty">Loading…</div>
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
}) {
  const { platform, sessionId } = props;
  const modelRef = useRef<SessionModel | null>(null);
  const callbacks = useRef(props);
  callbacks.current = props;
  const [model, setModel] = useState<SessionModel | null>(null);
  const [tab, setTab] = useState<string>('main');

  const makeModel = (id: string) => {
    const m = new SessionModel(platform, id, {
      onSessionsChanged: () => callbacks.current.onSessionsChanged(),
      notifyDelay: props.notifyDelay,
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

  const state = useModelState(model);

  useEffect(() => {
    if (model) model.mergeChildren(props.sessions);
  }, [model, props.sessions]);

  const runs = model ? model.activeRuns() : 0;
  const treeTokens = state ? totalTokens(state.treeUsage) : 0;
  useEffect(() => {
    props.onStats?.({ treeTokens, runs });
  }, [treeTokens, runs]);

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

  const send = async (text: string) => {
    if (model) return model.submit(text);
    // A new conversation: the session is created with the first message.
    const title = text.trim().split('\n')[0].slice(0, 60);
    const args: CreateSession = { workspace: props.workspace, title };
    const info: SessionInfo = await platform.invoke('create_session', args);
    const created = makeModel(info.session_id);
    modelRef.current = created;
    setModel(created);
    callbacks.current.onCreated(info.session_id);
    // Send only once the new session's events reach us, or they could be missed.
    await created.whenStreaming();
    await created.submit(text);
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
        <Composer running={false} onSend={send} onStop={async () => undefined} autoFocus />
      </div>
    );
  }

  const main = state.transcripts[model.sessionId];
  const childTab = tab === 'main' ? undefined : state.children.find((c) => c.sessionId === tab);
  const approval = state.approvals[0];
  const approvalPanel = approval ? (
    <ApprovalDialog approval={approval} queued={state.approvals.length} onDecide={(a, ok, remember, reason) => model.decide(a, ok, remember, reason)} />
  ) : null;

  return (
    <div class="session-pane" data-testid="session-pane" data-session-id={model.sessionId} data-running={state.running} data-paused={state.paused}>
      <div class="tabs" role="tablist">
        <button type="button" role="tab" aria-selected={!childTab} class={`tab ${!childTab ? 'active' : ''}`} data-testid="tab-main" onClick={() => setTab('main')}>
          Main
          {state.running && <span class="dot running" aria-label="running" />}
        </button>
        {state.children.map((c) => (
          <button
            key={c.sessionId}
            type="button"
            role="tab"
            aria-selected={childTab?.sessionId === c.sessionId}
            class={`tab child-tab state-${c.state} ${childTab?.sessionId === c.sessionId ? 'active' : ''}`}
            data-testid="child-tab"
            data-title={c.title}
            data-state={c.state}
            data-session-id={c.sessionId}
            title={`${c.title} (${STATE_LABEL[c.state]})`}
            onClick={() => setTab(c.sessionId)}
          >
            <span class="tab-icon" aria-hidden="true">
              {STATE_ICON[c.state]}
            </span>
            <span class="tab-title">{c.title}</span>
            <span class="tab-state">{STATE_LABEL[c.state]}</span>
          </button>
        ))}
      </div>
      {state.stream === 'reconnecting' && <div class="banner" data-testid="reconnecting">Connection lost; reconnecting…</div>}
      {childTab ? (
        <>
          <ChildView
            model={model}
            tab={childTab}
            onDeleted={() => {
              setTab('main');
              model.removeChild(childTab.sessionId);
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
          <Chat
            transcript={main}
            statuses={state.statuses}
            inflight={state.inflight}
            tabs={state.children}
            onOpenChild={(id) => setTab(id)}
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
          <Composer running={state.running} onSend={send} onStop={() => model.cancel()} autoFocus />
        </>
      )}
    </div>
  );
}
