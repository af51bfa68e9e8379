import { useEffect, useRef, useState } from 'preact/hooks';
import type { UpdateConfig } from '../bindings/UpdateConfig';
import { busyText } from '../busy';
import { toCommandError, type Platform, type ProbeResult } from '../platform';
import { ErrorBox } from './ErrorBox';
import { DEFAULT_PROVIDER, ModelServers } from './ModelServers';
import { McpServers } from './McpServers';
import { SkillsList } from './SkillsList';
import { AgentsList } from './AgentsList';
import { UndoHistory } from './UndoHistory';

export interface ProviderForm {
  kind: 'openai' | 'anthropic';
  base_url: string;
  model: string;
  api_key_env: string;
  /** How shell commands run (`tools.run_command.sandbox`, SPEC §11). */
  command_policy: 'sandbox' | 'ask' | 'off';
}

/** The well-known local servers the first start offers to look for. */
export const LOCAL_SERVERS = [
  { name: 'Ollama', kind: 'openai' as const, base_url: 'http://127.0.0.1:11434/v1', probe: 'http://127.0.0.1:11434/v1/models' },
  { name: 'LM Studio', kind: 'openai' as const, base_url: 'http://127.0.0.1:1234/v1', probe: 'http://127.0.0.1:1234/v1/models' },
];

/** The command sandbox policy of a config: SPEC §11's `tools.run_command.sandbox`, or the
 * `tools.command.policy` an older backend answers with. */
function commandPolicy(config: any): ProviderForm['command_policy'] {
  const value = config?.tools?.run_command?.sandbox ?? config?.tools?.command?.policy;
  return value === 'ask' || value === 'off' ? value : 'sandbox';
}

/**
 * The server top-level sessions use, which the form below edits (E19): `default_provider`
 * when it names an entry of `providers`, else the lone `provider` block (a
 * `providers.default` entry stands for it, as the runtime's `provider_named` has it).
 */
export function defaultServer(config: any): { name: string; path: ['provider'] | ['providers', string]; block: any } {
  const named = (config?.providers ?? {}) as Record<string, any>;
  const chosen = typeof config?.default_provider === 'string' ? config.default_provider : DEFAULT_PROVIDER;
  if (chosen in named) return { name: chosen, path: ['providers', chosen], block: named[chosen] };
  return { name: DEFAULT_PROVIDER, path: ['provider'], block: config?.provider ?? {} };
}

export function formFromConfig(config: any): ProviderForm {
  const p = defaultServer(config).block ?? {};
  return {
    kind: p.kind === 'anthropic' ? 'anthropic' : 'openai',
    base_url: typeof p.base_url === 'string' ? p.base_url : '',
    model: typeof p.model === 'string' ? p.model : '',
    api_key_env: typeof p.api_key_env === 'string' ? p.api_key_env : '',
    command_policy: commandPolicy(config),
  };
}

export { busyText };

type ProbeState = { status: 'idle' | 'running' } | { status: 'unsupported' } | { status: 'done'; results: ProbeResult[] } | { status: 'error'; message: string };

