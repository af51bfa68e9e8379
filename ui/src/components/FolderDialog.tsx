import { useEffect, useRef, useState } from 'preact/hooks';
import type { FolderList } from '../bindings/FolderList';
import { toCommandError, type Platform } from '../platform';
import { ErrorBox } from './ErrorBox';

/** The folder a typed path names (`/a/b/` → `/a/b`, `/a/b` → `/a`) and the name being typed. */
export function splitTyped(typed: string): { folder: string; prefix: string } {
  const cut = typed.lastIndexOf('/');
  if (cut < 0) return { folder: typed, prefix: '' };
  const folder = cut === 0 ? '/' : typed.slice(0, cut);
  return { folder, prefix: typed.slice(cut + 1) };
}

const join = (folder: string, name: string) => (folder.endsWith('/') ? `${folder}${name}` : `${folder}/${name}`);
const withSlash = (folder: string) => (folder.endsWith('/') ? folder : `${folder}/`);
/** The path to use: the typed one without its trailing slash (`/` stays `/`). */
const chosenPath = (typed: string) => (typed.length > 1 ? typed.trim().replace(/\/+$/, '') || '/' : typed.trim());

function commonPrefix(names: string[]): string {
  if (names.length === 0) return '';
  let prefix = names[0];
  for (const name of names.slice(1)) {
    let i = 0;
    while (i < prefix.length && i < name.length && prefix[i].toLowerCase() === name[i].toLowerCase()) i++;
    prefix = prefix.slice(0, i);
  }
  return prefix;
}

/**
 * The web UI's folder dialog (`bumblehive serve` has no native one): a typed path with
 * completion (Tab), the folder's sub-folders (a click goes in), Up and Home, Enter chooses
 * and Escape cancels. It starts in `start` (the last workspace) or the server's home folder.
 * The chosen path is checked by `onChoose` (the platform's `checkFolder`); a refused one
 * keeps the dialog open with the reason.
 */
