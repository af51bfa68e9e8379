import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, info, inAct, workspacePlatform } from './fake';
import { mountApp } from './mount';

const P = 'sess-parent';
const C = 'sess-child';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

async function withInterruptedChild() {
  const fake = workspacePlatform([
    info(P),
    info(C, { parent_session_id: P, task_id: 'call-1', title: 'Review db', state: 'paused', interrupted: true }),
  ]);
  fake.handlers.resume_subagent = () => ({});
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  const tab = $$(mounted.root, 'child-tab').find((t) => t.dataset.title === 'Review db')!;
  await inAct(() => tab.click());
  return { fake, root: mounted.root };
}

describe('a child interrupted by a restart', () => {
  it('says so and Resume continues it with resume_subagent', async () => {
    const { fake, root } = await withInterruptedChild();
    const view = $(root, 'child-view')!;
    expect($(view, 'child-interrupted')!.textContent).toContain('cut off');
    await inAct(() => $(view, 'child-resume')!.click());
    expect(fake.callsOf('resume_subagent')).toEqual([{ session_id: C }]);
    expect($(root, 'child-interrupted')).toBeNull();
    expect($(root, 'child-state')!.dataset.state).toBe('running');
  });

  it('Cancel is offered and tells the runtime to cancel it', async () => {
    const { fake, root } = await withInterruptedChild();
    const cancel = $(root, 'child-cancel') as HTMLButtonElement;
    expect(cancel.disabled).toBe(false);
    await inAct(() => cancel.click());
    expect(fake.callsOf('cancel')).toEqual([{ session_id: C }]);
    expect($(root, 'child-interrupted')).toBeNull();
    expect($(root, 'child-state')!.dataset.state).toBe('cancelled');
  });
});
