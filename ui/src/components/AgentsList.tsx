// Settings' agent profiles section (#29): every profile the composer's /agent offers, with
// what runs it (a model, or an external ACP agent's command) and where it came from; an
// ACP agent that is not installed says what to install before a child fails on it.
import { useEffect, useState } from 'preact/hooks';
import type { Profile } from '../bindings/Profile';
import type { Profiles } from '../bindings/Profiles';
import { toCommandError, type Platform } from '../platform';

/** What runs a profile's children, in words. */
export function runsOn(p: Profile): string {
  if (p.acp) return `ACP agent: ${[p.acp.command, ...p.acp.args].join(' ')}`;
  if (p.provider || p.model) return `model ${[p.provider, p.model].filter(Boolean).join(' · ')}`;
  return "the session's model";
}

export function AgentsList(props: { platform: Platform; workspace: string | null }) {
  const { platform, workspace } = props;
  const [list, setList] = useState<Profiles | null>(null);
  const [error, setError] = useState<string | null>(null);

  const load = async () => {
    if (!workspace) return;
    try {
      setList(await platform.invoke('list_agents', { workspace }));
      setError(null);
    } catch (err) {
      setError(toCommandError(err).message);
    }
  };
  useEffect(() => {
    void load();
  }, [workspace]);

  // Profiles are a workspace's (and the person's): without an open workspace there is no list.
  if (!workspace) return null;
  return (
    <section class="skills-list" data-testid="agents-section">
      <div class="row">
        <span>Agent profiles</span>
        <button type="button" data-testid="agents-refresh" onClick={() => void load()}>
          Refresh
        </button>
      </div>
      {error && (
        <div class="muted" data-testid="agents-error">
          {error}
        </div>
      )}
      {list?.profiles.map((p) => (
        <div key={p.name} class="skill-entry" data-testid="agent-entry" data-name={p.name}>
          <div class="row">
            <strong>{p.name}</strong>
            <span class="muted" data-testid="agent-runs">
              {runsOn(p)}
            </span>
            <span>{p.description}</span>
          </div>
          <div class="muted small" title={p.source}>
            {p.source}
          </div>
          {p.notices.map((n) => (
            <div key={n} class={n.includes('not installed') ? 'error-text small' : 'muted small'} data-testid="agent-notice">
              {n}
            </div>
          ))}
        </div>
      ))}
      {list && list.errors.length > 0 && (
        <ul class="skills-notices" data-testid="agents-errors">
          {list.errors.map((n) => (
            <li key={n} class="error-text small">
              {n}
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
