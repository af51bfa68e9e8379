// Small helpers shared by the components: formatting and remembered choices.

import type { JsonValue } from './bindings/serde_json/JsonValue';

export function formatTokens(n: number): string {
  if (n < 1000) return String(n);
  if (n < 1_000_000) return `${(n / 1000).toFixed(n < 10_000 ? 1 : 0).replace(/\.0$/, '')}k`;
  return `${(n / 1_000_000).toFixed(1).replace(/\.0$/, '')}M`;
}

/**
 * A model's window, compactly: windows are often multiples of 1024 (32768 → "32k", 131072 →
 * "128k"), where `formatTokens` would round to "33k"; round thousands read as usual
 * (128000 → "128k", 200000 → "200k").
 */
export function formatWindow(n: number): string {
  if (n >= 1024 && n % 1024 === 0 && n % 1000 !== 0) {
    const k = n / 1024;
    if (k < 1024) return `${k}k`;
    if (k % 1024 === 0) return `${k / 1024}M`;
  }
  return formatTokens(n);
}

export function basename(path: string): string {
  const parts = path.replace(/[\\/]+$/, '').split(/[\\/]/);
  return parts[parts.length - 1] || path;
}

export function pretty(value: JsonValue | undefined): string {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** A one-line hint of a tool call's arguments: its path, title, command or query. */
export function argumentHint(args: JsonValue | undefined): string {
  if (!args || typeof args !== 'object' || Array.isArray(args)) return typeof args === 'string' ? args.slice(0, 80) : '';
  for (const key of ['title', 'path', 'command', 'pattern', 'query', 'url', 'file']) {
    const value = (args as Record<string, JsonValue>)[key];
    if (typeof value === 'string') return value.length > 80 ? `${value.slice(0, 77)}…` : value;
  }
  return '';
}

const RECENTS_KEY = 'bumblehive.recentWorkspaces';
const LAST_SESSION_KEY = 'bumblehive.lastSession:';
export const SETUP_KEY = 'bumblehive.providerChecked';
/** Set once the person has seen that commands cannot be sandboxed here. */
export const SANDBOX_KEY = 'bumblehive.sandbox-notice-seen';

function storage(): Storage | null {
  try {
    return globalThis.localStorage ?? null;
  } catch {
    return null;
  }
}

export function readRecents(): string[] {
  try {
    const list = JSON.parse(storage()?.getItem(RECENTS_KEY) ?? '[]');
    return Array.isArray(list) ? list.filter((x) => typeof x === 'string') : [];
  } catch {
    return [];
  }
}

export function rememberWorkspace(path: string): string[] {
  const list = [path, ...readRecents().filter((p) => p !== path)].slice(0, 8);
  try {
    storage()?.setItem(RECENTS_KEY, JSON.stringify(list));
  } catch {
    /* ignore */
  }
  return list;
}

export function forgetWorkspace(path: string): string[] {
  const list = readRecents().filter((p) => p !== path);
  try {
    storage()?.setItem(RECENTS_KEY, JSON.stringify(list));
  } catch {
    /* ignore */
  }
  return list;
}

export function lastSession(workspace: string): string | null {
  try {
    return storage()?.getItem(LAST_SESSION_KEY + workspace) ?? null;
  } catch {
    return null;
  }
}

export function rememberSession(workspace: string, sessionId: string | null): void {
  try {
    if (sessionId) storage()?.setItem(LAST_SESSION_KEY + workspace, sessionId);
    else storage()?.removeItem(LAST_SESSION_KEY + workspace);
  } catch {
    /* ignore */
  }
}

export function flag(key: string): boolean {
  try {
    return storage()?.getItem(key) === '1';
  } catch {
    return true;
  }
}

export function setFlag(key: string): void {
  try {
    storage()?.setItem(key, '1');
  } catch {
    /* ignore */
  }
}
