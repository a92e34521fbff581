/**
 * End-to-end tests of pi's side of the sandboxed `bash` (js/bash.ts): REAL pi sessions (0.73, and
 * 1.x through `npm run test:pi1`; see helpers/pi-session.ts) with this package loaded, or with a
 * small extension that registers the sandboxed bash over a fake shell (written to a temp dir; the
 * fake is reached through a global symbol, since pi loads extensions in their own module scope).
 * The fake stands for the native addon's per-command sandbox: it records what it is asked to run
 * and answers as the test says. The sandbox itself is tested by the engine's own suites.
 *
 * Run: node --import tsx --test __test__/bash-tool.test.ts
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { fauxAssistantMessage, fauxToolCall } from "@mariozechner/pi-ai";
import { createPiHarness, messageText, PI_HOST, type PiHarness } from "./helpers/pi-session.ts";
import { sandboxSkipReason, skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import type { BashConfig, SandboxShell, ShellSource } from "../js/bash.ts";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));
const PACKAGE_ENTRY = join(PACKAGE_DIR, "index.js");
const BASH_MODULE = fileURLToPath(new URL("../js/bash.ts", import.meta.url));
const FAKE = Symbol.for("pi-python-sandbox.test.fake-bash");

// --- the file's temp dirs, pi's agent dir and the fixture extensions --------------------------------

const ROOT = mkdtempSync(join(tmpdir(), "pi-bash-tool-e2e-"));
// A shell path of its own (a link to bash), so that it is seen to be passed on, and works on the host.
const SHELL_LINK = join(ROOT, "shell", "bash");
mkdirSync(join(ROOT, "shell"));
symlinkSync("/bin/bash", SHELL_LINK);
const SHELL_SETTINGS = { shellPath: SHELL_LINK, shellCommandPrefix: "shopt -s expand_aliases" };
// pi 0.73 gives extensions no settings: js/bash.ts reads them as pi does, from the agent dir.
const AGENT_DIR = join(ROOT, "agent");
mkdirSync(AGENT_DIR);
writeFileSync(join(AGENT_DIR, "settings.json"), JSON.stringify(SHELL_SETTINGS));
const SAVED = { agentDir: process.env.PI_CODING_AGENT_DIR, apiKey: process.env.ANTHROPIC_API_KEY, off: process.env.PI_SANDBOX_BASH };
process.env.PI_CODING_AGENT_DIR = AGENT_DIR;
// A key in pi's environment, which no command may be handed.
process.env.ANTHROPIC_API_KEY = "sk-test-secret-key";
delete process.env.PI_SANDBOX_BASH;
after(() => {
  for (const [name, value] of [
    ["PI_CODING_AGENT_DIR", SAVED.agentDir],
    ["ANTHROPIC_API_KEY", SAVED.apiKey],
    ["PI_SANDBOX_BASH", SAVED.off],
  ] as const) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
  rmSync(ROOT, { recursive: true, force: true });
});

const FIXTURES = join(ROOT, "extensions");
mkdirSync(FIXTURES);
/** Registers the sandboxed bash over the fake of the current test. */
const FAKE_EXTENSION = join(FIXTURES, "fake-bash.ts");
writeFileSync(
  FAKE_EXTENSION,
  `import { registerSandboxedBash } from ${JSON.stringify(BASH_MODULE)};
export default function (pi) {
  const fake = globalThis[Symbol.for("pi-python-sandbox.test.fake-bash")];
  registerSandboxedBash(pi, (cwd) => fake.source(cwd), fake.config);
}
`,
);
/** Another extension's own `bash`. */
const OTHER_EXTENSION = join(FIXTURES, "other-bash.ts");
writeFileSync(
  OTHER_EXTENSION,
  `import { Type } from "typebox";
export default function (pi) {
  pi.registerTool({
    name: "bash", label: "other bash", description: "another extension's bash",
    parameters: Type.Object({ command: Type.String() }),
    async execute() { return { content: [{ type: "text", text: "other bash ran" }], details: {} }; },
  });
}
`,
);

