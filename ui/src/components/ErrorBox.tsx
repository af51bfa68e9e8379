import type { ComponentChildren } from 'preact';
import { Icon } from './Icon';

/** An error shown where it happened, with Retry when trying again makes sense. */
export function ErrorBox(props: {
  message: string;
  code?: string;
  onRetry?: () => void;
  onDismiss?: () => void;
  testid?: string;
  children?: ComponentChildren;
}) {
  return (
    <div class="error-box" role="alert" data-testid={props.testid ?? 'error'} data-code={props.code}>
      <span class="error-text">{props.message}</span>
      {props.children}
      <span class="error-actions">
        {props.onRetry && (
          <button type="button" data-testid="retry" onClick={props.onRetry}>
            Retry
          </button>
        )}
        {props.onDismiss && (
          <button type="button" class="quiet" aria-label="Dismiss" onClick={props.onDismiss}>
            <Icon name="close" />
          </button>
        )}
      </span>
    </div>
  );
}
