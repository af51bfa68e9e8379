// Agent profiles beside each other (#29): Settings lists each with what runs it (a model,
// or an external ACP agent's command) and says what to install for a missing agent; the
// composer's /agent menu names ACP agents too.
import { afterEach, describe, expect, it } from 'vitest';
import { describeProfiles, profileHint } from '../components/SessionPane';
import type { Profile } from '../bindings/Profile';
import type { Profiles } from '../bindings/Profiles';
import { $, $$, info, inAct, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const profile = (over: Partial<Profile>): Profile => ({
  name: 'x', description: '', provider: null, model: null, tools: null, disallowed_tools: [],
  max_turns: null, instructions: '', acp: null, source: 'built-in', notices: [], ...over,
});

const PROFILES: Profiles = {
  profiles: [
    profile({ name: 'explore', description: 'Reads and reports' }),
    profile({ name: 'fast', description: 'Quick answers', provider: 'local', model: 'tiny', source: '/ws/.bumblehive/agents/fast.md' }),
    profile({
      name: 'claude', description: 'Claude Code', source: '/ws/.bumblehive/agents/claude.md',
      acp: { command: 'claude-agent-acp', args: [], env: {} },
    }),
    profile({
      name: 'codex', description: '', source: '/ws/.bumblehive/agents/codex.md',
      acp: { command: 'codex-acp', args: ['--quiet'], env: {} },
      notices: ['`codex-acp` is not installed or not on PATH: install it (npm install -g @agentclientprotocol/codex-acp), or fix the profile\'s `command`'],
    }),
  ],
  errors: ['/ws/.bumblehive/agents/broken.md:3: expected `key: value`'],
};

describe('agent profiles', () => {
  it('Settings lists every profile with what runs it, and what to install for a missing ACP agent', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.handlers.list_agents = () => PROFILES;
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => fake.emit('p', snapshot('p')));
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    const section = $(mounted.root, 'agents-section')!;
    expect(fake.callsOf('list_agents').at(-1)).toEqual({ workspace: '/ws' });
    const entries = $$(section, 'agent-entry');
    expect(entries.map((e) => e.dataset.name)).toEqual(['explore', 'fast', 'claude', 'codex']);
    expect(entries.map((e) => $(e, 'agent-runs')!.textContent)).toEqual([
      "the session's model",
      'model local · tiny',
      'ACP agent: claude-agent-acp',
      'ACP agent: codex-acp --quiet',
    ]);
    expect($$(entries[2], 'agent-notice')).toHaveLength(0);
    const missing = $(entries[3], 'agent-notice')!;
    expect(missing.textContent).toContain('npm install -g @agentclientprotocol/codex-acp');
    expect(missing.className).toContain('error-text');
    expect($(section, 'agents-errors')!.textContent).toContain('broken.md:3:');
  });

  it('the /agent menu and its list name ACP agents, and say when one is not installed', () => {
    expect(profileHint(PROFILES.profiles[0])).toBe('Reads and reports');
    expect(profileHint(PROFILES.profiles[2])).toBe('Claude Code · ACP agent claude-agent-acp');
    expect(profileHint(PROFILES.profiles[3])).toBe('ACP agent codex-acp (not installed)');
    expect(describeProfiles(PROFILES, 'claude')).toContain('claude (current) — Claude Code · ACP agent claude-agent-acp');
  });
});
