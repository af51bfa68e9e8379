// The model's plan (issue 29): an update_plan call shows as a checklist in the chat; a
// plan the tool refused shows as the call it was.
import { render } from 'preact';
import { describe, expect, it } from 'vitest';
import { planSteps, ToolCard } from '../components/ToolCard';

const call = (args: unknown) => ({ id: 'p1', name: 'update_plan', arguments: args }) as any;
const plan = { plan: [{ step: 'Read the code', status: 'completed' }, { step: 'Fix the bug', status: 'in_progress' }, { step: 'Run the tests', status: 'pending' }] };

function show(props: Parameters<typeof ToolCard>[0]) {
  const host = document.createElement('div');
  render(<ToolCard {...props} />, host);
  return host;
}

describe('the plan', () => {
  it('shows every step with its status, and how many are done', () => {
    const host = show({ call: call(plan), result: { text: 'Plan updated: 1 of 3 steps completed.', isError: false } });
    const steps = Array.from(host.querySelectorAll('[data-testid=plan-step]'));
    expect(steps.map((s) => [s.textContent?.replace(/^\S+\s*/, ''), s.getAttribute('data-status')])).toEqual([
      ['Read the code', 'completed'],
      ['Fix the bug', 'in_progress'],
      ['Run the tests', 'pending'],
    ]);
    expect(host.querySelector('.plan-count')?.textContent).toBe('1 of 3 done');
    expect(host.querySelector('[data-testid=tool-card]')).toBeNull();
  });
  it('shows a refused plan as the tool call it was, with its error', () => {
    const bad = { plan: [{ step: 'a', status: 'in_progress' }, { step: 'b', status: 'in_progress' }] };
    const host = show({ call: call(bad), result: { text: 'Error: invalid arguments: 2 steps are in_progress: at most one may be', isError: true } });
    expect(host.querySelector('[data-testid=plan]')).toBeNull();
    expect(host.querySelector('[data-testid=tool-card]')?.getAttribute('data-state')).toBe('error');
  });
  it('reads only well-formed steps', () => {
    expect(planSteps(plan)?.length).toBe(3);
    expect(planSteps({ plan: [] })).toBeNull();
    expect(planSteps({ plan: [{ step: 'a', status: 'started' }] })).toBeNull();
    expect(planSteps(null)).toBeNull();
  });
});
