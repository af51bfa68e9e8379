import type { ComponentChildren } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { insertMention, matchCommands, mentionAt, parseSlash, slashQuery, type SlashCommand } from '../commands';
import { toCommandError } from '../platform';
import { ErrorBox } from './ErrorBox';

/** The prompt: Enter sends, Shift+Enter is a new line, Esc stops; `/` commands, `@` files. */
export function Composer(props: {
  running: boolean;
  disabled?: boolean;
  placeholder?: string;
  onSend: (text: string) => Promise<void>;
  onStop: () => Promise<void>;
  autoFocus?: boolean;
  /** Text to put in the composer (edit and resend); a new object each time. */
  draft?: { text: string } | null;
  commands?: SlashCommand[];
  /** Runs a command; a returned promise that fails shows its error here. */
  onCommand?: (name: string, arg: string) => void | Promise<void>;
  /** Workspace files matching a query (fuzzy); null when the backend cannot list files. */
  findFiles?: (query: string) => Promise<string[] | null>;
  /** Shown under the text field (the model picker). */
  extra?: ComponentChildren;
}) {
  const [text, setText] = useState('');
  const [sending, setSending] = useState(false);
  const [stopping, setStopping] = useState(false);
  const [error, setError] = useState<{ message: string; retry?: () => void } | null>(null);
  const area = useRef<HTMLTextAreaElement>(null);
  const [choice, setChoice] = useState(0);
  const [mention, setMention] = useState<{ query: string; start: number; files: string[] } | null>(null);
  const mentionSeq = useRef(0);

  useEffect(() => {
    if (!props.draft) return;
    setText(props.draft.text);
    area.current?.focus();
  }, [props.draft]);

  const commands = props.commands ?? [];
  const query = slashQuery(text);
  const matches = query == null ? [] : matchCommands(commands, query);
  const menu: { key: string; label: string; hint: string; disabled: boolean; pick: () => void }[] = mention
    ? mention.files.map((f) => ({ key: f, label: `@${f}`, hint: '', disabled: false, pick: () => pickMention(f) }))
    : matches.map((c) => ({
        key: c.name,
        label: `/${c.name}`,
        hint: c.available ? c.description : c.reason ? `${c.description} (${c.reason})` : `${c.description} (coming)`,
        disabled: !c.available,
        pick: () => runCommand(c.name, ''),
      }));

  const runCommand = (name: string, arg: string) => {
    const command = commands.find((c) => c.name === name);
    if (!command) {
      setError({ message: `Unknown command /${name}. Commands: ${commands.map((c) => `/${c.name}`).join(', ')}` });
      return;
    }
    if (!command.available) {
      setError({ message: command.reason ?? `/${name} is not available yet: ${command.description.toLowerCase()} needs support in the runtime.` });
      return;
    }
    setError(null);
    setText('');
    const done = props.onCommand?.(name, arg);
    if (done && typeof done.then === 'function') {
      done.catch((err) => setError({ message: `/${name} failed: ${toCommandError(err).message}`, retry: () => runCommand(name, arg) }));
    }
  };

  const pickMention = (path: string) => {
    const el = area.current;
    if (!mention || !el) return;
    const next = insertMention(text, mention.start, el.selectionStart ?? text.length, path);
    setText(next.text);
    setMention(null);
    requestAnimationFrame(() => {
      el.focus();
      el.setSelectionRange(next.caret, next.caret);
    });
  };

  const updateMention = (value: string, caret: number) => {
    const at = props.findFiles ? mentionAt(value, caret) : null;
    if (!at) return setMention(null);
    const seq = ++mentionSeq.current;
    void props.findFiles!(at.query)
      .then((files) => {
        if (seq !== mentionSeq.current) return;
        setChoice(0);
        setMention(files && files.length ? { ...at, files: files.slice(0, 8) } : null);
      })
      .catch(() => setMention(null));
  };

  useEffect(() => {
    if (props.autoFocus) area.current?.focus();
  }, [props.autoFocus]);
  useEffect(() => {
    if (!props.running) setStopping(false);
  }, [props.running]);

  const send = async (content = text) => {
    if (!content.trim() || sending || props.disabled) return;
    const slash = commands.length ? parseSlash(content) : null;
    if (slash && commands.some((c) => c.name === slash.name)) return runCommand(slash.name, slash.arg);
    setSending(true);
    setError(null);
    try {
      await props.onSend(content);
      setText((current) => (current === content ? '' : current));
    } catch (err) {
      setError({ message: toCommandError(err).message, retry: () => void send(content) });
    } finally {
      setSending(false);
      area.current?.focus();
    }
  };

  const stop = async () => {
    if (!props.running || stopping) return;
    setStopping(true);
    try {
      await props.onStop();
    } catch (err) {
      setStopping(false);
      setError({ message: toCommandError(err).message, retry: () => void stop() });
    }
  };

  const onKeyDown = (e: KeyboardEvent) => {
    if (menu.length && (e.key === 'ArrowDown' || e.key === 'ArrowUp')) {
      e.preventDefault();
      setChoice((c) => (c + (e.key === 'ArrowDown' ? 1 : menu.length - 1)) % menu.length);
      return;
    }
    if (menu.length && (e.key === 'Tab' || (e.key === 'Enter' && !e.shiftKey && !e.isComposing))) {
      const item = menu[Math.min(choice, menu.length - 1)];
      e.preventDefault();
      if (mention) item.pick();
      else if (e.key === 'Tab') setText(`${item.label} `);
      else item.pick();
      return;
    }
    if (e.key === 'Escape' && (mention || matches.length)) {
      e.preventDefault();
      e.stopPropagation();
      setMention(null);
      if (matches.length) setText('');
      return;
    }
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && !e.altKey && !e.ctrlKey && !e.metaKey) {
      e.preventDefault();
      void send();
    } else if (e.key === 'Escape') {
      e.preventDefault();
      e.stopPropagation();
      void stop();
    }
  };

  return (
    <div class="composer-wrap">
      {error && <ErrorBox message={error.message} onRetry={error.retry} onDismiss={() => setError(null)} testid="composer-error" />}
      {menu.length > 0 && (
        <ul class="composer-menu" role="listbox" data-testid={mention ? 'mention-menu' : 'slash-menu'}>
          {menu.map((item, i) => (
            <li key={item.key}>
              <button
                type="button"
                role="option"
                aria-selected={i === choice}
                class={`${i === choice ? 'active' : ''} ${item.disabled ? 'coming' : ''}`}
                data-testid={mention ? 'mention-item' : 'slash-item'}
                data-name={item.key}
                onMouseDown={(e) => e.preventDefault()}
                onClick={item.pick}
              >
                <span class="menu-label">{item.label}</span>
                {item.hint && <span class="muted">{item.hint}</span>}
              </button>
            </li>
          ))}
        </ul>
      )}
      <div class="composer">
        <textarea
          ref={area}
          rows={3}
          value={text}
          placeholder={props.placeholder ?? 'Message… (Enter sends, Shift+Enter new line, Esc stops, / commands, @ files)'}
          disabled={props.disabled}
          data-testid="prompt-input"
          aria-label="Message"
          onInput={(e) => {
            const el = e.target as HTMLTextAreaElement;
            setText(el.value);
            setChoice(0);
            updateMention(el.value, el.selectionStart ?? el.value.length);
          }}
          onKeyDown={onKeyDown}
        />
        <div class="composer-buttons">
          {props.extra}
          <button type="button" class="danger" data-testid="stop-button" disabled={!props.running || stopping} onClick={() => void stop()} title="Stop (Esc)">
            {stopping ? 'Stopping…' : 'Stop'}
          </button>
          <button type="button" class="primary" data-testid="send-button" disabled={!text.trim() || sending || props.disabled} onClick={() => void send()}>
            {sending ? 'Sending…' : 'Send'}
          </button>
        </div>
      </div>
    </div>
  );
}
