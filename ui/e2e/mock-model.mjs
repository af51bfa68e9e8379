#!/usr/bin/env node
// A scripted OpenAI-compatible model server for the end-to-end tests (no dependencies).
//
//   node ui/e2e/mock-model.mjs [--log FILE] [--delay MS] [--rate DELTAS_PER_S]
//
// Listens on 127.0.0.1 (a free port) and prints the port as its first stdout line.
// `POST /v1/chat/completions` (stream: true) answers in OpenAI's SSE chunk format; what it
// answers depends only on the request's messages, like the seed's scripted provider:
//
// child (first user message contains "\nTask:\n"), by its task text:
//   WRITE  → write_file {path: "notes.txt"} (`WRITE <name>.txt`: that file); after the tool
//            result: "Wrote notes.txt" (the file's name)
//   QUICK  → answers at once: "Quick check done: all good."
//   FLAKY  → its first request ever is refused (400, once per server); then "Flaky task done."
//   HELD   → like WRITE, but its first answer waits until the test calls `release('HELD')`
//            (so its approval is asked exactly when the test wants it)
//   STREAM <n> → streams n deltas, one word each, at the server's `rate` (deltas/s)
// parent, by its last message:
//   user "[Background tool result]…"  → "Report received: <the report's body>"
//   user "Stream bench <c> children <n> deltas" → c sub_agent calls (task STREAM n) in one
//                                        batch; after their results the parent streams n
//                                        deltas too (ui/e2e/bench-stream.mjs)
//   user containing "Second round"     → sub_agent {title: "Quick", task: "QUICK"} AND
//                                        write_file {path: "parent.txt"} in one batch
//   user containing "Link please"      → a text answer with a web link (LINK_URL)
//   user containing "Slow answer"      → 120 sentences, one chunk every 50 ms (to stop it)
//   user containing "Wide please"      → a 600-character unbroken line and a wide table
//   user containing "Mention check"    → says whether notes.txt's content came with it
//   user containing "Image check"      → says whether an image part (image_url) came with it
//   user containing "Flaky child"      → sub_agent {title: "Flaky", task: "FLAKY"}
//   user containing "Held writer"      → sub_agent {title: "Writer", task: "WRITE notes HELD"}
//   user containing "Profile check"    → a short text answer (the test reads the request's tools)
//   user containing "Restart check"    → "Restart check answered." (after `serve` restarted)
//   user containing "MCP check"        → "MCP check answered." (the test reads the request's tools)
//   user containing "Undo check"       → sub_agent {title: "Undoable", task: "WRITE undo.txt"}
//   user containing "Worktree child"   → sub_agent {title: "Isolated", task: "WRITE isolated.txt",
//                                        isolation: "worktree"}
//   any other user message             → sub_agent {title: "Writer", task: "WRITE notes"}
//   tool results                       → a short text answer
// Every request body is appended to the log file as one JSON line ({at, path, body}).
// `GET /v1/models` lists the one model. Can also be imported: `startMockModel(options)`.

import { appendFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { pathToFileURL } from 'node:url';

export const NOTES_CONTENT = 'Notes written by the Writer sub-agent.\n';
/** What a child's `WRITE <file>` task writes into `file`. */
export const contentOf = (file) => (file === 'notes.txt' ? NOTES_CONTENT : `Written by a sub-agent into ${file}.\n`);
export const PARENT_CONTENT = 'Written by the parent in the second round.\n';

const TASK_MARK = '\nTask:\n';
export const LINK_URL = 'https://example.com/guide';
export const SLOW_SENTENCES = 120;

export function textOf(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p === 'string' ? p : p?.text ?? '')).join('');
  return '';
}

/** The body of a report: what follows "Task ID: …" and a blank line. */
export function reportBody(text) {
  const at = text.indexOf('\n\n');
  return at >= 0 ? text.slice(at + 2) : text;
}

