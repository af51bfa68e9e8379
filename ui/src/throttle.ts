// A value that changes many times a second, handed on a few times a second (issue #31).
import { useEffect, useRef, useState } from 'preact/hooks';

/**
 * `value`, handed on at once when it last changed more than `ms` ago, else once `ms` have
 * passed; the latest value always arrives. For figures a person reads while something
 * streams (the live token count, E23): each change of such a figure re-renders whoever
 * shows it, and the count of nine streams changes about 45 times a second.
 */
export function useThrottled<T>(value: T, ms: number): T {
  const [shown, setShown] = useState(value);
  const changed = useRef(0);
  useEffect(() => {
    if (Object.is(value, shown)) return;
    const show = () => {
      changed.current = Date.now();
      setShown(value);
    };
    const wait = changed.current + ms - Date.now();
    if (wait <= 0) {
      show();
      return;
    }
    const timer = setTimeout(show, wait);
    return () => clearTimeout(timer);
  }, [value, shown, ms]);
  return shown;
}
