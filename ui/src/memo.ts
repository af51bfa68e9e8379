// `memo` for function components without `preact/compat`: importing compat installs a
// global hook that rewrites every element's props as it is made, which took 1.6 % of the
// web page's main thread with nine sessions streaming (issue 31, bench-stream's profile).
import { Component, type ComponentType, type FunctionComponent, h } from 'preact';

/** Renders `render` again only when a prop changed (compared with `===`, key by key). */
export function memo<P extends object>(render: FunctionComponent<P>): ComponentType<P> {
  class Memo extends Component<P> {
    shouldComponentUpdate(next: P): boolean {
      const before = this.props as Record<string, unknown>;
      const after = next as Record<string, unknown>;
      const keys = Object.keys(after);
      if (keys.length !== Object.keys(before).length) return true;
      return keys.some((key) => before[key] !== after[key]);
    }
    render(props: P) {
      return h(render, props);
    }
  }
  return Memo;
}
