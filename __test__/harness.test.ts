/**
 * Proves the pi session harness against a real pi 0.73 session with the echo fixture extension.
 * Run: node --import tsx --test __test__/harness.test.ts
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type Context, fauxAssistantMessage, fauxToolCall, getApiProvider } from "@mariozechner/pi-ai";
import { echoStats, resetEchoStats } from "./fixtures/echo-extension/index.ts";
import { createPiHarness, messageText, type PiHarness, type PiHarnessOptions } from "./helpers/pi-session.ts";

const ECHO_EXTENSION = fileURLToPath(new URL("./fixtures/echo-extension", import.meta.url));

/** A harness over a fresh temp cwd; both are removed when the test ends, pass or fail. */
async function setup(t: TestContext, opts: Partial<PiHarnessOptions> = {}): Promise<PiHarness> {
  resetEchoStats();
  const cwd = await mkdtemp(join(tmpdir(), "pi-harness-cwd-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const harness = await createPiHarness({ cwd, extensionPaths: [ECHO_EXTENSION], ...opts });
  t.after(() => harness.dispose());
  return harness;
}

/** Records the messages of the request the faux model receives, then answers with `reply`. */
function recordingReply(seen: Context["messages"][], reply: string) {
  return (context: Context) => {
    seen.push(structuredClone(context.messages));
    return fauxAssistantMessage(reply);
  };
}

test("loads the extension, fires session_start and records UI notifications", async (t) => {
  const h = await setup(t);
  assert.deepEqual(echoStats().starts, ["startup"]);
  assert.deepEqual(echoStats().hasUI, [true]);
  assert.deepEqual(h.notifications, [{ message: "echo ready (startup)", type: "info" }]);
  assert.deepEqual(h.extensionErrors, []);
});

test("direct tool call returns the text; a throwing call rejects", async (t) => {
  const h = await setup(t);
  const echo = h.getTool("echo");
  const result = await echo.execute("call-1", { text: "hello" }, undefined, undefined);
  assert.equal(messageText(result), "hello");
  assert.deepEqual(result.details, { length: 5 });
  await assert.rejects(echo.execute("call-2", { text: "fail" }, undefined, undefined), /echo failed/);
  assert.throws(() => h.getTool("nope"), /not active/);
});

test("select goes through the overridable hook", async (t) => {
  const h = await setup(t);
  const echo = h.getTool("echo");
  assert.equal(messageText(await echo.execute("c1", { text: "ask" }, undefined, undefined)), "picked: (nothing)");
  h.ui.select = async (_title, options) => options[1];
  assert.equal(messageText(await echo.execute("c2", { text: "ask" }, undefined, undefined)), "picked: b");
  assert.deepEqual(h.selects, [
    { title: "Pick one", options: ["a", "b"] },
    { title: "Pick one", options: ["a", "b"] },
  ]);
});

test("full agent turn: the model sees the tool result", async (t) => {
  const h = await setup(t);
  const seen: Context["messages"][] = [];
  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("echo", { text: "hi there" })], { stopReason: "toolUse" }),
    recordingReply(seen, "done"),
  ]);
  const added = await h.prompt("echo something");
  assert.equal(h.faux.getPendingResponseCount(), 0);

  const results = h.toolResults();
  assert.equal(results.length, 1);
  assert.equal(results[0].toolName, "echo");
  assert.equal(messageText(results[0]), "hi there");
  assert.equal(results[0].isError, false);

  // The second model request carried exactly that result.
  const modelSaw = seen[0].filter((m) => m.role === "toolResult");
  assert.equal(modelSaw.length, 1);
  assert.equal(messageText(modelSaw[0]), "hi there");
  assert.equal(modelSaw[0].isError, false);

  const final = added.at(-1);
  assert.ok(final?.role === "assistant");
  assert.equal(messageText(final), "done");
});

test("a thrown error and a tool_result {isError:true} both reach the model as isError", async (t) => {
  const h = await setup(t);
  const seen: Context["messages"][] = [];
  h.faux.setResponses([
    fauxAssistantMessage(
      [
        fauxToolCall("echo", { text: "fail" }),
        fauxToolCall("echo", { text: "soft-fail" }),
        fauxToolCall("echo", { text: "fine" }),
      ],
      { stopReason: "toolUse" },
    ),
    recordingReply(seen, "done"),
  ]);
  await h.prompt("try all three");

  const byText = (msgs: { isError: boolean; content: { type: string; text?: string }[] }[]) =>
    msgs.map((m) => [messageText(m), m.isError]);
  const expected = [
    ["echo failed: input was 'fail'", true],
    ["soft-fail", true],
    ["fine", false],
  ];
  assert.deepEqual(byText(h.toolResults()), expected);
  assert.deepEqual(byText(seen[0].filter((m) => m.role === "toolResult")), expected);
});

test("prompt() throws when the faux script runs out", async (t) => {
  const h = await setup(t);
  h.faux.setResponses([]);
  await assert.rejects(h.prompt("hello?"), /No more faux responses queued/);
});

