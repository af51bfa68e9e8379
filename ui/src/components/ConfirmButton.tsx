import { useEffect, useState } from 'preact/hooks';

/**
 * A button that asks once more in place ("Delete?" → "Really delete"), instead of
 * `window.confirm`, which webviews and WebDriver handle unevenly.
 */
export function ConfirmButton(props: {
  label: string;
  confirmLabel: string;
  onConfirm: () => void;
  disabled?: boolean;
  class?: string;
  title?: string;
  testid?: string;
  ariaLabel?: string;
}) {
  const [armed, setArmed] = useState(false);
  useEffect(() => {
    if (!armed) return;
    const timer = setTimeout(() => setArmed(false), 4000);
    return () => clearTimeout(timer);
  }, [armed]);
  return (
    <button
      type="button"
      class={`${props.class ?? ''} ${armed ? 'danger armed' : ''}`}
      disabled={props.disabled}
      title={props.title}
      aria-label={armed ? props.confirmLabel : props.ariaLabel ?? props.label}
      data-testid={props.testid}
      data-armed={armed ? 'true' : undefined}
      onClick={() => {
        if (armed) {
          setArmed(false);
          props.onConfirm();
        } else setArmed(true);
      }}
    >
      {armed ? props.confirmLabel : props.label}
    </button>
  );
}
