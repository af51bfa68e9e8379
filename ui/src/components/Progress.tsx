import type { Transcript } from '../model';
import { formatTokens } from '../util';

/** What the model is doing now, while it works. */
export function Progress({ transcript, approvals }: { transcript: Transcript; approvals: number }) {
  let text = 'Thinking…';
  const runningTools = Object.values(transcript.tools).filter((t) => t.running).length;
  if (approvals > 0) text = 'Waiting for your approval…';
  else if (transcript.retry) {
    const seconds = Math.max(1, Math.round(transcript.retry.delay_ms / 1000));
    text = `The provider did not answer (${transcript.retry.reason}); retrying in ${seconds}s (attempt ${transcript.retry.attempt})…`;
  } else if (transcript.slot) {
    // A server that takes few requests at once: this call waits its turn (top-level first).
    const { server, ahead } = transcript.slot;
    text = `Waiting for a slot on ${server}${ahead > 0 ? ` (${ahead} ahead)` : ''}…`;
  } else if (runningTools > 0) text = runningTools === 1 ? 'Running a tool…' : `Running ${runningTools} tools…`;
  else if (transcript.streaming) text = 'Writing…';
  // The provider counts tokens only when the answer ends: meanwhile a rough live count
  // (about 4 characters a token), so the answer's size is not "0 tokens" (D20). Kept out
  // of the live region, which would otherwise announce every change.
  const writing = approvals === 0 && !transcript.retry && !transcript.slot && runningTools === 0 && transcript.streaming;
  const estimate = writing ? Math.max(1, Math.round(transcript.streaming.length / 4)) : 0;
  return (
    <div class="progress" data-testid="progress">
      <span class="spinner" aria-hidden="true" />
      <span role="status" aria-live="polite">
        {text}
      </span>
      {writing && (
        <span class="muted" data-testid="progress-tokens" aria-hidden="true">
          ~{formatTokens(estimate)} tokens so far
        </span>
      )}
      <span class="progress-bar" aria-hidden="true" />
    </div>
  );
}
