import { useState } from 'preact/hooks';
import type { ToolCall } from '../bindings/ToolCall';
import type { ChildTab, ToolLive } from '../model';
import { argumentHint, pretty } from '../util';

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

/** One tool call: a collapsible card with its arguments and result. */
export function ToolCard(props: {
  call: ToolCall;
  live?: ToolLive;
  result?: { text: string; isError: boolean };
  child?: ChildTab;
  onOpenChild?: (sessionId: string) => void;
}) {
  const { call, live, child } = props;
  const resultText = props.result?.text ?? live?.result;
  const isError = props.result?.isError ?? live?.isError ?? (resultText?.startsWith('Error:') || false);
  const running = resultText === undefined && (live?.running ?? false);
  const state = running ? 'running' : resultText === undefined ? 'waiting' : isError ? 'error' : 'done';
  const hint = argumentHint(call.arguments);
  const taskId = call.name === 'sub_agent' ? subagentResult(resultText) : null;
  return (
    <details class={`tool-card tool-${state}`} data-testid="tool-card" data-tool={call.name} data-call-id={call.id} data-state={state}>
      <summary>
        <span class="tool-name">{call.name}</span>
        {hint && <span class="tool-hint">{call.name === 'sub_agent' ? `“${hint}”` : hint}</span>}
        <span class="tool-state">
          {state === 'running' && <span class="spinner" aria-hidden="true" />}
          {state === 'running' ? 'running' : state === 'waiting' ? '' : state === 'error' ? 'error' : taskId ? `→ pending (task ${taskId})` : 'done'}
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
            <div class="tool-label">{isError ? 'Error' : 'Result'}</div>
            <Folded text={resultText} testid="tool-result" />
          </>
        )}
      </div>
    </details>
  );
}
