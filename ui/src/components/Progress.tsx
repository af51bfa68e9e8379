import type { Transcript } from '../model';

/** What the model is doing now, while it works. */
export function Progress({ transcript, approvals }: { transcript: Transcript; approvals: number }) {
  let text = 'Thinking…';
  const runningTools = Object.values(transcript.tools).filter((t) => t.running).length;
  if (approvals > 0) text = 'Waiting for your approval…';
  else if (transcript.retry) {
    const seconds = Math.max(1, Math.round(transcript.retry.delay_ms / 1000));
    text = `The provider did not answer (${transcript.retry.reason}); retrying in ${seconds}s (attempt ${transcript.retry.attempt})…`;
  } else if (runningTools > 0) text = runningTools === 1 ? 'Running a tool…' : `Running ${runningTools} tools…`;
  else if (transcript.streaming) text = 'Writing…';
  return (
    <div class="progress" data-testid="progress" role="status" aria-live="polite">
      <span class="spinner" aria-hidden="true" />
      <span>{text}</span>
      <span class="progress-bar" aria-hidden="true" />
    </div>
  );
}
