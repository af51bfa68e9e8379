// Settings and the model picker, second pass (issue 28, E19; D6, D15, D25): the default
// server's form edits the server that is the default, named servers are edited, the model
// field offers the server's own models, no phantom row before anything is configured, Esc
// closes after "Add server", the runs that keep Settings busy are listed with Stop, and
// the status line names the model of the session on screen.
import { afterEach, describe, expect, it } from 'vitest';
import { merge } from './merge';
import { $, $$, inAct, info, key, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';
import css from '../styles.css?raw';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const CONFIG = {
  provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'qwen2.5-coder' },
  providers: {
    claude: { kind: 'anthropic', base_url: 'https://api.anthropic.com', model: 'claude-sonnet', api_key_keyring: 'claude' },
    local: { kind: 'openai', base_url: 'http://127.0.0.1:8080/v1', model: 'small', max_concurrent: 2 },
  },
  default_provider: 'local',
};

function platform(config: any = CONFIG, sessions = [info('p')]) {
  const fake = workspacePlatform(sessions);
  let current = JSON.parse(JSON.stringify(config));
  fake.handlers.get_config = () => current;
  fake.handlers.update_config = ({ patch }) => {
    current = merge(current, patch);
    return current;
  };
  return fake;
}

async function open(fake: ReturnType<typeof platform>) {
  const mounted = await mountApp(fake, 'p');
  unmount = mounted.unmount;
  await inAct(() => $(mounted.root, 'settings-button')!.click());
  return mounted.root;
}

const rowOf = (root: HTMLElement, name: string) => $$(root, 'server-row').find((r) => r.dataset.name === name)!;

