// An ACP client on the official TypeScript SDK (npm @agentclientprotocol/sdk, pinned in
// package.json / package-lock.json) driving `bumblehive acp`; tests/acp.rs runs it against
// a scripted model. It advertises `subagents` (the Subagent Sessions RFD, the SDK's
// `unstable` entry point), so the sub-agents come as child sessions.
//
// The same scenario as client.py (tests/acp.rs says what is checked); prints JSON lines on stdout:
// {"ev": "prompt_ended", ...} as each prompt ends (the Rust side releases the sub-agents on
// "delegate"), then one {"ev": "facts", ...} with every update, permission and answer.
//
// Usage: node dist/client.js BUMBLEHIVE CONFIG DATA_DIR WORKSPACE

import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk/unstable";

const WAIT_MS = 30_000;

type Recorded = { phase: string; session: string; update: Record<string, unknown> };
type Permission = {
  phase: string;
  session: string;
  toolCall: unknown;
  options: unknown[];
  answer: string;
};

function emit(value: unknown): void {
  process.stdout.write(JSON.stringify(value) + "\n");
}

class Recorder {
  phase = "init";
  updates: Recorded[] = [];
  permissions: Permission[] = [];
  private waiters: Array<() => void> = [];

  changed(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  textSince(start: number, session: string): string {
    return this.updates
      .slice(start)
      .filter((u) => u.session === session && u.update.sessionUpdate === "agent_message_chunk")
      .map((u) => ((u.update.content as { text?: string }) ?? {}).text ?? "")
      .join("");
  }

  /** The child session announced with this title, once it was. */
  childId(title: string): string | undefined {
    return this.updates.find((u) => u.update.sessionUpdate === "subagent_update" && u.update.title === title)
      ?.update.sessionId as string | undefined;
  }

  async waitFor(predicate: () => boolean): Promise<void> {
    const deadline = Date.now() + WAIT_MS;
    while (!predicate()) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error("timed out waiting for updates");
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }
}

function start(binary: string, args: string[], rec: Recorder) {
  const child = spawn(binary, args, { stdio: ["pipe", "pipe", "inherit"] });
  const stream = acp.ndJsonStream(
    Writable.toWeb(child.stdin) as WritableStream<Uint8Array>,
    Readable.toWeb(child.stdout) as ReadableStream<Uint8Array>,
  );
  const app = acp
    .client()
    .onRequest("session/request_permission", async ({ params }) => {
      const call = params.toolCall as { rawInput?: { path?: string } };
      if (call.rawInput?.path === "e.txt") {
        // Steering: the Rust side lets epsilon answer now; the write is allowed only once
        // epsilon has ended, so its report waits in the running turn for the batch's end.
        emit({ ev: "permission_asked", path: "e.txt" });
        await rec.waitFor(() =>
          rec.updates.some(
            (u) =>
              u.update.sessionUpdate === "subagent_update" &&
              u.update.sessionId === rec.childId("epsilon") &&
              (u.update.state as { stopReason?: string } | undefined)?.stopReason === "end_turn",
          ),
        );
      }
      // a.txt is allowed, b.txt rejected: both answers of the scenario.
      const wanted = call.rawInput?.path === "b.txt" ? "reject_once" : "allow_once";
      const option = params.options.find((o) => o.kind === wanted);
      rec.permissions.push({
        phase: rec.phase,
        session: params.sessionId,
        toolCall: params.toolCall,
        options: params.options,
        answer: wanted,
      });
      rec.changed();
      if (!option) return { outcome: { outcome: "cancelled" } };
      return { outcome: { outcome: "selected", optionId: option.optionId } };
    })
    .onNotification("session/update", ({ params }) => {
      rec.updates.push({
        phase: rec.phase,
        session: params.sessionId,
        update: params.update as unknown as Record<string, unknown>,
      });
      rec.changed();
    });
  const connection = app.connect(stream);
  return { child, agent: connection.agent, connection };
}

async function withTimeout<T>(promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error("timed out")), WAIT_MS);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

async function stop(child: ReturnType<typeof spawn>): Promise<void> {
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.stdin?.end();
  await withTimeout(exited);
}

