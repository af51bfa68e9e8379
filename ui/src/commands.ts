// Slash commands and @-mentions of the composer: parsing and matching, pure (tested).

export interface SlashCommand {
  name: string;
  description: string;
  /** False: shown as "coming" and never run (the runtime has no command for it yet). */
  available: boolean;
  /** Why it cannot run now (default: the runtime has no command for it yet). */
  reason?: string;
  /** Values its argument can take (`/agent explore`): offered as the person types. */
  choices?: { value: string; hint: string }[];
  /** A custom command or a skill (from `list_skills`): picking it puts `/name ` in the field for its arguments. */
  kind?: 'command' | 'skill';
}

/** The `$word` the caret is in (a skill named in a message), with where it starts. */
export function skillAt(text: string, caret: number): { query: string; start: number } | null {
  const before = text.slice(0, caret);
  const match = /(^|\s)\$([\w.-]*)$/.exec(before);
  if (!match) return null;
  return { query: match[2], start: before.length - match[2].length - 1 };
}

/** Whether the text names one of `skills` as `$name` (Codex's way), outside a `/command`. */
export function namesSkill(text: string, skills: string[]): boolean {
  return skills.some((name) => new RegExp(`(^|\\s)\\$${name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?![\\w-])`).test(text));
}

/** The word being typed when the text is a slash command (`/ne` → `ne`), else null. */
export function slashQuery(text: string): string | null {
  const match = /^\/([\w.-]*)$/.exec(text);
  return match ? match[1].toLowerCase() : null;
}

/** The command a finished line names (`/new`, `/agent Reviewer`), else null. */
export function parseSlash(text: string): { name: string; arg: string } | null {
  const match = /^\/([\w.-]+)(?:\s+(.*))?$/s.exec(text.trim());
  return match ? { name: match[1].toLowerCase(), arg: (match[2] ?? '').trim() } : null;
}

/** The command and partial argument being typed (`/agent ex` → agent, ex), else null. */
export function argumentQuery(text: string): { name: string; query: string } | null {
  const match = /^\/([\w-]+)\s+(\S*)$/.exec(text);
  return match ? { name: match[1].toLowerCase(), query: match[2].toLowerCase() } : null;
}

export function matchCommands(commands: SlashCommand[], query: string): SlashCommand[] {
  return commands.filter((c) => c.name.toLowerCase().startsWith(query));
}

/** The `@word` the caret is in, with where it starts: `look at @src/ma|` → `src/ma`. */
export function mentionAt(text: string, caret: number): { query: string; start: number } | null {
  const before = text.slice(0, caret);
  const match = /(^|\s)@([^\s@]*)$/.exec(before);
  if (!match) return null;
  return { query: match[2], start: before.length - match[2].length - 1 };
}

/** Replaces the `@query` at `start` with `@path ` and says where the caret goes. */
export function insertMention(text: string, start: number, caret: number, path: string): { text: string; caret: number } {
  const inserted = `@${path} `;
  const next = text.slice(0, start) + inserted + text.slice(caret).replace(/^\s+/, '');
  return { text: next, caret: start + inserted.length };
}
