import { useEffect, useRef, useState } from 'preact/hooks';
import type { ContextMeter } from '../bindings/ContextMeter';
import type { InstructionFile } from '../bindings/InstructionFile';
import { toCommandError } from '../platform';
import { modelLine, type ModelTokens } from '../usage';
import { basename, formatTokens, formatWindow } from '../util';
import { totalTokens } from '../model';
import { ErrorBox } from './ErrorBox';

function host(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return url;
  }
}

/** From this share of the window on, the meter warns: compaction is near. */
export const METER_WARN_PERCENT = 80;

/** "41 % of 32k": how full the model's window was at the last call, "N of M tokens" on hover. */
export function Meter(props: { meter: ContextMeter | null | undefined; testid?: string; short?: boolean }) {
  const { meter } = props;
  if (!meter || !(meter.window > 0)) return null;
  const percent = Math.min(100, Math.max(0, Math.floor(Number(meter.percent))));
  const warn = percent >= METER_WARN_PERCENT;
  return (
    <span
      class={`context-meter ${warn ? 'warn' : ''}`}
      data-testid={props.testid ?? 'context-meter'}
      data-percent={percent}
      data-warn={warn ? 'true' : undefined}
      title={`${meter.used} of ${meter.window} tokens`}
    >
      <span class="meter-bar" aria-hidden="true">
        <span class="meter-fill" style={{ width: `${percent}%` }} />
      </span>
      {props.short ? `${percent} %` : `${percent} % of ${formatWindow(meter.window)}`}
    </span>
  );
}

/** One line per loaded instruction file: "AGENTS.md ~1.2k tokens (cut)". */
export function instructionLine(file: InstructionFile): string {
  return `${file.path} ~${formatTokens(Number(file.tokens_estimate))} tokens${file.truncated ? ' (cut)' : ''}`;
}

/** "AGENTS.md · 2 files": the instruction files the last run loaded; a click lists them. */
export function Instructions(props: { files: InstructionFile[] }) {
  const [open, setOpen] = useState(false);
  const box = useRef<HTMLSpanElement>(null);
  // The list closes on a click elsewhere or Esc (Esc then does not also stop the run).
  useDismiss(open, box, () => setOpen(false));
  const { files } = props;
  if (!files.length) return null;
  const label = files.length === 1 ? basename(files[0].path) : `${basename(files[0].path)} · ${files.length} files`;
  const cut = files.some((f) => f.truncated);
  return (
    <span class="instructions" ref={box}>
      <button
        type="button"
        class={`link instructions-button ${cut ? 'cut' : ''}`}
        data-testid="status-instructions"
        aria-expanded={open}
        title={`Instructions the last run loaded:\n${files.map(instructionLine).join('\n')}`}
        onClick={() => setOpen(!open)}
      >
        {label}
      </button>
      {open && (
        <div class="instructions-popover" role="dialog" aria-label="Instruction files" data-testid="instructions-list">
          <div class="muted">Instructions the last run loaded</div>
          <ul>
            {files.map((f) => (
              <li key={f.path} data-testid="instruction-file" data-truncated={f.truncated ? 'true' : undefined}>
                <code>{f.path}</code> <span class="muted">~{formatTokens(Number(f.tokens_estimate))} tokens</span>
                {f.truncated && (
                  <span class="cut" title="Longer than the cap: only its start reaches the model">
                    {' '}
                    (cut)
                  </span>
                )}
              </li>
            ))}
          </ul>
        </div>
      )}
    </span>
  );
}

/** Closes a popover on a click outside `box` or on Esc (Esc then does not also stop the run). */
function useDismiss(open: boolean, box: { current: HTMLElement | null }, close: () => void) {
  useEffect(() => {
    if (!open) return;
    const away = (e: MouseEvent) => {
      if (box.current && !box.current.contains(e.target as Node)) close();
    };
    const esc = (e: KeyboardEvent) => {
      if (e.key !== 'Escape') return;
      e.preventDefault();
      close();
    };
    document.addEventListener('mousedown', away);
    document.addEventListener('keydown', esc, true);
    return () => {
      document.removeEventListener('mousedown', away);
      document.removeEventListener('keydown', esc, true);
    };
  }, [open]);
}

