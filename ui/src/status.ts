// One live state per session, for every place that shows one (E4, E5): the sidebar's icon,
// the tab chip, the child's header, the `sub_agent` card, the status line's counts and the
// quit guard all read `liveStates`. It joins the two things the UI hears: the runtime's
// events (folded per tree in model.ts's `RootAttention`: `subagent.state`, `slot.waiting`,
// runs starting and ending) and the session list (`SessionInfo`: what is stored, after a
// restart too: `interrupted`, `failed`, paused or idle). Events are newer than the list
// while a tree is watched; the list speaks for what no event has said.

import type { SessionInfo } from './bindings/SessionInfo';
import type { SubagentState } from './bindings/SubagentState';
import type { IconName } from './components/Icon';
import type { RootAttention } from './model';

/**
 * waiting: a sub-agent (or a run) waits for a free slot (the children cap, or its model
 * server's requests at once); running; interrupted: cut off by a quit or crash, resumable;
 * failed; stopped: the person stopped it; done: a sub-agent that reported; idle: a
 * conversation between turns.
 */
export type LiveState = 'waiting' | 'running' | 'interrupted' | 'failed' | 'stopped' | 'done' | 'idle';

/** The word and the icon of each state: the same everywhere. */
export const LIVE: Record<LiveState, { label: string; icon: IconName }> = {
  waiting: { label: 'waiting for a slot', icon: 'waiting' },
  running: { label: 'running', icon: 'running' },
  interrupted: { label: 'interrupted (can resume)', icon: 'resume' },
  failed: { label: 'failed', icon: 'failed' },
  stopped: { label: 'stopped', icon: 'paused' },
  done: { label: 'done', icon: 'done' },
  idle: { label: 'idle', icon: 'idle' },
};

/** Whether a state is work in progress (the status line counts it; quitting asks first). */
export const isActive = (s: LiveState | undefined) => s === 'running' || s === 'waiting';

/** What the events said of a session. */
export interface LiveFacts {
  /** A sub-agent's last `subagent.state` (or its snapshot entry, or a report's arrival). */
  sub?: SubagentState;
  /** Its next model call waits for a slot of its server (`slot.waiting`, until it streams). */
  slot?: boolean;
  /** A top-level session's own run, when its tree is watched. */
  running?: boolean;
}

/** A sub-agent's state from what the events said, else from what the list stores. */
export function childState(facts: LiveFacts, info: SessionInfo | undefined): LiveState {
  switch (facts.sub) {
    case 'waiting_for_slot':
      return 'waiting';
    case 'running':
      return facts.slot ? 'waiting' : 'running';
    case 'done':
      return 'done';
    case 'failed':
      return 'failed';
    case 'cancelled':
      // Shut down by a quit: the list says it is resumable.
      return info?.interrupted ? 'interrupted' : 'stopped';
  }
  if (!info) return 'waiting';
  if (info.interrupted) return 'interrupted';
  if (info.state === 'running') return facts.slot ? 'waiting' : 'running';
  if (info.state === 'paused') return info.failed === false ? 'stopped' : 'failed';
  return 'done';
}

/** A top-level session's state: its run from the events when watched, else the list's. */
export function rootState(facts: LiveFacts, info: SessionInfo | undefined): LiveState {
  const running = facts.running ?? info?.state === 'running';
  if (running) return facts.slot ? 'waiting' : 'running';
  if (info?.state === 'paused') return info.failed ? 'failed' : 'stopped';
  return 'idle';
}

/**
 * The live state of every session the list or a watched tree knows. `roots` are the trees
 * whose events the window hears (the open one and the live ones in the background).
 */
export function liveStates(sessions: SessionInfo[], roots: RootAttention[]): Record<string, LiveState> {
  const infos = new Map(sessions.map((s) => [s.session_id, s]));
  const facts = new Map<string, LiveFacts>();
  const childIds = new Set<string>();
  for (const root of roots) {
    facts.set(root.rootId, { running: root.running, slot: root.slots.includes(root.rootId) });
    for (const [id, child] of Object.entries(root.children)) {
      childIds.add(id);
      facts.set(id, { sub: child.state, slot: root.slots.includes(id) });
    }
  }
  const out: Record<string, LiveState> = {};
  for (const s of sessions) {
    const f = facts.get(s.session_id) ?? {};
    out[s.session_id] = s.parent_session_id || childIds.has(s.session_id) ? childState(f, s) : rootState(f, s);
  }
  // Trees and children the list does not have yet (just created).
  for (const [id, f] of facts) if (!(id in out)) out[id] = childIds.has(id) ? childState(f, infos.get(id)) : rootState(f, infos.get(id));
  return out;
}

/** How many sessions work now and how many wait for a slot (the status line; the quit guard). */
export function countStates(states: Record<string, LiveState>): { running: number; waiting: number } {
  let running = 0;
  let waiting = 0;
  for (const s of Object.values(states)) {
    if (s === 'running') running++;
    else if (s === 'waiting') waiting++;
  }
  return { running, waiting };
}
