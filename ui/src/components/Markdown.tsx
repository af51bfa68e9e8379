import { memo } from 'preact/compat';
import { useLayoutEffect, useMemo, useRef } from 'preact/hooks';
import { afterRender, copyText, renderMarkdown } from '../markdown';
import { usePlatform } from './context';

/** Sanitised markdown; links open outside the window, code blocks get a Copy button. */
export const Markdown = memo(function Markdown({ text, class: className }: { text: string; class?: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
  const ref = useRef<HTMLDivElement>(null);
  const platform = usePlatform();
  useLayoutEffect(() => {
    if (ref.current) afterRender(ref.current, copyText);
  }, [html]);
  const onClick = (e: MouseEvent) => {
    const anchor = (e.target as HTMLElement | null)?.closest?.('a');
    if (!anchor) return;
    // Never navigate the app window itself.
    e.preventDefault();
    const href = anchor.getAttribute('href');
    if (href && /^(https?:|mailto:)/i.test(href)) platform?.openExternal(href);
  };
  return <div ref={ref} class={`markdown ${className ?? ''}`} onClick={onClick} dangerouslySetInnerHTML={{ __html: html }} />;
});
