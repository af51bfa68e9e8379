// Honest state in the chat and the tabs: delegated cards follow their child, interrupted
// and failed children say what can be done, denials are decisions, Stop keeps the text.
import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, appended, info, inAct, kind, snapshot, workspacePlatform } from './fake';
import { mountApp } from './mount';
import { CommandError } from '../platform';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const P = 'p';
const delegation = (id: string, title: string) => ({ id, name: 'sub_agent', arguments: { title, task: 'x' } });
const pending = (id: string) => ({ role: 'tool', content: `{"status":"pending","task_id":"${id}"}`, tool_call_id: id });

describe('delegated cards and reports (D11)', () => {
  it('follow the child (failed, cancelled) and name a deleted child by its title, never by its id', async () => {
    const fake = workspacePlatform(
      [info(P), info('c1', { parent_session_id: P, task_id: 'call_1', title: 'Alpha', state: 'running' }), info('c2', { parent_session_id: P, task_id: 'call_2', title: 'Beta', state: 'running' })],
      {
        [P]: [
          { role: 'user', content: 'go', id: 'm1' },
          { role: 'assistant', content: null, tool_calls: [delegation('call_1', 'Alpha'), delegation('call_2', 'Beta'), delegation('call_3', 'Gamma')] },
          pending('call_1'),
          pending('call_2'),
          pending('call_3'),
          { role: 'user', content: '[Background tool result]\nTask ID: call_3\n\nGamma says hi', id: 'subagent:call_3' },
        ],
      },
    );
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => fake.emit(P, snapshot(P), kind('c1', 'subagent.state', { task_id: 'call_1', state: 'failed' }), kind('c2', 'subagent.state', { task_id: 'call_2', state: 'cancelled' })));
    const summaries = $$(root, 'tool-card').map((c) => [c.dataset.state, c.querySelector('.tool-state')!.textContent]);
    expect(summaries).toEqual([
      ['failed', 'sub-agent failed'],
      ['stopped', 'sub-agent stopped'],
      ['done', 'sub-agent done (reported)'],
    ]);
    const report = $$(root, 'chat-message').find((m) => m.dataset.role === 'report')!;
    expect(report.textContent).toContain('Report from “Gamma”');
    const heads = [...root.querySelectorAll('.tool-card summary, .message-head')].map((e) => e.textContent).join(' ');
    expect(heads).not.toMatch(/pending \(task|call_\d/);
  });
});

describe('a report whose child never said it was done', () => {
  it('the tab and the card say reported, not running', async () => {
    const fake = workspacePlatform([info(P)]);
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() =>
      fake.emit(
        P,
        snapshot(P, { running: true, subagents: [{ task_id: 'call_1', session_id: 'c1', parent_session_id: P, title: 'Alpha', state: 'running' }] }),
        appended(P, { role: 'assistant', content: null, tool_calls: [delegation('call_1', 'Alpha')] }),
        appended(P, pending('call_1')),
        appended(P, { role: 'user', content: '[Background tool result]\nTask ID: call_1\n\nAll done', id: 'subagent:call_1' }),
      ),
    );
    expect($$(mounted.root, 'child-tab')[0].dataset.state).toBe('done');
    expect($(mounted.root, 'tool-card')!.querySelector('.tool-state')!.textContent).toBe('sub-agent done (reported)');
  });
});

