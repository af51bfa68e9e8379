import { useEffect, useRef, useState } from 'preact/hooks';
import { toCommandError } from '../platform';
import { ErrorBox } from './ErrorBox';

/** The prompt: Enter sends, Shift+Enter is a new line, Esc stops. */
export function Composer(props: {
  running: boolean;
  disabled?: boolean;
  placeholder?: string;
  onSend: (text: string) => Promise<void>;
  onStop: () => Promise<void>;
  autoFocus?: boolean;
}) {
  const [text, setText] = useState('');
  const [sending, setSending] = useState(false);
  const [stopping, setStopping] = useState(false);
  const [error, setError] = useState<{ message: string; retry?: () => void } | null>(null);
  const area = useRef<HTMLTextAreaElement>(null);

  useEffect(() => {
    if (props.autoFocus) area.current?.focus();
  }, [props.autoFocus]);
  useEffect(() => {
    if (!props.running) setStopping(false);
  }, [props.running]);

  const send = async (content = text) => {
    if (!content.trim() || sending || props.disabled) return;
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
      <div class="composer">
        <textarea
          ref={area}
          rows={3}
          value={text}
          placeholder={props.placeholder ?? 'Message… (Enter sends, Shift+Enter new line, Esc stops)'}
          disabled={props.disabled}
          data-testid="prompt-input"
          aria-label="Message"
          onInput={(e) => setText((e.target as HTMLTextAreaElement).value)}
          onKeyDown={onKeyDown}
        />
        <div class="composer-buttons">
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
