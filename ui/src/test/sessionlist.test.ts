import { describe, expect, it } from 'vitest';
import { applyListEvent } from '../sessionlist';
import type { SessionInfo } from '../bindings/SessionInfo';

const info = (id: string, title = id): SessionInfo =>
  ({ session_id: id, title, workspace: '/w', state: 'idle' }) as unknown as SessionInfo;

describe('the session list kept from its feed', () => {
  it('takes the whole list, replaces a changed entry in place and keeps creation order for a new one', () => {
    let list = applyListEvent([info('x')], { type: 'listed', sessions: [info('a'), info('c')] });
    expect(list.map((s) => s.session_id)).toEqual(['a', 'c']);
    list = applyListEvent(list, { type: 'changed', session: info('c', 'renamed') });
    expect(list.map((s) => s.title)).toEqual(['a', 'renamed']);
    list = applyListEvent(list, { type: 'changed', session: info('b') });
    list = applyListEvent(list, { type: 'changed', session: info('d') });
    expect(list.map((s) => s.session_id)).toEqual(['a', 'b', 'c', 'd']);
  });

  it('drops a removed session and leaves the list untouched for an unknown one', () => {
    const list = [info('a'), info('b')];
    expect(applyListEvent(list, { type: 'removed', session_id: 'a' }).map((s) => s.session_id)).toEqual(['b']);
    expect(applyListEvent(list, { type: 'removed', session_id: 'zz' })).toBe(list);
  });
});