// --- the fake shell ---------------------------------------------------------------------------------

type ExecOpts = Parameters<SandboxShell["exec"]>[2];
interface Call {
  command: string;
  cwd: string;
  opts: ExecOpts;
}
interface Fake {
  source: ShellSource;
  config: BashConfig;
  calls: Call[];
}

/** A fake shell whose exec does `run`; installed for the extension to find. */
function installFake(t: TestContext, run: (call: Call) => ReturnType<SandboxShell["exec"]>, config: Partial<BashConfig> = {}): Fake {
  const calls: Call[] = [];
  const fake: Fake = {
    calls,
    config: { bash: "sandbox", userBash: "host", ...config },
    source: () => ({
      exec(command, cwd, opts) {
        const call = { command, cwd, opts };
        calls.push(call);
        return run(call);
      },
    }),
  };
  (globalThis as Record<symbol, unknown>)[FAKE] = fake;
  t.after(() => delete (globalThis as Record<symbol, unknown>)[FAKE]);
  return fake;
}

/** Resolves when `signal` aborts. */
const aborted = (signal: AbortSignal | undefined) =>
  new Promise<void>((resolve) => {
    if (!signal || signal.aborted) return resolve();
    signal.addEventListener("abort", () => resolve(), { once: true });
  });

// --- harness ----------------------------------------------------------------------------------------

async function tempCwd(t: TestContext): Promise<string> {
  const cwd = mkdtempSync(join(ROOT, "cwd-"));
  t.after(() => rmSync(cwd, { recursive: true, force: true }));
  return cwd;
}

async function setup(t: TestContext, extensionPaths: string[], cwd?: string, tolerateLoadError?: (error: string) => boolean): Promise<PiHarness> {
  // pi 1.x hands extensions its own settings: the same ones as the agent dir's file.
  const h = await createPiHarness({ cwd: cwd ?? (await tempCwd(t)), extensionPaths, settings: SHELL_SETTINGS, tolerateLoadError });
  t.after(() => h.dispose());
  return h;
}

/** The tool named `bash` as pi lists it (its source and label). */
function bashInfo(h: PiHarness) {
  const info = h.session.getAllTools().find((tool) => tool.name === "bash");
  assert.ok(info, "a tool named bash is registered");
  return { path: info.sourceInfo.path, label: h.getTool("bash").label };
}

type ToolOutcome = { text: string; isError: boolean; details?: unknown; updates: string[] };

/** A direct call of the active `bash` as the agent loop makes it; a thrown error is pi's failed result (0.73). */
async function callBash(
  h: PiHarness,
  params: { command: string; timeout?: number },
  signal?: AbortSignal,
  onText?: (text: string) => void,
): Promise<ToolOutcome> {
  const updates: string[] = [];
  const onUpdate = (partial: { content: Array<{ type: string; text?: string }> }) => {
    updates.push(messageText(partial));
    onText?.(messageText(partial));
  };
  try {
    const r = await h.getTool("bash").execute("call-1", params, signal, onUpdate as never);
    // pi 1.x returns a failed command as a result with isError; 0.73 throws.
    return { text: messageText(r), isError: (r as { isError?: boolean }).isError === true, details: r.details, updates };
  } catch (err) {
    return { text: (err as Error).message, isError: true, updates };
  }
}

/** The user's `!cmd` as pi's RPC and interactive modes run it: user_bash first, then pi's executeBash. */
async function userBash(h: PiHarness, command: string) {
  const session = h.session;
  const event = { type: "user_bash" as const, command, excludeFromContext: false, cwd: session.sessionManager.getCwd() };
  const handled = await session.extensionRunner.emitUserBash(event);
  if (handled?.result) return { handledBy: "result" as const, result: handled.result };
  const result = await session.executeBash(command, undefined, { operations: handled?.operations });
  return { handledBy: handled?.operations ? ("operations" as const) : ("host" as const), result };
}

