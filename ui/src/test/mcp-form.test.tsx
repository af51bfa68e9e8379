// MCP servers from the app (issue 28, E13): an Add form (a program or a URL), a pasted
// `.mcp.json` snippet, Edit and Remove of the config's servers, all through
// `update_config`'s merge patch; a busy refusal in words; "Trust and start" says when the
// workspace's servers are ready.
import { afterEach, describe, expect, it } from 'vitest';
import { merge } from './merge';
import { $, $$, inAct, info, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';
import { mcpPatch, parseSnippet, formOf } from '../mcpconfig';
import { mcpFollow } from '../components/McpServers';
import { settle } from './fake';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

/** A backend whose config follows the patches, and whose MCP list follows the config. */
function mcpPlatform(servers: Record<string, any> = {}) {
  const fake = workspacePlatform([info('p')]);
  let current: any = { provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'qwen2.5-coder' }, mcp_servers: servers };
  fake.handlers.get_config = () => current;
  fake.handlers.update_config = ({ patch }) => {
    current = merge(current, patch);
    return current;
  };
  fake.handlers.list_mcp_servers = () =>
    Object.entries(current.mcp_servers ?? {}).map(([name, block]: [string, any]) => ({
      name,
      workspace: null,
      transport: block.url ? 'http' : 'stdio',
      enabled: block.enabled !== false,
      state: 'not_started',
      error: null,
      tools: [],
      server_info: null,
    }));
  return { fake, config: () => current };
}

async function openSettings(fake: ReturnType<typeof workspacePlatform>) {
  const mounted = await mountApp(fake, 'p');
  unmount = mounted.unmount;
  await inAct(() => $(mounted.root, 'settings-button')!.click());
  return mounted.root;
}

const names = (root: HTMLElement) => $$(root, 'mcp-server').map((r) => r.dataset.name);