/** What to answer: `{text, calls: [{name, arguments}]}`. */
export function decide(messages) {
  const firstUser = messages.find((m) => m.role === 'user');
  const last = messages[messages.length - 1] ?? {};
  const first = textOf(firstUser?.content);
  const lastText = textOf(last.content);

  if (first.includes(TASK_MARK)) {
    const task = first.slice(first.indexOf(TASK_MARK) + TASK_MARK.length);
    // `WRITE <name>.txt` writes that file; any other WRITE task writes notes.txt.
    const file = /WRITE (\S+\.txt)/.exec(task)?.[1] ?? 'notes.txt';
    if (last.role === 'tool') {
      if (/denied|cancel|error/i.test(lastText)) return { text: `Could not write ${file}: ${lastText}` };
      return { text: `Wrote ${file}` };
    }
    if (task.includes('FLAKY')) return { text: 'Flaky task done.', failOnce: 'FLAKY' };
    if (task.includes('WRITE')) {
      return {
        hold: task.includes('HELD') ? 'HELD' : undefined,
        text: 'Writing the notes now.',
        calls: [{ name: 'write_file', arguments: { path: file, content: contentOf(file) } }],
      };
    }
    if (task.includes('QUICK')) return { text: 'Quick check done: all good.' };
    const stream = /STREAM (\d+)/.exec(task);
    if (stream) return streamed(Number(stream[1]));
    return { text: 'Done.' };
  }

  if (last.role === 'tool') {
    const batch = toolBatchBefore(messages);
    const bench = batch.map((c) => /STREAM (\d+)/.exec(c.arguments?.task ?? '')).find(Boolean);
    if (bench) return streamed(Number(bench[1]));
    if (batch.some((c) => c.name === 'write_file')) return { text: 'Second round finished: parent.txt is written.' };
    return { text: 'The Writer sub-agent is on it; its report will follow.' };
  }
  if (last.role === 'user' && lastText.startsWith('[Background tool result]')) {
    return { text: `Report received: ${reportBody(lastText).trim()}` };
  }
  if (last.role === 'user' && lastText.includes('Link please')) {
    return { text: `The guide is at [the guide](${LINK_URL}).` };
  }
  if (last.role === 'user' && lastText.includes('Command check:')) {
    return { text: `Command seen: ${/Command check: (\S+)/.exec(lastText)?.[1] ?? 'nothing'}.` };
  }
  if (last.role === 'user' && lastText.includes('Mention check')) {
    return { text: `Mention seen: ${lastText.includes(NOTES_CONTENT.trim()) ? 'yes' : 'no'}.` };
  }
  if (last.role === 'user' && lastText.includes('Image check')) {
    const parts = Array.isArray(last.content) ? last.content : [];
    const image = parts.some((p) => p?.type === 'image_url' && String(p.image_url?.url ?? '').startsWith('data:image/png;base64,'));
    return { text: `Image seen: ${image ? 'yes' : 'no'}.` };
  }
  if (last.role === 'user' && lastText.includes('Profile check')) return { text: 'Profile check answered.' };
  if (last.role === 'user' && lastText.includes('MCP check')) return { text: 'MCP check answered.' };
  if (last.role === 'user' && lastText.includes('Undo check')) {
    return { text: 'A sub-agent writes undo.txt.', calls: [{ name: 'sub_agent', arguments: { title: 'Undoable', task: 'WRITE undo.txt' } }] };
  }
  if (last.role === 'user' && lastText.includes('Worktree child')) {
    return {
      text: 'An isolated sub-agent writes isolated.txt in its own worktree.',
      calls: [{ name: 'sub_agent', arguments: { title: 'Isolated', task: 'WRITE isolated.txt', isolation: 'worktree' } }],
    };
  }
  if (last.role === 'user' && lastText.includes('Restart check')) return { text: 'Restart check answered.' };
  if (last.role === 'user' && lastText.includes('Flaky child')) {
    return { text: 'A flaky sub-agent starts.', calls: [{ name: 'sub_agent', arguments: { title: 'Flaky', task: 'FLAKY' } }] };
  }
  if (last.role === 'user' && lastText.includes('Held writer')) {
    return { text: 'I will delegate this to a sub-agent.', calls: [{ name: 'sub_agent', arguments: { title: 'Writer', task: 'WRITE notes HELD' } }] };
  }
  if (last.role === 'user' && lastText.includes('Wide please')) {
    const cell = 'x'.repeat(300);
    return {
      text: `A long line: ${'path/'.repeat(120)}end\n\n| A | B | C |\n|---|---|---|\n| ${cell} | ${cell} | ${cell} |\n\nAfter the table.`,
    };
  }
  if (last.role === 'user' && lastText.includes('Slow answer')) {
    const text = Array.from({ length: SLOW_SENTENCES }, (_, i) => `Sentence ${i + 1} of the slow answer.`).join(' ');
    return { text, parts: SLOW_SENTENCES, pace: 50 };
  }
  const bench = /Stream bench (\d+) children (\d+) deltas/.exec(lastText);
  if (last.role === 'user' && bench) {
    const calls = Array.from({ length: Number(bench[1]) }, (_, i) => ({
      name: 'sub_agent',
      arguments: { title: `Streamer ${i + 1}`, task: `STREAM ${bench[2]}` },
    }));
    return { text: `Starting ${calls.length} streaming sub-agents.`, calls };
  }
  if (last.role === 'user' && lastText.includes('Second round')) {
    return {
      text: 'Starting a quick check and writing parent.txt.',
      calls: [
        { name: 'sub_agent', arguments: { title: 'Quick', task: 'QUICK' } },
        { name: 'write_file', arguments: { path: 'parent.txt', content: PARENT_CONTENT } },
      ],
    };
  }
  return {
    text: 'I will delegate this to a sub-agent.',
    calls: [{ name: 'sub_agent', arguments: { title: 'Writer', task: 'WRITE notes' } }],
  };
}

