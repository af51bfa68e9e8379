// The Changes view: each turn's files with diffs; Undo changes shows the preview first and
// asks before overwriting the person's edits; Rewind and Fork open the fork; a sub-agent's
// undo; an isolated sub-agent's Apply to workspace (a conflict shown) and Discard; and the
// Changes tab of a session in the whole app.
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import { ChangesView } from '../components/ChangesView';
import { sessionTree } from '../components/Sidebar';
import type { Forked } from '../bindings/Forked';
import type { TurnChanges } from '../bindings/TurnChanges';
import { CommandError } from '../platform';
import { $, $$, FakePlatform, inAct, info, settle, workspacePlatform } from './fake';
import { mountApp } from './mount';

let root: HTMLElement | null = null;
let unmount: (() => void) | null = null;
afterEach(() => {
  if (root) render(null, root);
  root = null;
  unmount?.();
  unmount = null;
});

const file = (path: string, status: string, diff = `--- a/${path}\n+++ b/${path}\n@@ -1 +1 @@\n-old\n+new\n`) => ({ path, status, diff });

function changes(undone = false): TurnChanges {
  return {
    available: true,
    turns: [
      { message_index: 0, files: [file('a.txt', 'modified'), file('b.txt', 'added')], skipped: ['build/out.log (ignored by .gitignore)'], undone, pruned: false },
      { message_index: 4, files: [file('c.txt', 'deleted')], skipped: [], undone: false, pruned: false },
    ],
  };
}

async function mount(fake: FakePlatform, extra: Partial<Parameters<typeof ChangesView>[0]> = {}) {
  document.body.innerHTML = '';
  root = document.createElement('div');
  document.body.appendChild(root);
  await act(async () => {
    render(<ChangesView platform={fake} sessionId="s1" {...extra} />, root!);
  });
  await settle();
  return root;
}

