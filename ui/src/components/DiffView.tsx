/** A unified diff with added and removed lines coloured. */
export function DiffView({ diff }: { diff: string }) {
  const lines = diff.replace(/\n$/, '').split('\n');
  return (
    <pre class="diff" data-testid="approval-diff">
      {lines.map((line, i) => {
        let cls = 'diff-context';
        if (line.startsWith('+++') || line.startsWith('---')) cls = 'diff-file';
        else if (line.startsWith('@@')) cls = 'diff-hunk';
        else if (line.startsWith('+')) cls = 'diff-add';
        else if (line.startsWith('-')) cls = 'diff-del';
        return (
          <span key={i} class={`diff-line ${cls}`}>
            {line}
            {'\n'}
          </span>
        );
      })}
    </pre>
  );
}
