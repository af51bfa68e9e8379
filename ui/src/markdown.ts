// Markdown of model output → sanitised HTML. Model output is untrusted: it may contain
// HTML, scripts, event handlers or javascript: links. marked renders, DOMPurify removes
// everything that could run or load something; images are shown as links (no fetches).

import DOMPurify from 'dompurify';
import { Marked } from 'marked';

const marked = new Marked({
  gfm: true,
  breaks: false,
  async: false,
  renderer: {
    // No remote images: a model could use them to send data out. Show a link instead.
    image({ href, text }) {
      const label = escapeHtml(text || href || 'image');
      return `<a href="${escapeHtml(href ?? '')}" class="md-image-link">[image: ${label}]</a>`;
    },
  },
});

export function escapeHtml(text: string): string {
  return text
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&#39;');
}

let purifier: ReturnType<typeof DOMPurify> | null = null;

function purify(): ReturnType<typeof DOMPurify> {
  if (purifier) return purifier;
  purifier = DOMPurify(window);
  purifier.addHook('afterSanitizeAttributes', (node) => {
    // `class` would let model output wear the app's own styles (a full-window `.overlay`
    // with a fake dialog: security finding 4). Only the classes this renderer makes stay:
    // `language-*` on code blocks and `md-image-link` on image links.
    if (node.hasAttribute('class')) {
      const kept = (node.getAttribute('class') ?? '')
        .split(/\s+/)
        .filter(
          (name) =>
            (node.tagName === 'CODE' && /^language-[\w+#.-]+$/.test(name)) ||
            (node.tagName === 'A' && name === 'md-image-link'),
        );
      if (kept.length > 0) node.setAttribute('class', kept.join(' '));
      else node.removeAttribute('class');
    }
    if (node.tagName === 'A') {
      const href = node.getAttribute('href') ?? '';
      // Only web and mail links survive; everything else becomes plain text-like.
      if (!/^(https?:|mailto:)/i.test(href)) node.removeAttribute('href');
      node.setAttribute('rel', 'noopener noreferrer nofollow');
      node.setAttribute('target', '_blank');
    }
  });
  return purifier;
}

const SANITIZE = {
  ALLOWED_TAGS: [
    'a', 'b', 'blockquote', 'br', 'code', 'del', 'details', 'div', 'em', 'h1', 'h2', 'h3', 'h4',
    'h5', 'h6', 'hr', 'i', 'kbd', 'li', 'ol', 'p', 'pre', 's', 'span', 'strong', 'sub', 'summary',
    'sup', 'table', 'tbody', 'td', 'tfoot', 'th', 'thead', 'tr', 'ul', 'input',
  ],
  ALLOWED_ATTR: ['href', 'title', 'class', 'align', 'start', 'type', 'checked', 'disabled', 'colspan', 'rowspan'],
  ALLOW_DATA_ATTR: false,
  ALLOW_UNKNOWN_PROTOCOLS: false,
};

/** Renders untrusted markdown into HTML that is safe to put into the page. */
export function renderMarkdown(text: string): string {
  const html = marked.parse(text ?? '') as string;
  const clean = purify().sanitize(html, SANITIZE) as unknown as string;
  return String(clean);
}

/** Task-list checkboxes are the only inputs markdown makes; keep them inert. */
export function afterRender(root: HTMLElement, copy: (text: string) => void): void {
  for (const input of Array.from(root.querySelectorAll('input'))) {
    if ((input as HTMLInputElement).type !== 'checkbox') input.remove();
    else (input as HTMLInputElement).disabled = true;
  }
  for (const pre of Array.from(root.querySelectorAll('pre'))) {
    if (pre.querySelector(':scope > .copy-button')) continue;
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'copy-button';
    button.textContent = 'Copy';
    button.setAttribute('data-testid', 'copy-code');
    button.addEventListener('click', () => {
      const code = pre.querySelector('code') ?? pre;
      copy(code.textContent ?? '');
      button.textContent = 'Copied';
      setTimeout(() => (button.textContent = 'Copy'), 1200);
    });
    pre.appendChild(button);
  }
}

/** Copies text, with a fallback for webviews without the async clipboard. */
export function copyText(text: string): void {
  const fallback = () => {
    const area = document.createElement('textarea');
    area.value = text;
    area.style.position = 'fixed';
    area.style.opacity = '0';
    document.body.appendChild(area);
    area.select();
    try {
      document.execCommand('copy');
    } finally {
      area.remove();
    }
  };
  if (navigator.clipboard?.writeText) navigator.clipboard.writeText(text).catch(fallback);
  else fallback();
}

/**
 * Splits streaming markdown into blocks at blank lines outside code fences: the finished
 * blocks do not change while the answer streams, so each is parsed once and only the last
 * one is parsed again per frame (the whole text is parsed once when the message is final).
 */
export function streamingBlocks(text: string): string[] {
  const blocks: string[] = [];
  let fence: string | null = null;
  let start = 0;
  let at = 0;
  while (at < text.length) {
    const end = text.indexOf('\n', at);
    const lineEnd = end < 0 ? text.length : end;
    const line = text.slice(at, lineEnd);
    const mark = /^ {0,3}(`{3,}|~{3,})/.exec(line)?.[1];
    if (mark && (fence === null || (mark[0] === fence[0] && mark.length >= fence.length))) fence = fence === null ? mark : null;
    else if (fence === null && line.trim() === '' && lineEnd > start && text.slice(start, at).trim() !== '') {
      // A blank line ends a block, unless the next line continues a list item (indented).
      const next = text.slice(lineEnd + 1, text.indexOf('\n', lineEnd + 1) >>> 0);
      if (!/^\s/.test(next) || next.trim() === '') {
        blocks.push(text.slice(start, lineEnd + 1));
        start = lineEnd + 1;
      }
    }
    if (end < 0) break;
    at = end + 1;
  }
  if (start < text.length) blocks.push(text.slice(start));
  return blocks;
}