describe('changes view', () => {
  it('lists each turn with its files and diffs, and what was not recorded', async () => {
    const fake = new FakePlatform({ turn_changes: () => changes() });
    const view = await mount(fake);
    const turns = $$(view, 'changes-turn');
    expect(turns.map((t) => t.dataset.index)).toEqual(['0', '4']);
    const files = $$(turns[0], 'change-file').map((f) => [f.dataset.path, f.dataset.status]);
    expect(files).toEqual([
      ['a.txt', 'modified'],
      ['b.txt', 'added'],
    ]);
    expect(turns[0].querySelector('.diff-add')!.textContent).toContain('+new');
    expect($(turns[0], 'turn-skipped')!.textContent).toContain('build/out.log (ignored by .gitignore)');
    expect(fake.callsOf('turn_changes')).toEqual([{ session_id: 's1' }]);
  });

  it('undoes a turn after its preview, and asks before overwriting the person’s edits', async () => {
    let conflicts = ['a.txt'];
    let undone = false;
    const fake = new FakePlatform({
      turn_changes: () => changes(undone),
      undo_turn: (args) => {
        if (args.preview) return { applied: false, files: [file('a.txt', 'modified'), file('b.txt', 'deleted')], conflicts, skipped: [] };
        if (conflicts.length && !args.force) throw new CommandError('conflict', 'a.txt was changed');
        undone = true;
        return { applied: true, files: [file('a.txt', 'modified'), file('b.txt', 'deleted')], conflicts, skipped: [] };
      },
    });
    const view = await mount(fake);
    await inAct(() => $$(view, 'turn-undo')[0].click());
    await settle();
    expect(fake.callsOf('undo_turn')).toEqual([{ session_id: 's1', message_index: 0, preview: true }]);
    const preview = $(view, 'undo-preview')!;
    expect($$(preview, 'change-file').map((f) => f.dataset.path)).toEqual(['a.txt', 'b.txt']);
    // A file the person changed since: the only way on is to say so.
    expect($(preview, 'undo-preview-conflicts')!.textContent).toContain('a.txt');
    expect($(view, 'undo-confirm')).toBeNull();
    await inAct(() => $(view, 'undo-cancel')!.click());
    expect($(view, 'undo-preview')).toBeNull();
    expect(fake.callsOf('undo_turn').length).toBe(1);

    await inAct(() => $$(view, 'turn-undo')[0].click());
    await settle();
    await inAct(() => $(view, 'undo-confirm-force')!.click());
    await settle();
    expect(fake.callsOf('undo_turn').at(-1)).toEqual({ session_id: 's1', message_index: 0, force: true });
    expect($(view, 'changes-done')!.textContent).toContain('2 file(s) restored');
    expect($(view, 'turn-undone')).not.toBeNull();
    // A word apart from the turn's title, not "…worldundone" (UX E7): the badge's own
    // leading space was dropped by its inline-block.
    expect($(view, 'turn-undone')!.textContent).toBe('undone');
    expect($$(view, 'changes-turn')[0].querySelector('header')!.textContent).toMatch(/ undone$/);
    expect(($$(view, 'turn-undo')[0] as HTMLButtonElement).disabled).toBe(true);

    // Without a conflict the plain Undo is offered.
    conflicts = [];
    await inAct(() => $$(view, 'turn-undo')[1].click());
    await settle();
    expect($(view, 'undo-confirm-force')).toBeNull();
    expect($(view, 'undo-confirm')).not.toBeNull();
  });

  it('rewinds and forks: the fork is opened with the message as a draft', async () => {
    const forked: Forked[] = [];
    const fake = new FakePlatform({
      turn_changes: () => changes(),
      undo_turn: () => ({ applied: false, files: [file('c.txt', 'added')], conflicts: [], skipped: [] }),
      fork_session: (args) => ({ session: info(args.rewind ? 'rewound' : 'forked'), draft: 'second', undo: args.rewind ? { applied: true, files: [file('c.txt', 'added')], conflicts: [], skipped: [] } : null }),
    });
    const view = await mount(fake, { onForked: (f) => forked.push(f) });
    await inAct(() => $$(view, 'turn-fork')[1].click());
    await settle();
    expect(fake.callsOf('fork_session')).toEqual([{ session_id: 's1', message_index: 4, rewind: false }]);
    expect(fake.callsOf('undo_turn')).toEqual([]);
    await inAct(() => $$(view, 'turn-rewind')[1].click());
    await settle();
    expect($(view, 'undo-preview')!.textContent).toContain('Rewind to here');
    await inAct(() => $(view, 'undo-confirm')!.click());
    await settle();
    expect(fake.callsOf('fork_session').at(-1)).toEqual({ session_id: 's1', message_index: 4, rewind: true, force: false });
    expect(forked.map((f) => f.session.session_id)).toEqual(['forked', 'rewound']);
    expect(forked[1].draft).toBe('second');
  });

  it('offers a sub-agent one undo for all its changes', async () => {
    const fake = new FakePlatform({
      turn_changes: () => changes(),
      undo_turn: (args) => ({ applied: !args.preview, files: [file('a.txt', 'modified')], conflicts: [], skipped: [] }),
    });
    const view = await mount(fake, { child: true });
    expect($(view, 'turn-undo')).toBeNull();
    await inAct(() => $(view, 'child-undo')!.click());
    await settle();
    await inAct(() => $(view, 'undo-confirm')!.click());
    await settle();
    expect(fake.callsOf('undo_turn')).toEqual([
      { session_id: 's1', message_index: 0, preview: true },
      { session_id: 's1', message_index: 0, force: false },
    ]);
  });

  it('applies an isolated sub-agent’s worktree, shows a conflict, and discards it', async () => {
    let conflict = true;
    let changed = 0;
    const fake = new FakePlatform({
      turn_changes: () => ({ available: true, turns: [] }),
      apply_worktree: () => {
        if (conflict) throw new CommandError('conflict', "the sub-agent's changes do not apply cleanly: a.txt; nothing was applied");
        return { stat: ' a.txt | 2 +-\n 1 file changed' };
      },
      discard_worktree: () => ({}),
    });
    const worktree = { origin: '/ws', path: '/data/worktrees/c1', branch: 'bumblehive/c1', base: 'abc', applied: false };
    const view = await mount(fake, { child: true, worktree, onWorktreeChanged: () => changed++ });
    expect($(view, 'worktree-actions')!.textContent).toContain('bumblehive/c1');
    await inAct(() => $(view, 'worktree-apply')!.click());
    await settle();
    expect($(view, 'changes-error')!.textContent).toContain('nothing was applied');
    conflict = false;
    await inAct(() => $(view, 'worktree-apply')!.click());
    await settle();
    expect($(view, 'changes-done')!.textContent).toContain('1 file changed');
    await inAct(() => $(view, 'worktree-discard')!.click());
    await settle();
    expect(fake.callsOf('discard_worktree')).toEqual([{ session_id: 's1' }]);
    expect(changed).toBe(2);
  });

  it('offers an isolated sub-agent’s Apply and Discard in its conversation’s Changes tab and in its own tab (UX E2)', async () => {
    const worktree = { origin: '/ws', path: '/data/worktrees/c1', branch: 'bumblehive/c1', base: 'abc', applied: false };
    // The child works in its worktree (its `workspace`), yet the list names it under the parent.
    const fake = workspacePlatform(
      [info('a'), info('c1', { parent_session_id: 'a', task_id: 't1', title: 'iso', workspace: '/data/worktrees/c1', worktree }), info('g1', { parent_session_id: 'c1', title: 'deeper', worktree: { ...worktree, branch: 'bumblehive/g1' } })],
      { a: [], c1: [], g1: [] },
    );
    fake.handlers.turn_changes = () => ({ available: true, turns: [] });
    fake.handlers.apply_worktree = () => ({ stat: ' a.txt | 2 +-\n 1 file changed' });
    fake.handlers.discard_worktree = () => ({});
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'tab-changes')!.click());
    await settle();
    const actions = $$(mounted.root, 'worktree-actions');
    expect(actions.map((a) => a.dataset.sessionId)).toEqual(['c1', 'g1']);
    expect(actions[0].textContent).toContain('Sub-agent “iso”');
    expect(actions[0].textContent).toContain('bumblehive/c1');
    // The sentence is one item of the notice's row, its branch inside it (it was three
    // columns), and the empty view does not say nothing changed beside them.
    const sentence = actions[0].querySelector('.worktree-text')!;
    expect(sentence.textContent).toContain('works in its own worktree (branch bumblehive/c1); its changes reach');
    expect(sentence.querySelector('code')!.textContent).toBe('bumblehive/c1');
    expect($(mounted.root, 'changes-empty')!.textContent).toBe('Nothing else changed: the sub-agents above worked in their own worktrees.');
    await inAct(() => $(actions[0], 'worktree-apply')!.click());
    await settle();
    expect(fake.callsOf('apply_worktree')).toEqual([{ session_id: 'c1' }]);
    expect($(mounted.root, 'changes-done')!.textContent).toContain('1 file changed');
    await inAct(() => $(actions[1], 'worktree-discard')!.click());
    await settle();
    expect(fake.callsOf('discard_worktree')).toEqual([{ session_id: 'g1' }]);
    // Its own tab (made from the list) has them too.
    const tab = $$(mounted.root, 'child-tab').find((t) => t.dataset.sessionId === 'c1')!;
    expect(tab).toBeTruthy();
    await inAct(() => tab.click());
    await settle();
    await inAct(() => $(mounted.root, 'child-changes')!.click());
    await settle();
    expect($(mounted.root, 'worktree-actions')!.dataset.sessionId).toBe('c1');
  });

  it('shows what a turn’s sub-agents changed, and its undo offers to include them (UX E6)', async () => {
    const fake = new FakePlatform({
      turn_changes: () => ({
        available: true,
        turns: [],
        children: [{ session_id: 'c1', title: 'helper', message_index: 0, turns: [{ message_index: 0, files: [file('child-y.txt', 'added')], skipped: [], undone: false, pruned: false }] }],
      }),
      undo_turn: (args) => ({ applied: !args.preview, files: args.include_children ? [file('child-y.txt', 'deleted')] : [], conflicts: [], skipped: [] }),
    });
    const view = await mount(fake);
    // A turn whose only changes are its sub-agent's is listed, with the sub-agent named.
    const turn = $$(view, 'changes-turn')[0];
    expect(turn.dataset.index).toBe('0');
    const child = $(turn, 'changes-child')!;
    expect(child.textContent).toContain('Sub-agent “helper”');
    expect($$(child, 'change-file').map((f) => f.dataset.path)).toEqual(['child-y.txt']);
    expect($(view, 'changes-empty')).toBeNull();
    await inAct(() => $(turn, 'turn-undo')!.click());
    await settle();
    expect(fake.callsOf('undo_turn')).toEqual([{ session_id: 's1', message_index: 0, preview: true, include_children: true }]);
    const box = $(view, 'undo-include-children-box') as HTMLInputElement;
    expect(box.checked).toBe(true);
    expect($(view, 'undo-include-children')!.textContent).toContain('Include what its sub-agent changed');
    expect($$($(view, 'undo-preview-files')!, 'change-file').map((f) => f.dataset.path)).toEqual(['child-y.txt']);
    // Unticked: the preview without them; ticked again, the undo includes them.
    await inAct(() => box.click());
    await settle();
    expect(fake.callsOf('undo_turn').at(-1)).toEqual({ session_id: 's1', message_index: 0, preview: true });
    await inAct(() => ($(view, 'undo-include-children-box') as HTMLInputElement).click());
    await settle();
    await inAct(() => $(view, 'undo-confirm')!.click());
    await settle();
    expect(fake.callsOf('undo_turn').at(-1)).toEqual({ session_id: 's1', message_index: 0, force: false, include_children: true });
  });

  it('its rewind offers the sub-agents’ changes too and sends them with the fork (UX E6)', async () => {
    const fake = new FakePlatform({
      turn_changes: () => ({
        available: true,
        turns: [],
        children: [{ session_id: 'c1', title: 'helper', message_index: 0, turns: [{ message_index: 0, files: [file('child-y.txt', 'added')], skipped: [], undone: false, pruned: false }] }],
      }),
      undo_turn: (args) => ({ applied: false, files: args.include_children ? [file('child-y.txt', 'deleted')] : [], conflicts: [], skipped: [] }),
      fork_session: (args) => ({
        session: info('f', { forked_from: 's1', forked_at: args.message_index }),
        draft: 'write it',
        undo: { applied: true, files: args.include_children ? [file('child-y.txt', 'deleted')] : [], conflicts: [], skipped: [] },
      }),
    });
    const view = await mount(fake);
    const turn = $$(view, 'changes-turn')[0];
    await inAct(() => $(turn, 'turn-rewind')!.click());
    await settle();
    expect(fake.callsOf('undo_turn')).toEqual([{ session_id: 's1', message_index: 0, preview: true, include_children: true }]);
    expect(($(view, 'undo-include-children-box') as HTMLInputElement).checked).toBe(true);
    expect($$($(view, 'undo-preview-files')!, 'change-file').map((f) => f.dataset.path)).toEqual(['child-y.txt']);
    await inAct(() => $(view, 'undo-confirm')!.click());
    await settle();
    expect(fake.callsOf('fork_session')).toEqual([{ session_id: 's1', message_index: 0, rewind: true, force: false, include_children: true }]);
    expect($(view, 'changes-done')!.textContent).toContain('Rewound: 1 file(s) restored');
  });

  it('shows an undo’s note in the chat as a note, not as the person’s message (UX E7)', async () => {
    const history = [
      { role: 'user', content: 'write hello', id: 'm1' },
      { role: 'assistant', content: 'done' },
      {
        role: 'user',
        content: 'Note: the person undid the file changes of turn 1: hello.t deleted. The files are as they were before that turn; the conversation above is unchanged.',
        id: 'note:abc',
      },
    ];
    const fake = workspacePlatform([info('a')], { a: history });
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const note = $(mounted.root, 'chat-note')!;
    expect(note.textContent).toContain('You undid the file changes of turn 1: hello.t deleted.');
    expect(note.textContent).toContain('The agent reads this note at its next turn.');
    // The person's bubbles are theirs alone: the note is none, and Edit stays on their message.
    const mine = $$(mounted.root, 'chat-message').filter((m) => m.dataset.role === 'user');
    expect(mine.map((m) => m.dataset.messageId)).toEqual(['m1']);
    expect($$(mounted.root, 'edit-message').length).toBe(1);
    expect($$(mounted.root, 'fork-message').length).toBe(1);
  });

  it('says so when checkpoints are off', async () => {
    const fake = new FakePlatform({ turn_changes: () => ({ available: false, notice: 'Checkpoints and undo are off: git was not found', turns: [] }) });
    const view = await mount(fake);
    expect($(view, 'changes-off')!.textContent).toContain('git was not found');
  });

  it('lists a fork right under its original in the sidebar', () => {
    const tree = sessionTree([
      info('orig', { created_at: '2025-01-01T00:00:00Z' }),
      info('newer', { created_at: '2025-01-03T00:00:00Z' }),
      info('fork2', { created_at: '2025-01-04T00:00:00Z', forked_from: 'orig', forked_at: 4 }),
      info('fork1', { created_at: '2025-01-02T00:00:00Z', forked_from: 'orig', forked_at: 0 }),
    ]);
    expect(tree.map((n) => n.info.session_id)).toEqual(['newer', 'orig', 'fork1', 'fork2']);
  });

  it('forks from one of the person’s messages in the chat, with that message as the draft', async () => {
    const history = [
      { role: 'user', content: 'first', id: 'm1' },
      { role: 'assistant', content: 'one' },
      { role: 'user', content: 'second', id: 'm2' },
      { role: 'assistant', content: 'two' },
    ];
    const fake = workspacePlatform([info('a')], { a: history, f: history.slice(0, 2) });
    fake.handlers.fork_session = (args) => ({ session: info('f', { forked_from: 'a', forked_at: args.message_index }), draft: 'second' });
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    const forks = $$(mounted.root, 'fork-message');
    expect(forks.length).toBe(2);
    await inAct(() => forks[1].click());
    await settle();
    expect(fake.callsOf('fork_session')).toEqual([{ session_id: 'a', message_index: 2, rewind: false }]);
    expect(($(mounted.root, 'prompt-input') as HTMLTextAreaElement).value).toBe('second');
  });

  it('is a tab of the session in the app', async () => {
    const fake = workspacePlatform([info('a')], { a: [] });
    fake.handlers.turn_changes = () => changes();
    const mounted = await mountApp(fake, 'a');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'tab-changes')!.click());
    await settle();
    expect($$(mounted.root, 'changes-turn').length).toBe(2);
    expect(fake.callsOf('turn_changes')).toEqual([{ session_id: 'a' }]);
  });
});
