// A first run that tells the truth (D6, D7): the offer follows the config, set-up is
// reachable from the first screen and before the first send; provider errors lead somewhere.
import { afterEach, describe, expect, it } from 'vitest';
import { $, info, inAct, kind, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

describe('first run', () => {
  it('with no provider configured: offered on the picker, the default is not shown as a choice, and sending opens the set-up keeping the text', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.workspace = null;
    fake.host = { home_dir: '/home/me', provider_configured: false };
    fake.probe = [];
    const mounted = await mountApp(fake, null);
    unmount = mounted.unmount;
    const root = mounted.root;
    expect($(root, 'picker-setup')).not.toBeNull();
    expect($(root, 'status-model')!.textContent).toBe('no model configured');
    await inAct(() => typeInto($(root, 'workspace-path-input')!, '/ws'));
    await inAct(() => $(root, 'workspace-path-submit')!.click());
    expect($(root, 'setup-banner')).not.toBeNull();
    await inAct(() => typeInto($(root, 'prompt-input')!, 'hello there'));
    await inAct(() => $(root, 'send-button')!.click());
    expect(fake.callsOf('create_session')).toEqual([]);
    expect(fake.callsOf('submit')).toEqual([]);
    expect($(root, 'settings-dialog')).not.toBeNull();
    expect($(root, 'composer-error')!.textContent).toContain('Choose a model first');
    expect(($(root, 'prompt-input') as HTMLTextAreaElement).value).toBe('hello there');
    // "Later": the default address is tried; the set-up is offered, not forced.
    await inAct(() => $(root, 'settings-close')!.click());
    fake.handlers.create_session = ({ workspace, title }) => info('new', { workspace, title });
    await inAct(() => $(root, 'send-button')!.click());
    expect(fake.callsOf('create_session')).toEqual([{ workspace: '/ws', title: 'hello there' }]);
  });

  it('a config that names a provider is set up, whatever this browser remembers', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.host = { home_dir: '/home/me', provider_configured: true };
    // A fresh browser profile: no "setup done" flag (mountApp clears storage).
    const mounted = await mountApp(fake, 'p', {});
    unmount = mounted.unmount;
    localStorage.clear();
    expect($(mounted.root, 'setup-banner')).toBeNull();
    expect($(mounted.root, 'status-model')!.textContent).toBe('qwen2.5-coder @ 127.0.0.1:11434');
  });

  it('a provider error offers Open settings and Retry (which sends the last message again)', async () => {
    const fake = workspacePlatform([info('p')], { p: [{ role: 'user', content: 'summarise', id: 'm1' }] });
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    const root = mounted.root;
    await inAct(() =>
      fake.emit('p', snapshot('p', { running: true }), kind('p', 'content.delta', { text: '' }), {
        type: 'error',
        session_id: 'p',
        message: 'network error: cannot connect to the model server: Connection refused (os error 111)',
      }),
    );
    const note = $(root, 'run-error')!;
    await inAct(() => $(note, 'error-open-settings')!.click());
    expect($(root, 'settings-dialog')).not.toBeNull();
    await inAct(() => $(note, 'error-retry')!.click());
    expect(fake.callsOf('submit')).toEqual([{ session_id: 'p', content: 'summarise', config: null }]);
  });
});

describe('sandbox notice', () => {
  it('says once, clearly, that commands cannot be sandboxed here and that every command asks', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.host = { home_dir: '/home/me', provider_configured: true };
    fake.handlers.app_info = () => ({
      version: '0.1.0',
      commit: 'x',
      sandbox: { available: false, reason: 'bwrap is not installed', policy: 'sandbox', kind: 'bubblewrap' },
    });
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    const banner = $(mounted.root, 'sandbox-banner')!;
    expect(banner.textContent).toContain('bwrap is not installed');
    expect(banner.textContent).toContain('Every command will ask');
    await inAct(() => $(mounted.root, 'sandbox-dismiss')!.click());
    expect($(mounted.root, 'sandbox-banner')).toBeNull();
  });

  it('says nothing where the sandbox works', async () => {
    const fake = workspacePlatform([info('p')]);
    fake.host = { home_dir: '/home/me', provider_configured: true };
    fake.handlers.app_info = () => ({ version: '0.1.0', sandbox: { available: true, policy: 'sandbox', kind: 'bubblewrap' } });
    const mounted = await mountApp(fake, 'p');
    unmount = mounted.unmount;
    expect($(mounted.root, 'sandbox-banner')).toBeNull();
  });
});