// --- the tool ---------------------------------------------------------------------------------------

test("the tool named bash is this package's: a model's call runs in the shell with the user's shell settings and none of pi's environment", async (t) => {
  const fake = installFake(t, async ({ opts }) => {
    opts.onData(Buffer.from("hello from the sandbox\n"));
    return { exitCode: 0 };
  });
  const h = await setup(t, [FAKE_EXTENSION]);
  assert.equal(bashInfo(h).path, FAKE_EXTENSION);
  assert.equal(bashInfo(h).label, "bash (sandboxed)");
  // pi's schema and words, taken from pi's own definition.
  const tool = h.session.getAllTools().find((x) => x.name === "bash")!;
  assert.deepEqual(Object.keys((tool.parameters as { properties: object }).properties).sort(), ["command", "timeout"]);
  assert.match(tool.description, /Execute a bash command/);
  assert.match(h.session.systemPrompt, /Execute bash commands/);

  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("bash", { command: "echo hello" })], { stopReason: "toolUse" }),
    fauxAssistantMessage("done"),
  ]);
  await h.prompt("run it");
  const [result] = h.toolResults();
  assert.equal(result.toolName, "bash");
  assert.equal(result.isError, false);
  assert.equal(messageText(result), "hello from the sandbox\n");

  assert.equal(fake.calls.length, 1);
  const [call] = fake.calls;
  // The prefix is pi's (prepended by pi's definition); the shell path goes to the sandbox.
  assert.equal(call.command, `${SHELL_SETTINGS.shellCommandPrefix}\necho hello`);
  assert.equal(call.opts.shellPath, SHELL_SETTINGS.shellPath);
  assert.equal(call.cwd, h.session.sessionManager.getCwd());
  // Only pi's session variables, never pi's environment.
  const names = Object.keys(call.opts.env ?? {});
  assert.ok(names.every((n) => n.startsWith("PI_")), `env names: ${names.join(", ")}`);
  assert.ok(!JSON.stringify(call.opts.env ?? {}).includes("sk-test-secret-key"));
  assert.ok(!("PATH" in (call.opts.env ?? {})));
  // pi 1.x's session variables are the one part of its environment the sandbox may be given.
  if (PI_HOST === "pi1") assert.equal(call.opts.env?.PI_SESSION_ID, h.session.sessionManager.getSessionId());
  assert.deepEqual(h.notifications, []);
  assert.deepEqual(h.extensionErrors, []);
});

test("output streamed through onData reaches pi's partial updates and the result", async (t) => {
  let sawFirst!: () => void;
  const firstSeen = new Promise<void>((resolve) => (sawFirst = resolve));
  installFake(t, async ({ opts }) => {
    opts.onData(Buffer.from("first line\n"));
    // The second chunk only once pi has streamed the first to the UI.
    await firstSeen;
    opts.onData(Buffer.from("second line\n"));
    return { exitCode: 0 };
  });
  const h = await setup(t, [FAKE_EXTENSION]);
  const outcome = await callBash(h, { command: "two lines" }, undefined, (update) => {
    if (update.includes("first line")) sawFirst();
  });
  assert.equal(outcome.isError, false);
  assert.equal(outcome.text, "first line\nsecond line\n");
  assert.ok(outcome.updates.some((u) => u.includes("first line") && !u.includes("second line")), `updates: ${JSON.stringify(outcome.updates)}`);
  assert.ok(outcome.updates.some((u) => u.includes("second line")), `updates: ${JSON.stringify(outcome.updates)}`);
});

