import { afterEach, describe, expect, it } from 'vitest';
import { HISTORY_TAIL, mergeHistory } from '../model';
import { $, $$, appended, info, inAct, key, kind, settle, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';
import { C1, C2, P, recorded } from './recorded';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

async function openParent(histories: Record<string, unknown[]> = {}) {
  const fake = workspacePlatform([info(P, { title: 'Refactor' })], histories);
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  return { fake, root: mounted.root };
}

describe('events rendered into the chat and the tabs', () => {
  it('says which server a waiting sub-agent waits for a slot on', async () => {
    const { fake, root } = await openParent();
    await inAct(() =>
      fake.emit(
        P,
        snapshot(P, {
          running: true,
          subagents: [{ task_id: 't1', session_id: C1, parent_session_id: P, title: 'Scan', state: 'waiting_for_slot', server: 'local' }],
        }),
      ),
    );
    const tab = $$(root, 'child-tab')[0];
    expect(tab.textContent).toContain('waiting for a slot on local');
  });

  it('says when the next model call waits for a request slot of its server, and how many are ahead', async () => {
    const { fake, root } = await openParent();
    await inAct(() => fake.emit(P, snapshot(P, { running: true }), kind(P, 'slot.waiting', { server: 'local', ahead: 2 })));
    expect($(root, 'progress')!.textContent).toContain('Waiting for a slot on local (2 ahead)…');
    await inAct(() => fake.emit(P, kind(P, 'content.delta', { text: 'Here' })));
    expect($(root, 'progress')!.textContent).not.toContain('Waiting for a slot');
  });

  it('subscribes, reads the transcript, and renders a recorded delegation', async () => {
    const { fake, root } = await openParent();
    expect(fake.streams.has(P)).toBe(true);
    // The open session is read by its tail; its children whole (the `c9` read below).
    expect(fake.callsOf('get_session')).toEqual([{ session_id: P, last: HISTORY_TAIL }]);

    await inAct(() => fake.emit(P, ...recorded));

    const main = $(root, 'chat')!;
    const messages = $$(main, 'chat-message');
    const roles = messages.map((m) => m.dataset.role);
    expect(roles).toEqual(['user', 'assistant', 'assistant', 'report', 'assistant']);
    expect(messages[0].textContent).toContain('Review the auth and db modules in parallel');
    // "started" said something until the answer began; now it would only be jargon (D19).
    expect(messages[0].querySelector('[data-testid="message-status"]')).toBeNull();

    // Tool calls are cards with arguments and results.
    const cards = $$(main, 'tool-card');
    expect(cards.map((c) => c.dataset.tool)).toEqual(['sub_agent', 'sub_agent']);
    // Delegated cards follow their child and name it by its state, never by a task id (D11).
    expect(cards.map((c) => c.dataset.state)).toEqual(['done', 'delegated']);
    expect(cards[0].textContent).toContain('“Review auth”');
    expect(cards[0].textContent).toContain('sub-agent done (reported)');
    expect(cards[1].textContent).toContain('sub-agent waiting for a slot');
    for (const c of cards) expect(c.querySelector('summary')!.textContent).not.toContain('call-');
    expect($(cards[0], 'tool-arguments')!.textContent).toContain('"task": "Review src/auth"');

    // The report is a card naming the child, with its status chip; markdown rendered.
    const report = messages[3];
    expect(report.textContent).toContain('Report from “Review auth”');
    const chip = report.querySelector<HTMLElement>('[data-testid="message-status"]')!;
    // In words, not the runtime's name for it (D19).
    expect(chip.dataset.status).toBe('steered');
    expect(chip.textContent).toBe('read at its next step');
    expect(report.querySelector('strong')?.textContent).toBe('fine');
    expect(report.textContent).not.toContain('[Background tool result]');

    // Streaming text is shown live; the progress indicator runs.
    expect(messages[4].dataset.streaming).toBe('true');
    expect(messages[4].textContent).toContain('The auth review');
    expect($(root, 'progress')).not.toBeNull();
    // A rough live count while the answer streams (the provider's comes at its end, D20).
    const streamed = messages[4].querySelector('.markdown, .plain')?.textContent ?? '';
    expect($(root, 'progress-tokens')!.textContent).toBe(`~${Math.max(1, Math.round(streamed.length / 4))} tokens so far`);
    expect(($(root, 'stop-button') as HTMLButtonElement).disabled).toBe(false);

    // One tab per child, with title and state.
    const tabs = $$(root, 'child-tab');
    expect(tabs.map((t) => t.dataset.title)).toEqual(['Review auth', 'Review db']);
    expect(tabs.map((t) => t.dataset.state)).toEqual(['done', 'waiting']);
    expect(tabs[1].textContent).toContain('waiting for a slot');

    // Status line: tokens of the tree (10+5 + 7+3 + 20+4) and runs.
    // While the answer streams, the count adds an estimate from its text, marked "≈" (E23).
    expect($(root, 'status-tokens')!.textContent).toBe(`≈${49 + Math.ceil(streamed.length / 4)} tokens (tree)`);
    expect($(root, 'status-tokens')!.dataset.estimated).toBe('true');
    expect($(root, 'status-runs')!.textContent).toBe('1 running');
    expect($(root, 'status-model')!.textContent).toBe('qwen2.5-coder @ 127.0.0.1:11434');

    // A child's tab shows its own live transcript, state and usage.
    await inAct(() => tabs[0].click());
    const child = $(root, 'child-view')!;
    expect(child.dataset.sessionId).toBe(C1);
    expect($(child, 'child-state')!.dataset.state).toBe('done');
    expect($(child, 'child-usage')!.textContent).toBe('10 tokens');
    const childMessages = $$(child, 'chat-message');
    expect(childMessages.map((m) => m.dataset.role)).toEqual(['user', 'assistant']);
    expect(childMessages[1].textContent).toContain('Auth looks fine.');
    expect(($(child, 'child-cancel') as HTMLButtonElement).disabled).toBe(true);
    // The child was created while we watched: nothing to read from disk.
    expect(fake.callsOf('get_session').map((a) => a.session_id)).toEqual([P]);

    // Cancel on a running child cancels the child session (not a delete).
    await inAct(() => fake.emit(P, kind(C2, 'subagent.state', { task_id: 'call-2', state: 'running' })));
    await inAct(() => $$(root, 'child-tab')[1].click());
    await inAct(() => $(root, 'child-cancel')!.click());
    expect(fake.callsOf('cancel')).toEqual([{ session_id: C2 }]);
    expect(fake.callsOf('delete_session')).toEqual([]);

    // The report's "Open tab" link and the Main tab switch views.
    await inAct(() => $(root, 'tab-main')!.click());
    expect($(root, 'child-view')).toBeNull();
  });

  it('ends the run on result, and marks errors and stops where they happened', async () => {
    const { fake, root } = await openParent();
    await inAct(() =>
      fake.emit(
        P,
        snapshot(P, { running: true }),
        kind(P, 'content.delta', { text: 'Half an answ' }),
        { type: 'error', session_id: P, message: 'provider said 500' },
      ),
    );
    expect($(root, 'run-error')!.textContent).toContain('provider said 500');
    expect($(root, 'progress')).toBeNull();
    expect($$(root, 'chat-message').length).toBe(0);
    expect($(root, 'session-pane')!.dataset.paused).toBe('true');

    await inAct(() => fake.emit(P, { type: 'message_status', session_id: P, message_id: 'm2', status: 'started' }));
    expect($(root, 'progress')).not.toBeNull();
    await inAct(() => fake.emit(P, kind(P, 'run.cancelled', null)));
    expect($(root, 'run-stopped')).not.toBeNull();
    expect($(root, 'progress')).toBeNull();
  });

  it('says so when the agent repeats the same call (the loop guard)', async () => {
    const { fake, root } = await openParent();
    expect($(root, 'run-notice')).toBeNull();
    await inAct(() => fake.emit(P, kind(P, 'loop.warning', { name: 'read_file', repeats: 3 })));
    const notice = $(root, 'run-notice')!;
    expect(notice.textContent).toContain('same read_file call 3 times');
    expect(notice.getAttribute('role')).toBe('status');
  });

  it('merges the history read from disk with events that arrived meanwhile, and re-syncs on a new snapshot', async () => {
    const history = [
      { role: 'user', content: 'first', id: 'msg-0' },
      { role: 'assistant', content: 'one' },
    ];
    const { fake, root } = await openParent({ [P]: history });
    // Already in the history (saved before announced) and one new message.
    await inAct(() =>
      fake.emit(P, snapshot(P, { running: true }), appended(P, history[1]), appended(P, { role: 'user', content: 'second', id: 'msg-2' })),
    );
    expect($$(root, 'chat-message').map((m) => m.textContent!.trim())).toEqual(['Youfirst', 'one', 'Yousecond']);
    expect(mergeHistory([{ a: 1 }, { b: 2 }] as any, [{ b: 2 }, { c: 3 }] as any)).toEqual([{ a: 1 }, { b: 2 }, { c: 3 }]);
    expect(mergeHistory([{ a: 1 }] as any, [{ c: 3 }] as any)).toEqual([{ a: 1 }, { c: 3 }]);

    // A lagging stream gets a fresh snapshot: the transcript is read again.
    const reads = fake.callsOf('get_session').length;
    await inAct(() =>
      fake.emit(P, snapshot(P, { running: false, subagents: [{ task_id: 't9', session_id: 'c9', parent_session_id: P, title: 'Late child', state: 'running' }] })),
    );
    expect(fake.callsOf('get_session').length).toBe(reads + 1);
    expect($$(root, 'child-tab').map((t) => t.dataset.title)).toEqual(['Late child']);

    // A child known only from the snapshot: its history is read when its tab opens.
    await inAct(() => $$(root, 'child-tab')[0].click());
    expect(fake.callsOf('get_session').at(-1)).toEqual({ session_id: 'c9' });
  });

  it('sends with Enter, keeps Shift+Enter for new lines, and stops with Esc', async () => {
    const { fake, root } = await openParent();
    await inAct(() => fake.emit(P, snapshot(P)));
    const input = $(root, 'prompt-input')!;
    await inAct(() => typeInto(input, 'line one'));
    const shift = key(input, 'Enter', { shiftKey: true });
    expect(shift.defaultPrevented).toBe(false);
    expect(fake.callsOf('submit')).toEqual([]);
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit')).toEqual([{ session_id: P, content: 'line one', config: null }]);
    expect((input as HTMLTextAreaElement).value).toBe('');
    // Shown at once with its status until the run appends it.
    const inflight = $$(root, 'chat-message').at(-1)!;
    expect(inflight.textContent).toContain('line one');
    expect(inflight.querySelector('[data-testid="message-status"]')!.textContent).toBe('working on it');
    await inAct(() => fake.emit(P, appended(P, { role: 'user', content: 'line one', id: 'msg-1' })));
    expect($$(root, 'chat-message').length).toBe(1);

    await inAct(() => key(input, 'Escape'));
    expect(fake.callsOf('cancel')).toEqual([{ session_id: P }]);
  });

  it('shows a failed send where it happened, with Retry', async () => {
    const { fake, root } = await openParent();
    await inAct(() => fake.emit(P, snapshot(P)));
    fake.handlers.submit = () => {
      throw { error: { code: 'unavailable', message: 'the runtime is shutting down' } };
    };
    await inAct(() => typeInto($(root, 'prompt-input')!, 'hello'));
    await inAct(() => $(root, 'send-button')!.click());
    const error = $(root, 'composer-error')!;
    expect(error.textContent).toContain('the runtime is shutting down');
    expect(($(root, 'prompt-input') as HTMLTextAreaElement).value).toBe('hello');
    fake.handlers.submit = () => ({ message_id: 'm', status: 'started' });
    await inAct(() => $(error, 'retry')!.click());
    expect(fake.callsOf('submit').length).toBe(2);
    expect($(root, 'composer-error')).toBeNull();
  });

  it('nests children under their parent in the sidebar, with state badges', async () => {
    const fake = workspacePlatform([
      info(P, { title: 'Refactor', state: 'running' }),
      info(C1, { title: 'Review auth', parent_session_id: P, state: 'running', task_id: 'call-1' }),
      info('other', { title: 'Fix tests', state: 'paused', created_at: '2024-01-01T00:00:00Z' }),
    ]);
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const items = $$(mounted.root, 'session-item');
    expect(items.map((i) => [i.dataset.sessionId, i.dataset.state, i.dataset.parentId ?? null])).toEqual([
      [P, 'running', null],
      [C1, 'running', P],
      ['other', 'paused', null],
    ]);
    // The finished children listed by the server get tabs too.
    expect($$(mounted.root, 'child-tab').map((t) => t.dataset.title)).toEqual(['Review auth']);
    // A child in the sidebar opens its parent on the child's tab.
    await inAct(() => (items[1].querySelector('.session-open') as HTMLElement).click());
    expect($(mounted.root, 'child-view')!.dataset.sessionId).toBe(C1);
    // Deleting asks once more, in place.
    fake.handlers.delete_session = () => ({});
    const del = $(items[2], 'session-delete')!;
    await inAct(() => del.click());
    expect(fake.callsOf('delete_session')).toEqual([]);
    expect(del.dataset.armed).toBe('true');
    await inAct(() => del.click());
    expect(fake.callsOf('delete_session')).toEqual([{ session_id: 'other' }]);
    await settle();
  });
});
