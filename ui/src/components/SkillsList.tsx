// Settings' skills and custom commands section (#30): each one with where it came from, the
// copies of the same name it hides, and the files that could not be read.
import { useEffect, useState } from 'preact/hooks';
import type { SkillCatalog } from '../bindings/SkillCatalog';
import { toCommandError, type Platform } from '../platform';

export function SkillsList(props: { platform: Platform; workspace: string | null }) {
  const { platform, workspace } = props;
  const [catalog, setCatalog] = useState<SkillCatalog | null>(null);
  const [error, setError] = useState<string | null>(null);

  const load = async () => {
    if (!workspace) return;
    try {
      setCatalog(await platform.invoke('list_skills', { workspace }));
      setError(null);
    } catch (err) {
      setError(toCommandError(err).message);
    }
  };
  useEffect(() => {
    void load();
  }, [workspace]);

  // Skills are a workspace's (and the person's): without an open workspace there is no list.
  if (!workspace) return null;
  return (
    <section class="skills-list" data-testid="skills-section">
      <div class="row">
        <span>Skills and commands</span>
        <button type="button" data-testid="skills-refresh" onClick={() => void load()}>
          Refresh
        </button>
      </div>
      {error && (
        <div class="muted" data-testid="skills-error">
          {error}
        </div>
      )}
      {catalog && catalog.skills.length === 0 && catalog.commands.length === 0 && (
        <div class="muted" data-testid="skills-none">
          None found: add a folder with a <code>SKILL.md</code> to <code>.agents/skills/</code>, or a Markdown file to <code>.bumblehive/commands/</code>.
        </div>
      )}
      {catalog?.skills.map((s) => (
        <div key={`skill:${s.name}`} class="skill-entry" data-testid="skill-entry" data-name={s.name}>
          <div class="row">
            <strong>{s.name}</strong>
            <span class="muted">skill · {s.scope}</span>
            <span>{s.description}</span>
          </div>
          <div class="muted small" data-testid="skill-source" title={s.path}>
            {s.path}
            {s.allowed_tools.length > 0 && ` · names ${s.allowed_tools.join(', ')} (not pre-approved)`}
          </div>
          {s.shadowed.length > 0 && (
            <div class="muted small" data-testid="skill-shadowed">
              hides {s.shadowed.join(', ')}
            </div>
          )}
        </div>
      ))}
      {catalog?.commands.map((c) => (
        <div key={`command:${c.name}`} class="skill-entry" data-testid="command-entry" data-name={c.name}>
          <div class="row">
            <strong>/{c.name}</strong>
            <span class="muted">command · {c.scope}</span>
            <span>{c.description}</span>
          </div>
          <div class="muted small" data-testid="command-source" title={c.path}>
            {c.path}
            {c.model && ` · model ${c.model}`}
            {c.allowed_tools && ` · only ${c.allowed_tools.join(', ')}`}
          </div>
          {c.shadowed.length > 0 && (
            <div class="muted small" data-testid="command-shadowed">
              hides {c.shadowed.join(', ')}
            </div>
          )}
        </div>
      ))}
      {catalog && catalog.notices.length > 0 && (
        <ul class="skills-notices" data-testid="skills-notices">
          {catalog.notices.map((n) => (
            <li key={n} class="error-text small">
              {n}
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