test("a non-zero exit, and a command killed by a signal, give pi's exit text with the output", async (t) => {
  const results = [{ exitCode: 3 }, { exitCode: null, signal: "SIGKILL" as const }, { exitCode: null }];
  installFake(t, async ({ opts }) => {
    opts.onData(Buffer.from("partial output\n"));
    return results.shift()!;
  });
  const h = await setup(t, [FAKE_EXTENSION]);
  const exit3 = await callBash(h, { command: "exit 3" });
  assert.equal(exit3.isError, true);
  assert.equal(exit3.text, "partial output\n\n\nCommand exited with code 3");
  const killed = await callBash(h, { command: "kill -9 $$" });
  assert.equal(killed.text, "partial output\n\n\nCommand exited with code 137");
  // No exit status at all is a failure (pi 0.73 would take null for success).
  const none = await callBash(h, { command: "lost" });
  assert.equal(none.isError, true);
  assert.match(none.text, /\[the command ended without an exit status\]\n+Command exited with code 1$/);
});

test("an abort gives pi's abort text and stops the shell through its signal", async (t) => {
  const fake = installFake(t, async ({ opts }) => {
    opts.onData(Buffer.from("before the abort\n"));
    await aborted(opts.signal);
    // A shell that reports its stop in its own words still gives pi's text.
    throw new Error("sandbox stopped");
  });
  const h = await setup(t, [FAKE_EXTENSION]);
  const controller = new AbortController();
  const outcome = callBash(h, { command: "sleep 100" }, controller.signal);
  await new Promise((r) => setTimeout(r, 50));
  controller.abort();
  const r = await outcome;
  assert.equal(r.isError, true);
  assert.equal(r.text, "before the abort\n\n\nCommand aborted");
  assert.equal(fake.calls[0].opts.signal?.aborted, true);
  // Aborted before it starts: the shell is not asked at all.
  const early = await callBash(h, { command: "true" }, AbortSignal.abort());
  assert.equal(early.text, "Command aborted");
  assert.equal(fake.calls.length, 1);
});

test("a timeout gives pi's timeout text, and stops a shell that ignores it", async (t) => {
  const fake = installFake(t, async ({ opts }) => {
    opts.onData(Buffer.from("still running\n"));
    await aborted(opts.signal);
    return { exitCode: null, signal: "SIGKILL" };
  });
  const h = await setup(t, [FAKE_EXTENSION]);
  const r = await callBash(h, { command: "sleep 100", timeout: 1 });
  assert.equal(r.isError, true);
  assert.equal(r.text, "still running\n\n\nCommand timed out after 1 seconds");
  assert.equal(fake.calls[0].opts.timeout, 1);
  assert.equal(fake.calls[0].opts.signal?.aborted, true);
});

test("a shell that cannot start refuses with its diagnostic and the command never runs on the host", async (t) => {
  const cwd = await tempCwd(t);
  const marker = join(cwd, "ran-on-host");
  const diagnostic = "bubblewrap cannot create a user namespace (kernel.apparmor_restrict_unprivileged_userns=1); fix: ...";
  installFake(t, () => Promise.reject(new Error("unused")));
  (globalThis as unknown as Record<symbol, Fake>)[FAKE].source = () => new Error(diagnostic);
  const h = await setup(t, [FAKE_EXTENSION], cwd);
  const r = await callBash(h, { command: `touch ${marker}` });
  assert.equal(r.isError, true);
  assert.equal(r.text, diagnostic);
  // A source that throws counts as one that cannot start.
  (globalThis as unknown as Record<symbol, Fake>)[FAKE].source = () => {
    throw new Error("addon load failed");
  };
  const thrown = await callBash(h, { command: `touch ${marker}` });
  assert.equal(thrown.isError, true);
  assert.match(thrown.text, /the sandboxed bash is unavailable: addon load failed/);
  assert.equal(existsSync(marker), false, "the command ran on the host");
});

