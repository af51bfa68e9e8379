// One live state everywhere (E4, E5): for each state of a sub-agent, the sidebar's icon, the
// tab chip, the child's header, the `sub_agent` card, the status line's count and the quit
// guard say the same thing, in the same words and icon.
import { afterEach, describe, expect, it } from 'vitest';
import type { SessionInfo } from '../bindings/SessionInfo';
import type { SessionListEvent } from '../bindings/SessionListEvent';
import { LIVE, type LiveState } from '../status';
import { $, $$, info, inAct, kind, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const P = 'p';
const C = 'c1';
const T = 't1';
const history = [
  { role: 'user', content: 'delegate it', id: 'm1' },
  { role: 'assistant', content: null, tool_calls: [{ id: T, name: 'sub_agent', arguments: { title: 'Alpha', task: 'x' } }] },
  { role: 'tool', content: `{"status":"pending","task_id":"${T}"}`, tool_call_id: T },
];
const sub = (state: string) => ({ task_id: T, session_id: C, parent_session_id: P, title: 'Alpha', state });

async function open(child: Partial<SessionInfo> = {}) {
  const sessions = [info(P, { title: 'Parent' }), info(C, { parent_session_id: P, task_id: T, title: 'Alpha', ...child })];
  const fake = workspacePlatform(sessions, { [P]: history });
  fake.handlers.delete_session = () => ({});
  let listFeed: ((e: SessionListEvent) => void) | null = null;
  (fake as any).subscribeSessions = (_ws: string, onEvent: (e: SessionListEvent) => void) => {
    listFeed = onEvent;
    return () => undefined;
  };
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  return { fake, root: mounted.root, list: (e: SessionListEvent) => listFeed?.(e) };
}

/** What each place says of the child: its state, its words, its icon. */
async function everywhere(root: HTMLElement) {
  const item = root.querySelector(`[data-testid="session-item"][data-session-id="${C}"]`) as HTMLElement;
  const tab = root.querySelector(`[data-testid="child-tab"][data-session-id="${C}"]`) as HTMLElement;
  const card = $$(root, 'tool-card').find((c) => c.dataset.tool === 'sub_agent')!;
  const seen = {
    sidebar: { state: $(item, 'session-state')!.dataset.state, icon: item.querySelector('svg')!.dataset.icon, words: $(item, 'session-state')!.title },
    tab: { state: tab.dataset.state, icon: tab.querySelector('.tab-icon svg')!.getAttribute('data-icon'), words: tab.querySelector('.tab-state')!.textContent },
    card: { words: card.querySelector('.tool-state')!.textContent, look: card.dataset.state },
    header: { state: '', words: '' },
    runs: $(root, 'status-runs')!.textContent,
    waiting: $(root, 'status-waiting')?.textContent ?? null,
  };
  await inAct(() => tab.click());
  const head = $(root, 'child-state')!;
  seen.header = { state: head.dataset.state!, words: head.textContent!.trim() };
  await inAct(() => $(root, 'tab-main')!.click());
  return seen;
}

const CARD: Record<LiveState, string> = { waiting: 'delegated', running: 'delegated', interrupted: 'interrupted', failed: 'failed', stopped: 'stopped', done: 'done', idle: 'done' };

function expectSame(seen: Awaited<ReturnType<typeof everywhere>>, state: LiveState, guard: boolean[]) {
  const { label, icon } = LIVE[state];
  expect(seen.sidebar).toEqual({ state, icon, words: label });
  expect(seen.tab).toEqual({ state, icon, words: label });
  expect(seen.header).toEqual({ state, words: label });
  expect(seen.card.words).toContain(`sub-agent ${label}`);
  expect(seen.card.look).toBe(CARD[state]);
  expect(seen.runs).toBe(state === 'running' ? '1 running' : '0 running');
  expect(seen.waiting).toBe(state === 'waiting' ? '1 waiting for a slot' : null);
  // The quit guard asks only while something works or waits.
  expect(guard.at(-1) ?? false).toBe(state === 'running' || state === 'waiting');
}

describe('one live state everywhere (E4, E5)', () => {
  it('waiting for a slot: queued for the children cap, or its model call queued for its server (not ✓ idle)', async () => {
    const { fake, root } = await open({ state: 'idle' });
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [sub('waiting_for_slot')] as any })));
    expectSame(await everywhere(root), 'waiting', fake.guard);
    // It got its task slot, but its model call waits for one of its server's.
    await inAct(() => fake.emit(P, kind(C, 'subagent.state', { task_id: T, state: 'running' }), kind(C, 'slot.waiting', { server: 'ollama', ahead: 1 })));
    expectSame(await everywhere(root), 'waiting', fake.guard);
    // It streams: running.
    await inAct(() => fake.emit(P, kind(C, 'content.delta', { text: 'Hi' })));
    expectSame(await everywhere(root), 'running', fake.guard);
  });

  it('running, though the list still says idle', async () => {
    const { fake, root } = await open({ state: 'idle' });
    await inAct(() => fake.emit(P, snapshot(P), kind(C, 'subagent.state', { task_id: T, state: 'running' })));
    expectSame(await everywhere(root), 'running', fake.guard);
  });

  it('interrupted by a quit: resumable, never "cancelled" or red, also when the snapshot says cancelled', async () => {
    const { fake, root } = await open({ state: 'paused', interrupted: true });
    await inAct(() => fake.emit(P, snapshot(P)));
    expectSame(await everywhere(root), 'interrupted', fake.guard);
    await inAct(() => fake.emit(P, kind(C, 'subagent.state', { task_id: T, state: 'cancelled' })));
    expectSame(await everywhere(root), 'interrupted', fake.guard);
    expect(root.textContent).not.toContain('cancelled');
  });

  it('failed', async () => {
    const { fake, root } = await open({ state: 'running' });
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [sub('running')] as any }), kind(C, 'subagent.state', { task_id: T, state: 'failed' })));
    expectSame(await everywhere(root), 'failed', fake.guard);
  });

  it('stopped by the person', async () => {
    const { fake, root } = await open({ state: 'running' });
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [sub('running')] as any }), kind(C, 'subagent.state', { task_id: T, state: 'cancelled' })));
    expectSame(await everywhere(root), 'stopped', fake.guard);
  });

  it('done, though the list still says running (a stale entry)', async () => {
    const { fake, root } = await open({ state: 'running' });
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [sub('running')] as any }), kind(C, 'subagent.state', { task_id: T, state: 'done' })));
    expectSame(await everywhere(root), 'done', fake.guard);
  });

  it('done, from the list alone (a finished child after a restart)', async () => {
    const { fake, root } = await open({ state: 'idle' });
    await inAct(() => fake.emit(P, snapshot(P)));
    expectSame(await everywhere(root), 'done', fake.guard);
  });

  it('a deleted running child leaves no phantom "1 running" and no quit question', async () => {
    const { fake, root, list } = await open({ state: 'running' });
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [sub('running')] as any })));
    expect($(root, 'status-runs')!.textContent).toBe('1 running');
    expect(fake.guard.at(-1)).toBe(true);
    await inAct(() => (root.querySelector(`[data-testid="child-tab"][data-session-id="${C}"]`) as HTMLElement).click());
    await inAct(() => $(root, 'child-delete')!.click());
    await inAct(() => $(root, 'child-delete')!.click());
    expect(fake.callsOf('delete_session')).toEqual([{ session_id: C }]);
    await inAct(() => list({ type: 'removed', session_id: C }));
    expect($(root, 'status-runs')!.textContent).toBe('0 running');
    expect(fake.guard.at(-1)).toBe(false);
  });

  it('the badge count follows a discarded report', async () => {
    const { fake, root } = await open({ state: 'idle' });
    const report = (n: number) => ({ message_id: `subagent:${T}:${n}`, content: `[Background tool result]\nTask ID: ${T}\n\nreport ${n}`, status: 'queued', config: { runtime: {} } });
    await inAct(() => fake.emit(P, snapshot(P, { paused: true, pending: [report(1), report(2)] as any })));
    const badge = () => root.querySelector(`[data-testid="session-item"][data-session-id="${P}"] [data-testid="needs-badge"]`)?.textContent ?? null;
    expect(badge()).toBe('2');
    await inAct(() => fake.emit(P, kind(P, 'message.discarded', { message_id: `subagent:${T}:1` })));
    expect(badge()).toBe('1');
  });
  it('a worktree sub-agent, working in a folder outside the workspace, is opened from its card (E2)', async () => {
    const worktree = { origin: '/ws', path: '/data/worktrees/c', branch: `bumblehive/${C}`, base: 'abc', applied: false };
    const { root } = await open({ state: 'idle', workspace: '/data/worktrees/c', worktree });
    const card = $$(root, 'tool-card').find((c) => c.dataset.tool === 'sub_agent')!;
    const open_ = Array.from(card.querySelectorAll('button')).find((b) => b.textContent === 'Open tab') as HTMLElement;
    expect(open_).toBeTruthy();
    await inAct(() => open_.click());
    expect($(root, 'child-view')!.dataset.sessionId).toBe(C);
  });
});
