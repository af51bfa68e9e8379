import type { ComponentChildren } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { quietCaret } from '../quietcaret';
import { argumentQuery, insertMention, matchCommands, mentionAt, parseSlash, skillAt, slashQuery, type SlashCommand } from '../commands';
import { fencedBlock, fileKind, imageFile, imageRefusal, imageSrc, isBinaryText, MAX_TEXT_CHARS, pastedImages, readBase64, readText, type Attachment } from '../attachments';
import type { ImagePart } from '../bindings/ImagePart';
import { toCommandError } from '../platform';
import { ErrorBox } from './ErrorBox';
import { usePlatform } from './context';
import { mentionedPaths } from '../mentions';

let attachmentSeq = 0;

/**
 * What was typed and attached but not sent, per composer (`draftKey`: a session id, or
 * `new` for a conversation not started yet), kept while the window lives: switching
 * sessions keeps each one's text with it, and never shows it in another's (E8).
 */
const unsent = new Map<string, { text: string; attachments: Attachment[] }>();

/** How many composers hold text or attachments not sent (`recycle.ts`: none may be lost). */
export function unsentCount(): number {
  return unsent.size;
}

/** Forgets every unsent text (tests mount a fresh app each time). */
export function forgetUnsent(): void {
  unsent.clear();
}

/**
 * The prompt: Enter sends, Shift+Enter is a new line, Esc stops; `/` commands, `@` files.
 * Pasted or dropped images become attachments sent with the next message; dropped text files
 * are inserted as fenced code blocks.
 */
