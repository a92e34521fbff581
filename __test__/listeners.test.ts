/**
 * Listeners across /reload, /new and /fork, on pi 0.73 and pi 1.x: each evaluation of the extension
 * subscribes to the session's event bus (`pi.events`) and must unsubscribe in session_shutdown, and
 * nothing may pile up on `process` (the addon's exit hook is registered once per process).
 * Sandboxes and session directories across the same events are checked in extension.test.ts.
 *
 * Run: node --import tsx --test __test__/listeners.test.ts
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { fauxAssistantMessage } from "@mariozechner/pi-ai";
import { createPiHarness, messageText, PI_HOST, PI_VERSION, type PiHarness } from "./helpers/pi-session.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));
const PROCESS_EVENTS = ["exit", "beforeExit", "SIGINT", "SIGTERM", "SIGHUP", "uncaughtException", "unhandledRejection"] as const;

function processListeners(): Record<string, number> {
  return Object.fromEntries(PROCESS_EVENTS.map((e) => [e, process.listenerCount(e)]));
}

async function setup(t: TestContext): Promise<PiHarness> {
  const cwd = mkdtempSync(join(tmpdir(), "pi-python-listeners-"));
  const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE_DIR] });
  t.after(async () => {
    await h.dispose();
    rmSync(cwd, { recursive: true, force: true });
  });
  return h;
}

async function runOnce(h: PiHarness, code: string): Promise<string> {
  const result = await h.getTool("python").execute(`call-${Math.random()}`, { code }, undefined, undefined);
  return messageText(result);
}

test(`listeners (pi ${PI_VERSION}, ${PI_HOST}): three reloads leave one subscription set on the bus and none on process`, async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const bus = h.events;
  const onBus = bus.listenerCount();
  assert.ok(onBus > 0, "the extension subscribes to pi.events");
  assert.match(await runOnce(h, "1+1"), /result: 2/);
  const onProcess = processListeners();
  for (let i = 1; i <= 3; i++) {
    await h.reload();
    assert.equal(h.events, bus, "reload keeps the bus");
    assert.equal(bus.listenerCount(), onBus, `reload ${i}: bus subscriptions`);
    assert.equal(h.session.agent.state.tools.filter((tool) => tool.name === "python").length, 1, `reload ${i}: one tool`);
    assert.match(await runOnce(h, `${i}+1`), new RegExp(`result: ${i + 1}`));
    assert.deepEqual(processListeners(), onProcess, `reload ${i}: process listeners`);
  }
  assert.deepEqual(h.extensionErrors, []);
});

test(`listeners (pi ${PI_VERSION}, ${PI_HOST}): /new and /fork leave nothing subscribed on the old session's bus`, async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const onBus = h.events.listenerCount();
  assert.match(await runOnce(h, "1+1"), /result: 2/);
  const onProcess = processListeners();
  h.faux.setResponses([fauxAssistantMessage("one"), fauxAssistantMessage("two")]);
  await h.prompt("first");
  await h.prompt("second");

  const beforeNew = h.events;
  assert.deepEqual(await h.newSession(), { cancelled: false });
  assert.equal(beforeNew.listenerCount(), 0, "/new: the old bus has no subscriptions left");
  assert.equal(h.events.listenerCount(), onBus, "/new: the new session subscribed once");
  assert.match(await runOnce(h, "2+1"), /result: 3/);

  h.faux.setResponses([fauxAssistantMessage("three")]);
  await h.prompt("third");
  const user = h.session.sessionManager.getEntries().find((e) => e.type === "message" && e.message.role === "user")!;
  const beforeFork = h.events;
  assert.equal((await h.fork(user.id)).cancelled, false);
  assert.equal(beforeFork.listenerCount(), 0, "/fork: the old bus has no subscriptions left");
  assert.equal(h.events.listenerCount(), onBus, "/fork: the new session subscribed once");
  assert.match(await runOnce(h, "3+1"), /result: 4/);
  assert.deepEqual(processListeners(), onProcess, "process listeners");
  assert.deepEqual(h.extensionErrors, []);
});
