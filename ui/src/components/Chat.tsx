import type { ComponentChildren } from 'preact';
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from 'preact/hooks';
import { streamingBlocks } from '../markdown';
import { imageSrc } from '../attachments';
import type { ImagePart } from '../bindings/ImagePart';
import type { Compaction } from '../bindings/Compaction';
import type { Message } from '../bindings/Message';
import type { MessageStatus } from '../bindings/MessageStatus';
import { isNote, noteText, reportBody, reportTaskId, type ChildTab, type Inflight, type Note, type Transcript } from '../model';
import { Markdown } from './Markdown';
import { ToolCard } from './ToolCard';
import { CopyButton } from './CopyButton';
import { Icon } from './Icon';
import { formatTokens } from '../util';
import type { LiveState } from '../status';
import { splitMentions, typedText } from '../mentions';

/**
 * The person's message: the text as typed, and a chip per file its @-mentions carried to the
 * model (a click shows the file as sent); the files are not pasted into the bubble (E12).
 */
function UserText(props: { content: string | null | undefined }) {
  if (!props.content) return null;
  const { text, files } = splitMentions(props.content);
  return (
    <>
      {text ? <div class="plain">{text}</div> : null}
      {files.length > 0 && (
        <div class="mention-chips" data-testid="mention-chips">
          {files.map((f) => (
            <details key={f.path} class="mention-chip" data-testid="mention-chip" data-path={f.path}>
              <summary title="Sent to the model with this message; click to see it">@{f.path}</summary>
              <pre class="plain mention-body">{f.body}</pre>
            </details>
          ))}
        </div>
      )}
    </>
  );
}

/** Where each session's chat was scrolled, so switching sessions keeps each one's place. */
const positions = new Map<string, { top: number; stick: boolean; start?: number | null }>();

/**
 * A long history opens with only its last CHAT_WINDOW messages rendered; scrolling near the
 * top (or the "earlier messages" button) adds CHAT_STEP more above, keeping the place.
 * Opening a 2,000-message session then builds a few hundred nodes, not thousands (#19).
 * Only the history's tail is loaded (`Transcript.first`); rows above it are read with
 * `onLoadEarlier` when the rendered slice reaches them. Row indexes are history indexes.
 */
export const CHAT_WINDOW = 24;
export const CHAT_STEP = 100;
/** Forgets remembered scroll positions (tests start fresh). */
export const forgetScrollPositions = () => positions.clear();

const NO_STATUSES: Record<string, MessageStatus> = {};

/** Network-ish failures of the model server: the person's way forward is the settings. */
const PROVIDER_ERROR = /network error|cannot connect|connection refused|model server|provider|api key|unauthori[sz]ed|status 40[13]/i;


/** The images of a person's message: thumbnails; a click shows one larger (Esc or a click closes it). */
function MessageImages({ images }: { images: ImagePart[] | undefined }) {
  const [open, setOpen] = useState<string | null>(null);
  const shown = (images ?? []).map(imageSrc).filter((src): src is string => !!src);
  useEffect(() => {
    if (!open) return;
    const onKey = (e: KeyboardEvent) => {
      if (e.key !== 'Escape') return;
      // Esc closes the image, it does not stop the run.
      e.preventDefault();
      e.stopPropagation();
      setOpen(null);
    };
    window.addEventListener('keydown', onKey, true);
    return () => window.removeEventListener('keydown', onKey, true);
  }, [open]);
  if (!shown.length) return null;
  return (
    <div class="message-images" data-testid="message-images">
      {shown.map((src, i) => (
        <button key={i} type="button" class="message-image" data-testid="message-image" title="View larger" aria-label={`Image ${i + 1}: view larger`} onClick={() => setOpen(src)}>
          <img src={src} alt={`Image ${i + 1}`} />
        </button>
      ))}
      {open && (
        <div class="overlay image-viewer" data-testid="image-viewer" role="dialog" aria-label="Image" onClick={() => setOpen(null)}>
          <img src={open} alt="Image, larger" />
        </div>
      )}
    </div>
  );
}

/** The answer as it streams: its finished blocks parsed once each, the last one per frame. */
function StreamingMarkdown({ text }: { text: string }) {
  return (
    <>
      {streamingBlocks(text).map((block, i) => (
        <Markdown key={i} text={block} />
      ))}
    </>
  );
}

/**
 * What a message's status means to the person, in words (the runtime's names are jargon,
 * D19). No tooltip: the chip goes away as the run moves on, possibly under the pointer.
 */
