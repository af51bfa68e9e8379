import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, info, inAct, kind, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';

const P = 'sess-parent';
const pending = (id: string, content: string) => ({ message_id: id, content, status: 'queued', config: { runtime: {} } });

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

async function withPending(items = [pending('subagent:call-1', '[Background tool result]\nTask ID: call-1\n\nThe db module is fine.')]) {
  const fake = workspacePlatform([info(P)]);
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  await inAct(() =>
    fake.emit(
      P,
      snapshot(P, {
        paused: true,
        pending: items as any,
        subagents: [{ task_id: 'call-1', session_id: 'c1', parent_session_id: P, title: 'Review db', state: 'done' }],
      }),
    ),
  );
  return { fake, root: mounted.root };
}

describe('the pending tray', () => {
  it('is hidden when nothing waits', async () => {
    const { root } = await withPending([]);
    expect($(root, 'pending-tray')).toBeNull();
  });

  it('shows waiting reports with the child that sent them', async () => {
    const { root } = await withPending();
    const tray = $(root, 'pending-tray')!;
    expect($(tray, 'pending-count')!.textContent).toBe('Waiting: 1 report');
    const item = $(tray, 'pending-item')!;
    expect(item.textContent).toContain('Report from “Review db”');
    expect(item.textContent).toContain('The db module is fine.');
    expect($(tray, 'pending-resume-all')).toBeNull();
  });

  it('Resume steers the message and it leaves the tray', async () => {
    const { fake, root } = await withPending();
    await inAct(() => $(root, 'pending-resume')!.click());
    expect(fake.callsOf('steer')).toEqual([{ session_id: P, message_id: 'subagent:call-1' }]);
    expect($(root, 'pending-tray')).toBeNull();
    // It shows in the chat with its status until the run reads it.
    const card = $$(root, 'chat-message').at(-1)!;
    expect(card.dataset.role).toBe('report');
    expect($(card, 'message-status')!.dataset.status).toBe('started');
    expect($(card, 'message-status')!.textContent).toBe('working on it');
  });

  it('a report the runtime steers in by itself shows its text, read from the snapshot (D19)', async () => {
    const fake = workspacePlatform([info(P)]);
    const body = '[Background tool result]\nTask ID: t7\n\nSeven is done';
    fake.handlers.snapshot = ({ session_id }) => {
      const { type: _t, ...rest } = snapshot(session_id, { running: true, pending: [{ message_id: 'subagent:t7', content: body, status: 'steered', config: { runtime: {} } as any }] }) as any;
      return rest;
    };
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P, { running: true }), { type: 'message_status', session_id: P, message_id: 'subagent:t7', status: 'steered' }));
    const card = $$(mounted.root, 'chat-message').at(-1)!;
    expect(card.dataset.role).toBe('report');
    expect(card.textContent).toContain('Seven is done');
    expect(card.textContent).not.toContain('will show when the agent reads it');
  });

  it('Discard drops the message, and can be undone until it is sent (D22)', async () => {
    const { fake, root } = await withPending();
    await inAct(() => $(root, 'pending-discard')!.click());
    // Not sent yet: Undo brings it back and nothing reaches the runtime.
    expect(fake.callsOf('discard')).toEqual([]);
    await inAct(() => $(root, 'pending-undo')!.click());
    expect($$(root, 'pending-item').length).toBe(1);
    await inAct(() => $(root, 'pending-discard')!.click());
    await inAct(() => $(root, 'pending-discard-now')!.click());
    expect(fake.callsOf('discard')).toEqual([{ session_id: P, message_id: 'subagent:call-1' }]);
    expect($(root, 'pending-tray')).toBeNull();
    // As the runtime says it: a mark in the chat names the child whose report was dropped.
    await inAct(() => fake.emit(P, kind(P, 'message.discarded', { message_id: 'subagent:call-1' })));
    expect($$(root, 'run-notice').map((n) => n.textContent)).toEqual(['You discarded the report from “Review db”: the agent will not see it.']);
  });

  it("a discarded report's mark is back after a reload, where it was (D22)", async () => {
    const fake = workspacePlatform(
      [info(P), info('c1', { parent_session_id: P, task_id: 'call-1', title: 'Review db', state: 'idle' })],
      { [P]: [{ role: 'user', content: 'go', id: 'm1' }, { role: 'assistant', content: 'waiting' }, { role: 'user', content: 'later', id: 'm2' }] },
    );
    const plain = fake.handlers.get_session!;
    fake.handlers.get_session = (args: any) => ({ ...(plain(args) as any), discarded: [{ message_id: 'subagent:call-1', at: 2 }] });
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P)));
    const notice = $$(mounted.root, 'run-notice');
    expect(notice.map((n) => n.textContent)).toEqual(['You discarded the report from “Review db”: the agent will not see it.']);
    // Between the second and the third message, where the person discarded it.
    const rows = [...mounted.root.querySelectorAll('[data-testid=chat-message], [data-testid=run-notice]')].map((e) => (e as HTMLElement).dataset.testid);
    expect(rows).toEqual(['chat-message', 'chat-message', 'run-notice', 'chat-message']);
  });

  it('follows queued and discarded events; Resume all steers in order', async () => {
    const { fake, root } = await withPending();
    fake.handlers.snapshot = () => ({
      ...(snapshot(P) as any),
      pending: [pending('subagent:call-1', 'x'), pending('subagent:call-2', '[Background tool result]\nTask ID: call-2\n\nSecond.')],
    });
    await inAct(() => fake.emit(P, { type: 'message_status', session_id: P, message_id: 'subagent:call-2', status: 'queued' }));
    expect($(root, 'pending-count')!.textContent).toBe('Waiting: 2 reports');
    expect($$(root, 'pending-item')[1].textContent).toContain('Second.');
    await inAct(() => $(root, 'pending-resume-all')!.click());
    expect(fake.callsOf('steer').map((a) => a.message_id)).toEqual(['subagent:call-1', 'subagent:call-2']);

    fake.handlers.snapshot = () => ({ ...(snapshot(P) as any), paused: true, pending: [pending('msg-9', 'my own words')] });
    await inAct(() => fake.emit(P, { type: 'message_status', session_id: P, message_id: 'msg-9', status: 'queued' }));
    expect($(root, 'pending-count')!.textContent).toBe('Waiting: 1 message');
    expect($(root, 'pending-item')!.textContent).toContain('my own words');
    await inAct(() => fake.emit(P, kind(P, 'message.discarded', { message_id: 'msg-9' })));
    expect($(root, 'pending-tray')).toBeNull();
    // The discard leaves a mark in the chat (D22).
    expect($$(root, 'run-notice').map((n) => n.textContent)).toContain('You discarded a waiting message: the agent will not see it.');
  });

  it('shows a failed Resume in the tray with Retry', async () => {
    const { fake, root } = await withPending();
    fake.handlers.steer = () => {
      throw { error: { code: 'not_found', message: 'pending message subagent:call-1 not found' } };
    };
    await inAct(() => $(root, 'pending-resume')!.click());
    const tray = $(root, 'pending-tray')!;
    expect(tray.textContent).toContain('not found');
    fake.handlers.steer = () => ({ status: 'started' });
    await inAct(() => $(tray, 'retry')!.click());
    expect(fake.callsOf('steer').length).toBe(2);
    expect($(root, 'pending-tray')).toBeNull();
  });
});
