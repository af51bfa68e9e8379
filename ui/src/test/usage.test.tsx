import { afterEach, describe, expect, it } from 'vitest';
import { treeModels } from '../usage';
import { $, $$, inAct, info, usage, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const P = 'parent';
const C1 = 'child-1';
const C2 = 'child-2';
const G = 'grandchild';

const mu = (provider: string, model: string, input: number, output: number) => ({ provider, model, usage: usage(input, output) });

/** A parent on a hosted model, two children on a local one (the second switched models), a grandchild. */
function sessions() {
  return [
    info(P, { title: 'Refactor', usage: usage(1000, 200), models: [mu('hosted', 'big-model', 1000, 200)] }),
    info(C1, {
      title: 'Explore auth',
      parent_session_id: P,
      task_id: 'call-1',
      agent: 'explore',
      usage: usage(300, 50),
      models: [mu('local', 'qwen2.5-coder-7b', 300, 50)],
    }),
    info(C2, {
      title: 'Review db',
      parent_session_id: P,
      task_id: 'call-2',
      agent: 'review',
      usage: usage(700, 70),
      // The last entry is the model it ran on last.
      models: [mu('local', 'qwen2.5-coder-7b', 500, 50), mu('hosted', 'big-model', 200, 20)],
    }),
    info(G, { title: 'Look closer', parent_session_id: C1, task_id: 'call-3', usage: usage(10, 1), models: [mu('local', 'tiny', 10, 1)] }),
    info('other', { title: 'Elsewhere', created_at: '2024-01-01T00:00:00Z', usage: usage(5, 5), models: [mu('hosted', 'other-model', 5, 5)] }),
  ];
}

describe('profile and model of children, tokens per model', () => {
  it('sums a tree by provider and model in first-use order, children and grandchildren included, other trees not', () => {
    expect(treeModels(sessions(), P)).toEqual([
      { provider: 'hosted', model: 'big-model', tokens: { input: 1200, output: 220 } },
      { provider: 'local', model: 'qwen2.5-coder-7b', tokens: { input: 800, output: 100 } },
      { provider: 'local', model: 'tiny', tokens: { input: 10, output: 1 } },
    ]);
    expect(treeModels(sessions(), C1).map((m) => m.model)).toEqual(['qwen2.5-coder-7b', 'tiny']);
    expect(treeModels(sessions(), 'missing')).toEqual([]);
  });

  it("shows each child's profile, last model and its server (E3) on its tab, in the sidebar and in its pane; its own tokens on the tab's tooltip", async () => {
    const fake = workspacePlatform(sessions());
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const { root } = mounted;

    const tabs = $$(root, 'child-tab');
    expect(tabs.map((t) => t.dataset.title)).toEqual(['Explore auth', 'Review db', 'Look closer']);
    expect(tabs.map((t) => $(t, 'tab-agent')?.textContent ?? null)).toEqual(['explore · qwen2.5-coder-7b on local', 'review · big-model on hosted', 'tiny on local']);
    // The tooltip: its own tokens, and per model when it used more than one.
    expect(tabs[0].title).toBe('Explore auth (done)\nexplore · qwen2.5-coder-7b on local\n350 tokens (300 in, 50 out)');
    expect(tabs[1].title).toContain('770 tokens (700 in, 70 out)');
    expect(tabs[1].title).toContain('qwen2.5-coder-7b (local): 550 tokens (500 in, 50 out)');
    expect(tabs[1].title).toContain('big-model (hosted): 220 tokens (200 in, 20 out)');

    // The sidebar: children only (a top-level session shows no profile line).
    const items = $$(root, 'session-item');
    const agentOf = (id: string) => $(items.find((i) => i.dataset.sessionId === id)!, 'session-agent')?.textContent ?? null;
    expect(agentOf(P)).toBeNull();
    expect(agentOf(C1)).toBe('explore · qwen2.5-coder-7b on local');
    expect(agentOf(C2)).toBe('review · big-model on hosted');
    expect(agentOf(G)).toBe('tiny on local');
    const c1Button = items.find((i) => i.dataset.sessionId === C1)!.querySelector('.session-open') as HTMLElement;
    expect(c1Button.title).toBe('Explore auth · done · explore · qwen2.5-coder-7b on local · 350 tokens');

    // The child's pane header.
    await inAct(() => tabs[1].click());
    const view = $(root, 'child-view')!;
    expect(view.dataset.sessionId).toBe(C2);
    expect($(view, 'child-agent')!.textContent).toBe('review · big-model on hosted');
    expect($(view, 'child-usage')!.textContent).toBe('770 tokens');
    expect($(view, 'child-usage')!.title).toContain('big-model (hosted): 220 tokens');
  });

  it("splits the status line's tree tokens by model (tooltip and a popover that closes on Esc)", async () => {
    const fake = workspacePlatform(sessions());
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const { root } = mounted;
    const button = $(root, 'status-tokens')!;
    expect(button.title).toBe(
      'Tokens of this session and its sub-agents, by model:\n' +
        'big-model (hosted): 1.4k tokens (1200 in, 220 out)\n' +
        'qwen2.5-coder-7b (local): 900 tokens (800 in, 100 out)\n' +
        'tiny (local): 11 tokens (10 in, 1 out)',
    );
    expect($(root, 'usage-by-model')).toBeNull();
    await inAct(() => button.click());
    const rows = $$(root, 'usage-model');
    expect(rows.map((r) => [r.dataset.provider, r.dataset.model])).toEqual([
      ['hosted', 'big-model'],
      ['local', 'qwen2.5-coder-7b'],
      ['local', 'tiny'],
    ]);
    expect(rows[1].textContent).toContain('900');
    await inAct(() => document.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true })));
    expect($(root, 'usage-by-model')).toBeNull();
  });

  it('a child that has not run yet shows its profile alone, and the model and server chosen for it once set (E3)', async () => {
    const list = [
      info(P, { title: 'Refactor' }),
      info(C1, { title: 'Waiting one', parent_session_id: P, task_id: 'call-1', agent: 'explore', state: 'running' }),
      info(C2, { title: 'Picked', parent_session_id: P, task_id: 'call-2', model: 'chosen-model', provider: 'local' }),
      info('c3', { title: 'Model only', parent_session_id: P, task_id: 'call-4', model: 'other-model' }),
    ];
    const fake = workspacePlatform(list);
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const tabs = $$(mounted.root, 'child-tab');
    expect(tabs.map((t) => $(t, 'tab-agent')?.textContent ?? null)).toEqual(['explore', 'chosen-model on local', 'other-model']);
    // No model usage yet: the status line's tokens are plain text.
    expect($(mounted.root, 'status-tokens')!.tagName).toBe('SPAN');
  });
});
