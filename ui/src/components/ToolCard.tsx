import { useState } from 'preact/hooks';
import type { ToolCall } from '../bindings/ToolCall';
import type { ChildTab, ToolLive } from '../model';
import { childState, LIVE, type LiveState } from '../status';
import { argumentHint, pretty } from '../util';
import { mcpServerOf } from './McpServers';
import { CopyButton } from './CopyButton';

const FOLD_LINES = 24;
const FOLD_CHARS = 3000;

/** Long text folds to its start with a "Show all" button. */
export function Folded({ text, testid }: { text: string; testid?: string }) {
  const lines = text.split('\n');
  const long = lines.length > FOLD_LINES || text.length > FOLD_CHARS;
  const [open, setOpen] = useState(false);
  const shown = !long || open ? text : lines.slice(0, FOLD_LINES).join('\n').slice(0, FOLD_CHARS);
  return (
    <div class="folded">
      <pre data-testid={testid}>{shown}</pre>
      {long && (
        <button type="button" class="link" onClick={() => setOpen(!open)}>
          {open ? 'Show less' : `Show all (${lines.length} lines)`}
        </button>
      )}
    </div>
  );
}

function subagentResult(result: string | undefined): string | null {
  if (!result) return null;
  try {
    const value = JSON.parse(result);
    if (value && value.status === 'pending' && typeof value.task_id === 'string') return value.task_id;
  } catch {
    /* not JSON */
  }
  return null;
}

/** A denied call's result ("Error: denied by user: …"): the person's decision, not a failure. */
export function isDenial(text: string | undefined): boolean {
  return !!text && /^(Error: )?denied( by (the )?user)?\b/i.test(text);
}

/** A delegated card's state (its `data-state` and class) for each live state of its child. */
const CARD_STATE: Record<LiveState, string> = {
  waiting: 'delegated',
  running: 'delegated',
  interrupted: 'interrupted',
  failed: 'failed',
  stopped: 'stopped',
  done: 'done',
  idle: 'done',
};

export type PlanStep = { step: string; status: 'pending' | 'in_progress' | 'completed' };

/** The steps of an `update_plan` call's arguments, or null when they are not a plan. */
export function planSteps(args: unknown): PlanStep[] | null {
  const plan = (args as { plan?: unknown } | null)?.plan;
  if (!Array.isArray(plan) || plan.length === 0) return null;
  const steps: PlanStep[] = [];
  for (const item of plan) {
    const { step, status } = (item ?? {}) as { step?: unknown; status?: unknown };
    if (typeof step !== 'string' || (status !== 'pending' && status !== 'in_progress' && status !== 'completed')) return null;
    steps.push({ step, status });
  }
  return steps;
}

const PLAN_MARK: Record<PlanStep['status'], string> = { pending: '○', in_progress: '◐', completed: '●' };
const PLAN_LABEL: Record<PlanStep['status'], string> = { pending: 'to do', in_progress: 'in progress', completed: 'done' };

/** The model's plan (`update_plan`, issue 29) as the checklist it is; the call's own
 * card (arguments, result) only when the tool refused it. */
function PlanCard(props: { call: ToolCall; steps: PlanStep[] }) {
  const done = props.steps.filter((s) => s.status === 'completed').length;
  return (
    <div class="tool-card plan-card" data-testid="plan" data-call-id={props.call.id}>
      <div class="plan-title">
        Plan <span class="plan-count">{done} of {props.steps.length} done</span>
      </div>
      <ol class="plan-steps">
        {props.steps.map((s, i) => (
          <li key={i} class={`plan-step plan-${s.status}`} data-testid="plan-step" data-status={s.status}>
            <span class="plan-mark" aria-label={PLAN_LABEL[s.status]} title={PLAN_LABEL[s.status]}>
              {PLAN_MARK[s.status]}
            </span>{' '}
            {s.step}
          </li>
        ))}
      </ol>
    </div>
  );
}

