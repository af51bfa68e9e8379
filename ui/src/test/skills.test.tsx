// Skills and custom commands in the composer (#30): /name completion with descriptions from
// list_skills, a command's arguments expanded by expand_command and sent with its per-turn
// choices, /skill and $skill, and the Settings list.
import { afterEach, describe, expect, it } from 'vitest';
import { namesSkill, skillAt } from '../commands';
import { customCommands, SLASH_COMMANDS } from '../components/SessionPane';
import type { SkillCatalog } from '../bindings/SkillCatalog';
import { $, $$, info, inAct, key, snapshot, typeInto, workspacePlatform } from './fake';
import { mountApp } from './mount';

let unmount: (() => void) | null = null;
afterEach(() => {
  unmount?.();
  unmount = null;
});

const CATALOG: SkillCatalog = {
  skills: [
    { name: 'greet', description: 'Greets the person', path: '/ws/.agents/skills/greet/SKILL.md', scope: 'workspace', source: '/ws/.agents/skills', allowed_tools: ['run_command'], shadowed: ['/home/me/.claude/skills/greet/SKILL.md'] },
    { name: 'release-notes', description: 'Writes release notes', path: '/cfg/skills/release-notes/SKILL.md', scope: 'user', source: '/cfg/skills', allowed_tools: [], shadowed: [] },
    // The same name as a command: the command's /name wins, the skill stays for $name.
    { name: 'fix-issue', description: 'A skill of the same name', path: '/ws/.claude/skills/fix-issue/SKILL.md', scope: 'workspace', source: '/ws/.claude/skills', allowed_tools: [], shadowed: [] },
  ],
  commands: [
    { name: 'fix-issue', description: 'Fix a GitHub issue', argument_hint: 'NUMBER', model: 'small-model', allowed_tools: ['read_file', 'edit_file'], path: '/ws/.claude/commands/fix-issue.md', scope: 'workspace', source: '/ws/.claude/commands', shadowed: [] },
    // A file named like a built-in does not replace it.
    { name: 'compact', description: 'Not the real compact', argument_hint: null, model: null, allowed_tools: null, path: '/ws/.claude/commands/compact.md', scope: 'workspace', source: '/ws/.claude/commands', shadowed: [] },
  ],
  notices: ['/ws/.claude/skills/broken/SKILL.md:3: a list that opens with [ must close with ]'],
};

async function openSession() {
  const fake = workspacePlatform([info('p')]);
  fake.handlers.list_skills = () => CATALOG;
  fake.handlers.expand_command = ({ text }) => {
    if (text.startsWith('/fix-issue')) return { content: `Fix issue #${text.split(' ')[1]}.`, kind: 'command', name: 'fix-issue', model: 'small-model', allowed_tools: ['read_file', 'edit_file'], notices: [] };
    if (text.startsWith('/greet')) return { content: 'GREET-BODY', kind: 'skill', name: 'greet', model: null, allowed_tools: null, notices: [] };
    return { content: `${text}\n\nGREET-BODY`, kind: 'skill', name: 'greet', model: null, allowed_tools: null, notices: [] };
  };
  const mounted = await mountApp(fake, 'p');
  unmount = mounted.unmount;
  await inAct(() => fake.emit('p', snapshot('p')));
  return { fake, root: mounted.root };
}

describe('parsing', () => {
  it('finds the $word at the caret and whether a text names a skill', () => {
    expect(skillAt('use $gr', 7)).toEqual({ query: 'gr', start: 4 });
    expect(skillAt('costs 5$', 8)).toBeNull();
    expect(namesSkill('please $greet me', ['greet'])).toBe(true);
    expect(namesSkill('please $greeting me', ['greet'])).toBe(false);
    expect(namesSkill('$HOME', ['greet'])).toBe(false);
  });

  it('lists commands then skills after the built-ins, each name once', () => {
    const names = customCommands(CATALOG, SLASH_COMMANDS).map((c) => [c.name, c.kind, c.description]);
    expect(names).toEqual([
      ['fix-issue', 'command', 'Fix a GitHub issue (NUMBER)'],
      ['greet', 'skill', 'skill: Greets the person'],
      ['release-notes', 'skill', 'skill: Writes release notes'],
    ]);
  });
});

