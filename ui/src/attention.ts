// The hook over the pure attention state of model.ts: one background feed per live
// top-level session (the selected one's events come from its SessionModel instead),
// OS notifications while the window is not focused and the window title. The close guard
// follows the live states (status.ts), in App.

import { useCallback, useEffect, useMemo, useRef, useState } from 'preact/hooks';
import type { Event as WireEvent } from './bindings/Event';
import type { SessionInfo } from './bindings/SessionInfo';
import { acknowledge, emptyRoot, forgetSession, reduceRoot, rootsToWatch, summarize, windowTitle, type Alert, type AttentionSummary, type RootAttention } from './model';
import type { Platform } from './platform';

/**
 * Background feeds a backend may hold. A browser has ~6 HTTP/1.1 connections per origin:
 * the selected session's feed and at least 2 for commands leave 3.
 */
export function feedLimit(platform: Platform): number {
  return platform.kind === 'web' ? 3 : 32;
}

export interface Attention {
  summary: AttentionSummary;
  /** Events of the selected session's feed (its model subscribes; no second feed). */
  feed: (rootId: string, event: WireEvent) => void;
  /** The person looked at a session: its failure stops asking for attention. */
  seen: (rootId: string, sessionId: string) => void;
  /** The trees whose events the window hears (status.ts's `liveStates` reads them). */
  roots: RootAttention[];
  /** A session was deleted: no tree counts it any more. */
  forget: (sessionId: string) => void;
}

export function useAttention(
  platform: Platform,
  sessions: SessionInfo[],
  selected: string | null,
  /** A background tree changed in a way the sessions list shows (refresh it). */
  onListChanged?: () => void,
  focused: () => boolean = () => document.hasFocus(),
  /** Opens what a notification announced (its session, a child's tab: its approval docks there). */
  open?: (sessionId: string) => void,
): Attention {
  const openRef = useRef(open);
  openRef.current = open;
  /** The last notification sent while the window was not focused, not opened yet. */
  const announced = useRef<Alert | null>(null);
  const listChanged = useRef(onListChanged);
  listChanged.current = onListChanged;
  const [roots, setRoots] = useState<Record<string, RootAttention>>({});
  const rootsRef = useRef(roots);
  const feeds = useRef(new Map<string, () => void>());
  const titles = useMemo(() => Object.fromEntries(sessions.map((s) => [s.session_id, s.title])), [sessions]);
  const titlesRef = useRef(titles);
  titlesRef.current = titles;

  const notify = useCallback(
    (alerts: Alert[]) => {
      if (!alerts.length || focused()) return;
      for (const alert of alerts) {
        const title = alert.kind === 'approval' ? 'Bumblehive needs your approval' : alert.kind === 'failed' ? 'Bumblehive: something failed' : 'Bumblehive: reports are in';
        announced.current = alert;
        platform.notify?.(title, alert.text, () => {
          announced.current = null;
          openRef.current?.(alert.sessionId);
        });
      }
    },
    [platform],
  );

  const feed = useCallback(
    (rootId: string, event: WireEvent) => {
      const current = rootsRef.current[rootId] ?? emptyRoot(rootId);
      const { root, alerts } = reduceRoot(current, event, titlesRef.current);
      if (root !== current) {
        rootsRef.current = { ...rootsRef.current, [rootId]: root };
        setRoots(rootsRef.current);
      }
      notify(alerts);
    },
    [notify],
  );

  const seen = useCallback((rootId: string, sessionId: string) => {
    const current = rootsRef.current[rootId];
    if (!current) return;
    const next = acknowledge(current, sessionId);
    if (next === current) return;
    rootsRef.current = { ...rootsRef.current, [rootId]: next };
    setRoots(rootsRef.current);
  }, []);

  const forget = useCallback((sessionId: string) => {
    let changed = false;
    const next: Record<string, RootAttention> = {};
    for (const [id, root] of Object.entries(rootsRef.current)) {
      if (id === sessionId) {
        changed = true;
        continue;
      }
      next[id] = forgetSession(root, sessionId);
      if (next[id] !== root) changed = true;
    }
    if (!changed) return;
    rootsRef.current = next;
    setRoots(next);
  }, []);

  // Background feeds follow the list: live trees other than the selected one.
  const watch = rootsToWatch(sessions, selected, feedLimit(platform)).join('\n');
  useEffect(() => {
    const wanted = new Set(watch ? watch.split('\n') : []);
    for (const [id, stop] of feeds.current) {
      if (!wanted.has(id)) {
        stop();
        feeds.current.delete(id);
      }
    }
    for (const id of wanted) {
      if (!feeds.current.has(id)) {
        const onEvent = (event: WireEvent) => {
          feed(id, event);
          const ends = event.type === 'result' || event.type === 'error' || event.type === 'session_created';
          const child = event.type === 'event' && event.kind === 'subagent.state' && !['running', 'waiting_for_slot'].includes(String((event.data as any)?.state));
          if (ends || child) listChanged.current?.();
        };
        feeds.current.set(id, platform.subscribe(id, onEvent));
      }
    }
  }, [watch, platform, feed]);
  useEffect(
    () => () => {
      for (const stop of feeds.current.values()) stop();
      feeds.current.clear();
    },
    [],
  );

  // Roots that left the workspace (deleted, or another workspace opened) are forgotten.
  const known = sessions.map((s) => s.session_id).join('\n');
  useEffect(() => {
    const ids = new Set(known.split('\n'));
    const kept = Object.fromEntries(Object.entries(rootsRef.current).filter(([id]) => ids.has(id) || id === selected));
    if (Object.keys(kept).length !== Object.keys(rootsRef.current).length) {
      rootsRef.current = kept;
      setRoots(kept);
    }
  }, [known, selected]);

  const list = useMemo(() => Object.values(roots), [roots]);
  const summary = useMemo(() => summarize(list), [list]);
  const summaryRef = useRef(summary);
  summaryRef.current = summary;

  // Back in the window after a notification (its click focuses the window, or the person
  // follows the taskbar's urgency hint): it opens what was announced, while it still waits
  // (E21). The desktop's notification daemon does not tell the app about the click itself.
  useEffect(() => {
    const onFocus = () => {
      const alert = announced.current;
      announced.current = null;
      if (!alert) return;
      const still = alert.kind !== 'approval' || summaryRef.current.approvals.some((a) => a.session_id === alert.sessionId);
      if (still) openRef.current?.(alert.sessionId);
    };
    // A person already acting in the window (a click, a key) is back by their own way:
    // a later focus is not the notification's, and must not pull the view from under them
    // (seen in the desktop e2e: WebDriver's click on the Main tab after an approval from
    // the inbox focused the window and reopened the child's tab mid-click).
    const back = () => {
      announced.current = null;
    };
    window.addEventListener('focus', onFocus);
    window.addEventListener('pointerdown', back, true);
    window.addEventListener('keydown', back, true);
    return () => {
      window.removeEventListener('focus', onFocus);
      window.removeEventListener('pointerdown', back, true);
      window.removeEventListener('keydown', back, true);
    };
  }, []);

  const openTitle = selected ? titles[selected] ?? null : null;
  useEffect(() => {
    platform.setTitle?.(windowTitle(summary.count, openTitle));
  }, [platform, summary.count, openTitle]);
  return { summary, feed, seen, roots: list, forget };
}
