// Who ran on what and what it cost, from `list_sessions`: a session's profile and model,
// and tokens split by model over a session tree (SessionInfo.models). Pure TypeScript.

import type { ModelUsage } from './bindings/ModelUsage';
import type { SessionInfo } from './bindings/SessionInfo';
import { tokens, totalTokens, type Tokens } from './model';
import { formatTokens } from './util';

/** The model and server (provider name) a session ran on last (the last `models` entry), or those chosen for it. */
function lastRun(info: SessionInfo | null | undefined): { model: string | null; server: string | null } {
  const models = info?.models ?? [];
  const last = models[models.length - 1];
  return last
    ? { model: last.model || info?.model || null, server: last.provider || null }
    : { model: info?.model || null, server: info?.provider || null };
}

/** "tiny on local": where something runs, with whichever of the two is known. */
export function modelOnServer(model: string | null | undefined, server: string | null | undefined): string | null {
  return model && server ? `${model} on ${server}` : model || server || null;
}

/**
 * "explore · qwen2.5-coder-7b on local": a child's profile, model and server, whichever
 * are known. The server too (E3): a child follows its parent's pick or its profile, and
 * the person sees where its content goes, as the approval dock says it.
 */
export function agentLabel(info: SessionInfo | null | undefined): string {
  const { model, server } = lastRun(info);
  return [info?.agent, modelOnServer(model, server)].filter(Boolean).join(' · ');
}

export interface ModelTokens {
  provider: string;
  model: string;
  tokens: Tokens;
}

/** Adds each entry of `models` to `into`, keyed by provider and model, keeping first-use order. */
function addModels(into: ModelTokens[], models: ModelUsage[] | undefined): void {
  for (const m of models ?? []) {
    const add = tokens(m.usage);
    const entry = into.find((e) => e.provider === m.provider && e.model === m.model);
    if (entry) entry.tokens = { input: entry.tokens.input + add.input, output: entry.tokens.output + add.output };
    else into.push({ provider: m.provider, model: m.model, tokens: add });
  }
}

/** A session and everything below it, in list order (the root first). */
export function treeOf(sessions: SessionInfo[], rootId: string): SessionInfo[] {
  const byParent = new Map<string, SessionInfo[]>();
  for (const s of sessions) {
    if (!s.parent_session_id) continue;
    const list = byParent.get(s.parent_session_id) ?? [];
    list.push(s);
    byParent.set(s.parent_session_id, list);
  }
  const root = sessions.find((s) => s.session_id === rootId);
  const out: SessionInfo[] = root ? [root] : [];
  const seen = new Set<string>([rootId]);
  const queue = [rootId];
  while (queue.length) {
    for (const child of byParent.get(queue.shift()!) ?? []) {
      if (seen.has(child.session_id)) continue;
      seen.add(child.session_id);
      out.push(child);
      queue.push(child.session_id);
    }
  }
  return out;
}

/** The tokens of a session's whole tree by provider and model. */
export function treeModels(sessions: SessionInfo[], rootId: string): ModelTokens[] {
  const out: ModelTokens[] = [];
  for (const s of treeOf(sessions, rootId)) addModels(out, s.models);
  return out;
}

/** A session's own tokens by provider and model. */
export function sessionModels(info: SessionInfo | null | undefined): ModelTokens[] {
  const out: ModelTokens[] = [];
  addModels(out, info?.models);
  return out;
}

/** "qwen2.5-coder (local): 1.2k tokens (1000 in, 200 out)". */
export function modelLine(m: ModelTokens): string {
  return `${m.model} (${m.provider}): ${formatTokens(totalTokens(m.tokens))} tokens (${m.tokens.input} in, ${m.tokens.output} out)`;
}

/**
 * Tokens of answers streaming now, estimated from their text (a quarter of its length,
 * as the runtime estimates): providers report usage only at the end of a stream, so the
 * live count is shown as "≈" (E23). Past 100 tokens it moves in steps of 25, so the
 * status line re-renders every ~100 characters, not on every delta.
 */
export function streamingEstimate(chars: number): number {
  if (chars <= 0) return 0;
  const tokens = Math.ceil(chars / 4);
  return tokens <= 100 ? tokens : Math.ceil(tokens / 25) * 25;
}