async function main(): Promise<void> {
  const [binary, config, dataDir, workspace] = process.argv.slice(2);
  const args = ["--config", config, "--data-dir", dataDir, "acp"];
  const facts: Record<string, unknown> = {};
  const rec = new Recorder();
  const { child, agent } = start(binary, args, rec);
  facts.initialize = await agent.request("initialize", {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: { subagents: {} },
    clientInfo: { name: "typescript-sdk-test", version: "2.4.0" },
  });
  try {
    await agent.request("session/new", { cwd: "/", mcpServers: [] });
    facts.refused = null;
  } catch (err) {
    facts.refused = JSON.stringify(err) + " " + String(err);
  }
  const session = await agent.request("session/new", { cwd: workspace, mcpServers: [] });
  const sid = session.sessionId;
  facts.session = sid;
  const stops: Record<string, string> = {};
  const prompt = async (name: string, text: string): Promise<string> => {
    rec.phase = name;
    const response = await withTimeout(
      agent.request("session/prompt", { sessionId: sid, prompt: [{ type: "text", text }] }),
    );
    emit({ ev: "prompt_ended", name, stopReason: response.stopReason });
    return response.stopReason;
  };
  stops.read = await prompt("read", "read hello");
  stops.write_allow = await prompt("write_allow", "write a");
  stops.write_reject = await prompt("write_reject", "write b");
  stops.plan = await prompt("plan", "plan");

  // Stop while the model streams: cancel once the first words arrived.
  const first = rec.updates.length;
  const hang = prompt("cancel", "hang");
  await rec.waitFor(() => rec.textSince(first, sid).includes("partial"));
  await agent.notify("session/cancel", { sessionId: sid });
  stops.cancel = await hang;

  // Two sub-agents as child sessions; their reports arrive after the prompt ended (the
  // Rust side holds them until it reads prompt_ended) and wake the session.
  stops.delegate = await prompt("delegate", "delegate");
  rec.phase = "after";
  const after = rec.updates.length;
  await rec.waitFor(() => {
    const text = rec.textSince(after, sid);
    return text.includes("alpha_done_seen") && text.includes("beta_done_seen");
  });

  // Stop of one child: session/cancel on its own id (the RFD's `cancel` capability).
  stops.delegate_gamma = await prompt("child_cancel", "delegate gamma");
  const gamma = (): string | undefined =>
    rec.updates.find((u) => u.update.sessionUpdate === "subagent_update" && u.update.title === "gamma")
      ?.update.sessionId as string | undefined;
  await rec.waitFor(() => {
    const id = gamma();
    return id !== undefined && rec.textSince(0, id).includes("working");
  });
  await agent.notify("session/cancel", { sessionId: gamma() as string });
  await rec.waitFor(() =>
    rec.updates.some(
      (u) =>
        u.update.sessionUpdate === "subagent_update" &&
        u.update.sessionId === gamma() &&
        (u.update.state as { stopReason?: string } | undefined)?.stopReason === "cancelled",
    ),
  );
  facts.gamma = gamma();

  // Queued after Stop (the seed's scenario): Stop the session while its child works; the
  // child's report must wait in the queue (no wake-up while paused) until the next prompt.
  const beforeStop = rec.updates.length;
  const stopped = prompt("queue_stop", "delegate delta");
  await rec.waitFor(() => rec.textSince(beforeStop, sid).includes("thinking"));
  await agent.notify("session/cancel", { sessionId: sid });
  stops.queue_stop = await stopped;
  const delta = (): string | undefined =>
    rec.updates.find((u) => u.update.sessionUpdate === "subagent_update" && u.update.title === "delta")
      ?.update.sessionId as string | undefined;
  await rec.waitFor(() =>
    rec.updates.some(
      (u) =>
        u.update.sessionUpdate === "subagent_update" &&
        u.update.sessionId === delta() &&
        (u.update.state as { stopReason?: string } | undefined)?.stopReason === "end_turn",
    ),
  );
  // The report is queued, not lost: the session says so.
  await rec.waitFor(() => rec.textSince(beforeStop, sid).includes("sub-agent \u201cdelta\u201d waits"));
  const beforeResume = rec.updates.length;
  stops.resume = await prompt("resume", "resume");
  await rec.waitFor(() => rec.textSince(beforeResume, sid).includes("delta_done_seen"));

  // Steering at a safe point: epsilon's report arrives while the prompt's write waits for
  // its permission, and goes into the same prompt right after the write's result.
  stops.steer = await prompt("steer", "steer");
  facts.epsilon = rec.childId("epsilon");
  facts.stops = stops;
  await stop(child);
  facts.updates = rec.updates;
  facts.permissions = rec.permissions;
  emit({ ev: "facts", ...facts });
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