describe('MCP servers from the app (E13)', () => {
  it('adds a program with its arguments and environment, and a URL with headers, from the form', async () => {
    const { fake, config } = mcpPlatform();
    const root = await openSettings(fake);
    expect($(root, 'mcp-none')!.textContent).toContain('add one here');
    await inAct(() => $(root, 'mcp-add')!.click());
    const form = $(root, 'mcp-form')!;
    await inAct(() => typeInto($(form, 'mcp-name')!, 'time'));
    await inAct(() => typeInto($(form, 'mcp-command')!, 'uvx'));
    await inAct(() => typeInto($(form, 'mcp-args')!, 'mcp-server-time\n--local-timezone=UTC\n'));
    await inAct(() => typeInto($(form, 'mcp-env')!, 'TZ=UTC\nTOKEN=${GH_TOKEN}'));
    await inAct(() => $(form, 'mcp-save')!.click());
    expect(fake.callsOf('update_config')).toEqual([
      { patch: { mcp_servers: { time: { command: 'uvx', args: ['mcp-server-time', '--local-timezone=UTC'], env: { TZ: 'UTC', TOKEN: '${GH_TOKEN}' } } } } },
    ]);
    expect($(root, 'mcp-form')).toBeNull();
    expect(names(root)).toEqual(['time']);

    await inAct(() => $(root, 'mcp-add')!.click());
    const http = $(root, 'mcp-form')!;
    await inAct(() => typeInto($(http, 'mcp-name')!, 'remote'));
    const transport = $(http, 'mcp-transport') as HTMLSelectElement;
    transport.value = 'http';
    await inAct(() => transport.dispatchEvent(new Event('change', { bubbles: true })));
    // Without a URL it says so, and sends nothing.
    await inAct(() => $(http, 'mcp-save')!.click());
    expect($(http, 'mcp-form-error')!.textContent).toContain('Give the URL');
    await inAct(() => typeInto($(http, 'mcp-url')!, 'https://mcp.example.com/mcp'));
    await inAct(() => typeInto($(http, 'mcp-headers')!, 'Authorization: Bearer ${TOKEN}'));
    await inAct(() => $(http, 'mcp-save')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({
      patch: { mcp_servers: { remote: { type: 'http', url: 'https://mcp.example.com/mcp', headers: { Authorization: 'Bearer ${TOKEN}' } } } },
    });
    expect(config().mcp_servers.remote.url).toBe('https://mcp.example.com/mcp');
    expect(names(root)).toEqual(['time', 'remote']);
  });

  it('adds the servers of a pasted .mcp.json snippet, showing what each runs first', async () => {
    const { fake } = mcpPlatform();
    const root = await openSettings(fake);
    await inAct(() => $(root, 'mcp-add')!.click());
    const form = $(root, 'mcp-form')!;
    const snippet = JSON.stringify({
      mcpServers: {
        fetch: { command: 'uvx', args: ['mcp-server-fetch'] },
        docs: { type: 'http', url: 'https://docs.example.com/mcp' },
      },
    });
    await inAct(() => typeInto($(form, 'mcp-snippet')!, snippet));
    expect($(form, 'mcp-snippet-preview')!.textContent).toBe('fetch uvx mcp-server-fetchdocs https://docs.example.com/mcp');
    expect($(form, 'mcp-snippet-add')!.textContent).toBe('Add 2 servers');
    await inAct(() => $(form, 'mcp-snippet-add')!.click());
    expect(fake.callsOf('update_config')).toEqual([
      { patch: { mcp_servers: { fetch: { command: 'uvx', args: ['mcp-server-fetch'] }, docs: { type: 'http', url: 'https://docs.example.com/mcp' } } } },
    ]);
    expect(names(root)).toEqual(['fetch', 'docs']);
    // One bare server object takes the Name field's name; a name in use is refused.
    await inAct(() => $(root, 'mcp-add')!.click());
    const again = $(root, 'mcp-form')!;
    await inAct(() => typeInto($(again, 'mcp-snippet')!, '{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]}'));
    await inAct(() => $(again, 'mcp-snippet-add')!.click());
    expect($(again, 'mcp-form-error')!.textContent).toContain('type its name in the Name field');
    await inAct(() => typeInto($(again, 'mcp-name')!, 'fetch'));
    await inAct(() => $(again, 'mcp-snippet-add')!.click());
    expect($(again, 'mcp-form-error')!.textContent).toContain('Already configured: fetch');
    await inAct(() => typeInto($(again, 'mcp-name')!, 'memory'));
    await inAct(() => $(again, 'mcp-snippet-add')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({ patch: { mcp_servers: { memory: { command: 'npx', args: ['-y', '@modelcontextprotocol/server-memory'] } } } });
    expect(names(root)).toEqual(['fetch', 'docs', 'memory']);
  });

  it('edits a server keeping its stored secret, removes one, and says a busy refusal in words', async () => {
    // get_config shows a literal secret as <redacted> (mcp::config::redact).
    const { fake, config } = mcpPlatform({
      time: { command: 'uvx', args: ['mcp-server-time'], env: { API_KEY: '<redacted>', TZ: 'UTC' }, enabled: false },
      other: { command: 'other-server' },
    });
    const root = await openSettings(fake);
    const row = () => $$(root, 'mcp-server').find((r) => r.dataset.name === 'time')!;
    await inAct(() => $(row(), 'mcp-edit')!.click());
    const form = $(root, 'mcp-form')!;
    expect(($(form, 'mcp-name') as HTMLInputElement).disabled).toBe(true);
    expect(($(form, 'mcp-command') as HTMLInputElement).value).toBe('uvx');
    expect(($(form, 'mcp-env') as HTMLTextAreaElement).value).toBe('API_KEY=<redacted>\nTZ=UTC');
    await inAct(() => typeInto($(form, 'mcp-args')!, 'mcp-server-time\n--local-timezone=Europe/Paris'));
    await inAct(() => typeInto($(form, 'mcp-env')!, 'API_KEY=<redacted>\nTZ=Europe/Paris'));
    // Busy: nothing changes, and the refusal says why and what to do.
    const follow = fake.handlers.update_config;
    fake.handlers.update_config = () => {
      throw { error: { code: 'busy', message: 'the runtime is busy: 1 run(s) and 0 sub-agent task(s) are active; stop them before changing the config' } };
    };
    await inAct(() => $(form, 'mcp-save')!.click());
    const refused = $(root, 'mcp-form-error')!.textContent!;
    expect(refused).toContain('Not saved: Settings cannot change while the agent works (1 run(s) and 0 sub-agent task(s) are active)');
    expect(refused).toContain('Stop those runs');
    expect($(root, 'mcp-form')).not.toBeNull();
    fake.handlers.update_config = follow;
    await inAct(() => $(root, 'mcp-save')!.click());
    // The secret is not sent back; only what changed, and `enabled` is left as it was.
    expect(fake.callsOf('update_config').at(-1)).toEqual({
      patch: { mcp_servers: { time: { type: null, url: null, headers: null, command: 'uvx', args: ['mcp-server-time', '--local-timezone=Europe/Paris'], env: { TZ: 'Europe/Paris' } } } },
    });
    expect(config().mcp_servers.time).toEqual({ command: 'uvx', args: ['mcp-server-time', '--local-timezone=Europe/Paris'], env: { API_KEY: '<redacted>', TZ: 'Europe/Paris' }, enabled: false });
    // Remove asks once more, then removes the entry.
    const other = () => $$(root, 'mcp-server').find((r) => r.dataset.name === 'other');
    await inAct(() => $(other()!, 'mcp-remove')!.click());
    expect(fake.callsOf('update_config').at(-1)).not.toEqual({ patch: { mcp_servers: { other: null } } });
    await inAct(() => $(other()!, 'mcp-remove')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({ patch: { mcp_servers: { other: null } } });
    expect(names(root)).toEqual(['time']);
  });

  it('"Trust and start" says it is starting, then that each server is ready', async () => {
    const { fake } = mcpPlatform();
    let list: any[] = [
      {
        name: 'repo',
        workspace: '/ws',
        transport: 'stdio',
        enabled: true,
        state: 'waiting_for_trust',
        error: null,
        tools: [],
        server_info: null,
        launch: { command: ['python3', 'srv.py'], cwd: null, url: null, env: ['TOKEN'], headers: [], program_files: [], notes: [] },
        trust_sha256: 'shown',
      },
    ];
    fake.handlers.list_mcp_servers = () => list;
    let answer: (value: unknown) => void = () => undefined;
    fake.handlers.trust_mcp_workspace = () => new Promise((resolve) => (answer = resolve));
    const root = await openSettings(fake);
    const trust = $(root, 'mcp-trust')!;
    // The question names what runs: its command line and its environment's names.
    expect($(trust, 'mcp-trust-command')!.textContent).toBe('python3 srv.py');
    expect(trust.textContent).toContain('environment: TOKEN');
    await inAct(() => $(trust, 'mcp-trust-allow')!.click());
    expect(fake.callsOf('trust_mcp_workspace')).toEqual([{ workspace: '/ws', allow: true, sha256: 'shown', start: true }]);
    expect($(root, 'mcp-trust-starting')!.textContent).toContain('Starting');
    expect(($(root, 'mcp-trust-allow') as HTMLButtonElement).disabled).toBe(true);
    list = [{ ...list[0], state: 'ready', tools: [{ name: 'now', full_name: 'mcp__repo__now', description: '', read_only_hint: true }] }];
    await inAct(() => answer(list));
    expect($(root, 'mcp-trust-starting')).toBeNull();
    expect($(root, 'mcp-trust-result')!.textContent).toBe('repo: ready, 1 tool');
    const row = $$(root, 'mcp-server').find((r) => r.dataset.name === 'repo')!;
    expect($(row, 'mcp-state')!.textContent).toBe('ready, 1 tool');
  });
});

describe('"Trust and start" with a slow server', () => {
  it('follows a server still starting when the answer came, until it is ready', async () => {
    const saved = mcpFollow.intervalMs;
    mcpFollow.intervalMs = 5;
    try {
      const { fake } = mcpPlatform();
      const server = {
        name: 'slow',
        workspace: '/ws',
        transport: 'stdio',
        enabled: true,
        error: null,
        server_info: null,
        launch: { command: ['node', 'slow.js'], cwd: null, url: null, env: [], headers: [], program_files: [], notes: [] },
        trust_sha256: 'shown',
      };
      let state = 'waiting_for_trust';
      let reads = 0;
      fake.handlers.list_mcp_servers = () => {
        reads++;
        // The third read after the answer finds it ready.
        if (state === 'starting' && reads >= 4) state = 'ready';
        return [{ ...server, state, tools: state === 'ready' ? [{ name: 'a', full_name: 'mcp__slow__a', description: '', read_only_hint: false }] : [] }];
      };
      fake.handlers.trust_mcp_workspace = () => {
        state = 'starting';
        reads = 1;
        return [{ ...server, state, tools: [] }];
      };
      const root = await openSettings(fake);
      await inAct(() => $(root, 'mcp-trust-allow')!.click());
      expect($(root, 'mcp-trust-starting')).not.toBeNull();
      for (let i = 0; i < 20 && !$(root, 'mcp-trust-result'); i++) await settle(2);
      expect($(root, 'mcp-trust-result')!.textContent).toBe('slow: ready, 1 tool');
      expect($(root, 'mcp-trust-starting')).toBeNull();
      // It stops reading once settled.
      const settled = fake.callsOf('list_mcp_servers').length;
      await settle(6);
      expect(fake.callsOf('list_mcp_servers').length).toBe(settled);
    } finally {
      mcpFollow.intervalMs = saved;
    }
  });
});

describe('the MCP form rules', () => {
  it('reads .mcp.json, our config key, a map of servers and a fragment without braces', () => {
    expect(parseSnippet('{"mcp_servers": {"a": {"command": "x"}}}', '')).toEqual({ servers: [['a', { command: 'x' }]] });
    expect(parseSnippet('{"a": {"url": "http://h/mcp"}, "b": {"command": "y"}}', '')).toEqual({
      servers: [
        ['a', { url: 'http://h/mcp' }],
        ['b', { command: 'y' }],
      ],
    });
    expect(parseSnippet('"a": {"command": "x"},', '')).toEqual({ servers: [['a', { command: 'x' }]] });
    expect(parseSnippet('{"a": {"args": []}}', '')).toEqual({ error: '"a" has neither a command nor a url.' });
    expect('error' in parseSnippet('not json', '')).toBe(true);
  });

  it('switching an entry from a program to a URL removes what only a program has', () => {
    const form = { ...formOf('s', { command: 'x', args: ['a'], env: { A: '1' } }), transport: 'http' as const, url: 'https://h/mcp' };
    expect(mcpPatch(form, { command: 'x', args: ['a'], env: { A: '1' } })).toEqual({
      mcp_servers: { s: { type: 'http', command: null, args: null, env: null, cwd: null, url: 'https://h/mcp' } },
    });
  });
});
