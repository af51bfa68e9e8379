/// <reference types="vite/client" />
// `memo` without preact/compat (issue 31): a component renders again only when a prop
// changed, and the app's bundle no longer installs compat's props hook.
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { describe, expect, it } from 'vitest';
import { memo } from '../memo';

describe('memo', () => {
  it('renders again only when a prop changes, hooks included', async () => {
    let renders = 0;
    const View = memo(function View({ text, tone }: { text: string; tone?: string }) {
      renders++;
      return <p class={tone}>{text}</p>;
    });
    const root = document.createElement('div');
    await act(async () => render(<View text="a" />, root));
    await act(async () => render(<View text="a" />, root));
    expect(renders).toBe(1);
    await act(async () => render(<View text="b" />, root));
    expect(renders).toBe(2);
    await act(async () => render(<View text="b" tone="quiet" />, root));
    expect(renders).toBe(3);
    expect(root.innerHTML).toBe('<p class="quiet">b</p>');
  });

  it('nothing in the app imports preact/compat', () => {
    const sources = import.meta.glob('../**/*.{ts,tsx}', { query: '?raw', import: 'default', eager: true }) as Record<string, string>;
    expect(Object.keys(sources).length).toBeGreaterThan(20);
    const importing = Object.entries(sources)
      .filter(([path]) => !path.includes('/test/'))
      .filter(([, text]) => /from ['"]preact\/compat['"]/.test(text))
      .map(([path]) => path);
    expect(importing).toEqual([]);
  });
});
