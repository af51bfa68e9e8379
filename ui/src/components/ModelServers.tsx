// Settings → Model servers: every provider of the config by name (the lone `provider` block
// is `default`), with Add, Edit, Remove, Make default and Test (whose answer lists the
// server's models, offered in the form's model field). Changes go through
// `update_config`'s merge patch, keys through `set_api_key` into the keyring.

import { useState } from 'preact/hooks';
import type { ProviderTest } from '../bindings/ProviderTest';
import type { SetApiKey } from '../bindings/SetApiKey';
import type { UpdateConfig } from '../bindings/UpdateConfig';
import type { JsonValue } from '../bindings/serde_json/JsonValue';
import { toCommandError, type Platform } from '../platform';
import { ConfirmButton } from './ConfirmButton';
import { ErrorBox } from './ErrorBox';
import { Icon } from './Icon';

/** The name of the lone `provider` block (Rust: `config::DEFAULT_PROVIDER`). */
export const DEFAULT_PROVIDER = 'default';

export interface ServerRow {
  name: string;
  kind: string;
  base_url: string;
  model: string;
  /** The provider top-level sessions use (`default_provider`, else `default`). */
  isDefault: boolean;
  /** The lone `provider` block: it cannot be removed (runs fall back to it). */
  builtIn: boolean;
  max_concurrent: number | null;
  context_window: number | null;
  /** Where the key comes from, or null when none is set. */
  key: string | null;
}

function row(name: string, block: any, defaultName: string, builtIn: boolean): ServerRow {
  const b = block && typeof block === 'object' ? block : {};
  const num = (v: unknown) => (typeof v === 'number' ? v : null);
  const key =
    typeof b.api_key_env === 'string' && b.api_key_env
      ? `variable ${b.api_key_env}`
      : typeof b.api_key_keyring === 'string' && b.api_key_keyring
        ? 'keyring'
        : null;
  return {
    name,
    kind: String(b.kind ?? 'openai'),
    base_url: String(b.base_url ?? ''),
    model: String(b.model ?? ''),
    isDefault: name === defaultName,
    builtIn,
    max_concurrent: num(b.max_concurrent),
    context_window: num(b.context_window),
    key,
  };
}

/**
 * Every provider the config names, `default` (the `provider` block) first. `configured`
 * false: nothing is configured, and the `provider` block holds only the runtime's built-in
 * guess (Ollama's address), which is not listed as a server of the person's (E19, D6).
 */
export function serverRows(config: any, configured: boolean | null = null): ServerRow[] {
  if (!config || typeof config !== 'object') return [];
  const named = (config.providers ?? {}) as Record<string, any>;
  const defaultName = typeof config.default_provider === 'string' ? config.default_provider : DEFAULT_PROVIDER;
  const rows: ServerRow[] = [];
  // A `providers.default` entry replaces the `provider` block (as `provider_named` does).
  if (!(DEFAULT_PROVIDER in named) && configured !== false) rows.push(row(DEFAULT_PROVIDER, config.provider, defaultName, true));
  for (const [name, block] of Object.entries(named)) rows.push(row(name, block, defaultName, false));
  return rows;
}

type TestState = { status: 'running' } | { status: 'done'; result: ProviderTest } | { status: 'error'; message: string };

/** The models a server's last test listed (E19). */
function modelsOf(t: TestState | undefined): string[] {
  return t?.status === 'done' ? t.result.models ?? [] : [];
}

interface AddForm {
  /** The server being edited (its name is fixed), or null when adding. */
  editing?: string | null;
  name: string;
  kind: 'openai' | 'anthropic';
  base_url: string;
  model: string;
  api_key: string;
  max_concurrent: string;
  context_window: string;
}

const EMPTY_FORM: AddForm = { name: '', kind: 'openai', base_url: '', model: '', api_key: '', max_concurrent: '', context_window: '' };

/** What is wrong with the form, in words, or null. */
export function addFormProblem(form: AddForm, rows: ServerRow[]): string | null {
  const name = form.name.trim();
  if (!name) return 'Give the server a name.';
  if (!form.editing) {
    if (!/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(name)) return 'The name may use letters, digits, ".", "_" and "-".';
    if (name === DEFAULT_PROVIDER) return '"default" is the provider block; choose another name.';
    if (rows.some((r) => r.name === name)) return `A server named "${name}" exists already.`;
  }
  if (!form.base_url.trim()) return 'Give the base URL.';
  if (!form.model.trim()) return 'Give the model.';
  for (const [label, value] of [
    ['Parallel requests', form.max_concurrent],
    ['Context window', form.context_window],
  ] as const) {
    if (value.trim() && !(Number.isInteger(Number(value)) && Number(value) >= 1)) return `${label} must be a whole number of at least 1.`;
  }
  return null;
}

/** A refusal in words; `busy` says what to do. */
function refusal(err: unknown, what: string): string {
  const e = toCommandError(err);
  return e.code === 'busy' ? `${what}: stop running sessions first (${e.message}).` : `${what}: ${e.message}`;
}

