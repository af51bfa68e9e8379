import { afterEach, describe, expect, it } from 'vitest';
import type { SessionListEvent } from '../bindings/SessionListEvent';
import { $, $$, info, inAct, kind, workspacePlatform } from './fake';
import { mountApp } from './mount';

const P = 'sess-parent';
const C = 'sess-child';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

/** The app on P with the child C (as `child` says) open in its tab. */
async function withChild(child: Parameters<typeof info>[1] & { title: string }) {
  const fake = workspacePlatform([info(P), info(C, { parent_session_id: P, task_id: 'call-1', ...child })]);
  fake.handlers.resume_subagent = () => ({});
  // The desktop's list feed: the runtime says when a stored session changes.
  let listFeed: ((e: SessionListEvent) => void) | null = null;
  (fake as any).subscribeSessions = (_ws: string, onEvent: (e: SessionListEvent) => void) => {
    listFeed = onEvent;
    return () => undefined;
  };
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  const tab = $$(mounted.root, 'child-tab').find((t) => t.dataset.title === child.title)!;
  await inAct(() => tab.click());
  return { fake, root: mounted.root, listChanged: (e: SessionListEvent) => listFeed?.(e) };
}

const withInterruptedChild = () => withChild({ title: 'Review db', state: 'paused', interrupted: true });

describe('a child interrupted by a restart', () => {
  it('says so and Resume continues it with resume_subagent', async () => {
    const { fake, root } = await withInterruptedChild();
    const view = $(root, 'child-view')!;
    expect($(view, 'child-interrupted')!.textContent).toContain('cut off');
    await inAct(() => $(view, 'child-resume')!.click());
    expect(fake.callsOf('resume_subagent')).toEqual([{ session_id: C }]);
    // The resumed task gets its slot and runs (the runtime's events).
    await inAct(() => fake.emit(P, kind(C, 'subagent.state', { task_id: 'call-1', state: 'running' })));
    expect($(root, 'child-interrupted')).toBeNull();
    expect($(root, 'child-state')!.dataset.state).toBe('running');
  });

  it('Cancel is offered and tells the runtime to cancel it', async () => {
    const { fake, root, listChanged } = await withInterruptedChild();
    const cancel = $(root, 'child-cancel') as HTMLButtonElement;
    expect(cancel.disabled).toBe(false);
    await inAct(() => cancel.click());
    expect(fake.callsOf('cancel')).toEqual([{ session_id: C }]);
    // The runtime stores it as no longer interrupted (its parent got an error report).
    await inAct(() => listChanged({ type: 'changed', session: info(C, { parent_session_id: P, task_id: 'call-1', title: 'Review db', state: 'paused', interrupted: false }) }));
    expect($(root, 'child-interrupted')).toBeNull();
    expect($(root, 'child-state')!.dataset.state).toBe('stopped');
  });
});

describe('a child whose ACP agent died mid-turn (run.interrupted)', () => {
  it('is shown interrupted, says why in its transcript, and offers Resume', async () => {
    const { fake, root, listChanged } = await withChild({ title: 'Claude', state: 'running' });
    await inAct(() => fake.emit(P, kind(C, 'subagent.state', { task_id: 'call-1', state: 'running' })));
    expect($(root, 'child-state')!.dataset.state).toBe('running');
    // The runtime's order: the stored meta says interrupted, then the run's end, then the task's.
    await inAct(() => listChanged({ type: 'changed', session: info(C, { parent_session_id: P, task_id: 'call-1', title: 'Claude', state: 'paused', interrupted: true }) }));
    await inAct(() => fake.emit(P, kind(C, 'run.interrupted', { message: "the ACP agent's process ended during its turn" })));
    await inAct(() => fake.emit(P, kind(C, 'subagent.state', { task_id: 'call-1', state: 'cancelled' })));
    expect($(root, 'child-state')!.dataset.state).toBe('interrupted');
    expect($(root, 'child-interrupted')!.textContent).toContain("its agent's process ended");
    expect($(root, 'child-view')!.textContent).toContain("Interrupted: the ACP agent's process ended during its turn");
    expect($(root, 'child-resume')).not.toBeNull();
  });
});
