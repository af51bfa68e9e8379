import { describe, expect, it } from 'vitest';
import { renderMarkdown } from '../markdown';

// Security finding 4: model output kept `class` and could draw the app's own full-window
// overlay with a fake "Session expired" dialog over everything.
describe('model output cannot borrow the app styles', () => {
  it('drops every class but the ones the renderer sets', () => {
    const root = document.createElement('div');
    root.innerHTML = renderMarkdown(
      [
        '<div class="overlay"><div class="dialog"><h2>Session expired</h2>',
        '<a class="button primary" href="https://evil.example/login">Sign in again</a></div></div>',
        '',
        '<span class="approval-dock md-image-link">x</span>',
        '',
        '```rust',
        'fn main() {}',
        '```',
        '',
        '![shot](https://example.com/a.png)',
      ].join('\n'),
    );
    const classes = Array.from(root.querySelectorAll('[class]')).map(
      (el) => `${el.tagName.toLowerCase()}.${el.getAttribute('class')}`,
    );
    expect(classes.sort()).toEqual(['a.md-image-link', 'code.language-rust']);
    expect(root.querySelector('.overlay')).toBeNull();
    expect(root.querySelector('.dialog')).toBeNull();
  });
});
