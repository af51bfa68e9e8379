import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, appended, inAct, info, kind, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';
import { mcpServerOf } from '../components/McpServers';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const echo = { name: 'echo', full_name: 'mcp__everything__echo', description: 'Echoes back the input', read_only_hint: true };

describe('MCP servers in Settings', () => {
  it('lists each server with its state and tools, disables, restarts, and asks to trust a workspace .mcp.json', async () => {
    const fake = workspacePlatform([info('p')]);
    let list: any[] = [
      { name: 'everything', workspace: null, transport: 'stdio', enabled: true, state: 'ready', error: null, tools: [echo], server_info: 'mcp-servers/everything 2.0.0' },
      { name: 'broken', workspace: null, transport: 'http', enabled: true, state: 'failed', error: 'cannot start: connection refused', tools: [], server_info: null },
      {
        name: 'repo',
        workspace: '/ws',
        transport: 'stdio',
        enabled: true,
        state: 'waiting_for_trust',
        error: null,
        tools: [],
        server_info: null,
        launch: {
          command: ['python3', 'srv.py', '--fast'],
          cwd: null,
          url: null,
          env: ['TOKEN=${GH_TOKEN}', 'MODE'],
          headers: [],
          program_files: [{ path: '/ws/srv.py', sha256: 'abcdef0123456789' }],
          notes: ['allow_read_only is ignored in a workspace .mcp.json: every call asks'],
        },
        trust_sha256: 'digest-shown',
      },
    ];
    fake.handlers.list_mcp_servers = () => list;
    fake.handlers.set_mcp_server_enabled = ({ name, enabled }) => {
      list = list.map((s) => (s.name === name ? { ...s, enabled, state: enabled ? 'not_started' : 'disabled', tools: [] } : s));
      return list;
    };
    fake.handlers.restart_mcp_server = () => ({});
    // "Trust and start" (E13): the runtime answers once the servers settled.
    fake.handlers.trust_mcp_workspace = ({ start }) => {
      list = list.map((s) => (s.workspace ? { ...s, state: start ? 'ready' : 'not_started', tools: start ? [echo] : [] } : s));
      return list;
    };
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    const section = $(mounted.root, 'mcp-section')!;
    expect(fake.callsOf('list_mcp_servers').at(-1)).toEqual({ workspace: '/ws' });
    const rows = $$(section, 'mcp-server');
    expect(rows.map((r) => r.dataset.name)).toEqual(['everything', 'broken', 'repo']);
    expect($(rows[0], 'mcp-state')!.textContent).toBe('ready, 1 tool');
    expect($(rows[1], 'mcp-state')!.textContent).toBe('failed: cannot start: connection refused');
    expect($(rows[2], 'mcp-state')!.textContent).toBe('waiting for your trust');
    // Its tools, with the names the model calls them by.
    await inAct(() => $(rows[0], 'mcp-tools-toggle')!.click());
    expect($(rows[0], 'mcp-tools')!.textContent).toContain('mcp__everything__echo');
    // Restart asks the runtime and reloads.
    await inAct(() => $(rows[1], 'mcp-restart')!.click());
    expect(fake.callsOf('restart_mcp_server')).toEqual([{ name: 'broken', workspace: null }]);
    // Disable writes the config through the command; the row says so.
    await inAct(() => $(rows[0], 'mcp-toggle')!.click());
    expect(fake.callsOf('set_mcp_server_enabled')).toEqual([{ name: 'everything', enabled: false }]);
    const disabled = $$($(mounted.root, 'mcp-section')!, 'mcp-server')[0];
    expect(disabled.dataset.state).toBe('disabled');
    expect($(disabled, 'mcp-toggle')!.textContent).toBe('Enable');
    // A workspace's servers are not toggled from the config; they wait for trust.
    expect($(rows[2], 'mcp-toggle')).toBeNull();
    const trust = $(mounted.root, 'mcp-trust')!;
    expect(trust.textContent).toContain('repo');
    // The question shows what would run (security review 6), and the answer carries the
    // digest of what was shown.
    expect($(trust, 'mcp-trust-command')!.textContent).toBe('python3 srv.py --fast');
    expect(trust.textContent).toContain('TOKEN=${GH_TOKEN}, MODE');
    expect(trust.textContent).toContain('runs /ws/srv.py (SHA-256 abcdef012345…)');
    expect(trust.textContent).toContain('allow_read_only is ignored');
    await inAct(() => $(trust, 'mcp-trust-allow')!.click());
    expect(fake.callsOf('trust_mcp_workspace')).toEqual([{ workspace: '/ws', allow: true, sha256: 'digest-shown', start: true }]);
    expect($(mounted.root, 'mcp-trust')).toBeNull();
    // It says when the server is ready, not "starts with the first turn".
    expect($(mounted.root, 'mcp-trust-result')!.textContent).toBe('repo: ready, 1 tool');
  });

  it('shows why the list is unavailable without breaking the rest of Settings', async () => {
    const fake = workspacePlatform([info('p')]);
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    expect($(mounted.root, 'mcp-error')!.textContent).toContain('unknown command');
    expect($(mounted.root, 'settings-save')).not.toBeNull();
  });

  it('names the MCP server on the tool card and in the approval dialog', async () => {
    const fake = workspacePlatform([info('p')]);
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() =>
      fake.emit(
        'p',
        snapshot('p', { running: true }),
        appended('p', { role: 'user', content: 'echo', id: 'm1' }),
        appended('p', { role: 'assistant', content: null, tool_calls: [{ id: 'c1', name: 'mcp__everything__echo', arguments: { message: 'hi' } }] }),
        {
          type: 'approval_request',
          approval_id: 'approval-1',
          session_id: 'p',
          tool: 'mcp__everything__echo',
          arguments: { message: 'hi' },
          rememberable: true,
          mcp_server: 'everything',
        },
      ),
    );
    const card = $(mounted.root, 'tool-card')!;
    expect($(card, 'tool-mcp-server')!.textContent).toBe('MCP server everything');
    const dialog = $(mounted.root, 'approval-dialog')!;
    expect($(dialog, 'approval-mcp-server')!.textContent).toContain('MCP server everything');
  });

  it('tells the session when a workspace .mcp.json waits for trust, once, with a way to Settings', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.handlers.list_mcp_servers = () => [
      {
        name: 'repo',
        workspace: '/ws',
        transport: 'stdio',
        enabled: true,
        state: 'waiting_for_trust',
        error: null,
        tools: [],
        server_info: null,
        launch: {
          command: ['python3', 'srv.py', '--fast'],
          cwd: null,
          url: null,
          env: ['TOKEN=${GH_TOKEN}', 'MODE'],
          headers: [],
          program_files: [{ path: '/ws/srv.py', sha256: 'abcdef0123456789' }],
          notes: ['allow_read_only is ignored in a workspace .mcp.json: every call asks'],
        },
        trust_sha256: 'digest-shown',
      },
    ];
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    const ask = kind('p', 'mcp.trust_needed', { workspace: '/ws', servers: ['repo'] });
    await inAct(() => fake.emit('p', snapshot('p', { running: true }), ask, ask));
    const notices = $$(mounted.root, 'run-notice');
    expect(notices).toHaveLength(1);
    expect(notices[0].textContent).toContain('wants to start repo');
    await inAct(() => $(notices[0], 'notice-open-settings')!.click());
    expect($(mounted.root, 'mcp-trust')!.textContent).toContain('repo');
  });

  it('names the server of an MCP tool', () => {
    expect(mcpServerOf('mcp__everything__echo')).toBe('everything');
    expect(mcpServerOf('mcp__my-server__get_sum')).toBe('my-server');
    expect(mcpServerOf('read_file')).toBeNull();
  });
});
