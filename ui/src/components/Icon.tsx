// State icons as inline SVG: font glyphs (●, ✓, ⏸, ◌, !) render as empty boxes on a plain
// Debian font set. Each icon takes the text colour; the label is for screen readers.

export type IconName = 'resume' | 'running' | 'done' | 'paused' | 'waiting' | 'failed' | 'cancelled' | 'idle' | 'bell' | 'gear' | 'close' | 'chevron' | 'copy' | 'edit';

const PATHS: Record<IconName, string> = {
  // Interrupted, resumable: a circular arrow.
  resume: '<path d="M12.5 8a4.5 4.5 0 1 1-1.4-3.3" fill="none" stroke="currentColor" stroke-width="1.8" stroke-linecap="round"/><path d="M12.6 2.4v2.9H9.7" fill="none" stroke="currentColor" stroke-width="1.8" stroke-linecap="round" stroke-linejoin="round"/>',
  running: '<circle cx="8" cy="8" r="5" fill="currentColor"/>',
  idle: '<path d="M3.5 8.5l3 3 6-7" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round"/>',
  done: '<path d="M3.5 8.5l3 3 6-7" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round"/>',
  paused: '<rect x="4" y="3" width="3" height="10" rx="1" fill="currentColor"/><rect x="9" y="3" width="3" height="10" rx="1" fill="currentColor"/>',
  waiting: '<circle cx="8" cy="8" r="5" fill="none" stroke="currentColor" stroke-width="1.6" stroke-dasharray="2.4 2"/>',
  failed: '<circle cx="8" cy="8" r="6.5" fill="currentColor"/><rect x="7.1" y="4" width="1.8" height="5.2" rx=".9" fill="#fff"/><circle cx="8" cy="11.4" r="1.05" fill="#fff"/>',
  cancelled: '<path d="M4.5 4.5l7 7M11.5 4.5l-7 7" stroke="currentColor" stroke-width="2" stroke-linecap="round"/>',
  bell: '<path d="M8 2a4 4 0 0 0-4 4v3l-1.5 2.5h11L12 9V6a4 4 0 0 0-4-4zM6.5 13a1.5 1.5 0 0 0 3 0" fill="currentColor"/>',
  gear: '<circle cx="8" cy="8" r="2.2" fill="none" stroke="currentColor" stroke-width="1.6"/><path d="M8 1.5v2M8 12.5v2M1.5 8h2M12.5 8h2M3.4 3.4l1.4 1.4M11.2 11.2l1.4 1.4M3.4 12.6l1.4-1.4M11.2 4.8l1.4-1.4" stroke="currentColor" stroke-width="1.6" stroke-linecap="round"/>',
  close: '<path d="M4.5 4.5l7 7M11.5 4.5l-7 7" stroke="currentColor" stroke-width="1.8" stroke-linecap="round"/>',
  chevron: '<path d="M4 6l4 4 4-4" fill="none" stroke="currentColor" stroke-width="1.8" stroke-linecap="round" stroke-linejoin="round"/>',
  copy: '<rect x="5" y="5" width="8" height="9" rx="1.5" fill="none" stroke="currentColor" stroke-width="1.5"/><path d="M3 11V3.5A1.5 1.5 0 0 1 4.5 2H10" fill="none" stroke="currentColor" stroke-width="1.5"/>',
  edit: '<path d="M3 13l1-3.5L10.5 3l2.5 2.5L6.5 12z" fill="none" stroke="currentColor" stroke-width="1.5" stroke-linejoin="round"/>',
};

export function Icon(props: { name: IconName; label?: string; class?: string }) {
  return (
    <svg
      class={`icon icon-${props.name} ${props.class ?? ''}`}
      viewBox="0 0 16 16"
      width="14"
      height="14"
      role={props.label ? 'img' : undefined}
      aria-label={props.label}
      aria-hidden={props.label ? undefined : 'true'}
      data-icon={props.name}
      dangerouslySetInnerHTML={{ __html: PATHS[props.name] }}
    />
  );
}