test("reload fires shutdown+start, re-evaluates the extension and keeps the faux model", async (t) => {
  const h = await setup(t);
  const busBefore = h.events;
  await h.reload();
  assert.deepEqual(echoStats().shutdowns, ["reload"]);
  assert.deepEqual(echoStats().starts, ["startup", "reload"]);
  assert.equal(h.events, busBefore, "the bus survives reload");

  // The listener of the first evaluation was removed in session_shutdown: exactly one pong.
  const pongs: unknown[] = [];
  h.events.on("echo:pong", (data) => pongs.push(data));
  h.events.emit("echo:ping", 1);
  assert.deepEqual(pongs, [1]);

  // reload() ran resetApiProviders(); the model still answers.
  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("echo", { text: "after reload" })], { stopReason: "toolUse" }),
    fauxAssistantMessage("done"),
  ]);
  await h.prompt("again");
  assert.equal(messageText(h.toolResults().at(-1)!), "after reload");
});

test("new session, tree navigation and fork fire the matching events", async (t) => {
  const h = await setup(t);
  h.faux.setResponses([fauxAssistantMessage("one"), fauxAssistantMessage("two")]);
  await h.prompt("first");
  await h.prompt("second");

  // /tree to the first answer: session_tree only, same session.
  const entries = h.session.sessionManager.getEntries();
  const firstAnswer = entries.find((e) => e.type === "message" && e.message.role === "assistant")!;
  const sessionBefore = h.session;
  await h.navigateTree(firstAnswer.id);
  assert.equal(echoStats().trees, 1);
  assert.deepEqual(echoStats().shutdowns, []);
  assert.equal(h.session, sessionBefore);

  // /fork from the second user message: new session object, reason "fork".
  const secondUser = entries.filter((e) => e.type === "message" && e.message.role === "user")[1];
  const busBefore = h.events;
  const forked = await h.fork(secondUser.id);
  assert.equal(forked.cancelled, false);
  assert.equal(forked.selectedText, "second");
  assert.notEqual(h.session, sessionBefore);
  assert.notEqual(h.events, busBefore, "a replacement session gets a new bus, like the CLI");
  assert.deepEqual(echoStats().shutdowns, ["fork"]);

  // /new.
  assert.deepEqual(await h.newSession(), { cancelled: false });
  assert.deepEqual(echoStats().shutdowns, ["fork", "new"]);
  assert.deepEqual(echoStats().starts, ["startup", "fork", "new"]);
  assert.equal(h.session.messages.length, 0);
  h.getTool("echo");
});

test("hasUI: false behaves like print mode", async (t) => {
  const h = await setup(t, { hasUI: false });
  assert.deepEqual(echoStats().hasUI, [false]);
  assert.deepEqual(h.notifications, [], "pi's no-op UI drops notify");
  h.ui.select = async () => "a";
  const result = await h.getTool("echo").execute("c1", { text: "ask" }, undefined, undefined);
  assert.equal(messageText(result), "picked: (nothing)");
  assert.deepEqual(h.selects, []);
});

test("dispose fires session_shutdown(quit), removes agentDir and the faux provider, twice is fine", async (t) => {
  const h = await setup(t);
  const pongs: unknown[] = [];
  const bus = h.events;
  bus.on("echo:pong", (data) => pongs.push(data));
  assert.ok(existsSync(h.agentDir));
  assert.ok(getApiProvider(h.faux.api));

  await h.dispose();
  await h.dispose();
  assert.deepEqual(echoStats().shutdowns, ["quit"]);
  assert.equal(existsSync(h.agentDir), false);
  assert.equal(getApiProvider(h.faux.api), undefined);
  bus.emit("echo:ping", 1);
  assert.deepEqual(pongs, [], "the extension unsubscribed on shutdown");
});

test("extension load errors throw and leave no temp dirs behind", async (t) => {
  // Point os.tmpdir() at a private dir for this test so leftovers can be counted without races.
  const scratch = await mkdtemp(join(tmpdir(), "pi-harness-scratch-"));
  const savedTmpdir = process.env.TMPDIR;
  t.after(async () => {
    if (savedTmpdir === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = savedTmpdir;
    await rm(scratch, { recursive: true, force: true });
  });
  const broken = join(scratch, "broken.ts");
  await writeFile(broken, "throw new Error('boom at load time');\n");
  const privateTmp = join(scratch, "tmp");
  await mkdir(privateTmp);
  process.env.TMPDIR = privateTmp;

  await assert.rejects(
    createPiHarness({ cwd: scratch, extensionPaths: [ECHO_EXTENSION, broken] }),
    /pi failed to load extensions:[\s\S]*boom at load time/,
  );
  await assert.rejects(
    createPiHarness({ cwd: scratch, extensionPaths: [join(scratch, "missing")] }),
    /does not exist/,
  );
  // jiti (pi's TypeScript loader) keeps its transpile cache in tmpdir()/jiti; that one is not ours.
  assert.deepEqual((await readdir(privateTmp)).filter((name) => name !== "jiti"), []);
});
