import { memo } from '../memo';
import { useLayoutEffect, useMemo, useRef } from 'preact/hooks';
import { afterRender, copyText, renderMarkdown } from '../markdown';
import { usePlatform } from './context';
import { isExternalLink } from './ContextMenu';

/** Sanitised markdown; links open outside the window, code blocks get a Copy button. */
export const Markdown = memo(function Markdown({ text, class: className }: { text: string; class?: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
  const ref = useRef<HTMLDivElement>(null);
  const platform = usePlatform();
  useLayoutEffect(() => {
    if (ref.current) afterRender(ref.current, copyText);
  }, [html]);
  // Links open in the system browser (the desktop shell's opener), never in the app
  // window: a left or middle click is handed over; a disarmed link does nothing.
  const onClick = (e: MouseEvent) => {
    const anchor = (e.target as HTMLElement | null)?.closest?.('a');
    if (!anchor) return;
    e.preventDefault();
    if (e.type === 'auxclick' && e.button !== 1) return;
    const href = anchor.getAttribute('href');
    if (isExternalLink(href)) platform?.openExternal(href);
  };
  return <div ref={ref} class={`markdown ${className ?? ''}`} onClick={onClick} onAuxClick={onClick} dangerouslySetInnerHTML={{ __html: html }} />;
});
