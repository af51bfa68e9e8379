import { describe, expect, it } from 'vitest';
import { acknowledge, emptyRoot, reduceRoot, rootsToWatch, summarize, windowTitle, type RootAttention } from '../model';
import { countStates, liveStates } from '../status';
import { info, kind, snapshot } from './fake';

const approval = (id: string, session: string, extra = {}) => ({
  type: 'approval_request',
  approval_id: id,
  session_id: session,
  tool: 'write_file',
  arguments: { path: 'a.txt' },
  rememberable: true,
  ...extra,
});

function fold(root: RootAttention, ...events: unknown[]) {
  const alerts = [];
  for (const e of events) {
    const r = reduceRoot(root, e as any, { p: 'Refactor' });
    root = r.root;
    alerts.push(...r.alerts);
  }
  return { root, alerts };
}

describe('attention across sessions (pure)', () => {
  it('counts a child approval on the child and its root, and says who asks', () => {
    const { root, alerts } = fold(
      emptyRoot('p'),
      snapshot('p', { running: true, subagents: [{ task_id: 't', session_id: 'c', parent_session_id: 'p', title: 'Editor', state: 'running' }] }),
      approval('a1', 'c', { title: 'Editor' }),
    );
    expect(alerts).toEqual([{ kind: 'approval', rootId: 'p', sessionId: 'c', text: 'Sub-agent “Editor” asks to run write_file in “Refactor”' }]);
    const s = summarize([root]);
    expect(s.count).toBe(1);
    expect(s.sessions.c).toEqual({ approvals: 1, failed: false, reports: 0 });
    expect(s.sessions.p.approvals).toBe(1);
    // What runs is the live states' count (status.ts), the one rule.
    expect(countStates(liveStates([], [root])).running).toBe(2);
    // Resolved: nothing needs the person any more.
    const after = fold(root, { type: 'approval_resolved', session_id: 'c', approval_id: 'a1', approved: true }).root;
    expect(summarize([after]).count).toBe(0);
  });

  it('a failed child needs the person until they look at it; the last report is announced', () => {
    let { root, alerts } = fold(
      emptyRoot('p'),
      snapshot('p', {
        subagents: [
          { task_id: 't1', session_id: 'c1', parent_session_id: 'p', title: 'Alpha', state: 'running' },
          { task_id: 't2', session_id: 'c2', parent_session_id: 'p', title: 'Beta', state: 'running' },
        ],
      }),
      kind('c1', 'subagent.state', { task_id: 't1', state: 'failed' }),
    );
    expect(alerts.map((a) => a.kind)).toEqual(['failed']);
    expect(summarize([root]).failed).toEqual([{ rootId: 'p', sessionId: 'c1' }]);
    ({ root, alerts } = fold(root, kind('c2', 'subagent.state', { task_id: 't2', state: 'done' })));
    expect(alerts).toEqual([{ kind: 'reports', rootId: 'p', sessionId: 'p', text: 'Every sub-agent of “Refactor” has reported' }]);
    root = acknowledge(root, 'c1');
    expect(summarize([root]).count).toBe(0);
  });

  it('reports queued in a paused tray count once per root, and leave when resumed', () => {
    let { root } = fold(
      emptyRoot('p'),
      { type: 'message_status', session_id: 'p', message_id: 'subagent:t1', status: 'queued' },
      { type: 'message_status', session_id: 'p', message_id: 'subagent:t2', status: 'queued' },
      { type: 'message_status', session_id: 'p', message_id: 'm-own', status: 'queued' },
    );
    expect(summarize([root]).trays).toEqual([{ rootId: 'p', count: 2 }]);
    expect(summarize([root]).count).toBe(1);
    ({ root } = fold(root, { type: 'message_status', session_id: 'p', message_id: 'subagent:t1', status: 'started' }));
    expect(root.waitingReports).toEqual(['subagent:t2']);
    expect(root.running).toBe(true);
  });

  it('titles the window with the count', () => {
    expect(windowTitle(0)).toBe('Bumblehive');
    expect(windowTitle(1)).toBe('Bumblehive — 1 needs you');
    expect(windowTitle(2)).toBe('Bumblehive — 2 need you');
  });

  it('watches live trees other than the selected one, newest first, within the limit', () => {
    const sessions = [
      info('idle', { updated_at: '2025-01-05T00:00:00Z' }),
      info('r1', { updated_at: '2025-01-01T00:00:00Z' }),
      info('c1', { parent_session_id: 'r1', state: 'running', updated_at: '2025-01-03T00:00:00Z' }),
      info('r2', { state: 'paused', updated_at: '2025-01-02T00:00:00Z' }),
      info('r3', { state: 'running', updated_at: '2025-01-04T00:00:00Z' }),
    ];
    expect(rootsToWatch(sessions, null, 10)).toEqual(['r3', 'r1', 'r2']);
    expect(rootsToWatch(sessions, 'r3', 10)).toEqual(['r1', 'r2']);
    expect(rootsToWatch(sessions, null, 2)).toEqual(['r3', 'r1']);
  });
});

describe('a report without its state event', () => {
  it('still marks the child finished in the tree and in the tab', async () => {
    const { root, alerts } = fold(
      emptyRoot('p'),
      snapshot('p', { subagents: [{ task_id: 't1', session_id: 'c1', parent_session_id: 'p', title: 'Alpha', state: 'running' }] }),
      { type: 'message_status', session_id: 'p', message_id: 'subagent:t1', status: 'steered' },
    );
    expect(root.children.c1.state).toBe('done');
    expect(countStates(liveStates([], [root])).running).toBe(0);
    expect(alerts.map((a) => a.kind)).toEqual(['reports']);
  });
});
