import type { ComponentChildren } from 'preact';
import { useLayoutEffect, useRef } from 'preact/hooks';
import type { Message } from '../bindings/Message';
import type { MessageStatus } from '../bindings/MessageStatus';
import { reportBody, reportTaskId, type ChildTab, type Inflight, type Note, type Transcript } from '../model';
import { Markdown } from './Markdown';
import { ToolCard } from './ToolCard';

export function StatusChip({ status }: { status: MessageStatus | 'sending' | undefined }) {
  if (!status) return null;
  return (
    <span class={`chip chip-${status}`} data-testid="message-status" data-status={status}>
      {status}
    </span>
  );
}

function ReportCard(props: {
  messageId: string;
  text: string | null;
  status?: MessageStatus;
  tabs: ChildTab[];
  onOpenChild?: (sessionId: string) => void;
  inflight?: boolean;
}) {
  const taskId = reportTaskId(props.messageId);
  const child = props.tabs.find((c) => c.taskId === taskId);
  const body = props.text == null ? null : reportBody(props.text);
  const failed = body?.startsWith('Error:\n') ?? false;
  return (
    <div
      class={`message report ${failed ? 'report-failed' : ''} ${props.inflight ? 'inflight' : ''}`}
      data-testid="chat-message"
      data-role="report"
      data-message-id={props.messageId}
    >
      <div class="message-head">
        <span class="who">{failed ? 'Failed report' : 'Report'} from “{child?.title ?? taskId}”</span>
        <StatusChip status={props.status} />
        {child && props.onOpenChild && (
          <button type="button" class="link" onClick={() => props.onOpenChild?.(child.sessionId)}>
            Open tab
          </button>
        )}
      </div>
      {body != null ? <Markdown text={body} /> : <div class="muted">The report will show when the agent reads it.</div>}
    </div>
  );
}

function NoteView({ note }: { note: Note }) {
  return (
    <div class={`note note-${note.kind}`} data-testid={note.kind === 'error' ? 'run-error' : 'run-stopped'} role={note.kind === 'error' ? 'alert' : undefined}>
      {note.kind === 'error' ? (
        <>
          <strong>The run failed:</strong> {note.text}
          <div class="muted">The session is paused. Send a message (or resume a waiting report) to go on.</div>
        </>
      ) : (
        <>Stopped. Anything that arrives now waits until you resume.</>
      )}
    </div>
  );
}

/** The transcript of one session: messages, tool cards, reports, live text and what is in flight. */
export function Chat(props: {
  transcript: Transcript;
  statuses?: Record<string, MessageStatus>;
  inflight?: Inflight[];
  tabs: ChildTab[];
  onOpenChild?: (sessionId: string) => void;
  footer?: ComponentChildren;
  empty?: ComponentChildren;
}) {
  const { transcript: t, statuses = {} } = props;
  const scroller = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  useLayoutEffect(() => {
    const el = scroller.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  });
  const onScroll = () => {
    const el = scroller.current;
    if (el) stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 48;
  };

  // Tool results by call id, so each card shows its own.
  const results = new Map<string, { text: string; isError: boolean }>();
  for (const m of t.messages) {
    if (m.role === 'tool' && m.tool_call_id) {
      const text = m.content ?? '';
      results.set(m.tool_call_id, { text, isError: t.tools[m.tool_call_id]?.isError ?? text.startsWith('Error:') });
    }
  }
  const calls = new Set(t.messages.flatMap((m) => (m.tool_calls ?? []).map((c) => c.id)));

  const items: ComponentChildren[] = [];
  const notesAt = (i: number) => t.notes.filter((n) => n.at === i).forEach((n, k) => items.push(<NoteView key={`n${i}-${k}`} note={n} />));
  t.messages.forEach((m: Message, i) => {
    notesAt(i);
    const key = `m${i}`;
    if (m.role === 'system') return;
    if (m.role === 'user') {
      if (reportTaskId(m.id)) {
        items.push(
          <ReportCard key={key} messageId={m.id!} text={m.content} status={statuses[m.id!]} tabs={props.tabs} onOpenChild={props.onOpenChild} />,
        );
      } else {
        items.push(
          <div key={key} class="message user" data-testid="chat-message" data-role="user" data-message-id={m.id ?? undefined}>
            <div class="message-head">
              <span class="who">You</span>
              <StatusChip status={m.id ? statuses[m.id] : undefined} />
            </div>
            <div class="plain">{m.content}</div>
          </div>,
        );
      }
      return;
    }
    if (m.role === 'assistant') {
      items.push(
        <div key={key} class="message assistant" data-testid="chat-message" data-role="assistant">
          {m.content ? <Markdown text={m.content} /> : null}
          {(m.tool_calls ?? []).map((call) => (
            <ToolCard
              key={call.id}
              call={call}
              live={t.tools[call.id]}
              result={results.get(call.id)}
              child={call.name === 'sub_agent' ? props.tabs.find((c) => c.taskId === call.id) : undefined}
              onOpenChild={props.onOpenChild}
            />
          ))}
        </div>,
      );
      return;
    }
    // A tool result without its call in view (should not happen): show it plainly.
    if (m.role === 'tool' && !(m.tool_call_id && calls.has(m.tool_call_id))) {
      items.push(
        <div key={key} class="message tool" data-testid="chat-message" data-role="tool">
          <pre>{m.content}</pre>
        </div>,
      );
    }
  });
  notesAt(t.messages.length);
  // Notes recorded past the end (history re-read shorter than before) still show.
  t.notes.filter((n) => n.at > t.messages.length).forEach((n, k) => items.push(<NoteView key={`x${k}`} note={n} />));

  if (t.streaming) {
    items.push(
      <div key="streaming" class="message assistant streaming" data-testid="chat-message" data-role="assistant" data-streaming="true">
        <Markdown text={t.streaming} />
      </div>,
    );
  }
  for (const m of props.inflight ?? []) {
    if (reportTaskId(m.messageId)) {
      items.push(
        <ReportCard key={`i${m.messageId}`} messageId={m.messageId} text={m.content} status={m.status} tabs={props.tabs} onOpenChild={props.onOpenChild} inflight />,
      );
    } else {
      items.push(
        <div key={`i${m.messageId}`} class="message user inflight" data-testid="chat-message" data-role="user" data-message-id={m.messageId}>
          <div class="message-head">
            <span class="who">You</span>
            <StatusChip status={m.status} />
          </div>
          <div class="plain">{m.content ?? ''}</div>
        </div>,
      );
    }
  }

  return (
    <div class="chat" ref={scroller} onScroll={onScroll} data-testid="chat" data-session-id={t.sessionId}>
      {t.notice && <div class="note note-notice">{t.notice}</div>}
      {items.length === 0 && t.status !== 'loading' ? props.empty : null}
      {items}
      {props.footer}
    </div>
  );
}