/** Provider settings (`get_config` / `update_config`); on first start it offers to find a local server. */
export function Settings(props: {
  platform: Platform;
  welcome?: boolean;
  workspace?: string | null;
  /** Whether the config names a provider; `false`: the runtime's default is not shown as a choice. */
  configured?: boolean | null;
  /** The runs that keep the config from changing (SPEC §6), each with a Stop (D15). */
  running?: { id: string; title: string }[];
  onStop?: (sessionId: string) => void;
  onClose: () => void;
  onSaved: (config: any) => void;
}) {
  const { platform } = props;
  const [form, setForm] = useState<ProviderForm | null>(null);
  // The config as last read or saved, for the model servers list.
  const [config, setConfig] = useState<any>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  const [error, setError] = useState<{ code: string; message: string } | null>(null);
  const [saving, setSaving] = useState(false);
  const [saved, setSaved] = useState(false);
  const [probe, setProbe] = useState<ProbeState>({ status: 'idle' });
  const [apiKey, setApiKey] = useState('');
  const [keyState, setKeyState] = useState<{ status: 'idle' | 'saving' | 'saved' } | { status: 'error'; message: string }>({ status: 'idle' });
  const [logDir, setLogDir] = useState<string | null>(null);
  const [about, setAbout] = useState<{ version: string; commit: string | null } | null>(null);
  const box = useRef<HTMLDivElement>(null);
  // The command policy as the config has it, so that only a change is sent.
  const loadedPolicy = useRef<ProviderForm['command_policy']>('sandbox');

  const load = async () => {
    setLoadError(null);
    try {
      const read = await platform.invoke('get_config', {});
      const loaded = formFromConfig(read);
      // Nothing configured: the runtime's built-in default (Ollama's address) is not the
      // person's choice, so the form does not present it as one (D25).
      if (props.configured === false) {
        loaded.base_url = '';
        loaded.model = '';
      }
      setConfig(read);
      loadedPolicy.current = loaded.command_policy;
      setForm(loaded);
    } catch (err) {
      setLoadError(toCommandError(err).message);
    }
  };
  useEffect(() => {
    void load();
    platform
      .invoke('app_info', {})
      .then((info: any) => {
        setLogDir(typeof info?.log_dir === 'string' ? info.log_dir : null);
        // `commit` is optional: a build from a source tarball has none to report.
        setAbout(
          typeof info?.version === 'string'
            ? { version: info.version, commit: typeof info?.commit === 'string' && info.commit ? info.commit : null }
            : null,
        );
      })
      .catch(() => {
        setLogDir(null);
        setAbout(null);
      });
    box.current?.focus();
    if (props.welcome) void runProbe();
  }, []);

  const runProbe = async () => {
    setProbe({ status: 'running' });
    try {
      const results = await platform.probeProviders();
      setProbe(results == null ? { status: 'unsupported' } : { status: 'done', results });
    } catch (err) {
      setProbe({ status: 'error', message: toCommandError(err).message });
    }
  };

  const save = async () => {
    if (!form) return;
    if (!form.base_url.trim()) {
      setSaved(false);
      setError({ code: 'invalid_argument', message: 'choose a model server first: use one found above, or type its address.' });
      return;
    }
    setSaving(true);
    setError(null);
    setSaved(false);
    try {
      const block = {
        kind: form.kind,
        base_url: form.base_url.trim(),
        model: form.model.trim(),
        // null removes the key (JSON merge patch).
        api_key_env: form.api_key_env.trim() || null,
      };
      // The server that is the default, wherever the config keeps it (E19).
      const target = defaultServer(config).path;
      const patch: UpdateConfig['patch'] = target.length === 1 ? { provider: block } : { providers: { [target[1]]: block } };
      // Only a changed command policy is sent (a patch changes what it names).
      if (loadedPolicy.current !== form.command_policy) {
        (patch as Record<string, unknown>).tools = { run_command: { sandbox: form.command_policy } };
      }
      const args: UpdateConfig = { patch };
      const saved = await platform.invoke('update_config', args);
      setConfig(saved);
      const next = formFromConfig(saved);
      loadedPolicy.current = next.command_policy;
      setForm(next);
      setSaved(true);
      props.onSaved(saved);
    } catch (err) {
      const e = toCommandError(err);
      setError({ code: e.code, message: e.message });
    } finally {
      setSaving(false);
    }
  };

  // The key goes to the OS keyring through the backend; it is never kept in the UI's state
  // longer than the request, nor in the config.
  const saveKey = async () => {
    if (!apiKey.trim()) return;
    setKeyState({ status: 'saving' });
    try {
      const target = defaultServer(config).path;
      const stored = await platform.invoke('set_api_key', target.length === 1 ? { key: apiKey } : { key: apiKey, provider: target[1] });
      setConfig(stored);
      setApiKey('');
      setKeyState({ status: 'saved' });
      props.onSaved(stored);
    } catch (err) {
      setKeyState({ status: 'error', message: toCommandError(err).message });
    }
  };

  const field = (key: keyof ProviderForm) => (e: Event) => {
    setSaved(false);
    setForm((f) => (f ? { ...f, [key]: (e.target as HTMLInputElement).value } : f));
  };
  const use = (kind: ProviderForm['kind'], base_url: string, model?: string) => {
    setSaved(false);
    setForm((f) => ({ ...(f ?? { kind, base_url, model: '', api_key_env: '', command_policy: 'sandbox' as const }), kind, base_url, model: model ?? f?.model ?? '' }));
  };

  // The models the default server lists (its `test_provider` answer), for the model field.
  const [listed, setListed] = useState<{ status: 'idle' | 'running' } | { status: 'done'; models: string[] } | { status: 'error'; message: string }>({ status: 'idle' });
  const listModels = async () => {
    setListed({ status: 'running' });
    try {
      const result = await platform.invoke('test_provider', { name: defaultServer(config).name });
      setListed({ status: 'done', models: result.models ?? [] });
    } catch (err) {
      setListed({ status: 'error', message: toCommandError(err).message });
    }
  };

  const probed = probe.status === 'done' ? probe.results.filter((r) => r.ok) : [];
  const sameServer = (r: ProbeResult) => form != null && r.base_url.replace(/\/+$/, '') === form.base_url.trim().replace(/\/+$/, '');
  const serverModels = listed.status === 'done' ? listed.models : [];
  const modelOptions = [...new Set([...serverModels, ...[...probed.filter(sameServer), ...probed.filter((r) => !sameServer(r))].flatMap((r) => r.models)])];

  const onKeyDown = (e: KeyboardEvent) => {
    if (e.key === 'Escape') {
      e.preventDefault();
      e.stopPropagation();
      props.onClose();
    }
  };
  // Esc also closes it when the focus fell out of the dialog: a form that closed (Add
  // server, Save) took the focused button with it, and the key then reaches the page,
  // where Esc stops a run (E19). Caught before the page's own handlers see it.
  const closeRef = useRef(props.onClose);
  closeRef.current = props.onClose;
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      if (e.key !== 'Escape' || e.defaultPrevented) return;
      if (box.current && e.target instanceof Node && box.current.contains(e.target)) return;
      e.preventDefault();
      e.stopPropagation();
      closeRef.current();
    };
    window.addEventListener('keydown', onKey, true);
    return () => window.removeEventListener('keydown', onKey, true);
  }, []);
  const running = props.running ?? [];

  return (
    <div class="overlay" onKeyDown={onKeyDown}>
      <div class="dialog settings" role="dialog" aria-modal="true" aria-labelledby="settings-title" tabIndex={-1} ref={box} data-testid="settings-dialog">
        <h2 id="settings-title">{props.welcome ? 'Welcome: choose a model provider' : 'Settings'}</h2>
        {loadError && <ErrorBox message={`Cannot read the settings: ${loadError}`} onRetry={() => void load()} />}
        {running.length > 0 && !props.welcome && (
          <section class="settings-busy" data-testid="settings-busy">
            <span>
              Server and MCP changes wait until these stop ({running.length} running); a session's own model can change any time in its composer:
            </span>
            <ul>
              {running.map((r) => (
                <li key={r.id} data-testid="settings-busy-run" data-session-id={r.id}>
                  <span class="settings-busy-title">{r.title}</span>
                  {props.onStop && (
                    <button type="button" class="quiet" data-testid="settings-busy-stop" onClick={() => props.onStop?.(r.id)}>
                      Stop
                    </button>
                  )}
                </li>
              ))}
            </ul>
          </section>
        )}
        <section class="probe" data-testid="settings-probe-section">
          <div class="row">
            <span>Local model servers (Ollama, LM Studio)</span>
            <button type="button" data-testid="settings-probe" disabled={probe.status === 'running'} onClick={() => void runProbe()}>
              {probe.status === 'running' ? 'Looking…' : 'Look again'}
            </button>
          </div>
          {probe.status === 'unsupported' && (
            <div class="muted" data-testid="probe-unsupported">
              This backend cannot look for local servers yet. Pick one of the usual addresses, or type your own below:
              <div class="row">
                {LOCAL_SERVERS.map((s) => (
                  <button key={s.name} type="button" onClick={() => use(s.kind, s.base_url)} data-testid="probe-use">
                    {s.name} ({s.base_url})
                  </button>
                ))}
              </div>
            </div>
          )}
          {probe.status === 'error' && <ErrorBox message={probe.message} onRetry={() => void runProbe()} />}
          {probe.status === 'done' && probe.results.filter((r) => r.ok).length === 0 && (
            <div class="muted">No local server answered at {LOCAL_SERVERS.map((s) => s.probe).join(' or ')}.</div>
          )}
          {probe.status === 'done' &&
            probe.results
              .filter((r) => r.ok)
              .map((r) => (
                <div key={r.base_url} class="row probe-result">
                  <span>
                    {r.name} at {r.base_url}
                  </span>
                  {r.models.length > 0 ? (
                    r.models.slice(0, 6).map((m) => (
                      <button key={m} type="button" data-testid="probe-use" onClick={() => use(r.kind, r.base_url, m)}>
                        Use {m}
                      </button>
                    ))
                  ) : (
                    <button type="button" data-testid="probe-use" onClick={() => use(r.kind, r.base_url)}>
                      Use
                    </button>
                  )}
                </div>
              ))}
        </section>
        {config && (
          <ModelServers
            platform={platform}
            config={config}
            configured={props.configured ?? null}
            onChanged={(next) => {
              setConfig(next);
              props.onSaved(next);
            }}
          />
        )}
        {!props.welcome && (
          <McpServers
            platform={platform}
            workspace={props.workspace ?? null}
            config={config}
            onChanged={(next) => {
              setConfig(next);
              props.onSaved(next);
            }}
          />
        )}
        {!props.welcome && <SkillsList platform={platform} workspace={props.workspace ?? null} />}
        {!props.welcome && <AgentsList platform={platform} workspace={props.workspace ?? null} />}
        {!props.welcome && <UndoHistory platform={platform} workspace={props.workspace ?? null} />}
        {form && (
          <form
            class="settings-form"
            onSubmit={(e) => {
              e.preventDefault();
              void save();
            }}
          >
            <p class="muted" data-testid="settings-default-block">
              The default server, <strong data-testid="settings-default-name">{defaultServer(config).name}</strong> (top-level sessions use it; Make default
              in the list above chooses another):
            </p>
            <label>
              <span>Provider</span>
              <select value={form.kind} data-testid="settings-kind" onChange={field('kind')}>
                <option value="openai">OpenAI-compatible (OpenAI, Ollama, LM Studio, vLLM…)</option>
                <option value="anthropic">Anthropic</option>
              </select>
            </label>
            <label>
              <span>Base URL</span>
              <input type="url" value={form.base_url} data-testid="settings-base-url" onInput={field('base_url')} placeholder="http://127.0.0.1:11434/v1" />
            </label>
            <label>
              <span>Model</span>
              <input type="text" value={form.model} data-testid="settings-model" onInput={field('model')} list="settings-model-options" placeholder={modelOptions[0] ?? 'e.g. qwen2.5-coder'} />
              {/* The models the probe found (this address's first): a choice, and still free text. */}
              <datalist id="settings-model-options" data-testid="settings-model-options">
                {modelOptions.map((m) => (
                  <option key={m} value={m} />
                ))}
              </datalist>
            </label>
            {config && props.configured !== false && (
              <div class="row model-choices" data-testid="settings-model-choices">
                <button type="button" class="quiet" data-testid="settings-list-models" disabled={listed.status === 'running'} onClick={() => void listModels()}>
                  {listed.status === 'running' ? 'Asking the server…' : 'Models on this server'}
                </button>
                {serverModels.map((m) => (
                  <button key={m} type="button" class={`chip${form.model === m ? ' chosen' : ''}`} data-testid="settings-model-choice" onClick={() => use(form.kind, form.base_url, m)}>
                    {m}
                  </button>
                ))}
                {listed.status === 'done' && serverModels.length === 0 && <span class="muted">The server lists no models (type the name).</span>}
                {listed.status === 'error' && <span class="muted">Cannot ask: {listed.message}</span>}
              </div>
            )}
            <label>
              <span>API key environment variable</span>
              <input type="text" value={form.api_key_env} data-testid="settings-api-key-env" onInput={field('api_key_env')} placeholder="e.g. OPENAI_API_KEY (empty for local servers)" />
            </label>
            <p class="muted">The key itself is never stored here: Bumblehive reads it from that variable or the system keyring.</p>
            <label>
              <span>Shell commands</span>
              <select value={form.command_policy} data-testid="settings-command-policy" onChange={field('command_policy')}>
                <option value="sandbox">In the sandbox; run without asking (ask only for network or writes outside)</option>
                <option value="ask">In the sandbox; ask every time</option>
                <option value="off">Not sandboxed; ask every time</option>
              </select>
            </label>
            <label>
              <span>API key (kept in the system keyring)</span>
              <div class="row">
                <input
                  type="password"
                  autocomplete="off"
                  value={apiKey}
                  data-testid="settings-api-key"
                  onInput={(e) => {
                    setKeyState({ status: 'idle' });
                    setApiKey((e.target as HTMLInputElement).value);
                  }}
                  placeholder="paste a key to store it in the keyring"
                />
                <button type="button" data-testid="settings-api-key-save" disabled={!apiKey.trim() || keyState.status === 'saving'} onClick={() => void saveKey()}>
                  {keyState.status === 'saving' ? 'Storing…' : 'Store in keyring'}
                </button>
              </div>
            </label>
            {keyState.status === 'saved' && (
              <div class="ok" data-testid="settings-api-key-saved">
                Key stored in the system keyring.
              </div>
            )}
            {keyState.status === 'error' && (
              <ErrorBox testid="settings-api-key-error" message={`Key not stored: ${keyState.message}`} onRetry={() => void saveKey()} onDismiss={() => setKeyState({ status: 'idle' })} />
            )}
            {logDir && (
              <p class="muted" data-testid="settings-log-dir">
                Logs: <code>{logDir}</code>
              </p>
            )}
            {about && (
              <p class="muted" data-testid="settings-about">
                About: Bumblehive {about.version}
                {about.commit && (
                  <>
                    {' '}
                    (commit <code>{about.commit}</code>)
                  </>
                )}
              </p>
            )}
            {error && (
              <ErrorBox
                testid="settings-error"
                code={error.code}
                message={
                  error.code === 'busy'
                    ? busyText(error.message)
                    : `Not saved: ${error.message}`
                }
                onRetry={() => void save()}
                onDismiss={() => setError(null)}
              />
            )}
            {saved && (
              <div class="ok" data-testid="settings-saved">
                Saved.
              </div>
            )}
            <div class="dialog-buttons">
              <button type="submit" class="primary" disabled={saving} data-testid="settings-save">
                {saving ? 'Saving…' : 'Save'}
              </button>
              <button type="button" onClick={props.onClose} data-testid="settings-close">
                {props.welcome && !saved ? 'Later' : 'Close'}
              </button>
            </div>
          </form>
        )}
      </div>
    </div>
  );
}