test("this package's bash runs each command in the sandbox: a read-only project, .env empty, no API key, no raw escape, nothing on the host", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const cwd = await tempCwd(t);
  const marker = join(cwd, "ran-on-host");
  writeFileSync(join(cwd, ".env"), "TOKEN=project-secret\n");
  const h = await setup(t, [PACKAGE_DIR], cwd);
  assert.equal(bashInfo(h).path, PACKAGE_ENTRY);
  const lines = "for i in $(seq 3000); do printf '\\033]0;T\\007line %s\\n' $i; done";
  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("bash", { command: `touch ${marker}` })], { stopReason: "toolUse" }),
    fauxAssistantMessage([fauxToolCall("bash", { command: 'cat .env; echo "key=$ANTHROPIC_API_KEY"' })], { stopReason: "toolUse" }),
    fauxAssistantMessage([fauxToolCall("bash", { command: lines })], { stopReason: "toolUse" }),
    fauxAssistantMessage("done"),
  ]);
  await h.prompt("run them");
  const [touch, env, flood] = h.toolResults();
  assert.equal(touch.isError, true);
  assert.match(messageText(touch), /Read-only file system/);
  assert.match(messageText(touch), /\[sandbox\] The project is read-only in this permission mode/);
  assert.equal(existsSync(marker), false, "the command ran on the host");
  assert.equal(env.isError, false, messageText(env));
  assert.match(messageText(env), /^key=\s*$/);
  const text = messageText(flood);
  assert.match(text, /line 3000/);
  assert.doesNotMatch(text, /[\u001b\u0007]/);
  const full = (flood.details as { fullOutputPath?: string } | undefined)?.fullOutputPath;
  assert.ok(full, "pi kept the full output in a file");
  const saved = readFileSync(full, "utf8");
  assert.match(saved, /line 1\n/);
  assert.doesNotMatch(saved, /[\u001b\u0007]/, "the full-output file holds a raw escape");
});

test("a flood just under the output cap, ending while pi is busy, reaches pi's result whole and pi keeps running", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t, [PACKAGE_DIR]);
  // Over a thousand chunks of 64 KiB, then a last line. The first update with output holds the
  // main thread for 4 s (pi busy rendering), so the engine has read it all when pi runs again:
  // a chunk that came after the result would be appended to pi's finished accumulator, whose
  // throw inside the addon's callback ends the process.
  const held = new Int32Array(new SharedArrayBuffer(4));
  let holding = true;
  const outcome = await callBash(h, { command: "head -c 67000000 /dev/zero | tr '\\0' a; printf '\\nLAST-LINE\\n'" }, undefined, (update) => {
    if (holding && update.length > 0) {
      holding = false;
      Atomics.wait(held, 0, 0, 4000);
    }
  });
  const full = (outcome.details as { fullOutputPath?: string } | undefined)?.fullOutputPath;
  if (full) t.after(() => rmSync(full, { force: true }));
  assert.equal(outcome.isError, false, outcome.text.slice(-500));
  assert.match(outcome.text, /(^|\n)LAST-LINE\n/);
  assert.ok(full, "pi kept the full output in a file");
  const saved = readFileSync(full, "utf8");
  assert.equal(saved.length, 67_000_000 + "\nLAST-LINE\n".length);
  assert.ok(saved.endsWith("a\nLAST-LINE\n"));
});

// --- the user's !cmd --------------------------------------------------------------------------------

test("the user's !cmd runs on the host by default, as pi runs it", async (t) => {
  const cwd = await tempCwd(t);
  const marker = join(cwd, "user-ran-on-host");
  const h = await setup(t, [PACKAGE_DIR], cwd);
  const r = await userBash(h, `touch ${marker} && echo made`);
  assert.equal(r.handledBy, "host");
  assert.equal(r.result.exitCode, 0);
  assert.equal(existsSync(marker), true);
  assert.deepEqual(h.extensionErrors, []);
});