/** The tool calls of the last assistant message with tool calls (arguments parsed). */
function toolBatchBefore(messages) {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i];
    if (m.role === 'assistant' && Array.isArray(m.tool_calls) && m.tool_calls.length) {
      return m.tool_calls.map((c) => {
        let args = {};
        try {
          args = JSON.parse(c.function?.arguments ?? '{}');
        } catch {
          /* not JSON: no arguments */
        }
        return { id: c.id, name: c.function?.name ?? c.name, arguments: args };
      });
    }
  }
  return [];
}

/** A long answer of `n` words in short paragraphs, streamed one word per delta. */
function streamed(n) {
  const words = Array.from({ length: n }, (_, i) => (i % 24 === 23 ? `word${i}.\n\n` : `word${i} `));
  return { text: words.join(''), parts: n, pace: 'rate' };
}

/** Splits text into a few chunks (at spaces), so it streams in several deltas. */
export function chunks(text, parts = 4) {
  const words = text.split(/(?<=\s)(?=\S)/);
  const size = Math.max(1, Math.ceil(words.length / parts));
  const out = [];
  for (let i = 0; i < words.length; i += size) out.push(words.slice(i, i + size).join(''));
  return out;
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Starts the server. Options: `log` (file for request bodies), `delay` (ms between chunks),
 * `rate` (deltas per second of a streamed bench answer, per request; 100).
 * Resolves to `{port, baseUrl, requests, close()}`; `requests` holds the bodies seen.
 */
export function startMockModel(options = {}) {
  const delay = options.delay ?? 15;
  // Deltas per second of a streamed answer (`pace: 'rate'`), per request.
  const rate = options.rate ?? 100;
  const requests = [];
  let callCounter = 0;
  let completionCounter = 0;
  /** `failOnce` keys already failed, and the held answers' gates (`release(key)`). */
  const failed = new Set();
  const gates = new Map();
  const gate = (key) => {
    if (!gates.has(key)) {
      let open;
      const promise = new Promise((resolve) => (open = resolve));
      gates.set(key, { promise, open });
    }
    return gates.get(key);
  };

  const record = (path, body) => {
    requests.push(body);
    if (options.log) appendFileSync(options.log, JSON.stringify({ at: new Date().toISOString(), path, body }) + '\n');
  };

  const json = (res, status, value) => {
    const text = JSON.stringify(value);
    res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
    res.end(text);
  };

  const complete = async (req, res, body) => {
    const messages = Array.isArray(body.messages) ? body.messages : [];
    const answer = decide(messages);
    if (answer.failOnce && !failed.has(answer.failOnce)) {
      failed.add(answer.failOnce);
      // A 400 is not retried by the provider: the run fails at once, as with a bad request.
      return json(res, 400, { error: { message: `scripted failure of ${answer.failOnce}`, type: 'invalid_request_error' } });
    }
    if (answer.hold) await gate(answer.hold).promise;
    const id = `chatcmpl-mock-${++completionCounter}`;
    const model = body.model ?? 'm';
    const created = Math.floor(Date.now() / 1000);
    const calls = (answer.calls ?? []).map((c) => ({ ...c, id: `call_${++callCounter}` }));
    const promptTokens = Math.ceil(JSON.stringify(messages).length / 4);
    const completionTokens = Math.ceil((answer.text.length + JSON.stringify(calls).length) / 4);

    if (!body.stream) {
      return json(res, 200, {
        id,
        object: 'chat.completion',
        created,
        model,
        choices: [
          {
            index: 0,
            message: {
              role: 'assistant',
              content: answer.text,
              ...(calls.length
                ? {
                    tool_calls: calls.map((c) => ({
                      id: c.id,
                      type: 'function',
                      function: { name: c.name, arguments: JSON.stringify(c.arguments) },
                    })),
                  }
                : {}),
            },
            finish_reason: calls.length ? 'tool_calls' : 'stop',
          },
        ],
        usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens },
      });
    }

    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', Connection: 'keep-alive' });
    let closed = false;
    res.on('close', () => {
      closed = true;
    });
    const pace = answer.pace === 'rate' ? 1000 / rate : (answer.pace ?? delay);
    const send = async (value, wait = true) => {
      if (closed) return;
      res.write(`data: ${typeof value === 'string' ? value : JSON.stringify(value)}\n\n`);
      if (wait && pace > 0) await pause(pace);
    };
    const chunk = (delta, finish = null) => ({
      id,
      object: 'chat.completion.chunk',
      created,
      model,
      choices: [{ index: 0, delta, finish_reason: finish }],
    });

    await send(chunk({ role: 'assistant', content: '' }));
    for (const piece of chunks(answer.text, answer.parts)) await send(chunk({ content: piece }));
    for (const [index, call] of calls.entries()) {
      const args = JSON.stringify(call.arguments);
      const cut = Math.floor(args.length / 2);
      await send(
        chunk({
          tool_calls: [{ index, id: call.id, type: 'function', function: { name: call.name, arguments: args.slice(0, cut) } }],
        }),
      );
      await send(chunk({ tool_calls: [{ index, function: { arguments: args.slice(cut) } }] }));
    }
    await send(chunk({}, calls.length ? 'tool_calls' : 'stop'));
    await send({
      id,
      object: 'chat.completion.chunk',
      created,
      model,
      choices: [],
      usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens },
    });
    await send('[DONE]', false);
    if (!closed) res.end();
  };

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const parts = [];
    req.on('data', (d) => parts.push(d));
    req.on('end', () => {
      const raw = Buffer.concat(parts).toString('utf8');
      if (req.method === 'GET' && url.pathname === '/v1/models') {
        return json(res, 200, { object: 'list', data: [{ id: 'm', object: 'model', created: 0, owned_by: 'mock' }] });
      }
      if (req.method === 'POST' && url.pathname === '/v1/chat/completions') {
        let body;
        try {
          body = JSON.parse(raw);
        } catch (err) {
          record(url.pathname, { unparsable: raw });
          return json(res, 400, { error: { message: `invalid JSON: ${err.message}`, type: 'invalid_request_error' } });
        }
        record(url.pathname, body);
        complete(req, res, body).catch((err) => {
          console.error('mock-model: cannot answer', err);
          if (!res.headersSent) json(res, 500, { error: { message: String(err), type: 'server_error' } });
          else res.end();
        });
        return;
      }
      json(res, 404, { error: { message: `no route for ${req.method} ${url.pathname}`, type: 'invalid_request_error' } });
    });
  });

  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        port,
        baseUrl: `http://127.0.0.1:${port}/v1`,
        requests,
        /** Lets the held answer(s) of `key` go (and any asked later). */
        release: (key) => gate(key).open(),
        close: () =>
          new Promise((done) => {
            server.closeAllConnections?.();
            server.close(() => done());
          }),
      });
    });
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const args = process.argv.slice(2);
  const option = (name) => {
    const at = args.indexOf(name);
    return at >= 0 ? args[at + 1] : undefined;
  };
  const delay = option('--delay');
  const rate = option('--rate');
  const mock = await startMockModel({ log: option('--log'), delay: delay == null ? undefined : Number(delay), rate: rate == null ? undefined : Number(rate) });
  process.stdout.write(`${mock.port}\n`);
  const stop = () => mock.close().then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