/** One tool call: a collapsible card with its arguments and result. */
export function ToolCard(props: {
  call: ToolCall;
  live?: ToolLive;
  result?: { text: string; isError: boolean };
  child?: ChildTab;
  /** The live states of the children (status.ts): the card says its child's. */
  childStates?: Record<string, LiveState>;
  /** Whether the delegated task's report is in the transcript. */
  reported?: boolean;
  /** The person deleted the delegated task's child: it will not report. */
  deleted?: boolean;
  onOpenChild?: (sessionId: string) => void;
}) {
  const { call, live, child } = props;
  const resultText = props.result?.text ?? live?.result;
  const isError = props.result?.isError ?? live?.isError ?? (resultText?.startsWith('Error:') || false);
  const running = resultText === undefined && (live?.running ?? false);
  const denied = isError && isDenial(resultText);
  // Denied because the person pressed Stop (or the run was cancelled): say "stopped".
  const stopped = denied && /the run was stopped|cancel/i.test(resultText ?? '');
  const taskId = call.name === 'sub_agent' ? subagentResult(resultText) : null;
  // A delegated call is pending until its child reports: the card follows the child.
  const childLive: LiveState | null = taskId && child ? (props.childStates?.[child.sessionId] ?? (child.interrupted ? 'interrupted' : childState({ sub: child.state }, undefined))) : null;
  const state = running
    ? 'running'
    : taskId && props.deleted && !child
      ? 'deleted'
    : resultText === undefined
      ? 'waiting'
      : stopped
        ? 'stopped'
        : denied
          ? 'denied'
          : isError
          ? 'error'
          : childLive
            ? CARD_STATE[childLive]
            : 'done';
  const steps = call.name === 'update_plan' && !isError ? planSteps(call.arguments) : null;
  if (steps) return <PlanCard call={call} steps={steps} />;
  const hint = argumentHint(call.arguments);
  // A delegated card says its child's live state, in the words every other place uses.
  const delegated = childLive && state === CARD_STATE[childLive] ? `sub-agent ${LIVE[childLive].label}${childLive === 'done' ? ' (reported)' : ''}` : null;
  const stateText = delegated
    ? delegated
    : state === 'running'
      ? 'running'
      : state === 'waiting'
        ? ''
        : state === 'denied'
          ? 'denied by you'
          : state === 'stopped'
            ? 'stopped'
            : state === 'deleted'
              ? props.reported
                ? 'sub-agent deleted (after its report)'
                : 'sub-agent deleted; it will not report'
            : state === 'error'
              ? 'error'
              : taskId
                ? props.reported
                    ? 'sub-agent done (reported)'
                    : 'sub-agent deleted'
                : 'done';
  return (
    <details class={`tool-card tool-${state}`} data-testid="tool-card" data-tool={call.name} data-call-id={call.id} data-state={state}>
      <summary>
        <span class="tool-name">{call.name}</span>
        {mcpServerOf(call.name) && (
          <span class="tool-mcp" data-testid="tool-mcp-server">
            MCP server {mcpServerOf(call.name)}
          </span>
        )}
        {hint && <span class="tool-hint">{call.name === 'sub_agent' ? `“${hint}”` : hint}</span>}
        <span class="tool-state">
          {state === 'running' && <span class="spinner" aria-hidden="true" />}
          {stateText}
        </span>
        {child && props.onOpenChild && (
          <button
            type="button"
            class="link"
            onClick={(e) => {
              e.preventDefault();
              props.onOpenChild?.(child.sessionId);
            }}
          >
            Open tab
          </button>
        )}
      </summary>
      <div class="tool-body">
        <div class="tool-label">Arguments</div>
        <Folded text={pretty(call.arguments)} testid="tool-arguments" />
        {resultText !== undefined && (
          <>
            <div class="tool-label">
              {stopped ? 'Stopped' : denied ? 'Denied' : isError ? 'Error' : 'Result'}
              {resultText && <CopyButton text={resultText} label="Copy the result" testid="copy-result" />}
            </div>
            <Folded text={resultText} testid="tool-result" />
          </>
        )}
      </div>
    </details>
  );
}
