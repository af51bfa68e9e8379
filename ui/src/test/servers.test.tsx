import { afterEach, describe, expect, it } from 'vitest';
import { merge } from './merge';
import { $, $$, inAct, info, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const CONFIG = {
  provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'qwen2.5-coder' },
  providers: {
    claude: { kind: 'anthropic', base_url: 'https://api.anthropic.com', model: 'claude-sonnet', api_key_keyring: 'claude' },
    local: { kind: 'openai', base_url: 'http://127.0.0.1:8080/v1', model: 'small', max_concurrent: 2, context_window: 32768, api_key_env: 'LOCAL_KEY' },
  },
  default_provider: 'local',
};

/** A fake backend whose config follows the merge patches it is sent, as the runtime's does. */
function serversPlatform(config: any = CONFIG) {
  const fake = workspacePlatform([info('p')]);
  let current = JSON.parse(JSON.stringify(config));
  fake.handlers.get_config = () => current;
  fake.handlers.update_config = ({ patch }) => {
    current = merge(current, patch);
    return current;
  };
  fake.handlers.set_api_key = ({ provider, entry }) => {
    current = merge(current, { providers: { [provider]: { api_key_keyring: entry ?? provider } } });
    return current;
  };
  return fake;
}

async function openServers(fake: ReturnType<typeof serversPlatform>) {
  const mounted = await mountApp(fake, 'p');
  unmount = mounted.unmount;
  await inAct(() => $(mounted.root, 'settings-button')!.click());
  return { root: mounted.root, servers: $(mounted.root, 'model-servers')! };
}

const rowOf = (servers: HTMLElement, name: string) => $$(servers, 'server-row').find((r) => r.dataset.name === name)!;

