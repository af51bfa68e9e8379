// Labels (E18): the person's own follow-up and Retry in a child's tab are theirs, not "Task
// from the parent agent"; the Changes view numbers turns from 1 by the person's prompts; no
// "invalid argument:" jargon reaches people.
import { afterEach, describe, expect, it } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { ChangesView } from '../components/ChangesView';
import { CommandError, toCommandError } from '../platform';
import { $, $$, FakePlatform, historyPage, info, inAct, key, settle, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const P = 'p';
const C = 'c1';

describe("who wrote a child's messages", () => {
  it('its task and its parent’s messages are the parent agent’s; a follow-up typed in its tab and Retry are the person’s', async () => {
    const fake = workspacePlatform([info(P), info(C, { parent_session_id: P, task_id: 't1', title: 'Alpha' })], {
      [P]: [
        { role: 'user', content: 'delegate', id: 'm1' },
        { role: 'assistant', content: null, tool_calls: [{ id: 't1', name: 'sub_agent', arguments: { title: 'Alpha', task: 'do X' } }] },
        { role: 'tool', content: '{"status":"pending","task_id":"t1"}', tool_call_id: 't1' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'k1', name: 'message_subagent', arguments: { task_id: 't1', message: 'also check the tests' } }] },
        { role: 'tool', content: 'delivered', tool_call_id: 'k1' },
      ],
      [C]: [
        { role: 'user', content: 'do X', id: 'task:t1' },
        { role: 'assistant', content: 'did X' },
        { role: 'user', content: 'also check the tests', id: 'msg-1' },
        { role: 'assistant', content: 'checked' },
        { role: 'user', content: 'and the docs, please', id: 'msg-2' },
        { role: 'assistant', content: 'failed' },
        { role: 'user', content: 'The last attempt failed. Try the task again.', id: 'msg-3' },
        { role: 'assistant', content: 'done' },
      ],
    });
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P)));
    await inAct(() => $$(mounted.root, 'child-tab')[0].click());
    const who = $$($(mounted.root, 'child-view')!, 'message-who').map((w) => w.textContent);
    expect(who).toEqual(['Task from the parent agent', 'From the parent agent', 'You', 'You']);
  });
});

describe('turn numbers in the Changes view', () => {
  it('count the person’s prompts from 1, not message indexes (reports are not prompts)', async () => {
    const history = [
      { role: 'user', content: 'first prompt', id: 'm1' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'w', name: 'write_file', arguments: { path: 'a' } }] },
      { role: 'tool', content: 'ok', tool_call_id: 'w' },
      { role: 'user', content: '[Background tool result]\nTask ID: t1\n\nreport', id: 'subagent:t1' },
      { role: 'assistant', content: 'noted' },
      { role: 'user', content: 'second prompt', id: 'm2' },
    ];
    const fake = new FakePlatform({
      turn_changes: () => ({
        available: true,
        turns: [
          { message_index: 0, files: [{ path: 'a', status: 'added', diff: '' }], skipped: [], undone: false, pruned: false },
          { message_index: 5, files: [{ path: 'b', status: 'added', diff: '' }], skipped: [], undone: true, pruned: false },
        ],
      }),
      get_session: ({ session_id }) => historyPage(info(session_id), history),
    });
    document.body.innerHTML = '';
    const root = document.createElement('div');
    document.body.appendChild(root);
    await act(async () => {
      render(<ChangesView platform={fake} sessionId="s1" />, root);
    });
    await settle();
    unmount = () => render(null, root);
    const heads = $$(root, 'changes-turn').map((t) => t.textContent);
    expect($$(root, 'turn-number').map((n) => n.textContent)).toEqual(['Turn 1', 'Turn 2']);
    expect(heads.join(' ')).toContain('first prompt');
    expect(heads.join(' ')).toContain('second prompt');
    // An undone turn's mark stands apart from its title ("second prompt undone", not "promptundone").
    const undone = $(root, 'turn-undone')!;
    expect(undone.textContent).toBe('undone');
    expect(undone.previousSibling?.textContent).toMatch(/\s$/);
  });
});

describe('error words for people', () => {
  it('drop the runtime’s "invalid argument:" kind', async () => {
    expect(toCommandError({ error: { code: 'invalid_argument', message: 'invalid argument: /tmp/x does not exist' } }).message).toBe('/tmp/x does not exist');
    const fake = workspacePlatform([info(P)]);
    fake.handlers.submit = () => {
      throw new CommandError('invalid_argument', 'invalid argument: content must not be empty');
    };
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    await inAct(() => fake.emit(P, snapshot(P)));
    const input = $(mounted.root, 'prompt-input')!;
    await inAct(() => typeInto(input, 'hi'));
    await inAct(() => key(input, 'Enter'));
    expect($(mounted.root, 'composer-error')!.textContent).toContain('content must not be empty');
    expect($(mounted.root, 'composer-error')!.textContent).not.toContain('invalid argument');
  });
});