describe('interrupted and failed children (D12, D14)', () => {
  it('Main offers one "Resume all interrupted sub-agents" that resumes each', async () => {
    const fake = workspacePlatform([
      info(P),
      info('c1', { parent_session_id: P, task_id: 't1', title: 'Alpha', state: 'paused', interrupted: true }),
      info('c2', { parent_session_id: P, task_id: 't2', title: 'Beta', state: 'paused', interrupted: true }),
    ]);
    fake.handlers.resume_subagent = () => ({});
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const banner = $(mounted.root, 'interrupted-banner')!;
    expect(banner.textContent).toContain('2 sub-agents were cut off');
    // Tabs say interrupted, not failed.
    expect($$(mounted.root, 'child-tab').map((t) => t.querySelector('.tab-state')!.textContent)).toEqual(['interrupted (can resume)', 'interrupted (can resume)']);
    await inAct(() => $(banner, 'resume-all-interrupted')!.click());
    expect(fake.callsOf('resume_subagent')).toEqual([{ session_id: 'c1' }, { session_id: 'c2' }]);
    // As the runtime says: each resumed task waits for its slot.
    await inAct(() => fake.emit(P, kind('c1', 'subagent.state', { task_id: 't1', state: 'waiting_for_slot' }), kind('c2', 'subagent.state', { task_id: 't2', state: 'waiting_for_slot' })));
    expect($(mounted.root, 'interrupted-banner')).toBeNull();
  });

  it("a failed child's tab offers Retry: the child is sent a message and its tab shows it running again", async () => {
    const fake = workspacePlatform([info(P), info('c1', { parent_session_id: P, task_id: 't1', title: 'Breaker', state: 'running' })]);
    fake.handlers.submit = () => ({ message_id: 'm-c1', status: 'started' });
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P), { type: 'error', session_id: 'c1', message: 'provider said 400' }, kind('c1', 'subagent.state', { task_id: 't1', state: 'failed' })));
    await inAct(() => $$(mounted.root, 'child-tab')[0].click());
    const view = $(mounted.root, 'child-view')!;
    expect($(view, 'child-failed')!.textContent).toContain('its parent got the error');
    // The tab has a composer of its own now: a failed child takes a message.
    expect($(view, 'prompt-input')).not.toBeNull();
    await inAct(() => $(view, 'child-retry')!.click());
    expect(fake.callsOf('submit')).toEqual([{ session_id: 'c1', content: 'The last attempt failed. Try the task again.', config: null }]);
    // The runtime starts the child's message: it runs again.
    await inAct(() => fake.emit(P, { type: 'message_status', session_id: 'c1', message_id: 'm-c1', status: 'started' }));
    expect($$(mounted.root, 'child-tab')[0].dataset.state).toBe('running');
    expect($(mounted.root, 'child-state')!.dataset.state).toBe('running');
    expect($(mounted.root, 'child-retry')).toBeNull();
  });

  it('a refused Retry says why and the tab stays failed', async () => {
    const fake = workspacePlatform([info(P), info('c1', { parent_session_id: P, task_id: 't1', title: 'Breaker', state: 'paused', failed: true })]);
    fake.handlers.submit = () => {
      throw new CommandError('invalid_argument', 'the session was deleted');
    };
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P)));
    await inAct(() => $$(mounted.root, 'child-tab')[0].click());
    await inAct(() => $(mounted.root, 'child-retry')!.click());
    expect($(mounted.root, 'child-view')!.textContent).toContain('the session was deleted');
    expect($$(mounted.root, 'child-tab')[0].dataset.state).toBe('failed');
  });

  it("deleting a running child leaves a notice in the parent's chat and its card says deleted", async () => {
    const fake = workspacePlatform([info(P), info('c1', { parent_session_id: P, task_id: 'call_1', title: 'Alpha', state: 'running' })], {
      [P]: [{ role: 'user', content: 'go', id: 'm1' }, { role: 'assistant', content: null, tool_calls: [delegation('call_1', 'Alpha')] }, pending('call_1')],
    });
    fake.handlers.delete_session = () => ({});
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P, { running: true, subagents: [{ task_id: 'call_1', session_id: 'c1', parent_session_id: P, title: 'Alpha', state: 'running' }] })));
    await inAct(() => $$(mounted.root, 'child-tab')[0].click());
    await inAct(() => $(mounted.root, 'child-delete')!.click());
    await inAct(() => $(mounted.root, 'child-delete')!.click());
    expect(fake.callsOf('delete_session')).toEqual([{ session_id: 'c1' }]);
    // Back in Main: the tab is gone, the chat says the child will not report.
    expect($$(mounted.root, 'child-tab')).toEqual([]);
    expect($$(mounted.root, 'run-notice').map((n) => n.textContent)).toEqual(['Sub-agent “Alpha” was deleted; it will not report.']);
    const card = $(mounted.root, 'tool-card')!;
    expect(card.dataset.state).toBe('deleted');
    expect(card.querySelector('.tool-state')!.textContent).toContain('deleted');
    // A snapshot that still lists it (sent before the deletion) does not bring the tab back.
    await inAct(() => fake.emit(P, snapshot(P, { subagents: [{ task_id: 'call_1', session_id: 'c1', parent_session_id: P, title: 'Alpha', state: 'running' }] })));
    expect($$(mounted.root, 'child-tab')).toEqual([]);
  });
});

