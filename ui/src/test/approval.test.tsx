import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, info, inAct, key, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

const P = 'sess-parent';
const CHILD = 'sess-child';

const writeRequest = (extra: Record<string, unknown> = {}) => ({
  type: 'approval_request',
  approval_id: 'approval-1',
  session_id: CHILD,
  parent_session_id: P,
  title: 'Review auth',
  tool: 'write_file',
  arguments: { path: 'src/auth.rs', content: 'fn main() {}\n' },
  diff: '--- a/src/auth.rs\n+++ b/src/auth.rs\n@@ -1,2 +1,2 @@\n fn keep() {}\n-fn old() {}\n+fn main() {}\n',
  rememberable: true,
  ...extra,
});

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

async function withApproval(extra: Record<string, unknown> = {}) {
  const fake = workspacePlatform([info(P)]);
  const mounted = await mountApp(fake, P);
  unmount = mounted.unmount;
  await inAct(() => fake.emit(P, snapshot(P, { running: true }), writeRequest(extra)));
  const dialog = $(mounted.root, 'approval-dialog')!;
  return { fake, root: mounted.root, dialog };
}

describe('the approval dialog', () => {
  it('names the asking sub-agent, the tool, and shows the diff coloured', async () => {
    const { dialog } = await withApproval();
    expect(dialog).not.toBeNull();
    expect(dialog.textContent).toContain('Sub-agent “Review auth” wants to run write_file');
    expect(dialog.textContent).toContain('src/auth.rs');
    expect($(dialog, 'approval-worktree')).toBeNull();
    const diff = $(dialog, 'approval-diff')!;
    expect(Array.from(diff.querySelectorAll('.diff-add')).map((l) => l.textContent!.trim())).toEqual(['+fn main() {}']);
    expect(Array.from(diff.querySelectorAll('.diff-del')).map((l) => l.textContent!.trim())).toEqual(['-fn old() {}']);
    expect(diff.querySelectorAll('.diff-hunk').length).toBe(1);
  });

  it('an isolated sub-agent’s approval says the write goes to its worktree (UX E20)', async () => {
    const { dialog } = await withApproval({ worktree: 'bumblehive/c1' });
    expect($(dialog, 'approval-worktree')!.textContent).toContain('worktree (branch bumblehive/c1), not in the workspace');
  });

  it('a sub-agent’s approval names the model and server it runs on, so the person sees where the content goes (UX E3)', async () => {
    const { dialog } = await withApproval({ provider: 'local', model: 'qwen2.5-coder-7b' });
    expect($(dialog, 'approval-runs-on')!.textContent).toBe(' · qwen2.5-coder-7b on local');
    expect(dialog.querySelector('h2')!.textContent).toContain(
      'Sub-agent “Review auth” · qwen2.5-coder-7b on local wants to run write_file',
    );
    // Without them (a top-level session's own approval, an older runtime) nothing is added.
    unmount?.();
    const plain = await withApproval({ title: null, session_id: P });
    expect($(plain.dialog, 'approval-runs-on')).toBeNull();
    expect(plain.dialog.querySelector('h2')!.textContent).toContain('The agent wants to run write_file');
  });

  it('an overwrite with identical content says "no changes" instead of showing nothing (D29)', async () => {
    const { dialog } = await withApproval({ diff: '' });
    expect($(dialog, 'approval-no-changes')!.textContent).toContain('No changes');
    expect($(dialog, 'approval-diff')).toBeNull();
  });

  it('Approve decides with approved=true for the asking session', async () => {
    const { fake, root, dialog } = await withApproval();
    await inAct(() => $(dialog, 'approval-approve')!.click());
    expect(fake.callsOf('decide_approval')).toEqual([
      { session_id: CHILD, approval_id: 'approval-1', approved: true, remember: false, reason: null },
    ]);
    expect($(root, 'approval-dialog')).toBeNull();
  });

  it('Always allow remembers; it is offered only when rememberable', async () => {
    const { fake, dialog } = await withApproval();
    await inAct(() => $(dialog, 'approval-always')!.click());
    expect(fake.callsOf('decide_approval')).toEqual([
      { session_id: CHILD, approval_id: 'approval-1', approved: true, remember: true, reason: null },
    ]);
    unmount?.();
    const second = await withApproval({ rememberable: false, title: null, session_id: P, diff: null });
    expect($(second.dialog, 'approval-always')).toBeNull();
    expect(second.dialog.textContent).toContain('The agent wants to run write_file');
    expect($(second.dialog, 'approval-arguments')!.textContent).toContain('"path": "src/auth.rs"');
    // The button says what "always" covers: one command, never any command.
    unmount?.();
    const third = await withApproval({ tool: 'run_command', remember_label: 'always allow `cargo test` (with any further plain arguments) in this session' });
    expect($(third.dialog, 'approval-always')!.textContent).toBe('Always allow `cargo test` (with any further plain arguments) in this session');
  });

  it('Deny sends the optional reason', async () => {
    const { fake, dialog } = await withApproval();
    await inAct(() => typeInto($(dialog, 'approval-reason')!, '  not that file  '));
    await inAct(() => $(dialog, 'approval-deny')!.click());
    expect(fake.callsOf('decide_approval')).toEqual([
      { session_id: CHILD, approval_id: 'approval-1', approved: false, remember: false, reason: 'not that file' },
    ]);
  });

  it('Deny without a reason sends null', async () => {
    const { fake, dialog } = await withApproval();
    await inAct(() => $(dialog, 'approval-deny')!.click());
    expect(fake.callsOf('decide_approval')[0]).toMatchObject({ approved: false, reason: null });
  });

  it('Enter does not approve', async () => {
    const { fake, root } = await withApproval();
    // Focus is never on a button of the dialog (the composer keeps it while the person types).
    expect(document.activeElement?.tagName).not.toBe('BUTTON');
    (document.activeElement as HTMLElement | null)?.blur();
    await inAct(() => fake.emit(P, writeRequest({ approval_id: 'approval-0' })));
    await inAct(() => fake.emit(P, { type: 'approval_resolved', session_id: CHILD, approval_id: 'approval-1', approved: false }));
    const next = $(root, 'approval-dialog')!;
    expect(document.activeElement).toBe(next);
    await inAct(() => key(next, 'Enter'));
    const onApprove = key($(next, 'approval-approve')!, 'Enter');
    expect(onApprove.defaultPrevented).toBe(true);
    const onAlways = key($(next, 'approval-always')!, 'Enter');
    expect(onAlways.defaultPrevented).toBe(true);
    // Enter in the (empty) composer neither approves nor sends.
    await inAct(() => key($(root, 'prompt-input')!, 'Enter'));
    expect(fake.callsOf('decide_approval')).toEqual([]);
    expect(fake.callsOf('submit')).toEqual([]);
    expect($(root, 'approval-dialog')).not.toBeNull();
    // Enter in the reason field denies (never approves).
    await inAct(() => key($(next, 'approval-reason')!, 'Enter'));
    expect(fake.callsOf('decide_approval')).toEqual([
      { session_id: CHILD, approval_id: 'approval-0', approved: false, remember: false, reason: null },
    ]);
  });

  it('goes away when the approval is resolved elsewhere, and shows the next one', async () => {
    const { fake, root } = await withApproval();
    await inAct(() => fake.emit(P, writeRequest({ approval_id: 'approval-2', title: 'Review db' })));
    expect($(root, 'approval-dialog')!.textContent).toContain('1 of 2');
    await inAct(() => fake.emit(P, { type: 'approval_resolved', session_id: CHILD, approval_id: 'approval-1', approved: false }));
    expect($(root, 'approval-dialog')!.dataset.approvalId).toBe('approval-2');
    expect($(root, 'approval-dialog')!.textContent).toContain('Review db');
  });

  it('shows a failed decision with Retry', async () => {
    const { fake, dialog } = await withApproval();
    fake.handlers.decide_approval = () => {
      throw { error: { code: 'storage', message: 'disk full' } };
    };
    await inAct(() => $(dialog, 'approval-approve')!.click());
    expect(dialog.textContent).toContain('disk full');
    fake.handlers.decide_approval = () => ({});
    await inAct(() => $(dialog, 'retry')!.click());
    expect(fake.callsOf('decide_approval').map((a) => a.approved)).toEqual([true, true]);
  });

  it('comes from the snapshot for a late joiner', async () => {
    const fake = workspacePlatform([info(P)]);
    const mounted = await mountApp(fake, P);
    unmount = mounted.unmount;
    const { type: _t, ...approval } = writeRequest();
    await inAct(() => fake.emit(P, snapshot(P, { running: true, approvals: [approval as any] })));
    expect($$(mounted.root, 'approval-dialog').length).toBe(1);
  });
});
