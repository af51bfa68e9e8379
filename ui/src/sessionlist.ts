// The session list kept from the list feed (`SessionListEvent`): the whole list replaces
// what was shown, a changed session replaces its entry (or joins in creation order), a
// removed one leaves. Pure, so the sidebar's list follows the runtime without asking.

import type { SessionInfo } from './bindings/SessionInfo';
import type { SessionListEvent } from './bindings/SessionListEvent';

export function applyListEvent(list: SessionInfo[], event: SessionListEvent): SessionInfo[] {
  switch (event.type) {
    case 'listed':
      return event.sessions;
    case 'changed': {
      const session = event.session;
      const at = list.findIndex((s) => s.session_id === session.session_id);
      if (at >= 0) {
        const next = list.slice();
        next[at] = session;
        return next;
      }
      // Ids are UUIDv7: their order is the creation order the runtime lists in.
      const after = list.findIndex((s) => s.session_id > session.session_id);
      const next = list.slice();
      next.splice(after < 0 ? next.length : after, 0, session);
      return next;
    }
    case 'removed': {
      const next = list.filter((s) => s.session_id !== event.session_id);
      return next.length === list.length ? list : next;
    }
  }
}
