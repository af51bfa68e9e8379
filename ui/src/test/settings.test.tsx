import { afterEach, describe, expect, it } from 'vitest';
import { $, $$, FakePlatform, inAct, info, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

describe('settings', () => {
  it('sets how shell commands run (tools.run_command.sandbox), sending it only when it changed', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.handlers.update_config = ({ patch }) => ({ provider: { ...patch.provider }, tools: patch.tools ?? {} });
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    const dialog = $(mounted.root, 'settings-dialog')!;
    const select = $(dialog, 'settings-command-policy') as HTMLSelectElement;
    expect(select.value).toBe('sandbox');
    await inAct(() => $(dialog, 'settings-save')!.click());
    expect(fake.callsOf('update_config').at(-1)!.patch.tools).toBeUndefined();
    select.value = 'off';
    await inAct(() => select.dispatchEvent(new Event('change', { bubbles: true })));
    await inAct(() => $(dialog, 'settings-save')!.click());
    expect(fake.callsOf('update_config').at(-1)!.patch.tools).toEqual({ run_command: { sandbox: 'off' } });
  });

  it('reads the config, saves a provider patch, and shows busy clearly with Retry', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.handlers.update_config = () => {
      throw { error: { code: 'busy', message: 'the runtime is busy: 1 run(s) and 0 sub-agent task(s) are active' } };
    };
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    const dialog = $(mounted.root, 'settings-dialog')!;
    expect(($(dialog, 'settings-model') as HTMLInputElement).value).toBe('qwen2.5-coder');
    expect(($(dialog, 'settings-kind') as HTMLSelectElement).value).toBe('openai');
    await inAct(() => typeInto($(dialog, 'settings-model')!, 'llama3.1'));
    await inAct(() => typeInto($(dialog, 'settings-api-key-env')!, 'MY_KEY'));
    await inAct(() => $(dialog, 'settings-save')!.click());
    const error = $(dialog, 'settings-error')!;
    expect(error.dataset.code).toBe('busy');
    expect(error.textContent).toContain('cannot change while the agent works (1 run(s) and 0 sub-agent task(s) are active).');
    // What to do instead (D15): stop or wait, or a per-session model in the composer.
    expect(error.textContent).toContain('then Retry');
    expect(error.textContent).toContain("choose it in that session's composer");
    expect(error.textContent).not.toContain('the runtime is busy');

    fake.handlers.update_config = ({ patch }) => ({ provider: { ...patch.provider } });
    await inAct(() => $(error, 'retry')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({
      patch: { provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'llama3.1', api_key_env: 'MY_KEY' } },
    });
    expect($(dialog, 'settings-saved')).not.toBeNull();
    expect($(mounted.root, 'status-model')!.textContent).toBe('llama3.1 @ 127.0.0.1:11434');
  });

  it('stores an API key through the keyring command, shows a keyring error, and shows where the logs are', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.handlers.app_info = () => ({ version: '0.1.0', commit: 'f9d3a0e1b2', log_dir: '/data/bumblehive/logs' });
    fake.handlers.set_api_key = () => {
      throw { error: { code: 'unavailable', message: 'no Secret Service on this machine' } };
    };
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    const dialog = $(mounted.root, 'settings-dialog')!;
    expect($(dialog, 'settings-log-dir')!.textContent).toContain('/data/bumblehive/logs');
    // The About line names the version and the commit the build came from.
    expect($(dialog, 'settings-about')!.textContent).toBe('About: Bumblehive 0.1.0 (commit f9d3a0e1b2)');
    await inAct(() => typeInto($(dialog, 'settings-api-key')!, 'sk-secret'));
    await inAct(() => $(dialog, 'settings-api-key-save')!.click());
    expect(fake.callsOf('set_api_key').at(-1)).toEqual({ key: 'sk-secret' });
    expect($(dialog, 'settings-api-key-error')!.textContent).toContain('no Secret Service');
    fake.handlers.set_api_key = () => ({ provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'm', api_key_keyring: 'openai' } });
    await inAct(() => $($(dialog, 'settings-api-key-error')!, 'retry')!.click());
    expect($(dialog, 'settings-api-key-saved')).not.toBeNull();
    // The key does not stay in the form.
    expect(($(dialog, 'settings-api-key') as HTMLInputElement).value).toBe('');
    expect(JSON.stringify(fake.callsOf('update_config'))).not.toContain('sk-secret');
  });

  it('first start offers local servers; without probe_providers it says so and offers the usual addresses', async () => {
    const fake = workspacePlatform([info('p')]);
    const mounted = await mountApp(fake, null, { welcome: true });
    unmount = mounted.unmount;
    const dialog = $(mounted.root, 'settings-dialog')!;
    expect(dialog.textContent).toContain('Welcome');

    expect($(dialog, 'probe-unsupported')).not.toBeNull();
    const use = $$(dialog, 'probe-use');
    expect(use.map((b) => b.textContent)).toEqual(['Ollama (http://127.0.0.1:11434/v1)', 'LM Studio (http://127.0.0.1:1234/v1)']);
    await inAct(() => use[1].click());
    expect(($(dialog, 'settings-base-url') as HTMLInputElement).value).toBe('http://127.0.0.1:1234/v1');
    // "Later" closes the offer for good; Settings stays reachable.
    await inAct(() => $(dialog, 'settings-close')!.click());
    expect($(mounted.root, 'setup-banner')).toBeNull();
    expect(localStorage.getItem('bumblehive.providerChecked')).toBe('1');
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    expect($(mounted.root, 'settings-dialog')!.textContent).not.toContain('Welcome');
  });

  it('uses what probe_providers finds', async () => {
    const fake = workspacePlatform([info('p')]);
    (fake as FakePlatform).probe = [
      { name: 'Ollama', kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', ok: true, models: ['qwen2.5-coder:7b', 'llama3'] },
      { name: 'LM Studio', kind: 'openai', base_url: 'http://127.0.0.1:1234/v1', ok: false, models: [] },
    ];
    const mounted = await mountApp(fake, null, { welcome: true });
    unmount = mounted.unmount;
    const dialog = $(mounted.root, 'settings-dialog')!;
    const use = $$(dialog, 'probe-use');
    expect(use.map((b) => b.textContent)).toEqual(['Use qwen2.5-coder:7b', 'Use llama3']);
    await inAct(() => use[1].click());
    expect(($(dialog, 'settings-model') as HTMLInputElement).value).toBe('llama3');
  });
});

