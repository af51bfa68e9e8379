import { useEffect, useRef, useState } from 'preact/hooks';
import type { ApprovalInfo } from '../bindings/ApprovalInfo';
import { toCommandError } from '../platform';
import { modelOnServer } from '../usage';
import { argumentHint, pretty } from '../util';
import { DiffView } from './DiffView';
import { ErrorBox } from './ErrorBox';
import { Folded } from './ToolCard';

export type Decide = (approval: ApprovalInfo, approved: boolean, remember: boolean, reason: string | null) => Promise<void>;

/**
 * "tiny on local": where an asking sub-agent runs (E3), so the person sees which server
 * the call's content goes to before deciding. Null for a top-level session's approval.
 */
export function runsOn(approval: ApprovalInfo): string | null {
  return modelOnServer(approval.model, approval.provider);
}

/** What "Always" says on its button: exactly what it covers (the runtime's label). */
export function alwaysLabel(approval: ApprovalInfo): string {
  return approval.remember_label
    ? approval.remember_label.charAt(0).toUpperCase() + approval.remember_label.slice(1)
    : `Always allow ${approval.tool} in this session`;
}

/**
 * The approval of one tool call, docked above the composer so the chat stays readable.
 * Always shown in the parent's window (whichever tab is open), naming the sub-agent that
 * asks. Enter never approves: focus goes to the panel itself (never to a button), and Enter
 * is swallowed everywhere in it except on the Deny button and in the reason field (where it
 * denies). Approving takes a click (or Space on a focused button).
 */
export function ApprovalDialog(props: { approval: ApprovalInfo; queued: number; onDecide: Decide }) {
  const { approval } = props;
  const [reason, setReason] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [last, setLast] = useState<[boolean, boolean] | null>(null);
  const box = useRef<HTMLDivElement>(null);

  useEffect(() => {
    setReason('');
    setError(null);
    setBusy(false);
    // Take focus, unless the person is typing somewhere (their Enter then sends, never approves).
    const active = document.activeElement as HTMLElement | null;
    const typing = active && (active.tagName === 'TEXTAREA' || active.tagName === 'INPUT') && !box.current?.contains(active);
    if (!typing) box.current?.focus();
  }, [approval.approval_id]);

  const decide = async (approved: boolean, remember: boolean) => {
    if (busy) return;
    setBusy(true);
    setError(null);
    setLast([approved, remember]);
    try {
      await props.onDecide(approval, approved, remember, approved ? null : reason.trim() || null);
    } catch (err) {
      setError(toCommandError(err).message);
    } finally {
      setBusy(false);
    }
  };

  const onKeyDown = (e: KeyboardEvent) => {
    if (e.key === 'Escape') {
      // Esc elsewhere stops the run; here it does nothing by accident either.
      e.stopPropagation();
      return;
    }
    if (e.key !== 'Enter') return;
    const target = e.target as HTMLElement;
    const role = target?.getAttribute?.('data-testid');
    e.stopPropagation();
    if (role === 'approval-deny') return; // the button's own activation denies
    e.preventDefault();
    if (role === 'approval-reason' && !e.isComposing) void decide(false, false);
  };

  const who = approval.title ? `Sub-agent “${approval.title}”` : 'The agent';
  const where = runsOn(approval);
  const hint = argumentHint(approval.arguments);
  const always = alwaysLabel(approval);
  return (
    <div class="approval-dock">
      <div
        class="dialog approval"
        role="dialog"
        aria-modal="true"
        aria-labelledby="approval-title"
        tabIndex={-1}
        ref={box}
        onKeyDownCapture={onKeyDown}
        data-testid="approval-dialog"
        data-approval-id={approval.approval_id}
        data-session-id={approval.session_id}
      >
        <h2 id="approval-title">
          {who}
          {where && (
            <span class="approval-runs-on" data-testid="approval-runs-on">
              {' '}
              · {where}
            </span>
          )}{' '}
          wants to run <code>{approval.tool}</code>
          {hint && <span class="approval-hint"> on {hint}</span>}
          {approval.mcp_server && (
            <span class="approval-hint" data-testid="approval-mcp-server">
              {' '}
              (a tool of the MCP server {approval.mcp_server})
            </span>
          )}
        </h2>
        {approval.worktree && (
          <div class="muted" data-testid="approval-worktree">
            In its own worktree (branch <code>{approval.worktree}</code>), not in the workspace: the workspace changes
            only when you apply its work.
          </div>
        )}
        {props.queued > 1 && <div class="muted">1 of {props.queued} waiting for your decision</div>}
        {approval.diff != null && approval.diff.trim() === '' ? (
          <>
            <div class="tool-label">Changes</div>
            <div class="muted" data-testid="approval-no-changes">
              No changes: the file already has exactly this content.
            </div>
            <details>
              <summary>Arguments</summary>
              <Folded text={pretty(approval.arguments)} testid="approval-arguments" />
            </details>
          </>
        ) : approval.diff ? (
          <>
            <div class="tool-label">Changes</div>
            <DiffView diff={approval.diff} />
            <details>
              <summary>Arguments</summary>
              <Folded text={pretty(approval.arguments)} testid="approval-arguments" />
            </details>
          </>
        ) : (
          <>
            <div class="tool-label">Arguments</div>
            <Folded text={pretty(approval.arguments)} testid="approval-arguments" />
          </>
        )}
        <label class="reason">
          <span>Reason for denying (optional, told to the agent)</span>
          <input
            type="text"
            value={reason}
            data-testid="approval-reason"
            onInput={(e) => setReason((e.target as HTMLInputElement).value)}
          />
        </label>
        {error && (
          <ErrorBox message={error} onRetry={last ? () => void decide(last[0], last[1]) : undefined} onDismiss={() => setError(null)} />
        )}
        <div class="dialog-buttons">
          <div class="muted small approval-keys" data-testid="approval-keys">
            Click or Space on a button decides; Enter never approves (in the reason field it denies). Tab moves between the buttons.
          </div>
          <button type="button" class="primary" disabled={busy} data-testid="approval-approve" onClick={() => void decide(true, false)}>
            Approve
          </button>
          {approval.rememberable && (
            <button type="button" class="approval-always" disabled={busy} data-testid="approval-always" title={always} onClick={() => void decide(true, true)}>
              {always}
            </button>
          )}
          <button type="button" class="danger" disabled={busy} data-testid="approval-deny" onClick={() => void decide(false, false)}>
            Deny
          </button>
        </div>
      </div>
    </div>
  );
}
