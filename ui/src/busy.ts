// The busy refusal (SPEC §6: the config changes only while nothing runs) in words, one
// place for every part of Settings that changes the config (model servers, MCP servers,
// the default server's form).

/**
 * The refusal with what the person can do: stop the runs (Settings lists them with a Stop
 * button each, D15) or wait, or choose a model for one session in its composer, which
 * works at any time.
 */
export function busyText(message: string): string {
  const what = message
    .replace(/^the runtime is busy:\s*/i, '')
    .replace(/;?\s*stop them before changing the config\.?$/i, '')
    .trim();
  return (
    `Settings cannot change while the agent works${what ? ` (${what})` : ''}. ` +
    'Stop those runs (listed at the top of Settings, or Esc in their session) or let them finish, then Retry. ' +
    "To use another model for one session, choose it in that session's composer: that works while others run."
  );
}