test("with userBash sandbox, the user's !cmd runs through the shell with pi's prefix and the user's shell", async (t) => {
  const cwd = await tempCwd(t);
  const marker = join(cwd, "user-ran-on-host");
  const fake = installFake(
    t,
    async ({ opts }) => {
      opts.onData(Buffer.from("from the sandbox\n"));
      return { exitCode: 0 };
    },
    { userBash: "sandbox" },
  );
  const h = await setup(t, [FAKE_EXTENSION], cwd);
  const r = await userBash(h, `touch ${marker}`);
  assert.equal(r.handledBy, "operations");
  assert.equal(r.result.exitCode, 0);
  assert.equal(r.result.output, "from the sandbox\n");
  assert.equal(fake.calls.length, 1);
  assert.equal(fake.calls[0].command, `${SHELL_SETTINGS.shellCommandPrefix}\ntouch ${marker}`);
  assert.equal(fake.calls[0].cwd, cwd);
  assert.equal(fake.calls[0].opts.shellPath, SHELL_SETTINGS.shellPath);
  assert.equal(existsSync(marker), false);
});

test("with userBash sandbox, a shell that refuses or throws never makes the handler throw, and nothing runs on the host", async (t) => {
  const cwd = await tempCwd(t);
  const marker = join(cwd, "user-ran-on-host");
  const fake = installFake(t, () => Promise.reject(new Error("the sandbox could not start: reason; fix: this")), { userBash: "sandbox" });
  const h = await setup(t, [FAKE_EXTENSION], cwd);
  // The shell starts but its exec rejects: the diagnostic is the command's output.
  const rejected = await userBash(h, `touch ${marker}`);
  assert.equal(rejected.handledBy, "operations");
  assert.equal(rejected.result.exitCode, 126);
  assert.match(rejected.result.output, /the sandbox could not start: reason; fix: this/);
  // No shell at all, and a source that throws: a result with the error text.
  fake.source = () => new Error("no sandbox here; fix: that");
  const refused = await userBash(h, `touch ${marker}`);
  assert.equal(existsSync(marker), false, "the refused command ran on the host");
  assert.equal(refused.handledBy, "result");
  assert.equal(refused.result.exitCode, 126);
  assert.match(refused.result.output, /no sandbox here; fix: that/);
  fake.source = () => {
    throw new Error("boom");
  };
  const thrown = await userBash(h, `touch ${marker}`);
  assert.equal(existsSync(marker), false, "the command of a throwing shell ran on the host");
  assert.equal(thrown.handledBy, "result");
  assert.match(thrown.result.output, /the sandboxed bash is unavailable: boom/);
  assert.deepEqual(h.extensionErrors, [], "a user_bash handler threw");
  assert.equal(existsSync(marker), false, "the command ran on the host");
});

// --- turning it off, and another extension's bash --------------------------------------------------

test("PI_SANDBOX_BASH=0 leaves pi's own bash (and bash: host in the configuration does too)", async (t) => {
  const cwd = await tempCwd(t);
  const marker = join(cwd, "host-bash-ran");
  process.env.PI_SANDBOX_BASH = "0";
  t.after(() => delete process.env.PI_SANDBOX_BASH);
  const h = await setup(t, [PACKAGE_DIR], cwd);
  assert.notEqual(bashInfo(h).path, PACKAGE_ENTRY);
  assert.equal(bashInfo(h).label, "bash");
  const r = await callBash(h, { command: `touch ${marker}` });
  assert.equal(r.isError, false);
  assert.equal(existsSync(marker), true);
  await h.dispose();

  delete process.env.PI_SANDBOX_BASH;
  installFake(t, () => Promise.reject(new Error("unused")), { bash: "host" });
  const h2 = await setup(t, [FAKE_EXTENSION], cwd);
  assert.notEqual(bashInfo(h2).path, FAKE_EXTENSION);
  assert.equal(bashInfo(h2).label, "bash");
});

test("when another extension's bash was registered first, session start says so once", async (t) => {
  const fake = installFake(t, async () => ({ exitCode: 0 }));
  // pi reports the conflict as a load error of the second extension and loads it all the same.
  const h = await setup(t, [OTHER_EXTENSION, FAKE_EXTENSION], undefined, (error) => error === `Tool "bash" conflicts with ${OTHER_EXTENSION}`);
  assert.equal(bashInfo(h).path, OTHER_EXTENSION);
  const warnings = () => h.notifications.filter((n) => n.message.includes("the sandboxed bash is not in use"));
  assert.equal(warnings().length, 1);
  assert.equal(warnings()[0].type, "warning");
  assert.ok(warnings()[0].message.includes(OTHER_EXTENSION));
  const r = await callBash(h, { command: "true" });
  assert.equal(r.text, "other bash ran");
  assert.equal(fake.calls.length, 0);
});