describe('Settings: servers (E19)', () => {
  it('the default server form edits the server that is the default, not the entry named "default"', async () => {
    const fake = platform();
    const root = await open(fake);
    const dialog = $(root, 'settings-dialog')!;
    expect($(dialog, 'settings-default-name')!.textContent).toBe('local');
    expect(($(dialog, 'settings-base-url') as HTMLInputElement).value).toBe('http://127.0.0.1:8080/v1');
    expect(($(dialog, 'settings-model') as HTMLInputElement).value).toBe('small');
    await inAct(() => typeInto($(dialog, 'settings-model')!, 'bigger'));
    await inAct(() => $(dialog, 'settings-save')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({
      patch: { providers: { local: { kind: 'openai', base_url: 'http://127.0.0.1:8080/v1', model: 'bigger', api_key_env: null } } },
    });
    expect($(root, 'status-model')!.textContent).toBe('bigger @ 127.0.0.1:8080');
  });

  it('edits a named server, offering the models its server lists', async () => {
    const fake = platform();
    fake.handlers.test_provider = ({ name }) => ({ ok: false, model: 'claude-sonnet', latency_ms: 3, message: 'not found', models: name === 'claude' ? ['claude-opus-4', 'claude-sonnet-4-5'] : [] });
    const root = await open(fake);
    await inAct(() => $(rowOf(root, 'claude'), 'server-edit')!.click());
    const form = $(root, 'server-add-form')!;
    expect(($(form, 'server-name') as HTMLInputElement).disabled).toBe(true);
    expect(($(form, 'server-model') as HTMLInputElement).value).toBe('claude-sonnet');
    expect(($(form, 'server-kind') as HTMLSelectElement).value).toBe('anthropic');
    await inAct(() => $(form, 'server-list-models')!.click());
    expect(fake.callsOf('test_provider')).toEqual([{ name: 'claude' }]);
    const choices = $$(form, 'server-model-choice');
    expect(choices.map((c) => c.textContent)).toEqual(['claude-opus-4', 'claude-sonnet-4-5']);
    await inAct(() => choices[1].click());
    expect(($(form, 'server-model') as HTMLInputElement).value).toBe('claude-sonnet-4-5');
    await inAct(() => typeInto($(form, 'server-max-concurrent')!, '3'));
    await inAct(() => $(form, 'server-add-save')!.click());
    expect(fake.callsOf('update_config').at(-1)).toEqual({
      patch: { providers: { claude: { kind: 'anthropic', base_url: 'https://api.anthropic.com', model: 'claude-sonnet-4-5', max_concurrent: 3, context_window: null } } },
    });
    expect($(root, 'server-add-form')).toBeNull();
    expect(rowOf(root, 'claude').textContent).toContain('claude-sonnet-4-5');
    // The key it had stays (the patch does not name it).
    expect($(rowOf(root, 'claude'), 'server-key')!.textContent).toBe('keyring');
  });

  it("the default server's form offers its server's models", async () => {
    const fake = platform();
    fake.handlers.test_provider = () => ({ ok: true, model: 'small', latency_ms: 3, message: '', models: ['small', 'qwen2.5-coder-7b'] });
    const root = await open(fake);
    await inAct(() => $(root, 'settings-list-models')!.click());
    expect(fake.callsOf('test_provider')).toEqual([{ name: 'local' }]);
    const choices = $$(root, 'settings-model-choice');
    expect(choices.map((c) => c.textContent)).toEqual(['small', 'qwen2.5-coder-7b']);
    await inAct(() => choices[1].click());
    expect(($(root, 'settings-model') as HTMLInputElement).value).toBe('qwen2.5-coder-7b');
    const options = Array.from($(root, 'settings-model-options')!.querySelectorAll('option')).map((o) => o.value);
    expect(options).toEqual(['small', 'qwen2.5-coder-7b']);
  });

  it('nothing configured: no phantom "default · 127.0.0.1:11434" row (D6)', async () => {
    const fake = platform({ provider: { kind: 'openai', base_url: 'http://127.0.0.1:11434/v1', model: 'qwen2.5-coder' } });
    fake.host = { home_dir: '/home/me', provider_configured: false };
    const root = await open(fake);
    expect($(root, 'model-servers')).not.toBeNull();
    expect($$(root, 'server-row')).toEqual([]);
    expect($(root, 'status-model')!.textContent).toBe('no model configured');
  });

  it('Esc closes Settings after "Add server" took the focus with it, and stops no run', async () => {
    const fake = platform();
    const root = await open(fake);
    await inAct(() => fake.emit('p', snapshot('p', { running: true })));
    await inAct(() => $(root, 'server-add')!.click());
    const form = $(root, 'server-add-form')!;
    await inAct(() => typeInto($(form, 'server-name')!, 'vllm'));
    await inAct(() => typeInto($(form, 'server-base-url')!, 'http://gpu:8000/v1'));
    await inAct(() => typeInto($(form, 'server-model')!, 'qwen'));
    const save = $(form, 'server-add-save')!;
    save.focus();
    await inAct(() => save.click());
    expect($(root, 'server-add-form')).toBeNull();
    // The focused button is gone: the key reaches the page, not the dialog.
    expect(document.activeElement === document.body || !$(root, 'settings-dialog')!.contains(document.activeElement)).toBe(true);
    await inAct(() => key(document.body, 'Escape'));
    expect($(root, 'settings-dialog')).toBeNull();
    expect(fake.callsOf('cancel')).toEqual([]);
  });
});

describe('Settings at 900×600 (E19)', () => {
  it('no field or table is wider than the dialog: selects take the column, the servers table shares it', async () => {
    const style = document.createElement('style');
    style.textContent = css;
    document.head.appendChild(style);
    try {
      const root = await open(platform());
      // The long "Shell commands" choice was cut off and the dialog scrolled sideways.
      const shell = getComputedStyle($(root, 'settings-command-policy')!);
      expect([shell.maxWidth, shell.minWidth, shell.width]).toEqual(['100%', '0', '100%']);
      expect(getComputedStyle(root.querySelector('.model-servers .servers')!).tableLayout).toBe('fixed');
      await inAct(() => $(root, 'mcp-add')!.click());
      expect(getComputedStyle($(root, 'mcp-args')!).maxWidth).toBe('100%');
    } finally {
      style.remove();
    }
  });
});

describe('Settings: what keeps it busy (D15)', () => {
  it('lists the running sessions with a Stop each', async () => {
    const fake = platform(CONFIG, [info('p', { title: 'Refactor the parser', state: 'running' }), info('q', { title: 'Idle one' })]);
    const root = await open(fake);
    await inAct(() => fake.emit('p', snapshot('p', { running: true })));
    const busy = $(root, 'settings-busy')!;
    expect(busy.textContent).toContain('(1 running)');
    const runs = $$(busy, 'settings-busy-run');
    expect(runs.map((r) => r.textContent)).toEqual(['Refactor the parserStop']);
    await inAct(() => $(runs[0], 'settings-busy-stop')!.click());
    expect(fake.callsOf('cancel')).toEqual([{ session_id: 'p' }]);
  });
});

describe('the model picker and the status line (E19)', () => {
  it('the picker lists each server once; the status line names the model of the session on screen', async () => {
    const fake = platform(CONFIG, [info('p', { provider: 'claude' })]);
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() => fake.emit('p', snapshot('p')));
    const picker = $(root, 'model-picker') as HTMLSelectElement;
    expect(Array.from(picker.options).map((o) => o.textContent)).toEqual(['Default · local · small', 'default · qwen2.5-coder', 'claude · claude-sonnet']);
    expect(picker.value).toBe('claude');
    expect($(root, 'status-model')!.textContent).toBe('claude-sonnet @ api.anthropic.com');
  });
});
