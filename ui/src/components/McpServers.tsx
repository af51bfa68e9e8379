// Settings' MCP servers section (issue #15): each server's state, its tools, enable/disable,
// restart, and the trust question for a workspace's `.mcp.json`.
import { useEffect, useState } from 'preact/hooks';
import type { McpServerInfo } from '../bindings/McpServerInfo';
import { toCommandError, type Platform } from '../platform';

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

export function McpServers(props: { platform: Platform; workspace: string | null }) {
  const { platform, workspace } = props;
  const [servers, setServers] = useState<McpServerInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [open, setOpen] = useState<Record<string, boolean>>({});

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

  const waiting = (servers ?? []).filter((s) => s.state === 'waiting_for_trust');
  const key = (s: McpServerInfo) => `${s.workspace ?? ''}/${s.name}`;
  return (
    <section class="mcp-servers" data-testid="mcp-section">
      <div class="row">
        <span>MCP servers</span>
        <button type="button" data-testid="mcp-refresh" onClick={() => void load()}>
          Refresh
        </button>
      </div>
      {error && (
        <div class="muted" data-testid="mcp-error">
          {error}
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
            <button type="button" class="primary" data-testid="mcp-trust-allow" onClick={() => void act(() => platform.invoke('trust_mcp_workspace', { workspace, allow: true, sha256: shownDigest(waiting) }))}>
              Trust and start
            </button>
            <button type="button" data-testid="mcp-trust-deny" onClick={() => void act(() => platform.invoke('trust_mcp_workspace', { workspace, allow: false, sha256: shownDigest(waiting) }))}>
              Don't start
            </button>
          </div>
        </div>
      )}
      {servers && servers.length === 0 && (
        <div class="muted" data-testid="mcp-none">
          None configured: add <code>mcp_servers</code> to the config, or a <code>.mcp.json</code> to the workspace.
        </div>
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