describe('the set-up form tells the truth (D25)', () => {
  it("with nothing configured the form is empty, not the runtime's default; the probed models are offered for the model field; Save without a server says why", async () => {
    const fake = workspacePlatform([info('p')]);
    fake.probe = [
      { name: 'LM Studio', kind: 'openai', base_url: 'http://127.0.0.1:1234/v1', ok: true, models: ['qwen2.5-coder-0.5b'] },
      { name: 'Ollama', kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', ok: true, models: ['llama3', 'qwen2.5-coder-0.5b'] },
    ];
    fake.handlers.update_config = ({ patch }) => ({ provider: { ...patch.provider } });
    const mounted = await mountApp(fake, null, { welcome: true });
    unmount = mounted.unmount;
    const dialog = $(mounted.root, 'settings-dialog')!;
    expect(($(dialog, 'settings-base-url') as HTMLInputElement).value).toBe('');
    expect(($(dialog, 'settings-model') as HTMLInputElement).value).toBe('');
    await inAct(() => $(dialog, 'settings-save')!.click());
    expect(fake.callsOf('update_config')).toEqual([]);
    expect($(dialog, 'settings-error')!.textContent).toContain('choose a model server first');
    // The model field lists what the probe found, the typed server's models first.
    await inAct(() => typeInto($(dialog, 'settings-base-url')!, 'http://127.0.0.1:11434/v1'));
    const options = () => Array.from($(dialog, 'settings-model-options')!.querySelectorAll('option')).map((o) => o.value);
    expect(options()).toEqual(['llama3', 'qwen2.5-coder-0.5b']);
    expect(($(dialog, 'settings-model') as HTMLInputElement).getAttribute('list')).toBe('settings-model-options');
    await inAct(() => typeInto($(dialog, 'settings-model')!, 'llama3'));
    await inAct(() => $(dialog, 'settings-save')!.click());
    expect(fake.callsOf('update_config')).toEqual([{ patch: { provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'llama3', api_key_env: null } } }]);
    // Saved: the button no longer says "Later".
    expect($(dialog, 'settings-close')!.textContent).toBe('Close');
  });

  it('a configured provider is shown as it is', async () => {
    const fake = workspacePlatform([info('p')]);
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    await inAct(() => $(mounted.root, 'settings-button')!.click());
    expect(($(mounted.root, 'settings-base-url') as HTMLInputElement).value).toBe('http://127.0.0.1:11434/v1');
  });
});