describe('settings: model servers', () => {
  it('lists every provider with its kind, address, model, limits, key and the default marker', async () => {
    const { servers } = await openServers(serversPlatform());
    const rows = $$(servers, 'server-row');
    expect(rows.map((r) => r.dataset.name)).toEqual(['default', 'claude', 'local']);
    expect(rows.map((r) => r.dataset.default ?? null)).toEqual([null, null, 'true']);
    const cells = (r: HTMLElement) => Array.from(r.querySelectorAll('td')).slice(0, 7).map((td) => td.textContent);
    expect(cells(rows[2])).toEqual(['local (default)', 'openai', 'http://127.0.0.1:8080/v1', 'small', '2', '32768', 'variable LOCAL_KEY']);
    expect(cells(rows[1])).toEqual(['claude', 'anthropic', 'https://api.anthropic.com', 'claude-sonnet', '—', 'auto', 'keyring']);
    expect($(rows[0], 'server-key')!.textContent).toBe('none');
    // The default cannot be removed or made default again; the built-in block cannot be removed.
    expect($(rows[2], 'server-remove')).toBeNull();
    expect($(rows[2], 'server-make-default')).toBeNull();
    expect($(rows[0], 'server-remove')).toBeNull();
    expect($(rows[1], 'server-remove')).not.toBeNull();
  });

  it('tests a server: a done mark, model · latency, or the error in words', async () => {
    const fake = serversPlatform();
    fake.handlers.test_provider = ({ name }) =>
      name === 'local'
        ? { ok: true, model: 'small', latency_ms: 120, message: '' }
        : { ok: false, model: 'claude-sonnet', latency_ms: 80, message: 'authentication failed: invalid x-api-key (HTTP 401). Check the API key (its variable or the keyring entry).' };
    const { servers } = await openServers(fake);
    await inAct(() => $(rowOf(servers, 'local'), 'server-test')!.click());
    expect(fake.callsOf('test_provider')).toEqual([{ name: 'local' }]);
    const ok = $(rowOf(servers, 'local'), 'server-test-result')!;
    expect(ok.dataset.ok).toBe('true');
    expect(ok.textContent).toBe(' small · 120 ms');
    // Its mark is an SVG icon, not a font glyph (D13).
    expect(ok.querySelector('svg')).not.toBeNull();
    await inAct(() => $(rowOf(servers, 'claude'), 'server-test')!.click());
    const bad = $(rowOf(servers, 'claude'), 'server-test-result')!;
    expect(bad.dataset.ok).toBe('false');
    expect(bad.textContent).toContain('authentication failed: invalid x-api-key');
    // A backend without the command says so on the row.
    delete fake.handlers.test_provider;
    await inAct(() => $(rowOf(servers, 'default'), 'server-test')!.click());
    expect($(rowOf(servers, 'default'), 'server-test-result')!.textContent).toContain('Cannot test');
  });

  it('adds a server through a merge patch, then stores its key for that server only', async () => {
    const fake = serversPlatform();
    const { root, servers } = await openServers(fake);
    await inAct(() => $(servers, 'server-add')!.click());
    const form = $(servers, 'server-add-form')!;
    // Bad input is refused in words and nothing is sent.
    await inAct(() => typeInto($(form, 'server-name')!, 'local'));
    await inAct(() => $(form, 'server-add-save')!.click());
    expect($(form, 'server-add-error')!.textContent).toContain('exists already');
    await inAct(() => typeInto($(form, 'server-name')!, 'vllm'));
    await inAct(() => typeInto($(form, 'server-base-url')!, 'http://gpu-box:8000/v1'));
    await inAct(() => typeInto($(form, 'server-model')!, 'qwen2.5-coder-32b'));
    await inAct(() => typeInto($(form, 'server-max-concurrent')!, '0'));
    await inAct(() => $(form, 'server-add-save')!.click());
    expect($(form, 'server-add-error')!.textContent).toContain('Parallel requests must be a whole number');
    expect(fake.callsOf('update_config')).toEqual([]);
    await inAct(() => typeInto($(form, 'server-max-concurrent')!, '4'));
    await inAct(() => typeInto($(form, 'server-context-window')!, '65536'));
    await inAct(() => typeInto($(form, 'server-api-key')!, 'sk-vllm-secret'));
    await inAct(() => $(form, 'server-add-save')!.click());
    expect(fake.callsOf('update_config')).toEqual([
      { patch: { providers: { vllm: { kind: 'openai', base_url: 'http://gpu-box:8000/v1', model: 'qwen2.5-coder-32b', max_concurrent: 4, context_window: 65536 } } } },
    ]);
    expect(fake.callsOf('set_api_key')).toEqual([{ key: 'sk-vllm-secret', provider: 'vllm' }]);
    // The key never goes into the config patch.
    expect(JSON.stringify(fake.callsOf('update_config'))).not.toContain('sk-vllm');
    expect($(servers, 'server-add-form')).toBeNull();
    const row = rowOf(servers, 'vllm');
    expect($(row, 'server-key')!.textContent).toBe('keyring');
    // The composer's model picker offers it at once.
    const picker = $(root, 'model-picker') as HTMLSelectElement | null;
    expect(Array.from(picker?.options ?? []).map((o) => o.value)).toContain('vllm');
  });

  it('makes a server the default and removes one, showing busy refusals clearly', async () => {
    const fake = serversPlatform();
    const { root, servers } = await openServers(fake);
    // The status line names the default server's model.
    expect($(root, 'status-model')!.textContent).toBe('small @ 127.0.0.1:8080');
    await inAct(() => $(rowOf(servers, 'claude'), 'server-make-default')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({ patch: { default_provider: 'claude' } });
    expect(rowOf(servers, 'claude').dataset.default).toBe('true');
    expect($(root, 'status-model')!.textContent).toBe('claude-sonnet @ api.anthropic.com');
    expect($(rowOf(servers, 'local'), 'server-remove')).not.toBeNull();
    // The lone block becomes the default again by clearing `default_provider`.
    await inAct(() => $(rowOf(servers, 'default'), 'server-make-default')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({ patch: { default_provider: null } });
    expect(rowOf(servers, 'default').dataset.default).toBe('true');

    const busy = fake.handlers.update_config;
    fake.handlers.update_config = () => {
      throw { error: { code: 'busy', message: 'the runtime is busy: 1 run(s) and 0 sub-agent task(s) are active' } };
    };
    const remove = $(rowOf(servers, 'local'), 'server-remove')!;
    await inAct(() => remove.click());
    await inAct(() => remove.click());
    const error = $(servers, 'servers-error')!;
    expect(error.textContent).toContain('Not removed: stop running sessions first');
    expect(error.textContent).toContain('1 run(s)');
    expect(rowOf(servers, 'local')).toBeDefined();

    fake.handlers.update_config = busy;
    const again = $(rowOf(servers, 'local'), 'server-remove')!;
    await inAct(() => again.click());
    await inAct(() => again.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({ patch: { providers: { local: null } } });
    expect($$(servers, 'server-row').map((r) => r.dataset.name)).toEqual(['default', 'claude']);
  });

  it('a server added while a key cannot be stored stays added and says the key was not stored', async () => {
    const fake = serversPlatform();
    fake.handlers.set_api_key = () => {
      throw { error: { code: 'unavailable', message: 'no Secret Service on this machine' } };
    };
    const { servers } = await openServers(fake);
    await inAct(() => $(servers, 'server-add')!.click());
    const form = $(servers, 'server-add-form')!;
    await inAct(() => typeInto($(form, 'server-name')!, 'hosted'));
    await inAct(() => typeInto($(form, 'server-base-url')!, 'https://api.example.com/v1'));
    await inAct(() => typeInto($(form, 'server-model')!, 'gpt-x'));
    await inAct(() => typeInto($(form, 'server-api-key')!, 'sk-x'));
    await inAct(() => $(form, 'server-add-save')!.click());
    expect($(servers, 'servers-error')!.textContent).toContain('“hosted” was added, but its key was not stored: no Secret Service');
    expect($(rowOf(servers, 'hosted'), 'server-key')!.textContent).toBe('none');
  });
});