/** A row as the form edits it. */
function editForm(r: ServerRow): AddForm {
  return {
    editing: r.name,
    name: r.name,
    kind: r.kind === 'anthropic' ? 'anthropic' : 'openai',
    base_url: r.base_url,
    model: r.model,
    api_key: '',
    max_concurrent: r.max_concurrent == null ? '' : String(r.max_concurrent),
    context_window: r.context_window == null ? '' : String(r.context_window),
  };
}

export function ModelServers(props: { platform: Platform; config: any; configured?: boolean | null; onChanged: (config: any) => void }) {
  const { platform } = props;
  const rows = serverRows(props.config, props.configured ?? null);
  const [tests, setTests] = useState<Record<string, TestState>>({});
  const [error, setError] = useState<string | null>(null);
  const [adding, setAdding] = useState<AddForm | null>(null);
  const [addError, setAddError] = useState<string | null>(null);
  const [working, setWorking] = useState(false);

  const patch = async (change: UpdateConfig['patch'], what: string): Promise<boolean> => {
    setWorking(true);
    setError(null);
    try {
      const args: UpdateConfig = { patch: change };
      props.onChanged(await platform.invoke('update_config', args));
      return true;
    } catch (err) {
      setError(refusal(err, what));
      return false;
    } finally {
      setWorking(false);
    }
  };

  const test = async (name: string) => {
    setTests((t) => ({ ...t, [name]: { status: 'running' } }));
    try {
      const result = await platform.invoke('test_provider', { name });
      setTests((t) => ({ ...t, [name]: { status: 'done', result } }));
    } catch (err) {
      setTests((t) => ({ ...t, [name]: { status: 'error', message: toCommandError(err).message } }));
    }
  };

  const add = async () => {
    if (!adding) return;
    const problem = addFormProblem(adding, rows);
    if (problem) {
      setAddError(problem);
      return;
    }
    setAddError(null);
    const name = adding.name.trim();
    const editing = adding.editing ?? null;
    const block: { [key: string]: JsonValue } = { kind: adding.kind, base_url: adding.base_url.trim(), model: adding.model.trim() };
    // Editing: an emptied optional field removes its key (null in a merge patch).
    if (adding.max_concurrent.trim()) block.max_concurrent = Number(adding.max_concurrent);
    else if (editing) block.max_concurrent = null;
    if (adding.context_window.trim()) block.context_window = Number(adding.context_window);
    else if (editing) block.context_window = null;
    // The built-in `default` row is the lone `provider` block.
    const builtIn = editing != null && rows.some((r) => r.name === editing && r.builtIn);
    setWorking(true);
    try {
      let config = await platform.invoke('update_config', { patch: builtIn ? { provider: block } : { providers: { [name]: block } } });
      props.onChanged(config);
      const key = adding.api_key.trim();
      // The server is added before its key: `set_api_key` names an existing provider.
      if (key) {
        try {
          const args: SetApiKey = builtIn ? { key } : { key, provider: name };
          config = await platform.invoke('set_api_key', args);
          props.onChanged(config);
        } catch (err) {
          // The key never stays in the form once sent.
          setAdding(null);
          setError(refusal(err, `“${name}” was ${editing ? 'saved' : 'added'}, but its key was not stored`));
          return;
        }
      }
      setAdding(null);
    } catch (err) {
      setAddError(refusal(err, editing ? 'Not saved' : 'Not added'));
    } finally {
      setWorking(false);
    }
  };

  const field = (key: keyof AddForm) => (e: Event) => {
    const value = (e.target as HTMLInputElement).value;
    setAdding((f) => (f ? { ...f, [key]: value } : f));
  };

  return (
    <section class="model-servers" data-testid="model-servers">
      <div class="row">
        <strong>Model servers</strong>
        {!adding && (
          <button type="button" data-testid="server-add" disabled={working} onClick={() => setAdding({ ...EMPTY_FORM })}>
            Add…
          </button>
        )}
      </div>
      <table class="servers">
        <thead>
          <tr>
            <th>Name</th>
            <th>Kind</th>
            <th>Base URL</th>
            <th>Model</th>
            <th title="Requests the server takes at once (max_concurrent)">Parallel</th>
            <th title="The model's context window in tokens (context_window); unset: asked from the server">Window</th>
            <th>Key</th>
          </tr>
        </thead>
        {rows.map((r) => {
          const t = tests[r.name];
          // One body per server: its settings, then a line with its actions and test result.
          return (
            <tbody key={r.name} data-testid="server-row" data-name={r.name} data-default={r.isDefault ? 'true' : undefined}>
              <tr>
                <td>
                  <strong>{r.name}</strong>
                  {r.isDefault && (
                    <span class="server-default" data-testid="server-default" title="Top-level sessions use this one">
                      {' '}
                      (default)
                    </span>
                  )}
                </td>
                <td>{r.kind}</td>
                <td class="server-url">
                  <code>{r.base_url}</code>
                </td>
                <td>{r.model}</td>
                <td>{r.max_concurrent ?? '—'}</td>
                <td>{r.context_window ?? 'auto'}</td>
                <td data-testid="server-key">{r.key ?? 'none'}</td>
              </tr>
              <tr class="server-actions-row">
                <td colSpan={7}>
                  <div class="server-actions">
                    <button type="button" data-testid="server-test" disabled={t?.status === 'running'} onClick={() => void test(r.name)}>
                      {t?.status === 'running' ? 'Testing…' : 'Test'}
                    </button>
                    <button
                      type="button"
                      data-testid="server-edit"
                      disabled={working || adding != null}
                      onClick={() => {
                        setAddError(null);
                        setAdding(editForm(r));
                      }}
                    >
                      Edit
                    </button>
                    {!r.isDefault && (
                      <button
                        type="button"
                        data-testid="server-make-default"
                        disabled={working}
                        onClick={() => void patch({ default_provider: r.name === DEFAULT_PROVIDER ? null : r.name }, 'Not changed')}
                      >
                        Make default
                      </button>
                    )}
                    {!r.isDefault && !r.builtIn && (
                      <ConfirmButton
                        class="quiet"
                        testid="server-remove"
                        label="Remove"
                        confirmLabel="Remove it"
                        disabled={working}
                        title="Remove this server from the config (a session or profile that names it says so at its next run)"
                        onConfirm={() => void patch({ providers: { [r.name]: null } }, 'Not removed')}
                      />
                    )}
                    {t?.status === 'done' && t.result.ok && (
                      <span class="ok" data-testid="server-test-result" data-ok="true">
                        {/* SVG, not a ✓ glyph: glyphs are empty boxes on a plain font set (D13). */}
                        <Icon name="done" /> {t.result.model} · {t.result.latency_ms} ms
                      </span>
                    )}
                    {t?.status === 'done' && !t.result.ok && (
                      <span class="server-test-error" data-testid="server-test-result" data-ok="false">
                        <Icon name="failed" /> {t.result.message}
                      </span>
                    )}
                    {t?.status === 'error' && (
                      <span class="server-test-error" data-testid="server-test-result" data-ok="false">
                        <Icon name="failed" /> Cannot test: {t.message}
                      </span>
                    )}
                  </div>
                </td>
              </tr>
            </tbody>
          );
        })}
      </table>
      {error && <ErrorBox testid="servers-error" message={error} onDismiss={() => setError(null)} />}
      {adding && (
        <form
          class="server-add-form"
          data-testid="server-add-form"
          // Our own checks say what is wrong in words, beside the form (see addFormProblem).
          noValidate
          onSubmit={(e) => {
            e.preventDefault();
            void add();
          }}
        >
          <label>
            <span>Name</span>
            <input type="text" value={adding.name} data-testid="server-name" disabled={!!adding.editing} onInput={field('name')} placeholder="e.g. local, claude" />
          </label>
          <label>
            <span>Kind</span>
            <select value={adding.kind} data-testid="server-kind" onChange={field('kind')}>
              <option value="openai">OpenAI-compatible</option>
              <option value="anthropic">Anthropic</option>
            </select>
          </label>
          <label>
            <span>Base URL</span>
            <input type="url" value={adding.base_url} data-testid="server-base-url" onInput={field('base_url')} placeholder="http://127.0.0.1:8080/v1" />
          </label>
          <label>
            <span>Model</span>
            <input type="text" value={adding.model} data-testid="server-model" onInput={field('model')} />
          </label>
          {adding.editing && (
            <div class="row model-choices" data-testid="server-model-choices">
              <button type="button" class="quiet" data-testid="server-list-models" disabled={tests[adding.editing]?.status === 'running'} onClick={() => void test(adding.editing!)}>
                {tests[adding.editing]?.status === 'running' ? 'Asking the server…' : 'Models on this server'}
              </button>
              {modelsOf(tests[adding.editing]).map((m) => (
                <button
                  key={m}
                  type="button"
                  class={`chip${adding.model === m ? ' chosen' : ''}`}
                  data-testid="server-model-choice"
                  onClick={() => setAdding((f) => (f ? { ...f, model: m } : f))}
                >
                  {m}
                </button>
              ))}
            </div>
          )}
          <label>
            <span>API key (optional, kept in the system keyring)</span>
            <input type="password" autocomplete="off" value={adding.api_key} data-testid="server-api-key" onInput={field('api_key')} />
          </label>
          <label>
            <span>Parallel requests (optional)</span>
            <input type="number" min="1" value={adding.max_concurrent} data-testid="server-max-concurrent" onInput={field('max_concurrent')} />
          </label>
          <label>
            <span>Context window in tokens (optional)</span>
            <input type="number" min="1" value={adding.context_window} data-testid="server-context-window" onInput={field('context_window')} />
          </label>
          {addError && <ErrorBox testid="server-add-error" message={addError} onDismiss={() => setAddError(null)} />}
          <div class="row">
            <button type="submit" class="primary" disabled={working} data-testid="server-add-save">
              {adding.editing ? (working ? 'Saving…' : 'Save') : working ? 'Adding…' : 'Add server'}
            </button>
            <button
              type="button"
              data-testid="server-add-cancel"
              onClick={() => {
                setAdding(null);
                setAddError(null);
              }}
            >
              Cancel
            </button>
          </div>
        </form>
      )}
    </section>
  );
}