describe('workspace picker', () => {
  it('opens a typed path, remembers it as recent, and starts a new conversation with the first message', async () => {
    const fake = new FakePlatform({
      list_sessions: () => [],
      get_config: () => ({ provider: { model: 'm', base_url: 'http://h:1/v1' } }),
      create_session: ({ workspace, title }) => info('new', { workspace, title }),
      get_session: () => ({ info: info('new'), messages: [] }),
      submit: () => ({ message_id: 'msg-1', status: 'started' }),
    });
    const mounted = await mountApp(fake, null);
    unmount = mounted.unmount;
    const picker = $(mounted.root, 'workspace-picker')!;
    await inAct(() => typeInto($(picker, 'workspace-path-input')!, '/home/me/proj'));
    await inAct(() => $(picker, 'workspace-path-submit')!.click());
    expect(fake.callsOf('list_sessions')).toEqual([{ workspace: '/home/me/proj' }]);
    expect(JSON.parse(localStorage.getItem('bumblehive.recentWorkspaces')!)).toEqual(['/home/me/proj']);

    await inAct(() => typeInto($(mounted.root, 'prompt-input')!, 'Fix the tests\nplease'));
    await inAct(() => $(mounted.root, 'send-button')!.click());
    expect(fake.callsOf('create_session')).toEqual([{ workspace: '/home/me/proj', title: 'Fix the tests' }]);
    expect(fake.callsOf('submit')).toEqual([{ session_id: 'new', content: 'Fix the tests\nplease', config: null }]);
    expect(fake.streams.has('new')).toBe(true);
    expect($(mounted.root, 'session-pane')!.dataset.sessionId).toBe('new');
  });

  it("sends a new conversation's first message only once its events can reach the chat", async () => {
    const fake = new FakePlatform({
      list_sessions: () => [],
      get_config: () => ({ provider: { model: 'm', base_url: 'http://h:1/v1' } }),
      create_session: ({ workspace, title }) => info('new', { workspace, title }),
      get_session: () => ({ info: info('new'), messages: [] }),
      submit: () => ({ message_id: 'msg-1', status: 'started' }),
    });
    fake.workspace = '/ws';
    fake.autoOpen = false;
    const mounted = await mountApp(fake, null);
    unmount = mounted.unmount;
    await inAct(() => typeInto($(mounted.root, 'prompt-input')!, 'Hello'));
    await inAct(() => $(mounted.root, 'send-button')!.click());
    expect(fake.callsOf('create_session')).toHaveLength(1);
    expect(fake.callsOf('submit')).toEqual([]);
    await inAct(() => fake.streams.get('new')!.onStatus!('open'));
    expect(fake.callsOf('submit')).toEqual([{ session_id: 'new', content: 'Hello', config: null }]);
  });
});