export const STATUS_WORDS: Record<MessageStatus | 'sending', string> = {
  sending: 'sending…',
  queued: 'waiting until the agent is free',
  steered: 'read at its next step',
  started: 'working on it',
};

export function StatusChip({ status }: { status: MessageStatus | 'sending' | undefined }) {
  if (!status) return null;
  return (
    <span class={`chip chip-${status}`} data-testid="message-status" data-status={status}>
      {STATUS_WORDS[status] ?? status}
    </span>
  );
}

function ReportCard(props: {
  messageId: string;
  /** Titles of delegated tasks by task id (from the `sub_agent` calls), for deleted children. */
  titles?: Map<string, string>;
  text: string | null;
  status?: MessageStatus;
  tabs: ChildTab[];
  onOpenChild?: (sessionId: string) => void;
  inflight?: boolean;
  summarised?: boolean;
}) {
  const taskId = reportTaskId(props.messageId);
  const child = props.tabs.find((c) => c.taskId === taskId);
  const body = props.text == null ? null : reportBody(props.text);
  const failed = body?.startsWith('Error:\n') ?? false;
  return (
    <div
      class={`message report ${failed ? 'report-failed' : ''} ${props.inflight ? 'inflight' : ''} ${props.summarised ? 'summarised' : ''}`}
      data-testid="chat-message"
      data-summarised={props.summarised ? 'true' : undefined}
      data-role="report"
      data-message-id={props.messageId}
    >
      <div class="message-head">
        <span class="who">
          {failed ? 'Failed report' : 'Report'} from {child || props.titles?.get(taskId ?? '') ? `“${child?.title ?? props.titles?.get(taskId ?? '')}”` : 'a deleted sub-agent'}
        </span>
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

const COMPACTION_LABEL: Record<Compaction['kind'], string> = {
  summary: 'Earlier conversation summarised',
  elided: 'Earlier tool output elided',
  dropped: 'Earliest turns dropped to fit the window',
};

/**
 * Where a compaction cut the history: what the model sees from here on is the summary (or
 * the note), then the messages below. The messages above stay, marked as summarised.
 */
export function CompactionDivider({ compaction: c }: { compaction: Compaction }) {
  const [open, setOpen] = useState(false);
  const before = Number(c.tokens_before);
  const after = Number(c.tokens_after);
  const elided = c.elided?.length ?? 0;
  return (
    <div class={`compaction compaction-${c.kind}`} data-testid="compaction-divider" data-kind={c.kind} data-compaction-id={c.id} data-first-kept={c.first_kept}>
      <button
        type="button"
        class="compaction-head"
        data-testid="compaction-toggle"
        aria-expanded={open}
        title={`About ${before} tokens before, ${after} after`}
        onClick={() => setOpen(!open)}
      >
        <span class="compaction-label">{COMPACTION_LABEL[c.kind] ?? 'Earlier conversation compacted'}</span>
        <span class="muted" data-testid="compaction-tokens">
          {formatTokens(before)} → {formatTokens(after)} tokens
        </span>
        <span class="muted">{open ? 'Hide' : c.summary ? 'Show summary' : 'Details'}</span>
      </button>
      {open && (
        <div class="compaction-body" data-testid="compaction-body">
          {c.summary ? <Markdown text={c.summary} /> : null}
          {c.note ? <div class="compaction-note">{c.note}</div> : null}
          {!c.summary && !c.note && c.kind !== 'elided' ? <div class="muted">No summary was made.</div> : null}
          {elided > 0 && (
            <div class="muted">
              {elided} tool result{elided === 1 ? '' : 's'} below reach the model as a short stub.
            </div>
          )}
          <div class="muted">The messages above stay here for you; the model sees {c.summary ? 'this summary' : 'only what follows'} instead.</div>
        </div>
      )}
    </div>
  );
}

function NoteView(props: { note: Note; canSend: boolean; onRetry?: () => Promise<void> | void; onOpenSettings?: () => void }) {
  const { note } = props;
  const [error, setError] = useState<string | null>(null);
  const provider = note.kind === 'error' && PROVIDER_ERROR.test(note.text);
  if (note.kind === 'notice') {
    return (
      <div class="note note-notice" data-testid="run-notice" role="status">
        {note.text}
        {note.action === 'open-settings' && props.onOpenSettings && (
          <div class="note-actions">
            <button type="button" data-testid="notice-open-settings" onClick={props.onOpenSettings}>
              Open settings
            </button>
          </div>
        )}
      </div>
    );
  }
  return (
    <div class={`note note-${note.kind}`} data-testid={note.kind === 'error' ? 'run-error' : 'run-stopped'} role={note.kind === 'error' ? 'alert' : undefined}>
      {note.kind === 'error' ? (
        <>
          <strong>The run failed:</strong> {note.text}
          {props.canSend ? (
            <div class="muted">The session is paused. Send a message (or resume a waiting report) to go on.</div>
          ) : (
            <div class="muted">This sub-agent stopped here; its parent got the error as its report.</div>
          )}
          {props.canSend && (provider || props.onRetry) && (
            <div class="note-actions">
              {provider && props.onOpenSettings && (
                <button type="button" data-testid="error-open-settings" onClick={props.onOpenSettings}>
                  Open settings
                </button>
              )}
              {props.onRetry && (
                <button
                  type="button"
                  data-testid="error-retry"
                  title="Send your last message again"
                  onClick={() => {
                    setError(null);
                    Promise.resolve(props.onRetry?.()).catch((err) => setError(String(err?.message ?? err)));
                  }}
                >
                  Retry
                </button>
              )}
            </div>
          )}
          {error && <div class="muted">{error}</div>}
        </>
      ) : (
        <>
          {note.partial && (
            <div class="message assistant stopped" data-testid="stopped-partial" data-role="assistant">
              <Markdown text={note.partial} />
            </div>
          )}
          <div>{note.partial ? 'Stopped here. ' : 'Stopped. '}Anything that arrives now waits until you resume.</div>
        </>
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
  /** Whether this chat has a composer (child tabs have none). */
  canSend?: boolean;
  /** Sends the person's last message again (after a failed run), with its images. */
  onRetry?: (text: string, images: ImagePart[]) => Promise<void>;
  onOpenSettings?: () => void;
  /** Puts the person's last message (text and images) into the composer to edit and send as a new one. */
  onEdit?: (text: string, images: ImagePart[]) => void;
  /** Forks the conversation before the person's message at this history index. */
  onFork?: (messageIndex: number) => void;
  /** Reads the page of history before the loaded part (`Transcript.first`). */
  onLoadEarlier?: () => Promise<void>;
  /** Task ids of sub-agents the person deleted (their cards say "deleted"). */
  deleted?: string[];
  /** The children's live states by session id (status.ts): their `sub_agent` cards say it. */
  childStates?: Record<string, LiveState>;
  /** Who wrote a user message (a child's tab: its parent's task, the parent, or the person). */
  senderOf?: (message: Message, index: number) => string;
}) {
  const { transcript: t } = props;
  const statuses = props.statuses ?? NO_STATUSES;
  const canSend = props.canSend ?? true;
  const scroller = useRef<HTMLDivElement>(null);
  // The latest callbacks, read when clicked: the memoised rows below need no new closures.
  const handlers = useRef(props);
  handlers.current = props;
  // Each session keeps its own place; a new one follows the end (the component is keyed by
  // session, so nothing carries over from the previous one).
  const saved = positions.get(t.sessionId);
  const stick = useRef(saved?.stick ?? true);
  const restored = useRef(false);
  const [behind, setBehind] = useState(!(saved?.stick ?? true));
  // The first rendered message (a history index): fixed once the history is loaded (what
  // arrives later is appended below it), moved up by `showEarlier`. Rows are only drawn
  // from what is loaded: above `t.first` they wait for the earlier page.
  const start = useRef<number | null>(saved?.start ?? null);
  const end = t.first + t.messages.length;
  if (start.current === null && t.status === 'loaded') start.current = Math.max(t.first, end - CHAT_WINDOW);
  const from = Math.max(t.first, Math.min(start.current ?? t.first, end));
  // Set by `showEarlier`: the distance from the bottom to keep while rows are added above
  // (kept while the earlier page is being read, with the `from` it was set at).
  const anchor = useRef<number | null>(null);
  const anchorFrom = useRef(0);
  const reading = useRef(false);
  const [earlierError, setEarlierError] = useState<string | null>(null);
  const [, grew] = useState(0);
  /** Reads the page before the loaded part when the rendered slice reaches above it. */
  const readEarlier = () => {
    const load = handlers.current.onLoadEarlier;
    if (start.current === null || start.current >= t.first || !load || reading.current) return;
    reading.current = true;
    setEarlierError(null);
    load()
      .catch((err) => setEarlierError(`Cannot read earlier messages: ${String(err?.message ?? err)}`))
      .finally(() => {
        reading.current = false;
        grew((n) => n + 1);
      });
  };
  const showEarlier = () => {
    const el = scroller.current;
    if (from <= 0) return;
    if (el) anchor.current = el.scrollHeight - el.scrollTop;
    anchorFrom.current = from;
    start.current = Math.max(0, from - CHAT_STEP);
    readEarlier();
    grew((n) => n + 1);
  };
  // Back in a session scrolled far up (its place is remembered, its history read again by
  // the tail): read pages until the remembered slice is loaded, then restore the place.
  useEffect(() => {
    if (t.status === 'loaded' && !earlierError) readEarlier();
  }, [t.status, t.first, earlierError]);
  useLayoutEffect(() => {
    const el = scroller.current;
    if (!el) return;
    if (anchor.current !== null) {
      // The rows come with the page: keep the place until they are drawn.
      if (from === anchorFrom.current && reading.current) return;
      el.scrollTop = el.scrollHeight - anchor.current;
      anchor.current = null;
      return;
    }
    if (!restored.current && saved && !saved.stick && t.status === 'loaded' && (saved.start ?? t.first) >= t.first) {
      restored.current = true;
      el.scrollTop = saved.top;
      return;
    }
    if (stick.current) el.scrollTop = el.scrollHeight;
  });
  useLayoutEffect(
    () => () => {
      const el = scroller.current;
      if (el) positions.set(t.sessionId, { top: el.scrollTop, stick: stick.current, start: start.current });
    },
    [],
  );
  const onScroll = () => {
    const el = scroller.current;
    if (!el) return;
    stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 48;
    positions.set(t.sessionId, { top: el.scrollTop, stick: stick.current, start: start.current });
    if (behind === stick.current) setBehind(!stick.current);
    // Near the top with more above: render the next slice before the person gets there.
    if (el.scrollTop < 400 && from > 0 && anchor.current === null && !earlierError) showEarlier();
  };
  const jump = () => {
    const el = scroller.current;
    stick.current = true;
    setBehind(false);
    if (el) el.scrollTop = el.scrollHeight;
  };
  const items = useMemo(() => {
  const cur = handlers.current;
  const live = handlers;
  const props = {
    ...cur,
    onRetry: cur.onRetry && ((text: string, images: ImagePart[]) => live.current.onRetry?.(text, images) ?? Promise.resolve()),
    onOpenSettings: cur.onOpenSettings && (() => live.current.onOpenSettings?.()),
    onEdit: cur.onEdit && ((text: string, images: ImagePart[]) => live.current.onEdit?.(text, images)),
    onFork: cur.onFork && ((index: number) => live.current.onFork?.(index)),
    onOpenChild: cur.onOpenChild && ((id: string) => live.current.onOpenChild?.(id)),
  };
  // History indexes (the loaded part starts at `t.first`).
  const lastUserAt = t.messages.reduce((last, m, k) => (m.role === 'user' && !reportTaskId(m.id) && !isNote(m) ? k : last), -1);
  const lastUser = lastUserAt >= 0 ? t.first + lastUserAt : -1;
  const lastAssistant = t.first + t.messages.reduce((last, m, k) => (m.role === 'assistant' ? k : last), -1);
  // Tool results at the top of a page whose calls are in the page before it (not loaded).
  const orphansUntil = t.first > 0 ? t.first + Math.max(0, t.messages.findIndex((m) => m.role !== 'tool')) : 0;

  // Tool results by call id, so each card shows its own.
  const results = new Map<string, { text: string; isError: boolean }>();
  for (const m of t.messages) {
    if (m.role === 'tool' && m.tool_call_id) {
      const text = m.content ?? '';
      results.set(m.tool_call_id, { text, isError: t.tools[m.tool_call_id]?.isError ?? text.startsWith('Error:') });
    }
  }
  const calls = new Set(t.messages.flatMap((m) => (m.tool_calls ?? []).map((c) => c.id)));
  const reported = new Set(t.messages.map((m) => reportTaskId(m.id)).filter((x): x is string => !!x));
  const titles = new Map<string, string>();
  for (const m of t.messages)
    for (const c of m.tool_calls ?? []) {
      const title = c.name === 'sub_agent' && c.arguments && typeof c.arguments === 'object' ? (c.arguments as Record<string, unknown>).title : null;
      if (typeof title === 'string') titles.set(c.id, title);
    }

  const items: ComponentChildren[] = [];
  // As typed: the files its mentions carried are added again by the runtime (E12).
  const lastText = lastUserAt >= 0 ? typedText(t.messages[lastUserAt].content ?? '') : '';
  const lastImages = lastUserAt >= 0 ? (t.messages[lastUserAt].images ?? []) : [];
  const note = (n: Note, key: string) => (
    <NoteView
      key={key}
      note={n}
      canSend={canSend}
      onOpenSettings={props.onOpenSettings}
      onRetry={props.onRetry && (lastText || lastImages.length) && !t.running ? () => props.onRetry?.(lastText, lastImages) : undefined}
    />
  );
  const notesAt = (i: number) => t.notes.filter((n) => n.at === i).forEach((n, k) => items.push(note(n, `n${i}-${k}`)));
  // Compactions: a divider before each one's first kept message; what the latest one
  // summarised (all before its cut but the person's kept messages) is marked, not hidden.
  const compactions = t.compactions ?? [];
  const latest = compactions.at(-1);
  const cut = latest ? latest.first_kept : 0;
  const keptUser = new Set(latest?.kept_user ?? []);
  const summarised = (i: number) => i < cut && !keptUser.has(i);
  const dividersAt = (i: number) => compactions.filter((c) => c.first_kept === i).forEach((c) => items.push(<CompactionDivider key={`c${c.id}`} compaction={c} />));
  const marks = (i: number) => (summarised(i) ? { cls: ' summarised', data: 'true' } : { cls: '', data: undefined });
  // A status chip says something only while the message waits for its answer.
  const chipFor = (i: number, id: string | null | undefined) => (id && t.running && i > lastAssistant ? statuses[id] : undefined);
  // Above the rendered slice: nothing (its notes and dividers come with it).
  t.messages.forEach((m: Message, k) => {
    const i = t.first + k;
    if (i < from) return;
    notesAt(i);
    dividersAt(i);
    const key = `m${i}`;
    const mark = marks(i);
    if (m.role === 'system') return;
    if (m.role === 'user') {
      if (isNote(m)) {
        items.push(
          <div key={key} class="note note-notice note-app" data-testid="chat-note" data-message-id={m.id ?? undefined} role="status">
            {noteText(m.content)}
            <div class="muted small">The agent reads this note at its next turn.</div>
          </div>,
        );
      } else if (reportTaskId(m.id)) {
        items.push(
          <ReportCard
            key={key}
            titles={titles}
            messageId={m.id!}
            text={m.content}
            status={chipFor(i, m.id)}
            tabs={props.tabs}
            onOpenChild={props.onOpenChild}
            summarised={summarised(i)}
          />,
        );
      } else {
        items.push(
          <div key={key} class={`message user${mark.cls}`} data-testid="chat-message" data-role="user" data-summarised={mark.data} data-message-id={m.id ?? undefined}>
            <div class="message-head">
              <span class="who" data-testid="message-who">{props.senderOf ? props.senderOf(m, i) : canSend ? 'You' : 'Task from the parent agent'}</span>
              <StatusChip status={chipFor(i, m.id)} />
              <span class="spacer" />
              {i === lastUser && canSend && props.onEdit && !t.running && (
                <button type="button" class="quiet icon-button" data-testid="edit-message" title="Edit and send again as a new message" aria-label="Edit and send again" onClick={() => props.onEdit?.(typedText(m.content ?? ''), m.images ?? [])}>
                  <Icon name="edit" />
                </button>
              )}
              {canSend && props.onFork && !t.running && (
                <button
                  type="button"
                  class="quiet"
                  data-testid="fork-message"
                  title="Fork from here: a new conversation with the history before this message, this message in its composer; no file is touched"
                  onClick={() => props.onFork?.(i)}
                >
                  Fork
                </button>
              )}
              <CopyButton text={typedText(m.content ?? '')} />
            </div>
            <UserText content={m.content} />
            <MessageImages images={m.images} />
          </div>,
        );
      }
      return;
    }
    if (m.role === 'assistant') {
      items.push(
        <div
          key={key}
          class={`message assistant ${m.stopped ? 'stopped' : ''}${mark.cls}`}
          data-testid="chat-message"
          data-role="assistant"
          data-summarised={mark.data}
          data-stopped={m.stopped ? 'true' : undefined}
        >
          {m.stopped && (
            <div class="message-head" data-testid="stopped-answer">
              <span class="who">Stopped here: the model sees this partial answer</span>
              {/* The provider's count comes at the end of a stream, which Stop cut off: the
                  runtime's estimate, said to be one (E23). */}
              {m.usage && m.usage_estimated && (
                <span class="muted" data-testid="stopped-usage" title="Estimated by Bumblehive: the provider reports usage only at the end of an answer">
                  {' '}
                  · ≈{formatTokens(m.usage.input_tokens + m.usage.output_tokens)} tokens (estimated)
                </span>
              )}
            </div>
          )}
          {m.content ? (
            <div class="message-actions">
              <CopyButton text={m.content} />
            </div>
          ) : null}
          {m.content ? <Markdown text={m.content} /> : null}
          {(m.tool_calls ?? []).map((call) => (
            <ToolCard
              key={call.id}
              call={call}
              live={t.tools[call.id]}
              result={results.get(call.id)}
              child={call.name === 'sub_agent' ? props.tabs.find((c) => c.taskId === call.id) : undefined}
              childStates={props.childStates}
              reported={reported.has(call.id)}
              deleted={props.deleted?.includes(call.id)}
              onOpenChild={props.onOpenChild}
            />
          ))}
        </div>,
      );
      return;
    }
    // A tool result without its call in view (should not happen): show it plainly.
    if (m.role === 'tool' && !(m.tool_call_id && calls.has(m.tool_call_id)) && i >= orphansUntil) {
      items.push(
        <div key={key} class={`message tool${mark.cls}`} data-testid="chat-message" data-role="tool" data-summarised={mark.data}>
          <pre>{m.content}</pre>
        </div>,
      );
    }
  });
  notesAt(end);
  // A compaction announced before the messages it keeps arrived (or past a shorter re-read).
  compactions.filter((c) => c.first_kept >= end).forEach((c) => items.push(<CompactionDivider key={`c${c.id}`} compaction={c} />));
  // Notes recorded past the end (history re-read shorter than before) still show.
  t.notes.filter((n) => n.at > end).forEach((n, k) => items.push(note(n, `x${k}`)));
  return { items, titles };
    // Everything the rows show; callbacks are read through `handlers` when used.
  }, [t.messages, t.first, t.notes, t.compactions, t.tools, t.running, t.status, statuses, props.tabs, props.deleted, props.childStates, from, canSend]);
  const titles = items.titles;
  const rows = items.items;

  const tail: ComponentChildren[] = [];
  if (t.streaming) {
    tail.push(
      <div key="streaming" class="message assistant streaming" data-testid="chat-message" data-role="assistant" data-streaming="true">
        <StreamingMarkdown text={t.streaming} />
      </div>,
    );
  }
  for (const m of props.inflight ?? []) {
    if (reportTaskId(m.messageId)) {
      tail.push(
        <ReportCard key={`i${m.messageId}`} titles={titles} messageId={m.messageId} text={m.content} status={m.status} tabs={props.tabs} onOpenChild={props.onOpenChild} inflight />,
      );
    } else {
      tail.push(
        <div key={`i${m.messageId}`} class="message user inflight" data-testid="chat-message" data-role="user" data-message-id={m.messageId}>
          <div class="message-head">
            <span class="who">You</span>
            <StatusChip status={m.status} />
          </div>
          <div class="plain">{m.content ?? ''}</div>
          <MessageImages images={m.images} />
        </div>,
      );
    }
  }

  return (
    <div class="chat-wrap">
      <div class="chat" ref={scroller} onScroll={onScroll} data-testid="chat" data-session-id={t.sessionId}>
        <div class="chat-column">
          {t.notice && <div class="note note-notice">{t.notice}</div>}
          {rows.length === 0 && tail.length === 0 && t.status !== 'loading' ? props.empty : null}
          {from > 0 && (
            <button type="button" class="link show-earlier" data-testid="show-earlier" disabled={t.loadingEarlier} onClick={showEarlier}>
              {t.loadingEarlier ? 'Reading earlier messages…' : `Show ${Math.min(from, CHAT_STEP)} earlier messages (${from} not shown)`}
            </button>
          )}
          {earlierError && <div class="note note-error" data-testid="earlier-error">{earlierError}</div>}
          {rows}
          {tail}
          {props.footer}
        </div>
      </div>
      {behind && (
        <button type="button" class="jump-latest" data-testid="jump-latest" onClick={jump}>
          Jump to latest
        </button>
      )}
    </div>
  );
}