export function Composer(props: {
  running: boolean;
  disabled?: boolean;
  placeholder?: string;
  /** `images` are the attachments (empty when none); the text may be empty when there are some. */
  onSend: (text: string, images: ImagePart[]) => Promise<void>;
  onStop: () => Promise<void>;
  autoFocus?: boolean;
  /** Text (and images, removable) to put in the composer (edit and resend); a new object each time. */
  draft?: { text: string; images?: ImagePart[] } | null;
  /** The draft was put in the composer: the owner drops it, so it is applied once only. */
  onDraftTaken?: () => void;
  /**
   * Whose composer this is (a session id, or `new`): unsent text is kept under it. The owner
   * gives each key its own composer (`key={draftKey}`).
   */
  draftKey?: string;
  commands?: SlashCommand[];
  /** Runs a command; a returned promise that fails shows its error here, a string it gives shows as a note. */
  onCommand?: (name: string, arg: string) => void | Promise<void | string>;
  /** Workspace files matching a query (fuzzy); null when the backend cannot list files. */
  findFiles?: (query: string) => Promise<string[] | null>;
  /** Whether images can be attached (default yes). */
  images?: boolean;
  /** Shown under the text field (the model picker). */
  extra?: ComponentChildren;
}) {
  const kept = props.draftKey ? unsent.get(props.draftKey) : undefined;
  const [text, setText] = useState(kept?.text ?? '');
  const [sending, setSending] = useState(false);
  const [stopping, setStopping] = useState(false);
  const [error, setError] = useState<{ message: string; retry?: () => void } | null>(null);
  const area = useRef<HTMLTextAreaElement>(null);
  const picker = useRef<HTMLInputElement>(null);
  const [choice, setChoice] = useState(0);
  /** The person moved the menu's highlight with the arrows (Enter then picks it). */
  const [moved, setMoved] = useState(false);
  const [mention, setMention] = useState<{ query: string; start: number; files: string[] } | null>(null);
  /** The `$skill` being typed, with where it starts (skills complete like files). */
  const [dollar, setDollar] = useState<{ query: string; start: number } | null>(null);
  const mentionSeq = useRef(0);
  /** Files chosen from the @ menu (or brought back by Edit): shown as chips while their @path stays. */
  const [picked, setPicked] = useState<string[]>(() => (kept ? mentionedPaths(kept.text) : []));
  const [attachments, setAttachments] = useState<Attachment[]>(kept?.attachments ?? []);
  const attached = useRef(0);
  attached.current = attachments.length;
  /** Why pasted or dropped files were refused or cut (shown until dismissed or sent). */
  const [fileNotes, setFileNotes] = useState<string[]>([]);
  /** What a command answered (`/agent` lists the profiles). */
  const [info, setInfo] = useState<string | null>(null);

  useEffect(() => {
    if (!props.draft) return;
    setText(props.draft.text);
    setPicked(mentionedPaths(props.draft.text));
    // The edited message's images come back as attachments (the person may remove them);
    // they replace what was attached, as the text replaces what was typed.
    const images = props.draft.images ?? [];
    setAttachments(images.map((image, k) => ({ id: `a${++attachmentSeq}`, name: `image ${k + 1}`, image })));
    area.current?.focus();
    props.onDraftTaken?.();
  }, [props.draft]);

  // Keep what is typed with its session (read back when its composer is shown again).
  useEffect(() => {
    if (!props.draftKey) return;
    if (text || attachments.length) unsent.set(props.draftKey, { text, attachments });
    else unsent.delete(props.draftKey);
  }, [text, attachments, props.draftKey]);

  const commands = props.commands ?? [];
  const query = slashQuery(text);
  const matches = query == null ? [] : matchCommands(commands, query);
  const typingArg = argumentQuery(text);
  const argCommand = typingArg ? commands.find((c) => c.name === typingArg.name && c.available && c.choices?.length) : undefined;
  const argMatches = argCommand && typingArg ? argCommand.choices!.filter((c) => c.value.toLowerCase().startsWith(typingArg.query)) : [];
  const skillMatches = dollar ? commands.filter((c) => c.kind === 'skill' && c.name.toLowerCase().startsWith(dollar.query.toLowerCase())).slice(0, 8) : [];
  const inline = mention != null || skillMatches.length > 0;
  const menu: { key: string; label: string; hint: string; disabled: boolean; pick: () => void }[] = mention
    ? mention.files.map((f) => ({ key: f, label: `@${f}`, hint: '', disabled: false, pick: () => pickMention(f) }))
    : skillMatches.length
      ? skillMatches.map((c) => ({ key: c.name, label: `$${c.name}`, hint: c.description, disabled: false, pick: () => pickSkill(c.name) }))
    : argCommand
      ? argMatches.map((c) => ({ key: c.value, label: `/${argCommand.name} ${c.value}`, hint: c.hint, disabled: false, pick: () => runCommand(argCommand.name, c.value) }))
      : matches.map((c) => ({
        key: c.name,
        label: `/${c.name}`,
        hint: c.available ? c.description : c.reason ? `${c.description} (${c.reason})` : `${c.description} (coming)`,
        disabled: !c.available,
        // A custom command or a skill takes its arguments in the field: picking it only names it.
        pick: () => (c.kind ? insertCommand(c.name) : runCommand(c.name, '')),
      }));

  const insertCommand = (name: string) => {
    setText(`/${name} `);
    requestAnimationFrame(() => area.current?.focus());
  };

  const pickSkill = (name: string) => {
    const el = area.current;
    if (!dollar || !el) return;
    const next = insertMention(text, dollar.start, el.selectionStart ?? text.length, name);
    // insertMention writes `@name `: the same edit with `$`.
    const written = next.text.slice(0, dollar.start) + '$' + next.text.slice(dollar.start + 1);
    setText(written);
    setDollar(null);
    requestAnimationFrame(() => {
      el.focus();
      el.setSelectionRange(next.caret, next.caret);
    });
  };

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
    setInfo(null);
    setText('');
    const done = props.onCommand?.(name, arg);
    if (done && typeof done.then === 'function') {
      done.then(
        (said) => {
          if (typeof said === 'string') setInfo(said);
        },
        (err) => setError({ message: `/${name} failed: ${toCommandError(err).message}`, retry: () => runCommand(name, arg) }),
      );
    }
  };

  const pickMention = (path: string) => {
    const el = area.current;
    if (!mention || !el) return;
    const next = insertMention(text, mention.start, el.selectionStart ?? text.length, path);
    setText(next.text);
    setPicked((list) => (list.includes(path) ? list : [...list, path]));
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
  // No caret blinking in an idle window (WebKitGTK never stops it on its own).
  useEffect(() => (area.current ? quietCaret(area.current) : undefined), []);
  useEffect(() => {
    if (!props.running) setStopping(false);
  }, [props.running]);

  const canAttach = props.images ?? true;
  const platform = usePlatform();

  /** Pasted or dropped files: images attach, text files are inserted, anything else is refused. */
  const addFiles = async (files: File[], dropped: boolean) => {
    const notes: string[] = [];
    const inserts: string[] = [];
    let count = attached.current;
    const added: Attachment[] = [];
    for (const file of files) {
      if (file.type.startsWith('image/') || !dropped) {
        if (!canAttach) {
          notes.push(`Cannot attach ${file.name || 'the pasted image'}: images cannot be sent here.`);
          continue;
        }
        const refusal = imageRefusal(file, count);
        if (refusal) {
          notes.push(refusal);
          continue;
        }
        try {
          added.push({ id: `a${++attachmentSeq}`, name: file.name || 'pasted image', image: { media_type: file.type, data: await readBase64(file) } });
          count++;
        } catch (err) {
          notes.push(`Cannot read ${file.name || 'the pasted image'}: ${String((err as Error)?.message ?? err)}`);
        }
        continue;
      }
      if (fileKind(file) === 'binary') {
        notes.push(`Cannot attach ${file.name}: only images (PNG, JPEG, GIF, WebP) and text files can be added to a message.`);
        continue;
      }
      try {
        const content = await readText(file);
        if (isBinaryText(content)) {
          notes.push(`Cannot attach ${file.name}: it is not a text file; only images and text files can be added to a message.`);
          continue;
        }
        const { block, cut } = fencedBlock(file.name, content, MAX_TEXT_CHARS, file.size > MAX_TEXT_CHARS * 4);
        if (cut) notes.push(`${file.name} is longer than 100 KB: only its first 100 KB were inserted.`);
        inserts.push(block);
      } catch (err) {
        notes.push(`Cannot read ${file.name}: ${String((err as Error)?.message ?? err)}`);
      }
    }
    if (added.length) setAttachments((list) => [...list, ...added]);
    if (inserts.length) setText((current) => [current.replace(/\s+$/, ''), ...inserts].filter((s) => s).join('\n\n') + '\n');
    setFileNotes(notes);
  };

  /**
   * The clipboard's image as the platform reads it (the desktop shell, from GTK's
   * clipboard), for a paste whose event carried nothing: WebKitGTK's, when the clipboard
   * holds only a picture (E14).
   */
  const pasteFromClipboard = async (read: () => Promise<ImagePart | null>) => {
    try {
      const image = await read();
      if (image) await addFiles([imageFile(image, 'pasted image')], false);
    } catch (err) {
      setFileNotes([`Cannot paste the clipboard's image: ${toCommandError(err).message}`]);
    }
  };

  const onPaste = (e: ClipboardEvent) => {
    // Pasted text goes into the field as usual; only images are taken here.
    const { files, askClipboard } = pastedImages(e.clipboardData);
    if (!files.length) {
      // The field's own paste goes on (it has nothing to insert); the image, if the
      // clipboard has one, is added beside it when the platform has read it.
      const read = platform?.clipboardImage?.bind(platform);
      if (askClipboard && read) void pasteFromClipboard(read);
      return;
    }
    e.preventDefault();
    // Taking the images stops the default paste: put any text that came with them in by hand.
    const pastedText = e.clipboardData?.getData?.('text/plain') ?? '';
    const el = area.current;
    if (pastedText && el) {
      const start = el.selectionStart ?? text.length;
      const end = el.selectionEnd ?? start;
      setText(text.slice(0, start) + pastedText + text.slice(end));
    }
    void addFiles(files, false);
  };

  // A file dropped beside the composer would make the page navigate to it (leaving the app).
  useEffect(() => {
    const guard = (e: DragEvent) => {
      if (Array.from(e.dataTransfer?.types ?? []).includes('Files')) e.preventDefault();
    };
    window.addEventListener('dragover', guard);
    window.addEventListener('drop', guard);
    return () => {
      window.removeEventListener('dragover', guard);
      window.removeEventListener('drop', guard);
    };
  }, []);

  const [dragging, setDragging] = useState(false);
  const onDragOver = (e: DragEvent) => {
    if (!Array.from(e.dataTransfer?.types ?? []).includes('Files')) return;
    e.preventDefault();
    if (!dragging) setDragging(true);
  };
  const onDrop = (e: DragEvent) => {
    const files = Array.from(e.dataTransfer?.files ?? []);
    setDragging(false);
    if (!files.length) return;
    e.preventDefault();
    void addFiles(files, true);
  };

  const inText = mentionedPaths(text);
  const chips = picked.filter((p) => inText.includes(p));
  /** Takes `@path` out of the text (its chip's ×). */
  const dropMention = (path: string) => {
    const escaped = path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    setText((current) => current.replace(new RegExp(`(^|\\s)@${escaped}(?=[\\s,.;:)!?]|$) ?`, 'g'), '$1'));
    setPicked((list) => list.filter((p) => p !== path));
    area.current?.focus();
  };

  const send = async (content = text) => {
    const images = attachments.map((a) => a.image);
    if ((!content.trim() && !images.length) || sending || props.disabled) return;
    const slash = commands.length ? parseSlash(content) : null;
    const named = slash ? commands.find((c) => c.name.toLowerCase() === slash.name) : undefined;
    if (slash && named) return runCommand(named.name, slash.arg);
    setSending(true);
    setError(null);
    const key = props.draftKey;
    try {
      await props.onSend(content, images);
      // Sent: its composer may be gone already (a new conversation's), its text must go too.
      if (key && unsent.get(key)?.text === content) unsent.delete(key);
      setText((current) => (current === content ? '' : current));
      const sent = new Set(images);
      setAttachments((list) => list.filter((a) => !sent.has(a.image)));
      setFileNotes([]);
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
      setMoved(true);
      return;
    }
    // `/agent ` + Enter runs it as typed (lists the profiles) rather than picking the first
    // name, unless the person highlighted one with the arrows: Enter chooses that (E17).
    const bareArg = argCommand && !typingArg?.query && e.key === 'Enter' && !moved;
    if (menu.length && !bareArg && (e.key === 'Tab' || (e.key === 'Enter' && !e.shiftKey && !e.isComposing))) {
      const item = menu[Math.min(choice, menu.length - 1)];
      e.preventDefault();
      if (inline) item.pick();
      else if (e.key === 'Tab') setText(argCommand ? item.label : `${item.label} `);
      else item.pick();
      return;
    }
    if (e.key === 'Escape' && (mention || skillMatches.length || matches.length || argMatches.length)) {
      e.preventDefault();
      e.stopPropagation();
      setMention(null);
      setDollar(null);
      if (matches.length || argMatches.length) setText('');
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
    <div class={`composer-wrap ${dragging ? 'dragging' : ''}`} onDragOver={onDragOver} onDragLeave={() => setDragging(false)} onDrop={onDrop} data-testid="composer">
      {error && <ErrorBox message={error.message} onRetry={error.retry} onDismiss={() => setError(null)} testid="composer-error" />}
      {info && (
        <div class="note note-notice composer-info" data-testid="composer-info" role="status">
          <pre class="plain">{info}</pre>
          <button type="button" class="quiet" aria-label="Dismiss" onClick={() => setInfo(null)}>
            ×
          </button>
        </div>
      )}
      {fileNotes.length > 0 && (
        <ErrorBox message={fileNotes.join('\n')} onDismiss={() => setFileNotes([])} testid="attach-error" />
      )}
      {attachments.length > 0 && (
        <div class="attachments" data-testid="attachments">
          {attachments.map((a) => (
            <div key={a.id} class="attachment" data-testid="attachment" title={a.name}>
              <img src={imageSrc(a.image) ?? ''} alt={a.name} data-testid="attachment-thumb" />
              <button
                type="button"
                class="attachment-remove"
                data-testid="attachment-remove"
                aria-label={`Remove ${a.name}`}
                title={`Remove ${a.name}`}
                onClick={() => setAttachments((list) => list.filter((x) => x.id !== a.id))}
              >
                ×
              </button>
            </div>
          ))}
        </div>
      )}
      {chips.length > 0 && (
        <div class="mention-chips composer-mentions" data-testid="composer-mentions" title="These files go to the model with the message; the chat shows them as chips">
          {chips.map((p) => (
            <span key={p} class="mention-chip" data-testid="composer-mention" data-path={p}>
              @{p}
              <button type="button" class="quiet mention-remove" aria-label={`Remove @${p}`} title={`Remove @${p}`} onClick={() => dropMention(p)}>
                ×
              </button>
            </span>
          ))}
        </div>
      )}
      {menu.length > 0 && (
        <ul class="composer-menu" role="listbox" data-testid={mention ? 'mention-menu' : skillMatches.length ? 'skill-menu' : argCommand ? 'argument-menu' : 'slash-menu'}>
          {menu.map((item, i) => (
            <li key={item.key}>
              <button
                type="button"
                role="option"
                aria-selected={i === choice}
                class={`${i === choice ? 'active' : ''} ${item.disabled ? 'coming' : ''}`}
                data-testid={mention ? 'mention-item' : skillMatches.length ? 'skill-item' : argCommand ? 'argument-item' : 'slash-item'}
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
            setMoved(false);
            updateMention(el.value, el.selectionStart ?? el.value.length);
            setDollar(skillAt(el.value, el.selectionStart ?? el.value.length));
          }}
          onKeyDown={onKeyDown}
          onPaste={onPaste}
        />
        <div class="composer-buttons">
          {canAttach && (
            <>
              <button
                type="button"
                class="attach-button"
                data-testid="attach-button"
                title="Attach images (PNG, JPEG, GIF, WebP); you can also paste or drop them"
                aria-label="Attach images"
                disabled={props.disabled}
                onClick={() => picker.current?.click()}
              >
                + Image
              </button>
              <input
                ref={picker}
                type="file"
                accept="image/png,image/jpeg,image/gif,image/webp"
                multiple
                hidden
                data-testid="attach-input"
                onChange={(e) => {
                  const input = e.target as HTMLInputElement;
                  const files = Array.from(input.files ?? []);
                  input.value = '';
                  // Chosen files are checked like dropped ones: anything but an image is refused.
                  if (files.length) void addFiles(files, true);
                }}
              />
            </>
          )}
          {props.extra}
          <button type="button" class="danger" data-testid="stop-button" disabled={!props.running || stopping} onClick={() => void stop()} title="Stop (Esc)">
            {stopping ? 'Stopping…' : 'Stop'}
          </button>
          <button type="button" class="primary" data-testid="send-button" disabled={(!text.trim() && !attachments.length) || sending || props.disabled} onClick={() => void send()}>
            {sending ? 'Sending…' : 'Send'}
          </button>
        </div>
      </div>
    </div>
  );
}
