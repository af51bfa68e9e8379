import { render } from 'preact';
import { act } from 'preact/test-utils';
import { App } from '../components/App';
import { forgetScrollPositions } from '../components/Chat';
import { forgetUnsent } from '../components/Composer';
import { SETUP_KEY } from '../util';
import { settle, type FakePlatform } from './fake';

/** Renders the whole app on the fake platform, opened on `/ws` and the given session. */
export async function mountApp(fake: FakePlatform, sessionId: string | null, options: { welcome?: boolean } = {}) {
  localStorage.clear();
  forgetScrollPositions();
  forgetUnsent();
  // The first-start offer follows the config: a welcome run has no provider configured.
  if (options.welcome) fake.host = { ...fake.host, provider_configured: false };
  if (!options.welcome) localStorage.setItem(SETUP_KEY, '1');
  if (sessionId) localStorage.setItem('bumblehive.lastSession:/ws', sessionId);
  document.body.innerHTML = '';
  const root = document.createElement('div');
  document.body.appendChild(root);
  await act(async () => {
    render(<App platform={fake} notifyDelay={0} />, root);
  });
  await settle();
  if (options.welcome) {
    const open = root.querySelector('[data-testid="setup-open"]') as HTMLElement | null;
    if (!open) throw new Error('no first-start offer');
    await act(async () => open.click());
    await settle();
  }
  return {
    root,
    unmount: () => render(null, root),
  };
}
