import { formatTokens } from '../util';

function host(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return url;
  }
}

/** "What is it doing and what does it cost": model, tokens of the session tree, active runs. */
export function StatusLine(props: { config: any; treeTokens: number | null; runs: number | null; transport: string }) {
  const p = props.config?.provider;
  return (
    <footer class="status-line" data-testid="status-line">
      <span data-testid="status-model">{p ? `${p.model} @ ${host(p.base_url)}` : 'no model configured'}</span>
      {props.treeTokens != null && <span data-testid="status-tokens">{formatTokens(props.treeTokens)} tokens (tree)</span>}
      {props.runs != null && <span data-testid="status-runs">{props.runs} running</span>}
      <span class="muted">{props.transport}</span>
    </footer>
  );
}
