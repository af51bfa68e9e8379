// Attention across sessions in the app: badges, the inbox, the title, notifications and the
// app-wide running count, from the feeds of sessions other than the selected one (D1, D26).
import { afterEach, describe, expect, it, vi } from 'vitest';
import { $, $$, info, inAct, key, kind, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
  vi.restoreAllMocks();
});

const approval = { type: 'approval_request', approval_id: 'a1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', tool: 'write_file', arguments: { path: 'edit.txt' }, rememberable: true };

async function twoSessions() {
  const fake = workspacePlatform([
    info('sel', { title: 'Looking here', updated_at: '2025-01-02T00:00:00Z' }),
    info('bg', { title: 'Background work', state: 'running' }),
    info('c', { title: 'Editor', parent_session_id: 'bg', task_id: 't1', state: 'running' }),
  ]);
  const mounted = await mountApp(fake, 'sel');
  unmount = mounted.unmount;
  return { fake, root: mounted.root };
}

describe('a sub-agent of another session asks for approval', () => {
  it('badges the session and the child, titles the window, notifies when unfocused, and the inbox leads there', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(false);
    const { fake, root } = await twoSessions();
    // The selected session has its own feed; the live one in the background has one too.
    expect([...fake.streams.keys()].sort()).toEqual(['bg', 'sel']);
    await inAct(() => fake.emit('bg', snapshot('bg', { running: true, subagents: [{ task_id: 't1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', state: 'running' }] }), approval));

    const item = (id: string) => $$(root, 'session-item').find((i) => i.dataset.sessionId === id)!;
    expect($(item('bg'), 'needs-badge')!.dataset.kind).toBe('approval');
    expect($(item('c'), 'needs-badge')!.getAttribute('aria-label')).toBe('needs you: 1 approval');
    expect($(item('sel'), 'needs-badge')).toBeNull();
    // The window names the session on screen, then what waits (D26).
    expect(fake.titles.at(-1)).toBe('Looking here — Bumblehive — 1 needs you');
    expect(fake.notified).toEqual([{ title: 'Bumblehive needs your approval', body: 'Sub-agent “Editor” asks to run write_file in “Background work”' }]);
    // Everything that runs in the app, not only the selected tree.
    expect($(root, 'status-runs')!.textContent).toBe('2 running');

    await inAct(() => $(root, 'inbox-button')!.click());
    const inbox = $(root, 'inbox')!;
    expect($(inbox, 'inbox-approval')!.textContent).toContain('Editor wants to run write_file on edit.txt');
    await inAct(() => $(inbox, 'inbox-approval')!.click());
    // The child's tab in its session, where the approval panel docks.
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('bg');
    expect($(root, 'child-view')!.dataset.sessionId).toBe('c');
    // Its feed opens with a snapshot (as the backend's does), which carries the approval.
    const { type: _t, ...open } = approval;
    await inAct(() => fake.emit('bg', snapshot('bg', { running: true, approvals: [open as any], subagents: [{ task_id: 't1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', state: 'running' }] })));
    expect(root.querySelector('.approval-dock')).not.toBeNull();
    expect($$(root, 'child-tab')[0].querySelector('[data-testid="tab-needs"]')).not.toBeNull();
  });

  it('does not notify while the window has focus; a failure badges until seen', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(true);
    const { fake, root } = await twoSessions();
    await inAct(() => fake.emit('bg', snapshot('bg', { subagents: [{ task_id: 't1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', state: 'running' }] }), kind('c', 'subagent.state', { task_id: 't1', state: 'failed' })));
    expect(fake.notified).toEqual([]);
    expect(fake.titles.at(-1)).toBe('Looking here — Bumblehive — 1 needs you');
    const childItem = $$(root, 'session-item').find((i) => i.dataset.sessionId === 'c')!;
    expect($(childItem, 'needs-badge')!.dataset.kind).toBe('failed');
    // Opening the failed child clears it.
    await inAct(() => (childItem.querySelector('.session-open') as HTMLElement).click());
    expect($(root, 'child-view')!.dataset.sessionId).toBe('c');
    expect(fake.titles.at(-1)).toBe('Background work — Bumblehive');
  });
});

describe('a notification leads to what it announced (E21)', () => {
  it('its click opens the asking child’s tab with the approval; the inbox names the conversation', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(false);
    const { fake, root } = await twoSessions();
    await inAct(() => fake.emit('bg', snapshot('bg', { running: true, subagents: [{ task_id: 't1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', state: 'running' }] }), approval));
    expect(fake.notified.at(-1)!.body).toContain('in “Background work”');
    await inAct(() => $(root, 'inbox-button')!.click());
    expect($(root, 'inbox-approval')!.textContent).toContain('in “Background work”');
    await inAct(() => $(root, 'inbox-close')!.click());
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('sel');
    await inAct(() => fake.notificationClicks.at(-1)!());
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('bg');
    expect($(root, 'child-view')!.dataset.sessionId).toBe('c');
  });

  it('on the desktop (no click reported), focusing the window after it opens the approval while it still waits', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(false);
    const { fake, root } = await twoSessions();
    await inAct(() => fake.emit('bg', snapshot('bg', { running: true, subagents: [{ task_id: 't1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', state: 'running' }] }), approval));
    await inAct(() => window.dispatchEvent(new Event('focus')));
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('bg');
    expect($(root, 'child-view')!.dataset.sessionId).toBe('c');
    // Once opened it does not pull the window there again.
    await inAct(() => ($$(root, 'session-item').find((i) => i.dataset.sessionId === 'sel')!.querySelector('.session-open') as HTMLElement).click());
    await inAct(() => window.dispatchEvent(new Event('focus')));
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('sel');
  });

  it('a person already acting in the window is not pulled away by a later focus', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(false);
    const { fake, root } = await twoSessions();
    await inAct(() => fake.emit('bg', snapshot('bg', { running: true, subagents: [{ task_id: 't1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', state: 'running' }] }), approval));
    // Back by their own way: a click in the window (here on the inbox), then a focus.
    await inAct(() => $(root, 'inbox-button')!.dispatchEvent(new MouseEvent('pointerdown', { bubbles: true })));
    await inAct(() => window.dispatchEvent(new Event('focus')));
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('sel');
  });
});

