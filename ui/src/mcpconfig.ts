// Settings' MCP server form (issue 28, E13): the config's `mcp_servers` entries as a form,
// a form back into the `update_config` merge patch that adds or edits one, and a pasted
// `.mcp.json` snippet read into entries. No I/O: McpServers.tsx sends the patches.

import type { JsonValue } from './bindings/serde_json/JsonValue';

/** What `get_config` shows instead of a literal secret (Rust: `mcp::config::redact`). */
export const REDACTED = '<redacted>';

export interface McpForm {
  /** The entry being edited (its name is fixed), or null when adding. */
  editing: string | null;
  name: string;
  transport: 'stdio' | 'http';
  command: string;
  /** One argument per line: no quoting rules to get wrong. */
  args: string;
  /** `NAME=value` per line (a value may be `${VAR}` or `keyring:ENTRY`). */
  env: string;
  url: string;
  /** `Name: value` per line. */
  headers: string;
}

export const EMPTY_MCP_FORM: McpForm = { editing: null, name: '', transport: 'stdio', command: '', args: '', env: '', url: '', headers: '' };

type Block = { [key: string]: JsonValue };

const isObject = (v: unknown): v is Record<string, any> => !!v && typeof v === 'object' && !Array.isArray(v);

/** Whether a config or `.mcp.json` entry is one server (it says how to reach it). */
function isServer(v: unknown): v is Record<string, any> {
  return isObject(v) && (typeof v.command === 'string' || typeof v.url === 'string');
}

function isHttp(block: Record<string, any>): boolean {
  return block.type === 'http' || block.type === 'streamable-http' || (typeof block.url === 'string' && typeof block.command !== 'string');
}

/** A config entry as the form shows it. */
export function formOf(name: string, block: Record<string, any>): McpForm {
  const pairs = (map: unknown, sep: string) =>
    isObject(map)
      ? Object.entries(map)
          .map(([k, v]) => `${k}${sep}${String(v)}`)
          .join('\n')
      : '';
  return {
    editing: name,
    name,
    transport: isHttp(block) ? 'http' : 'stdio',
    command: typeof block.command === 'string' ? block.command : '',
    args: Array.isArray(block.args) ? block.args.map(String).join('\n') : '',
    env: pairs(block.env, '='),
    url: typeof block.url === 'string' ? block.url : '',
    headers: pairs(block.headers, ': '),
  };
}

function lines(text: string): string[] {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '');
}

/** `NAME=value` (or `Name: value`) lines into a map, or what is wrong with a line. */
function parsePairs(text: string, sep: '=' | ':', what: string): Record<string, string> | string {
  const map: Record<string, string> = {};
  for (const line of lines(text)) {
    const at = line.indexOf(sep);
    if (at <= 0) return `${what}: "${line}" is not ${sep === '=' ? 'NAME=value' : 'Name: value'}.`;
    map[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return map;
}

/** Where a name and form are wrong, in words, or null. */
export function mcpFormProblem(form: McpForm, existing: string[]): string | null {
  const name = form.name.trim();
  if (!name) return 'Give the server a name.';
  if (!/^[A-Za-z0-9_-]+$/.test(name)) return 'The name may use letters, digits, "-" and "_".';
  if (form.editing == null && existing.includes(name)) return `A server named "${name}" exists already.`;
  if (form.transport === 'stdio' && !form.command.trim()) return 'Give the command to run.';
  if (form.transport === 'http' && !/^https?:\/\//.test(form.url.trim())) return 'Give the URL (http:// or https://).';
  const env = parsePairs(form.env, '=', 'Environment');
  if (typeof env === 'string') return env;
  const headers = parsePairs(form.headers, ':', 'Headers');
  if (typeof headers === 'string') return headers;
  return null;
}

/**
 * The merge patch that makes the config's entry what the form says. Editing keeps what
 * the form does not show (`enabled`, timeouts) and every redacted value unchanged (the
 * secret is not in the UI to send back); a line removed removes its key.
 */
export function mcpPatch(form: McpForm, before: Record<string, any> | null): { mcp_servers: Block } {
  const name = form.name.trim();
  const env = parsePairs(form.env, '=', '') as Record<string, string>;
  const headers = parsePairs(form.headers, ':', '') as Record<string, string>;
  const map = (next: Record<string, string>, old: unknown): Block | null => {
    const out: Block = {};
    const prior = isObject(old) ? old : {};
    for (const key of Object.keys(prior)) if (!(key in next)) out[key] = null;
    for (const [key, value] of Object.entries(next)) {
      // A redacted value left as it was keeps the stored secret.
      if (value === REDACTED && key in prior) continue;
      if (prior[key] !== value) out[key] = value;
    }
    return Object.keys(out).length > 0 ? out : null;
  };
  const block: Block = {};
  if (form.transport === 'stdio') {
    block.type = null;
    block.url = null;
    block.headers = null;
    block.command = form.command.trim();
    block.args = lines(form.args);
    const changed = map(env, before?.env);
    if (changed) block.env = changed;
  } else {
    block.type = 'http';
    block.command = null;
    block.args = null;
    block.env = null;
    block.cwd = null;
    block.url = form.url.trim();
    const changed = map(headers, before?.headers);
    if (changed) block.headers = changed;
  }
  if (!before) {
    // A new entry: nothing to remove.
    for (const [key, value] of Object.entries(block)) if (value === null) delete block[key];
    if (Array.isArray(block.args) && block.args.length === 0) delete block.args;
  }
  return { mcp_servers: { [name]: block } };
}

/**
 * A pasted snippet's servers: `{"mcpServers": {...}}` (`.mcp.json`, Claude Desktop),
 * `{"mcp_servers": {...}}` (our config), a map of names to servers, or one bare server
 * object (named by `fallbackName`). An error in words when it is none of these.
 */
export function parseSnippet(text: string, fallbackName: string): { servers: [string, Block][] } | { error: string } {
  let value: unknown;
  const trimmed = text.trim();
  if (!trimmed) return { error: 'Paste a .mcp.json snippet first.' };
  try {
    value = JSON.parse(trimmed);
  } catch {
    // A snippet copied from inside a file: `"name": {…}` without the outer braces.
    try {
      value = JSON.parse(`{${trimmed.replace(/,\s*$/, '')}}`);
    } catch (err) {
      return { error: `Not JSON: ${(err as Error).message}` };
    }
  }
  if (!isObject(value)) return { error: 'Expected a JSON object.' };
  const map = isObject(value.mcpServers) ? value.mcpServers : isObject(value.mcp_servers) ? value.mcp_servers : null;
  let entries: [string, unknown][];
  if (map) entries = Object.entries(map);
  else if (isServer(value)) {
    const name = fallbackName.trim();
    if (!name) return { error: 'This is one server without a name: type its name in the Name field.' };
    entries = [[name, value]];
  } else entries = Object.entries(value);
  if (entries.length === 0) return { error: 'The snippet names no server.' };
  const servers: [string, Block][] = [];
  for (const [name, server] of entries) {
    if (!isServer(server)) return { error: `"${name}" has neither a command nor a url.` };
    servers.push([name, server as Block]);
  }
  return { servers };
}

/** The command line or URL of a config entry, as the person reads it. */
export function entryLaunch(block: Record<string, any>): string {
  if (isHttp(block)) return String(block.url ?? '');
  const args = Array.isArray(block.args) ? block.args.map(String) : [];
  return [String(block.command ?? ''), ...args].join(' ');
}
