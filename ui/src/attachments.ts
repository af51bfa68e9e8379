// Pasted and dropped files of the composer: which become image attachments (checked with the
// runtime's own limits, so a refusal is explained before sending), which are inserted as text,
// and which are refused. Reads files with FileReader; no DOM beyond that.

import type { ImagePart } from './bindings/ImagePart';

/** The image types `submit` accepts (the runtime refuses any other with `invalid_argument`). */
export const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'] as const;
/** At most this many images per message, each at most `MAX_IMAGE_BYTES` (the runtime's limits). */
export const MAX_IMAGES = 8;
export const MAX_IMAGE_BYTES = 5 * 1024 * 1024;
/** A dropped text file is inserted up to this many characters (longer ones are cut, and say so). */
export const MAX_TEXT_CHARS = 100 * 1024;

/** An image waiting to be sent with the next message. */
export interface Attachment {
  /** Unique within the composer (the remove button names it). */
  id: string;
  name: string;
  image: ImagePart;
}

const mib = (bytes: number) => `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;

/** Why an image cannot be attached (type, size, count), or null when it can. */
export function imageRefusal(file: { name: string; type: string; size: number }, already: number): string | null {
  const name = file.name || 'the pasted image';
  if (!(IMAGE_TYPES as readonly string[]).includes(file.type)) {
    return `Cannot attach ${name}: ${file.type || 'its type is unknown'}; only PNG, JPEG, GIF and WebP images can be sent.`;
  }
  if (file.size > MAX_IMAGE_BYTES) return `Cannot attach ${name}: it is ${mib(file.size)}; an image may be at most 5 MiB.`;
  if (already >= MAX_IMAGES) return `Cannot attach ${name}: a message can carry at most ${MAX_IMAGES} images.`;
  return null;
}

/**
 * What a dropped file that is not an image is, by its type: `text`, `binary`, or `unknown`
 * (no type, as for most source files): then its bytes decide (`isBinaryText`).
 */
export function fileKind(file: { type: string }): 'text' | 'binary' | 'unknown' {
  if (file.type.startsWith('text/') || /^application\/(json|xml|javascript|typescript|x-sh|x-yaml|yaml|toml|sql)/.test(file.type)) return 'text';
  return !file.type || file.type === 'application/octet-stream' ? 'unknown' : 'binary';
}

/** Text read from a binary file has NULs or many replacement characters. */
export function isBinaryText(text: string): boolean {
  if (text.includes('\u0000')) return true;
  const bad = text.match(/\uFFFD/g)?.length ?? 0;
  return bad > 8 && bad > text.length / 100;
}

/** The fence language of a file name (`main.rs` → `rs`), or empty. */
function fenceLanguage(name: string): string {
  const match = /\.([A-Za-z0-9]+)$/.exec(name);
  return match ? match[1].toLowerCase() : '';
}

/**
 * A file's text as a fenced code block headed by its name, cut at `cap` characters with a
 * line saying so. The fence is longer than any backtick run inside, so the text cannot end it.
 */
export function fencedBlock(name: string, text: string, cap = MAX_TEXT_CHARS, more = false): { block: string; cut: boolean } {
  // `more`: the text read is already only the file's start.
  const cut = more || text.length > cap;
  const body = (cut ? text.slice(0, cap) : text).replace(/\n$/, '');
  const longest = Math.max(2, ...Array.from(body.matchAll(/`+/g), (m) => m[0].length));
  const fence = '`'.repeat(longest + 1);
  const note = cut ? `\n(${name} was cut: only its first ${cap >= 1024 ? `${Math.round(cap / 1024)} KB` : `${cap} characters`} are here.)` : '';
  return { block: `${name}:\n${fence}${fenceLanguage(name)}\n${body}\n${fence}${note}`, cut };
}

/** Reads a file as base64 (without the `data:…;base64,` prefix). */
export function readBase64(file: Blob): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => {
      const url = String(reader.result ?? '');
      resolve(url.slice(url.indexOf(',') + 1));
    };
    reader.onerror = () => reject(reader.error ?? new Error('cannot read the file'));
    reader.readAsDataURL(file);
  });
}

/** Reads a file's text: only its start when it is far longer than `MAX_TEXT_CHARS` could use. */
export function readText(whole: Blob): Promise<string> {
  const file = whole.size > MAX_TEXT_CHARS * 4 ? whole.slice(0, MAX_TEXT_CHARS * 4) : whole;
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result ?? ''));
    reader.onerror = () => reject(reader.error ?? new Error('cannot read the file'));
    reader.readAsText(file);
  });
}

/** A data URL to show a stored image; null for a type the runtime would not have stored. */
export function imageSrc(image: ImagePart): string | null {
  if (!(IMAGE_TYPES as readonly string[]).includes(image.media_type)) return null;
  if (!/^[A-Za-z0-9+/=\s]*$/.test(image.data)) return null;
  return `data:${image.media_type};base64,${image.data}`;
}

/** What a paste event's `clipboardData` offers (the part of `DataTransfer` read here). */
export interface PastedData {
  files?: ArrayLike<File> | null;
  items?: ArrayLike<{ kind: string; type: string; getAsFile(): File | null }> | null;
  getData?(type: string): string;
}

/**
 * What a paste brings the composer: the images it carries (Chromium lists a pasted
 * screenshot in `files`, some engines only as an item), and whether the platform must be
 * asked for the clipboard's image instead. WebKitGTK fires `paste` with an empty
 * `clipboardData` when the clipboard holds only a picture (E14): a paste with neither an
 * image nor text asks. A paste with text never asks: it stays the field's own paste.
 */
export function pastedImages(data: PastedData | null | undefined): { files: File[]; askClipboard: boolean } {
  let files = Array.from(data?.files ?? []).filter((f) => f.type.startsWith('image/'));
  if (!files.length) {
    files = Array.from(data?.items ?? [])
      .filter((item) => item.kind === 'file' && item.type.startsWith('image/'))
      .map((item) => item.getAsFile())
      .filter((f): f is File => f != null);
  }
  const text = data?.getData?.('text/plain') ?? '';
  return { files, askClipboard: !files.length && !text };
}

/** The clipboard's image (as the platform read it) as a file, checked and attached like a pasted one. */
export function imageFile(image: ImagePart, name: string): File {
  const bytes = Uint8Array.from(atob(image.data), (c) => c.charCodeAt(0));
  return new File([bytes], name, { type: image.media_type });
}