describe('the composer', () => {
  it('/ completes custom commands and skills with their descriptions; a command goes expanded, with its model and tools for that turn', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => typeInto(input, '/'));
    const items = $$(root, 'slash-item').map((i) => i.dataset.name);
    expect(items).toEqual(['new', 'clear', 'compact', 'model', 'agent', 'fix-issue', 'greet', 'release-notes']);
    await inAct(() => typeInto(input, '/fi'));
    const hints = $$(root, 'slash-item').map((i) => i.textContent);
    expect(hints).toEqual(['/fix-issueFix a GitHub issue (NUMBER)']);
    // Enter names the command (it takes arguments); nothing is sent yet.
    await inAct(() => key(input, 'Enter'));
    expect(input.value).toBe('/fix-issue ');
    expect(fake.callsOf('submit')).toEqual([]);
    await inAct(() => typeInto(input, '/fix-issue 42'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('expand_command')).toEqual([{ workspace: '/ws', text: '/fix-issue 42' }]);
    expect(fake.callsOf('submit')).toEqual([
      { session_id: 'p', content: 'Fix issue #42.', config: { runtime: { model: 'small-model', tools: ['read_file', 'edit_file'] } } },
    ]);
    expect(input.value).toBe('');
  });

  it('/skill sends the skill\'s instructions; $skill completes and goes with them; an unknown /name is sent as typed', async () => {
    const { fake, root } = await openSession();
    const input = $(root, 'prompt-input') as HTMLTextAreaElement;
    await inAct(() => typeInto(input, '/greet'));
    await inAct(() => key(input, 'Enter'));
    expect(input.value).toBe('/greet ');
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'p', content: 'GREET-BODY', config: null });

    await inAct(() => typeInto(input, 'please use $gr'));
    expect($$(root, 'skill-item').map((i) => i.textContent)).toEqual(['$greetskill: Greets the person']);
    await inAct(() => key(input, 'Enter'));
    expect(input.value).toBe('please use $greet ');
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('expand_command').at(-1)).toEqual({ workspace: '/ws', text: 'please use $greet ' });
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'p', content: 'please use $greet \n\nGREET-BODY', config: null });

    // Not a command or a skill: the text goes as it is, no expansion asked.
    const expansions = fake.callsOf('expand_command').length;
    await inAct(() => typeInto(input, '/usr/bin is a folder'));
    await inAct(() => key(input, 'Enter'));
    expect(fake.callsOf('expand_command')).toHaveLength(expansions);
    expect(fake.callsOf('submit').at(-1)).toEqual({ session_id: 'p', content: '/usr/bin is a folder', config: null });
  });
});

describe('Settings', () => {
  it('lists each skill and command with where it came from, what it hides, and the files that could not be read', async () => {
    const { fake, root } = await openSession();
    await inAct(() => $(root, 'settings-button')!.click());
    const section = $(root, 'skills-section')!;
    expect(fake.callsOf('list_skills').at(-1)).toEqual({ workspace: '/ws' });
    const skills = $$(section, 'skill-entry');
    expect(skills.map((s) => s.dataset.name)).toEqual(['greet', 'release-notes', 'fix-issue']);
    expect(skills[0].textContent).toContain('skill · workspace');
    expect($(skills[0], 'skill-source')!.textContent).toBe('/ws/.agents/skills/greet/SKILL.md · names run_command (not pre-approved)');
    expect($(skills[0], 'skill-shadowed')!.textContent).toBe('hides /home/me/.claude/skills/greet/SKILL.md');
    expect(skills[1].textContent).toContain('skill · user');
    const commands = $$(section, 'command-entry');
    expect(commands.map((c) => c.dataset.name)).toEqual(['fix-issue', 'compact']);
    expect($(commands[0], 'command-source')!.textContent).toBe('/ws/.claude/commands/fix-issue.md · model small-model · only read_file, edit_file');
    expect($(section, 'skills-notices')!.textContent).toContain('broken/SKILL.md:3:');
  });
});
