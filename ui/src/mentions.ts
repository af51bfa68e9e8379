// @-mentions as the person sees them (E12). The runtime expands `@path` in a message by
// appending each file as `<file path="path">…</file>` after the text (src/mentions.rs):
// the model gets the files, the person's bubble shows the text and a chip per file, and
// Edit or Retry send the text as typed (so the runtime expands it once again, not twice).

/** A file a message carried by mention: its path and what was appended. */
export interface MentionedFile {
  path: string;
  body: string;
}

/** The `@path` words of a text (trailing punctuation off), in order, once each. */
export function mentionedPaths(text: string): string[] {
  const out: string[] = [];
  for (const word of text.split(/\s+/)) {
    if (!word.startsWith('@')) continue;
    const path = word.slice(1).replace(/[,.;:)!?]+$/, '');
    if (path && !out.includes(path)) out.push(path);
  }
  return out;
}

const OPEN = '\n\n<file path="';

/**
 * Splits an expanded message into the text the person typed and the files its mentions
 * appended. A message without such a tail (or whose tail names a file the text does not
 * mention) is all text.
 */
export function splitMentions(content: string): { text: string; files: MentionedFile[] } {
  const named = mentionedPaths(content);
  if (!named.length) return { text: content, files: [] };
  for (let at = content.indexOf(OPEN); at >= 0; at = content.indexOf(OPEN, at + 1)) {
    const text = content.slice(0, at);
    const files = parseBlocks(content.slice(at), mentionedPaths(text));
    if (files) return { text, files };
  }
  return { text: content, files: [] };
}

/** The blocks of a tail, each naming a path of `paths`, and nothing else; null if it is not. */
function parseBlocks(tail: string, paths: string[]): MentionedFile[] | null {
  const files: MentionedFile[] = [];
  let rest = tail;
  while (rest.length) {
    if (!rest.startsWith(OPEN)) return null;
    const head = /^\n\n<file path="([^"]*)">\n/.exec(rest);
    if (!head || !paths.includes(head[1])) return null;
    rest = rest.slice(head[0].length);
    // The block ends at the `\n</file>` followed by the next block or the end.
    let end = -1;
    for (let k = rest.indexOf('\n</file>'); k >= 0; k = rest.indexOf('\n</file>', k + 1)) {
      const after = rest.slice(k + '\n</file>'.length);
      if (after === '' || (after.startsWith(OPEN) && /^\n\n<file path="([^"]*)">\n/.test(after) && paths.includes(/^\n\n<file path="([^"]*)">/.exec(after)![1]))) {
        end = k;
        break;
      }
    }
    if (end < 0) return null;
    files.push({ path: head[1], body: rest.slice(0, end) });
    rest = rest.slice(end + '\n</file>'.length);
  }
  return files.length ? files : null;
}

/** The text the person typed, without the files the runtime appended (Edit, Retry, Fork). */
export function typedText(content: string): string {
  return splitMentions(content).text;
}