export function FolderDialog(props: {
  platform: Platform;
  start: string | null;
  /** Resolves to an error to show, or null once the folder is taken. */
  onChoose: (path: string) => Promise<string | null>;
  onCancel: () => void;
}) {
  const { platform } = props;
  const [typed, setTyped] = useState('');
  const [listing, setListing] = useState<FolderList | null>(null);
  const [listError, setListError] = useState<string | null>(null);
  const [chooseError, setChooseError] = useState<string | null>(null);
  const [checking, setChecking] = useState(false);
  const [hidden, setHidden] = useState(false);
  const asked = useRef(0);
  const input = useRef<HTMLInputElement>(null);

  /** Lists `path` (null: home); `show` puts that folder in the field once it is listed. */
  const load = async (path: string | null, show: boolean, withHidden = hidden) => {
    const ticket = ++asked.current;
    try {
      const list = await platform.invoke('list_folders', withHidden ? { path, hidden: true } : { path });
      if (ticket !== asked.current) return;
      setListing(list);
      setListError(null);
      if (show) setTyped(withSlash(list.path));
    } catch (err) {
      if (ticket !== asked.current) return;
      setListError(toCommandError(err).message);
      if (show && path) setTyped(withSlash(path));
    }
  };

  useEffect(() => {
    void load(props.start, true).then(() => input.current?.focus());
  }, []);

  // Typing lists the folder the path is in (once per folder, not per key).
  const { folder, prefix } = splitTyped(typed);
  useEffect(() => {
    if (!typed || !folder) return;
    if (listing && (listing.path === folder || withSlash(listing.path) === withSlash(folder))) return;
    const timer = setTimeout(() => void load(folder, false), 150);
    return () => clearTimeout(timer);
  }, [folder]);

  const here = listing && withSlash(listing.path) === withSlash(folder) ? listing : null;
  const shown = here ? here.folders.filter((name) => name.toLowerCase().startsWith(prefix.toLowerCase())) : [];

  const goTo = (path: string | null) => {
    setChooseError(null);
    void load(path, true);
    input.current?.focus();
  };

  const complete = () => {
    if (!here || shown.length === 0) return;
    if (shown.length === 1) {
      setTyped(withSlash(join(here.path, shown[0])));
      return;
    }
    const common = commonPrefix(shown);
    if (common.length > prefix.length) setTyped(join(here.path, common));
  };

  const choose = async () => {
    const path = chosenPath(typed);
    if (!path || checking) return;
    setChecking(true);
    setChooseError(null);
    try {
      const problem = await props.onChoose(path);
      if (problem) setChooseError(problem);
    } finally {
      setChecking(false);
    }
  };

  return (
    <div
      class="overlay"
      data-testid="folder-dialog"
      onClick={(e) => e.target === e.currentTarget && props.onCancel()}
      onKeyDown={(e) => {
        if (e.key === 'Escape') {
          e.preventDefault();
          e.stopPropagation();
          props.onCancel();
        }
      }}
    >
      <div class="dialog folder-dialog" role="dialog" aria-labelledby="folder-dialog-title">
        <h2 id="folder-dialog-title">Open a workspace folder</h2>
        <p class="muted">A folder on the machine that runs <code>bumblehive serve</code>.</p>
        <div class="row">
          <button type="button" data-testid="folder-up" disabled={!listing?.parent} onClick={() => goTo(listing?.parent ?? null)}>
            Up
          </button>
          <button type="button" data-testid="folder-home" onClick={() => goTo(listing?.home ?? null)}>
            Home
          </button>
          <input
            ref={input}
            type="text"
            class="folder-path"
            aria-label="Folder path"
            data-testid="folder-path"
            spellcheck={false}
            autoComplete="off"
            value={typed}
            onInput={(e) => {
              // `~` is the server's home folder: written out, so the listing matches the field.
              const value = (e.target as HTMLInputElement).value;
              const home = listing?.home;
              setTyped(home && (value === '~' || value.startsWith('~/')) ? withSlash(home) + value.slice(2) : value);
              setChooseError(null);
            }}
            onKeyDown={(e) => {
              if (e.key === 'Enter') {
                e.preventDefault();
                void choose();
              } else if (e.key === 'Tab' && !e.shiftKey && shown.length > 0 && prefix) {
                e.preventDefault();
                complete();
              }
            }}
          />
        </div>
        {listError && <ErrorBox message={listError} testid="folder-list-error" />}
        {chooseError && <ErrorBox message={chooseError} testid="folder-choose-error" />}
        <label class="row muted">
          <input
            type="checkbox"
            data-testid="folder-hidden"
            checked={hidden}
            onChange={(e) => {
              const next = (e.target as HTMLInputElement).checked;
              setHidden(next);
              // Dot-folders come after the others (the server sorts them last).
              if (listing) void load(listing.path, false, next);
            }}
          />
          Show hidden folders
        </label>
        <ul class="folder-list" data-testid="folder-list" aria-label="Sub-folders">
          {shown.map((name) => (
            <li key={name}>
              <button type="button" class="quiet folder-entry" data-testid="folder-entry" data-name={name} onClick={() => goTo(join(here!.path, name))}>
                {name}/
              </button>
            </li>
          ))}
          {here && shown.length === 0 && <li class="muted">{prefix ? `No sub-folder starts with “${prefix}”.` : 'No sub-folders.'}</li>}
          {here?.truncated && <li class="muted">More folders than shown: type the start of a name.</li>}
        </ul>
        <div class="dialog-buttons">
          <button type="button" onClick={props.onCancel} data-testid="folder-cancel">
            Cancel
          </button>
          <button type="button" class="primary" data-testid="folder-choose" disabled={!chosenPath(typed) || checking} onClick={() => void choose()}>
            Open this folder
          </button>
        </div>
      </div>
    </div>
  );
}