// --- the trusted configuration file ---------------------------------------------------------------

/** Writes the trusted configuration for one test (pi's agent dir is this file's). */
function writeTrusted(t: TestContext, text: string): void {
  const dir = join(AGENT_DIR, "extensions", "pi-python-sandbox");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), text);
  t.after(() => rmSync(join(dir, "config.json"), { force: true }));
}

test("a malformed trusted configuration is named at session start and bash stays sandboxed", async (t) => {
  writeTrusted(t, JSON.stringify({ bash: "host", bogusKey: 1 }));
  const h = await setup(t, [PACKAGE_DIR]);
  assert.equal(bashInfo(h).path, PACKAGE_ENTRY, "an error keeps the most restrictive setting");
  const errors = h.notifications.filter((n) => n.type === "error").map((n) => n.message);
  assert.ok(errors.some((m) => m.includes("bogusKey")), JSON.stringify(h.notifications));
  if (sandboxSkipReason() !== null && process.env.CI !== "true") return;
  // The first result names it too, the second does not repeat it.
  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("bash", { command: "echo one" })], { stopReason: "toolUse" }),
    fauxAssistantMessage([fauxToolCall("bash", { command: "echo two" })], { stopReason: "toolUse" }),
    fauxAssistantMessage("done"),
  ]);
  await h.prompt("run");
  const [first, second] = h.toolResults();
  assert.match(messageText(first), /one\n\[sandbox\] configuration: .*bogusKey/s);
  assert.doesNotMatch(messageText(second), /bogusKey/);
});

test('"bash": "host" in the trusted configuration leaves pi\'s own bash', async (t) => {
  writeTrusted(t, JSON.stringify({ bash: "host" }));
  const h = await setup(t, [PACKAGE_DIR]);
  assert.notEqual(bashInfo(h).path, PACKAGE_ENTRY);
});

test("a project's own configuration file is ignored with a notice", async (t) => {
  const cwd = await tempCwd(t);
  mkdirSync(join(cwd, ".pi", "extensions", "pi-python-sandbox"), { recursive: true });
  writeFileSync(join(cwd, ".pi", "extensions", "pi-python-sandbox", "config.json"), JSON.stringify({ bash: "host" }));
  const prev = process.cwd();
  process.chdir(cwd);
  t.after(() => process.chdir(prev));
  const h = await setup(t, [PACKAGE_DIR], cwd);
  assert.equal(bashInfo(h).path, PACKAGE_ENTRY, "the project's file did not widen anything");
  assert.ok(h.notifications.some((n) => /ignored/i.test(n.message)), JSON.stringify(h.notifications));
});

test('with "userBash": "sandbox" the user\'s !cmd runs in this package\'s sandbox, never on the host', async (t) => {
  if (skipWithoutSandbox(t)) return;
  writeTrusted(t, JSON.stringify({ userBash: "sandbox" }));
  const cwd = await tempCwd(t);
  writeFileSync(join(cwd, ".env"), "TOKEN=project-secret\n");
  const marker = join(cwd, "user-ran-on-host");
  const h = await setup(t, [PACKAGE_DIR], cwd);
  const r = await userBash(h, `cat .env; echo "key=$ANTHROPIC_API_KEY"; touch ${marker}`);
  assert.equal(r.handledBy, "operations");
  assert.match(r.result.output, /^key=\n/);
  assert.match(r.result.output, /Read-only file system/);
  assert.doesNotMatch(r.result.output, /project-secret/);
  assert.equal(existsSync(marker), false, "the user's command ran on the host");
});
