// Settings' MCP servers section (issue #15): each server's state, its tools, enable/disable,
// restart, the trust question for a workspace's `.mcp.json` ("Trust and start" waits until
// they are ready), and the config's servers added, pasted, edited and removed through
// `update_config` (E13; the form's rules in mcpconfig.ts).
import { useEffect, useState } from 'preact/hooks';
import type { McpServerInfo } from '../bindings/McpServerInfo';
import type { TrustMcpWorkspace } from '../bindings/TrustMcpWorkspace';
import type { UpdateConfig } from '../bindings/UpdateConfig';
import { busyText } from '../busy';
import { EMPTY_MCP_FORM, entryLaunch, formOf, mcpFormProblem, mcpPatch, parseSnippet, type McpForm } from '../mcpconfig';
import { toCommandError, type Platform } from '../platform';
import { ConfirmButton } from './ConfirmButton';
import { ErrorBox } from './ErrorBox';

/** The server part of an `mcp__<server>__<tool>` name, else null. */
export function mcpServerOf(tool: string): string | null {
  const match = /^mcp__(.+?)(?:__|$)/.exec(tool);
  return match ? match[1] : null;
}

/** What a server is doing, in words. */
export function mcpStateText(server: McpServerInfo): string {
  switch (server.state) {
    case 'not_started':
      return 'not started (starts with the first turn that uses it)';
    case 'starting':
      return 'starting…';
    case 'ready':
      return `ready, ${server.tools.length} tool${server.tools.length === 1 ? '' : 's'}`;
    case 'failed':
      return `failed: ${server.error ?? 'unknown error'}`;
    case 'waiting_for_trust':
      return 'waiting for your trust';
    case 'disabled':
      return 'disabled';
  }
}

/** The command line (or URL) a server runs, as the trust question shows it. */
export function launchText(server: McpServerInfo): string {
  const launch = server.launch;
  if (!launch) return server.transport;
  return launch.url ?? launch.command.join(' ');
}

/** The trust digest of what is shown: the answer is refused if the file changed since. */
function shownDigest(waiting: McpServerInfo[]): string | undefined {
  return waiting.find((s) => s.trust_sha256)?.trust_sha256 ?? undefined;
}

/** A refused config change in words: a `busy` refusal says what to do (SPEC §6). */
function refusal(err: unknown, what: string): string {
  const e = toCommandError(err);
  return e.code === 'busy' ? `${what}: ${busyText(e.message)}` : `${what}: ${e.message}`;
}

/**
 * How often the list is read again while a trusted server is still starting after
 * "Trust and start" answered (a server slower than its start-up timeout). Tests shorten it.
 */
export const mcpFollow = { intervalMs: 1000, maxPolls: 120 };

const stillStarting = (list: McpServerInfo[] | null) => (list ?? []).some((s) => s.workspace && s.state === 'starting');

/** What "Trust and start" ended with, per server, in words. */
function startedText(list: McpServerInfo[]): string {
  const ws = list.filter((s) => s.workspace);
  if (ws.length === 0) return 'Trusted.';
  return ws.map((s) => `${s.name}: ${mcpStateText(s)}`).join('; ');
}

