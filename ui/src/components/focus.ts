// Where keyboard focus goes back to: the composer of the pane on screen (E16).

/**
 * Focuses the composer on screen (the open tab's). With `onlyIfLost`, only when focus is
 * nowhere (on the body, or on an element that was removed: the approval dock after a
 * decision, a dialog that closed); a person typing elsewhere keeps their place.
 */
export function focusComposer(onlyIfLost = true): void {
  const active = document.activeElement as HTMLElement | null;
  if (onlyIfLost && active && active !== document.body && active.isConnected) return;
  const input = document.querySelector('.session-pane [data-testid="prompt-input"]') as HTMLTextAreaElement | null;
  if (input && !input.disabled) input.focus();
}