describe('denials and chips (D19, D21)', () => {
  it('a denied call reads as the person’s decision, not as an error', async () => {
    const fake = workspacePlatform([info(P)], {
      [P]: [
        { role: 'assistant', content: null, tool_calls: [{ id: 'w', name: 'write_file', arguments: { path: 'a.txt' } }] },
        { role: 'tool', content: 'Error: denied by user: wrong name', tool_call_id: 'w' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'w2', name: 'write_file', arguments: { path: 'b.txt' } }] },
        { role: 'tool', content: 'Error: denied by user: the run was stopped', tool_call_id: 'w2' },
      ],
    });
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P)));
    const [card, stoppedCard] = $$(mounted.root, 'tool-card');
    expect(stoppedCard.dataset.state).toBe('stopped');
    expect(card.dataset.state).toBe('denied');
    expect(card.querySelector('.tool-state')!.textContent).toBe('denied by you');
    expect([...card.querySelectorAll('.tool-label')].at(-1)!.textContent).toBe('Denied');
  });
});

describe('Stop keeps what was streamed (D2, on screen)', () => {
  it('the partial answer stays, marked as stopped', async () => {
    const fake = workspacePlatform([info(P)]);
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P, { running: true }), appended(P, { role: 'user', content: 'long answer please', id: 'm1' }), kind(P, 'content.delta', { text: 'Ninety-two sentences, ' }), kind(P, 'content.delta', { text: 'the first one.' })));
    await inAct(() => fake.emit(P, kind(P, 'run.cancelled', null)));
    const stopped = $(mounted.root, 'run-stopped')!;
    expect($(stopped, 'stopped-partial')!.textContent).toContain('Ninety-two sentences, the first one.');
    expect(stopped.textContent).toContain('Stopped here.');
  });
});

describe('why a session paused, after a restart (D13: the saved reason)', () => {
  it('a failed run says it failed; a stopped one says it was stopped', async () => {
    for (const [failed, words] of [
      [true, 'its last run failed'],
      [false, 'its last run was stopped'],
    ] as const) {
      const fake = workspacePlatform([info(P, { state: 'paused', failed })], { [P]: [{ role: 'user', content: 'go', id: 'm1' }] });
      const mounted = await mountApp(fake, P);
      await inAct(() => fake.emit(P, snapshot(P, { paused: true })));
      expect($(mounted.root, 'paused-notice')!.textContent).toContain(words);
      mounted.unmount();
    }
  });

  it("a child's tab shows failed or stopped from the stored reason", async () => {
    const fake = workspacePlatform([
      info(P),
      info('c1', { parent_session_id: P, task_id: 't1', title: 'Broke', state: 'paused', failed: true }),
      info('c2', { parent_session_id: P, task_id: 't2', title: 'Halted', state: 'paused', failed: false }),
    ]);
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const state = (title: string) => $$(mounted.root, 'child-tab').find((t) => t.dataset.title === title)!.dataset.state;
    expect(state('Broke')).toBe('failed');
    expect(state('Halted')).toBe('stopped');
    // The stopped one can be written to, to go on.
    await inAct(() => $$(mounted.root, 'child-tab').find((t) => t.dataset.title === 'Halted')!.click());
    expect($(mounted.root, 'child-view')!.querySelector('textarea')).not.toBeNull();
    expect($(mounted.root, 'child-retry')).toBeNull();
  });
});

describe('a paused session after a restart (D13)', () => {
  it('says it is paused and how to go on', async () => {
    const fake = workspacePlatform([info(P, { state: 'paused' })], { [P]: [{ role: 'user', content: 'go', id: 'm1' }] });
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P, { paused: true })));
    expect($(mounted.root, 'paused-notice')!.textContent).toContain('paused');
    const item = $$(mounted.root, 'session-item')[0];
    expect($(item, 'session-state')!.querySelector('svg')!.dataset.icon).toBe('paused');
    // Going on clears it.
    await inAct(() => fake.emit(P, { type: 'message_status', session_id: P, message_id: 'm2', status: 'started' }));
    expect($(mounted.root, 'paused-notice')).toBeNull();
  });
});