export function McpServers(props: { platform: Platform; workspace: string | null; config?: any; onChanged?: (config: any) => void }) {
  const { platform, workspace } = props;
  const [servers, setServers] = useState<McpServerInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [open, setOpen] = useState<Record<string, boolean>>({});
  const [form, setForm] = useState<McpForm | null>(null);
  const [formError, setFormError] = useState<string | null>(null);
  const [snippet, setSnippet] = useState('');
  const [working, setWorking] = useState(false);
  const [trusting, setTrusting] = useState<'idle' | 'starting' | { done: string }>('idle');
  // Polls left while following servers that still start after the answer.
  const [follow, setFollow] = useState(0);
  const configured: Record<string, any> = (props.config?.mcp_servers as Record<string, any> | undefined) ?? {};

  const load = async () => {
    try {
      setServers(await platform.invoke('list_mcp_servers', { workspace }));
      setError(null);
    } catch (err) {
      setError(toCommandError(err).message);
    }
  };
  useEffect(() => {
    void load();
  }, [workspace]);

  const act = async (run: () => Promise<unknown>) => {
    try {
      const result = await run();
      if (Array.isArray(result)) setServers(result as McpServerInfo[]);
      else await load();
      setError(null);
    } catch (err) {
      setError(toCommandError(err).message);
    }
  };

  /** Sends a config change; the list follows (a server added starts with the next turn). */
  const change = async (patch: UpdateConfig['patch'], what: string): Promise<string | null> => {
    setWorking(true);
    try {
      const args: UpdateConfig = { patch };
      props.onChanged?.(await platform.invoke('update_config', args));
      await load();
      return null;
    } catch (err) {
      return refusal(err, what);
    } finally {
      setWorking(false);
    }
  };

  const saveForm = async () => {
    if (!form) return;
    const problem = mcpFormProblem(form, Object.keys(configured));
    if (problem) {
      setFormError(problem);
      return;
    }
    const before = form.editing != null ? configured[form.editing] ?? null : null;
    const failed = await change(mcpPatch(form, before), form.editing != null ? 'Not saved' : 'Not added');
    setFormError(failed);
    if (!failed) setForm(null);
  };

  const addSnippet = async () => {
    const parsed = parseSnippet(snippet, form?.name ?? '');
    if ('error' in parsed) {
      setFormError(parsed.error);
      return;
    }
    const taken = parsed.servers.map(([name]) => name).filter((name) => name in configured);
    if (taken.length > 0) {
      setFormError(`Already configured: ${taken.join(', ')} (edit or remove ${taken.length === 1 ? 'it' : 'them'} first).`);
      return;
    }
    const failed = await change({ mcp_servers: Object.fromEntries(parsed.servers) }, 'Not added');
    setFormError(failed);
    if (!failed) {
      setSnippet('');
      setForm(null);
    }
  };

  const trust = async (allow: boolean, shown: McpServerInfo[]) => {
    if (!workspace) return;
    const args: TrustMcpWorkspace = { workspace, allow, sha256: shownDigest(shown) };
    if (allow) {
      args.start = true;
      setTrusting('starting');
    }
    try {
      const list = await platform.invoke('trust_mcp_workspace', args);
      setServers(list);
      setError(null);
      // Still starting (slower than its start-up timeout): the list is followed until it
      // settles, so the answer is "ready" or "failed", never a state that went stale.
      if (allow && stillStarting(list)) setFollow(mcpFollow.maxPolls);
      else setTrusting(allow ? { done: startedText(list) } : 'idle');
    } catch (err) {
      setTrusting('idle');
      setError(toCommandError(err).message);
    }
  };

  useEffect(() => {
    if (follow <= 0) return;
    if (!stillStarting(servers)) {
      setFollow(0);
      setTrusting({ done: startedText(servers ?? []) });
      return;
    }
    const timer = setTimeout(() => {
      setFollow((n) => n - 1);
      void load();
    }, mcpFollow.intervalMs);
    return () => clearTimeout(timer);
  }, [follow, servers]);

  const waiting = (servers ?? []).filter((s) => s.state === 'waiting_for_trust');
  const key = (s: McpServerInfo) => `${s.workspace ?? ''}/${s.name}`;
  const snippetPreview = snippet.trim() ? parseSnippet(snippet, form?.name ?? '') : null;
  const field = (name: keyof McpForm) => (e: Event) => {
    const value = (e.target as HTMLInputElement).value;
    setForm((f) => (f ? { ...f, [name]: value } : f));
  };
  return (
    <section class="mcp-servers" data-testid="mcp-section">
      <div class="row">
        <span>MCP servers</span>
        <button type="button" data-testid="mcp-refresh" onClick={() => void load()}>
          Refresh
        </button>
        {props.onChanged && !form && (
          <button
            type="button"
            data-testid="mcp-add"
            disabled={working}
            onClick={() => {
              setFormError(null);
              setForm({ ...EMPTY_MCP_FORM });
            }}
          >
            Add…
          </button>
        )}
      </div>
      {error && (
        <div class="muted" data-testid="mcp-error">
          {error}
        </div>
      )}
      {trusting === 'starting' && (
        <div class="muted" data-testid="mcp-trust-starting">
          Starting the workspace's servers…
        </div>
      )}
      {typeof trusting === 'object' && (
        <div class="muted" data-testid="mcp-trust-result">
          {trusting.done}
        </div>
      )}
      {waiting.length > 0 && workspace && (
        <div class="mcp-trust" data-testid="mcp-trust">
          This workspace's <code>.mcp.json</code> wants to start the servers below. They run programs the repository chose, outside the
          sandbox, with your permissions, and a command can change the files they run (you are asked again when one changes). Start them?
          <ul class="mcp-trust-servers" data-testid="mcp-trust-servers">
            {waiting.map((s) => (
              <li key={key(s)} data-testid="mcp-trust-server" data-name={s.name}>
                <strong>{s.name}</strong> <code data-testid="mcp-trust-command">{launchText(s)}</code>
                {s.launch?.cwd ? <span class="muted"> in {s.launch.cwd}</span> : null}
                {s.launch && s.launch.env.length > 0 && <div class="muted">environment: {s.launch.env.join(', ')}</div>}
                {s.launch && s.launch.headers.length > 0 && <div class="muted">headers: {s.launch.headers.join(', ')}</div>}
                {s.launch?.program_files.map((f) => (
                  <div class="muted" key={f.path}>
                    runs {f.path} (SHA-256 {f.sha256.slice(0, 12)}…)
                  </div>
                ))}
                {s.launch?.notes.map((note) => (
                  <div class="muted" key={note}>
                    {note}
                  </div>
                ))}
              </li>
            ))}
          </ul>
          <div class="row">
            <button type="button" class="primary" data-testid="mcp-trust-allow" disabled={trusting === 'starting'} onClick={() => void trust(true, waiting)}>
              Trust and start
            </button>
            <button type="button" data-testid="mcp-trust-deny" disabled={trusting === 'starting'} onClick={() => void trust(false, waiting)}>
              Don't start
            </button>
          </div>
        </div>
      )}
      {servers && servers.length === 0 && (
        <div class="muted" data-testid="mcp-none">
          None configured: add one here, or a <code>.mcp.json</code> to the workspace.
        </div>
      )}
      {form && (
        <form
          class="mcp-form"
          data-testid="mcp-form"
          noValidate
          onSubmit={(e) => {
            e.preventDefault();
            void saveForm();
          }}
        >
          <label>
            <span>Name</span>
            <input type="text" value={form.name} data-testid="mcp-name" disabled={form.editing != null} onInput={field('name')} placeholder="e.g. time, github" />
          </label>
          <label>
            <span>Kind</span>
            <select value={form.transport} data-testid="mcp-transport" onChange={field('transport')}>
              <option value="stdio">A program (stdio)</option>
              <option value="http">A URL (streamable HTTP)</option>
            </select>
          </label>
          {form.transport === 'stdio' ? (
            <>
              <label>
                <span>Command</span>
                <input type="text" value={form.command} data-testid="mcp-command" onInput={field('command')} placeholder="e.g. uvx, npx, /usr/local/bin/server" />
              </label>
              <label>
                <span>Arguments, one per line</span>
                <textarea rows={3} value={form.args} data-testid="mcp-args" onInput={field('args')} placeholder={'mcp-server-time\n--local-timezone=Europe/Paris'} />
              </label>
              <label>
                <span>Environment, NAME=value per line (a value may be {'${VAR}'} or keyring:ENTRY)</span>
                <textarea rows={2} value={form.env} data-testid="mcp-env" onInput={field('env')} />
              </label>
            </>
          ) : (
            <>
              <label>
                <span>URL</span>
                <input type="url" value={form.url} data-testid="mcp-url" onInput={field('url')} placeholder="https://example.com/mcp" />
              </label>
              <label>
                <span>Headers, Name: value per line</span>
                <textarea rows={2} value={form.headers} data-testid="mcp-headers" onInput={field('headers')} placeholder={'Authorization: Bearer ${TOKEN}'} />
              </label>
            </>
          )}
          {form.editing == null && (
            <label>
              <span>Or paste a .mcp.json snippet ({'{"mcpServers": {…}}'} or one server's object)</span>
              <textarea rows={4} value={snippet} data-testid="mcp-snippet" onInput={(e) => setSnippet((e.target as HTMLTextAreaElement).value)} />
            </label>
          )}
          {snippetPreview && 'servers' in snippetPreview && (
            <ul class="mcp-snippet-preview" data-testid="mcp-snippet-preview">
              {snippetPreview.servers.map(([name, block]) => (
                <li key={name}>
                  <strong>{name}</strong> <code>{entryLaunch(block as Record<string, any>)}</code>
                </li>
              ))}
            </ul>
          )}
          {formError && <ErrorBox testid="mcp-form-error" message={formError} onDismiss={() => setFormError(null)} />}
          <div class="row">
            {snippet.trim() && form.editing == null ? (
              <button type="button" class="primary" data-testid="mcp-snippet-add" disabled={working} onClick={() => void addSnippet()}>
                {snippetPreview && 'servers' in snippetPreview && snippetPreview.servers.length > 1 ? `Add ${snippetPreview.servers.length} servers` : 'Add from snippet'}
              </button>
            ) : (
              <button type="submit" class="primary" data-testid="mcp-save" disabled={working}>
                {form.editing != null ? 'Save' : 'Add server'}
              </button>
            )}
            <button
              type="button"
              data-testid="mcp-cancel"
              onClick={() => {
                setForm(null);
                setSnippet('');
                setFormError(null);
              }}
            >
              Cancel
            </button>
          </div>
        </form>
      )}
      {servers?.map((s) => (
        <div key={key(s)} class={`mcp-server mcp-${s.state}`} data-testid="mcp-server" data-name={s.name} data-state={s.state}>
          <div class="row">
            <strong>{s.name}</strong>
            <span class="muted">
              {s.transport}
              {s.workspace ? ' · .mcp.json' : ''}
              {s.server_info ? ` · ${s.server_info}` : ''}
            </span>
            <span data-testid="mcp-state">{mcpStateText(s)}</span>
            {!s.workspace && (
              <button
                type="button"
                data-testid="mcp-toggle"
                onClick={() => void act(() => platform.invoke('set_mcp_server_enabled', { name: s.name, enabled: !s.enabled }))}
              >
                {s.enabled ? 'Disable' : 'Enable'}
              </button>
            )}
            {!s.workspace && props.onChanged && configured[s.name] && (
              <button
                type="button"
                data-testid="mcp-edit"
                disabled={working}
                onClick={() => {
                  setFormError(null);
                  setSnippet('');
                  setForm(formOf(s.name, configured[s.name]));
                }}
              >
                Edit
              </button>
            )}
            {!s.workspace && props.onChanged && configured[s.name] && (
              <ConfirmButton
                class="quiet"
                testid="mcp-remove"
                label="Remove"
                confirmLabel="Remove it"
                disabled={working}
                title="Remove this server from the config (its process stops with the next turn)"
                onConfirm={() =>
                  void change({ mcp_servers: { [s.name]: null } }, 'Not removed').then((failed) => setError(failed))
                }
              />
            )}
            {(s.state === 'ready' || s.state === 'failed') && (
              <button type="button" data-testid="mcp-restart" onClick={() => void act(() => platform.invoke('restart_mcp_server', { name: s.name, workspace: s.workspace }))}>
                Restart
              </button>
            )}
            {s.tools.length > 0 && (
              <button type="button" class="link" data-testid="mcp-tools-toggle" onClick={() => setOpen((o) => ({ ...o, [key(s)]: !o[key(s)] }))}>
                {open[key(s)] ? 'Hide tools' : 'Tools'}
              </button>
            )}
          </div>
          {open[key(s)] && (
            <ul class="mcp-tools" data-testid="mcp-tools">
              {s.tools.map((t) => (
                <li key={t.full_name}>
                  <code>{t.full_name}</code> {t.description}
                </li>
              ))}
            </ul>
          )}
        </div>
      ))}
    </section>
  );
}
