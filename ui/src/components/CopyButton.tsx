import { useState } from 'preact/hooks';
import { copyText } from '../markdown';
import { Icon } from './Icon';

/** Copies a message's or a tool result's text; says "Copied" for a moment. */
export function CopyButton({ text, label = 'Copy message', testid = 'copy-message' }: { text: string; label?: string; testid?: string }) {
  const [done, setDone] = useState(false);
  return (
    <button
      type="button"
      class="quiet icon-button"
      data-testid={testid}
      title={label}
      aria-label={label}
      onClick={(e) => {
        // Inside a tool card's summary a click would also fold the card.
        e.preventDefault();
        copyText(text);
        setDone(true);
        setTimeout(() => setDone(false), 1200);
      }}
    >
      <Icon name={done ? 'done' : 'copy'} />
      {done && (
        <span class="copied" data-testid="copied" role="status">
          Copied
        </span>
      )}
    </button>
  );
}
