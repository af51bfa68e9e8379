// A recorded delegation: the person asks for two reviews, the parent delegates to two
// sub-agents, one finishes and reports (its events arrive on the parent's stream tagged
// with its own session id), the other waits for a slot.

import { appended, kind, snapshot, usage } from './fake';

export const P = 'sess-parent';
export const C1 = 'sess-auth';
export const C2 = 'sess-db';

export const REPORT_1 = '[Background tool result]\nTask ID: call-1\n\nAuth looks **fine**.';

export const recorded: unknown[] = [
  snapshot(P),
  { type: 'message_status', session_id: P, message_id: 'msg-1', status: 'started' },
  appended(P, { role: 'user', content: 'Review the auth and db modules in parallel', id: 'msg-1' }),
  kind(P, 'content.delta', { text: 'Let me ' }),
  kind(P, 'content.delta', { text: 'delegate.' }),
  appended(P, {
    role: 'assistant',
    content: 'Let me delegate.',
    tool_calls: [
      { id: 'call-1', name: 'sub_agent', arguments: { title: 'Review auth', task: 'Review src/auth' } },
      { id: 'call-2', name: 'sub_agent', arguments: { title: 'Review db', task: 'Review src/db' } },
    ],
    usage: usage(10, 5),
  }),
  kind(P, 'tool.call.started', { call_id: 'call-1', name: 'sub_agent', arguments: { title: 'Review auth' } }),
  kind(P, 'tool.call.started', { call_id: 'call-2', name: 'sub_agent', arguments: { title: 'Review db' } }),
  { type: 'session_created', session_id: C1, parent_session_id: P, task_id: 'call-1', title: 'Review auth' },
  kind(C1, 'subagent.state', { task_id: 'call-1', state: 'waiting_for_slot' }),
  kind(P, 'tool.call.finished', { call_id: 'call-1', name: 'sub_agent', result: '{"status":"pending","task_id":"call-1"}', is_error: false }),
  { type: 'session_created', session_id: C2, parent_session_id: P, task_id: 'call-2', title: 'Review db' },
  kind(C2, 'subagent.state', { task_id: 'call-2', state: 'waiting_for_slot' }),
  kind(P, 'tool.call.finished', { call_id: 'call-2', name: 'sub_agent', result: '{"status":"pending","task_id":"call-2"}', is_error: false }),
  appended(P, { role: 'tool', content: '{"status":"pending","task_id":"call-1"}', tool_call_id: 'call-1' }),
  appended(P, { role: 'tool', content: '{"status":"pending","task_id":"call-2"}', tool_call_id: 'call-2' }),
  kind(C1, 'subagent.state', { task_id: 'call-1', state: 'running' }),
  { type: 'message_status', session_id: C1, message_id: 'msg-c1', status: 'started' },
  appended(C1, { role: 'user', content: 'You are the sub-agent "Review auth".\nTask:\nReview src/auth', id: 'msg-c1' }),
  kind(C1, 'content.delta', { text: 'Auth looks' }),
  kind(C1, 'content.delta', { text: ' **fine**.' }),
  appended(C1, { role: 'assistant', content: 'Auth looks **fine**.', usage: usage(7, 3) }),
  { type: 'result', session_id: C1, content: 'Auth looks **fine**.' },
  kind(C1, 'subagent.state', { task_id: 'call-1', state: 'done' }),
  kind(P, 'content.delta', { text: 'I started two reviews.' }),
  appended(P, { role: 'assistant', content: 'I started two reviews.', usage: usage(20, 4) }),
  { type: 'message_status', session_id: P, message_id: 'subagent:call-1', status: 'steered' },
  appended(P, { role: 'user', content: REPORT_1, id: 'subagent:call-1' }),
  kind(P, 'content.delta', { text: 'The auth review' }),
];