describe('the inbox decides an approval in place (E21)', () => {
  const running = { running: true, subagents: [{ task_id: 't1', session_id: 'c', parent_session_id: 'bg', title: 'Editor', state: 'running' as const }] };

  it('Approve decides there, as the dock does, naming the conversation; the window stays where it was and the composer gets the focus back', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(true);
    const { fake, root } = await twoSessions();
    await inAct(() => fake.emit('bg', snapshot('bg', running), approval));
    await inAct(() => $(root, 'inbox-button')!.click());
    const row = $(root, 'inbox-approval-row')!;
    expect(row.textContent).toContain('Editor wants to run write_file on edit.txt in “Background work”');
    await inAct(() => $(row, 'inbox-approve')!.click());
    expect(fake.callsOf('decide_approval')).toEqual([{ session_id: 'c', approval_id: 'a1', approved: true, remember: false, reason: null }]);
    // Nothing else waited: the inbox closes, the selected session stays on screen.
    expect($(root, 'inbox')).toBeNull();
    expect($(root, 'session-pane')!.dataset.sessionId).toBe('sel');
    expect(document.activeElement).toBe($(root, 'prompt-input'));
    // The runtime's answer clears the badge as any decision does.
    await inAct(() => fake.emit('bg', { type: 'approval_resolved', session_id: 'c', approval_id: 'a1', approved: true }));
    expect($$(root, 'needs-badge')).toEqual([]);
  });

  it('Deny carries the reason typed beside it, Always is offered as in the dock, and focus moves to the next request', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(true);
    const { fake, root } = await twoSessions();
    const second = { ...approval, approval_id: 'a2', tool: 'run_command', arguments: { command: 'cargo test' }, remember_label: 'always allow `cargo test` in this session' };
    await inAct(() => fake.emit('bg', snapshot('bg', running), approval, second, { ...approval, approval_id: 'a3', rememberable: false }));
    await inAct(() => $(root, 'inbox-button')!.click());
    const rows = () => $$(root, 'inbox-approval-row');
    expect(rows()).toHaveLength(3);
    // Always only where the dock offers it, saying what it covers.
    expect($(rows()[1], 'inbox-always')!.textContent).toBe('Always allow `cargo test` in this session');
    expect($(rows()[2], 'inbox-always')).toBeNull();

    await inAct(() => typeInto($(rows()[0], 'inbox-reason')!, '  not that file  '));
    await inAct(() => key($(rows()[0], 'inbox-reason')!, 'Enter'));
    expect(fake.callsOf('decide_approval')).toEqual([{ session_id: 'c', approval_id: 'a1', approved: false, remember: false, reason: 'not that file' }]);
    // The decided request leaves the list at once; focus goes to the one now in its place
    // (its item, which opens: never a decision button, so a stray Space decides nothing).
    expect(rows().map((r) => r.dataset.approvalId)).toEqual(['a2', 'a3']);
    expect(document.activeElement).toBe($(rows()[0], 'inbox-approval'));

    await inAct(() => $(rows()[0], 'inbox-always')!.click());
    expect(fake.callsOf('decide_approval')[1]).toEqual({ session_id: 'c', approval_id: 'a2', approved: true, remember: true, reason: null });
    await inAct(() => $(rows()[0], 'inbox-deny')!.click());
    expect(fake.callsOf('decide_approval')[2]).toEqual({ session_id: 'c', approval_id: 'a3', approved: false, remember: false, reason: null });
    expect($(root, 'inbox')).toBeNull();
  });

  it('an item names the model and server the sub-agent runs on (E3)', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(true);
    const { fake, root } = await twoSessions();
    await inAct(() => fake.emit('bg', snapshot('bg', running), { ...approval, provider: 'local', model: 'tiny' }));
    await inAct(() => $(root, 'inbox-button')!.click());
    expect($(root, 'inbox-approval')!.textContent).toContain('Editor · tiny on local wants to run write_file on edit.txt in “Background work”');
  });

  it('a failed decision stays in the inbox with its error and a retry', async () => {
    vi.spyOn(document, 'hasFocus').mockReturnValue(true);
    const { fake, root } = await twoSessions();
    let fail = true;
    fake.handlers.decide_approval = () => {
      if (fail) throw { code: 'internal', message: 'the backend is gone' };
      return {};
    };
    await inAct(() => fake.emit('bg', snapshot('bg', running), approval));
    await inAct(() => $(root, 'inbox-button')!.click());
    await inAct(() => $(root, 'inbox-approve')!.click());
    expect($(root, 'inbox-approval-row')!.textContent).toContain('the backend is gone');
    fail = false;
    await inAct(() => $($(root, 'inbox-approval-row')!, 'retry')!.click());
    expect(fake.callsOf('decide_approval')).toHaveLength(2);
    expect($(root, 'inbox')).toBeNull();
  });
});
