import { useEffect, useRef, useState } from 'preact/hooks';
import { copyText } from '../markdown';
import type { Platform } from '../platform';

interface MenuState {
  x: number;
  y: number;
  selection: string;
  link: string | null;
}

/** Links the app hands to the system; anything else is not offered as a link. */
export const isExternalLink = (href: string | null | undefined): href is string => !!href && /^(https?:|mailto:)/i.test(href);

/**
 * The app's own right-click menu (Copy, Copy link, Open link) instead of the webview's,
 * whose Back / Reload drop the person at the folder picker. Text fields keep the
 * webview's menu (Cut / Copy / Paste work there).
 */
export function ContextMenu({ platform }: { platform: Platform }) {
  const [menu, setMenu] = useState<MenuState | null>(null);
  const box = useRef<HTMLDivElement>(null);

  useEffect(() => {
    const onMenu = (e: MouseEvent) => {
      const target = e.target as HTMLElement | null;
      if (target?.closest?.('input, textarea, [contenteditable="true"]')) return;
      e.preventDefault();
      const anchor = target?.closest?.('a') as HTMLAnchorElement | null;
      const href = anchor?.getAttribute('href') ?? null;
      const selection = globalThis.getSelection?.()?.toString() ?? '';
      const link = isExternalLink(href) ? href : null;
      if (!selection && !link) {
        setMenu(null);
        return;
      }
      setMenu({ x: e.clientX, y: e.clientY, selection, link });
    };
    const close = (e: Event) => {
      if (e instanceof KeyboardEvent && e.key !== 'Escape') return;
      if (e.type === 'mousedown' && box.current?.contains(e.target as Node)) return;
      setMenu(null);
    };
    // The desktop window is not a web page: reloading it (F5, Ctrl+R) would only drop the
    // person's place (D16). A browser tab keeps its reload.
    const onKey = (e: KeyboardEvent) => {
      if (platform.kind !== 'tauri') return;
      if (e.key === 'F5' || ((e.ctrlKey || e.metaKey) && e.key.toLowerCase() === 'r')) e.preventDefault();
    };
    document.addEventListener('keydown', onKey);
    document.addEventListener('contextmenu', onMenu);
    document.addEventListener('mousedown', close);
    document.addEventListener('keydown', close);
    window.addEventListener('blur', close);
    return () => {
      document.removeEventListener('keydown', onKey);
      document.removeEventListener('contextmenu', onMenu);
      document.removeEventListener('mousedown', close);
      document.removeEventListener('keydown', close);
      window.removeEventListener('blur', close);
    };
  }, [platform]);

  if (!menu) return null;
  const run = (fn: () => void) => () => {
    fn();
    setMenu(null);
  };
  // Keep the menu inside the window.
  const left = Math.min(menu.x, (globalThis.innerWidth || 10000) - 180);
  const top = Math.min(menu.y, (globalThis.innerHeight || 10000) - 110);
  return (
    <div ref={box} class="context-menu" role="menu" data-testid="context-menu" style={{ left: `${Math.max(0, left)}px`, top: `${Math.max(0, top)}px` }}>
      {menu.selection && (
        <button type="button" role="menuitem" data-testid="menu-copy" onClick={run(() => copyText(menu.selection))}>
          Copy
        </button>
      )}
      {menu.link && (
        <>
          <button type="button" role="menuitem" data-testid="menu-copy-link" onClick={run(() => copyText(menu.link!))}>
            Copy link
          </button>
          <button type="button" role="menuitem" data-testid="menu-open-link" onClick={run(() => platform.openExternal(menu.link!))}>
            Open link
          </button>
        </>
      )}
    </div>
  );
}