/** "12k tokens (tree)"; the tooltip and a click split them by model (the session and its sub-agents). */
export function TreeTokens(props: { total: number; models: ModelTokens[]; streaming?: number }) {
  const [open, setOpen] = useState(false);
  const box = useRef<HTMLSpanElement>(null);
  useDismiss(open, box, () => setOpen(false));
  const { models } = props;
  const live = props.streaming ?? 0;
  // While an answer streams, its tokens are estimated from its text, and the count says so
  // with "≈" (providers report usage only at the end; E23).
  const label = live > 0 ? `≈${formatTokens(props.total + live)} tokens (tree)` : `${formatTokens(props.total)} tokens (tree)`;
  const liveNote = live > 0 ? `\nIncludes ≈${formatTokens(live)} estimated from the answer streaming now.` : '';
  if (!models.length)
    return (
      <span data-testid="status-tokens" data-estimated={live > 0 ? 'true' : undefined} title={liveNote.trim() || undefined}>
        {label}
      </span>
    );
  return (
    <span class="instructions" ref={box}>
      <button
        type="button"
        class="link"
        data-testid="status-tokens"
        data-estimated={live > 0 ? 'true' : undefined}
        aria-expanded={open}
        title={`Tokens of this session and its sub-agents, by model:\n${models.map(modelLine).join('\n')}${liveNote}`}
        onClick={() => setOpen(!open)}
      >
        {label}
      </button>
      {open && (
        <div class="instructions-popover" role="dialog" aria-label="Tokens by model" data-testid="usage-by-model">
          <div class="muted">Tokens of this session and its sub-agents, by model</div>
          <ul>
            {models.map((m) => (
              <li key={`${m.provider}/${m.model}`} data-testid="usage-model" data-model={m.model} data-provider={m.provider}>
                <code>{m.model}</code> <span class="muted">({m.provider})</span> {formatTokens(totalTokens(m.tokens))}{' '}
                <span class="muted">
                  ({m.tokens.input} in, {m.tokens.output} out)
                </span>
              </li>
            ))}
          </ul>
        </div>
      )}
    </span>
  );
}

/** Compacts the conversation now; disabled without a session, errors shown beside it. */
function CompactButton(props: { onCompact: (() => Promise<void>) | null }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<{ message: string; retry: () => void } | null>(null);
  const run = async () => {
    if (!props.onCompact || busy) return;
    setBusy(true);
    setError(null);
    try {
      await props.onCompact();
    } catch (err) {
      setError({ message: `Cannot compact: ${toCommandError(err).message}`, retry: () => void run() });
    } finally {
      setBusy(false);
    }
  };
  return (
    <>
      <button
        type="button"
        class="link compact-button"
        data-testid="compact-button"
        disabled={!props.onCompact || busy}
        title="Summarise the earlier conversation now, to make room in the model's window (a running session does it before its next model call)"
        onClick={() => void run()}
      >
        {busy ? 'Compacting…' : 'Compact'}
      </button>
      {error && (
        <div class="status-error">
          <ErrorBox message={error.message} onRetry={error.retry} onDismiss={() => setError(null)} testid="compact-error" />
        </div>
      )}
    </>
  );
}

/**
 * The model the status line names: the open session's choice when it made one (a server
 * the config still has), else the default server (`default_provider`'s block, else the
 * `provider` block).
 */
export function statusServer(
  config: any,
  session: { provider?: string | null; model?: string | null } | null,
): { model: string; base_url: string; chosen: boolean } | null {
  if (!config) return null;
  const blockOf = (name: string | null | undefined) =>
    typeof name === 'string' && name ? config.providers?.[name] ?? (name === 'default' ? config.provider : undefined) : undefined;
  const chosen = blockOf(session?.provider);
  const p = chosen ?? blockOf(config.default_provider) ?? config.provider;
  if (!p) return null;
  return { model: String(session?.model || p.model || ''), base_url: String(p.base_url ?? ''), chosen: !!chosen || !!session?.model };
}

/** "What is it doing and what does it cost": model, tokens of the session tree, active runs, the window. */
export function StatusLine(props: {
  config: any;
  treeTokens: number | null;
  /** Estimated tokens of the answers streaming now in the open tree (E23). */
  streamingTokens?: number;
  /** The open session tree's tokens by model (from the session list). */
  models?: ModelTokens[];
  runs: number | null;
  /** Sessions waiting for a slot (shown beside the running ones when there are any). */
  waiting?: number;
  transport: string;
  context?: ContextMeter | null;
  instructions?: InstructionFile[];
  /** Compacts the open session; null when there is none. */
  onCompact?: (() => Promise<void>) | null;
  /** The open session's own choice (`set_model`), so the line names what it runs on (E19). */
  session?: { provider?: string | null; model?: string | null } | null;
}) {
  const p = statusServer(props.config, props.session ?? null);
  return (
    <footer class="status-line" data-testid="status-line">
      <span data-testid="status-model" title={p?.chosen ? "This session's model (chosen in its composer)" : 'The default server'}>
        {p ? `${p.model} @ ${host(p.base_url)}` : 'no model configured'}
      </span>
      {props.treeTokens != null && <TreeTokens total={props.treeTokens} models={props.models ?? []} streaming={props.streamingTokens ?? 0} />}
      {props.runs != null && <span data-testid="status-runs">{props.runs} running</span>}
      {(props.waiting ?? 0) > 0 && <span data-testid="status-waiting">{props.waiting} waiting for a slot</span>}
      <Meter meter={props.context} testid="status-context" />
      {props.onCompact !== undefined && <CompactButton onCompact={props.onCompact} />}
      <Instructions files={props.instructions ?? []} />
      <span class="muted">{props.transport}</span>
    </footer>
  );
}
