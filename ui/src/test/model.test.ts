import { describe, expect, it } from 'vitest';
import { SessionModel, reportBody, reportTaskId } from '../model';
import { appended, FakePlatform, info, snapshot } from './fake';

function deferred<T>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

describe('SessionModel', () => {
  it('merges events that arrive while get_session is in flight, without duplicates', async () => {
    const read = deferred<unknown>();
    const fake = new FakePlatform({ get_session: () => read.promise });
    const model = new SessionModel(fake, 'p', { notifyDelay: 0 });
    model.start();
    const a = { role: 'user', content: 'a', id: 'm-a' };
    const b = { role: 'assistant', content: 'b' };
    const c = { role: 'user', content: 'c', id: 'm-c' };
    fake.emit('p', snapshot('p', { running: true }), appended('p', b), appended('p', c));
    read.resolve({ info: info('p'), messages: [a, b] });
    await new Promise((r) => setTimeout(r, 0));
    expect(model.state.transcripts.p.messages).toEqual([a, b, c]);
    expect(model.state.transcripts.p.status).toBe('loaded');
    model.dispose();
  });

  it('skips echoes of what the load read when they arrive after it', async () => {
    const a = { role: 'user', content: 'a', id: 'm-a' };
    const b = { role: 'assistant', content: 'b' };
    const fake = new FakePlatform({ get_session: () => ({ info: info('p'), messages: [a, b] }) });
    const model = new SessionModel(fake, 'p', { notifyDelay: 0 });
    model.start();
    await new Promise((r) => setTimeout(r, 0));
    fake.emit('p', appended('p', b), appended('p', { role: 'user', content: 'n', id: 'm-n' }), appended('p', b));
    expect(model.state.transcripts.p.messages.map((m) => m.content)).toEqual(['a', 'b', 'n', 'b']);
  });

  it('tracks queued, steered and started messages and the pending queue', async () => {
    const fake = new FakePlatform({
      get_session: () => ({ info: info('p'), messages: [] }),
      snapshot: () => ({ ...(snapshot('p') as any), pending: [{ message_id: 'subagent:t1', content: 'report text', status: 'queued', config: { runtime: {} } }] }),
    });
    const model = new SessionModel(fake, 'p', { notifyDelay: 0 });
    model.start();
    fake.emit('p', snapshot('p', { paused: true }));
    fake.emit('p', { type: 'message_status', session_id: 'p', message_id: 'subagent:t1', status: 'queued' });
    expect(model.state.pending.map((p) => p.message_id)).toEqual(['subagent:t1']);
    // The event carries no text: the snapshot is read for it.
    await new Promise((r) => setTimeout(r, 0));
    expect(fake.callsOf('snapshot')).toEqual([{ session_id: 'p' }]);
    expect(model.state.pending[0].content).toBe('report text');
    fake.emit('p', { type: 'message_status', session_id: 'p', message_id: 'subagent:t1', status: 'steered' });
    expect(model.state.pending).toEqual([]);
    expect(model.state.inflight).toEqual([{ messageId: 'subagent:t1', content: 'report text', status: 'steered' }]);
    fake.emit('p', appended('p', { role: 'user', content: 'report text', id: 'subagent:t1' }));
    expect(model.state.inflight).toEqual([]);
    expect(model.state.statuses['subagent:t1']).toBe('steered');
  });

  it('reads report ids and bodies', () => {
    expect(reportTaskId('subagent:call-7')).toBe('call-7');
    expect(reportTaskId('msg-1')).toBeNull();
    // A follow-up's report (subagent:<task_id>:<n>) belongs to the same child.
    expect(reportTaskId('subagent:call-7:2')).toBe('call-7');
    expect(reportBody('[Background tool result]\nTask ID: x\n\nError:\nboom')).toBe('Error:\nboom');
  });
});
