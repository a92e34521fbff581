/**
 * End-to-end tests of the `python` tool: the package at /work/main loaded into a REAL pi 0.73
 * session (see helpers/pi-session.ts), driven by direct tool calls and by full agent turns of the
 * scripted faux model, with the real native addon and the real bubblewrap sandbox.
 *
 * Run: node --import tsx --test __test__/extension.test.ts
 *
 * - The whole file runs with a private TMPDIR, so the sandbox's default runtime root
 *   (`<os.tmpdir()>/pi-python-sandbox-<uid>`, read by the addon from TMPDIR at run time) and the
 *   harness's temp dirs belong to this file alone: listings and counts are not disturbed by other
 *   pi sessions or test runs on the machine, and everything is removed at the end.
 * - Top-level tests run one at a time (node:test's default within a file): the harness allows only
 *   one live harness per process once anything reloads.
 * - Sandbox processes are counted as descendants of this process whose command line contains
 *   "/worker.py", which "/worker.pyc" contains too (bwrap's argv mounts the worker there and the
 *   sandboxed interpreter runs it); one session's sandboxes are those whose bwrap command line
 *   names `<session dir>/scratch`.
 * - The file runs with rollback on (the default) and off (PI_PYTHON_TOOL_ROLLBACK=0); where the two
 *   differ (an abort rolled back or its state lost, a reset in the same sandbox or a new one), a
 *   test asserts the exact behaviour of the setting in force (ROLLBACK).
 * - Run as root, the last test runs again as `nobody` the tests where the user matters: the
 *   runtime root is the user's (per uid, private to it), and the session directories a start makes
 *   and a dispose, a reload, a tree navigation or a new session removes are the user's, as are the
 *   files the sandbox wrote in them (root would remove what nobody cannot). None of that depends
 *   on the rollback setting or pi's major: the rerun is made once, under pi 0.73 with rollback on.
 */
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { after, type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type Context, fauxAssistantMessage, fauxToolCall, type ToolResultMessage } from "@mariozechner/pi-ai";
import * as piAgent from "@mariozechner/pi-coding-agent";
import { createPiHarness, messageText, PI_HOST, type PiHarness } from "./helpers/pi-session.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { sessionDirs } from "../scripts/lib/runtime-root.mjs";
import { descendantsOf, parentOf } from "./helpers/host-procs.ts";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { waitUntil } from "./helpers/sandbox-fixture.ts";
import { context, plain, pythonRenderers, screen, setupTui, shown, shownResult, theme } from "./helpers/render.ts";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));
const MAX_TEXT_BYTES = 51200;
const MAX_TEXT_LINES = 2000;

// --- a private TMPDIR for this file -------------------------------------------------------------

const PRIVATE_TMP = mkdtempSync(join(tmpdir(), "pi-python-sandbox-e2e-"));
const SAVED_TMPDIR = process.env.TMPDIR;
process.env.TMPDIR = PRIVATE_TMP;
after(() => {
  if (SAVED_TMPDIR === undefined) delete process.env.TMPDIR;
  else process.env.TMPDIR = SAVED_TMPDIR;
  rmSync(PRIVATE_TMP, { recursive: true, force: true });
});

/** The sandbox's default runtime root (README: under the OS temp dir, per uid). */
function runtimeRoot(): string {
  return join(tmpdir(), `pi-python-sandbox-${process.getuid!()}`);
}

/** Session directories under the runtime root (empty when the root does not exist). */
function runtimeDirs(): string[] {
  return sessionDirs(runtimeRoot());
}

// --- processes ------------------------------------------------------------------------------------

function readProc(pid: string, file: string): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/${file}`, "utf8");
  } catch {
    return undefined; // gone meanwhile
  }
}

/** Sandbox processes (bwrap and the sandboxed interpreter) started by this test process. */
function sandboxProcesses(): number[] {
  return descendantsOf(process.pid).filter((pid) => (readProc(String(pid), "cmdline") ?? "").includes("/worker.py"));
}

/** The processes of the sandbox whose session dir is `root`: its bwrap and everything below it. */
function sandboxTree(root: string): number[] {
  const bwraps = descendantsOf(process.pid).filter((pid) => (readProc(String(pid), "cmdline") ?? "").includes(`${root}/scratch`));
  return [...new Set(bwraps.flatMap((pid) => [pid, ...descendantsOf(pid)]))].sort((a, b) => a - b);
}

/** The outer bwrap processes (one per sandbox) of session dir `root`. */
function sandboxes(root: string): number[] {
  return descendantsOf(process.pid).filter(
    (pid) => parentOf(pid) === process.pid && (readProc(String(pid), "cmdline") ?? "").includes(`${root}/scratch`),
  );
}

/**
 * The interpreter that ran in session dir `root` is gone: of the sandboxes
 * alive before (`before`), at most the pristine spare is left.
 */
async function assertInterpreterGone(root: string, before: number[], h: PiHarness, what: string): Promise<void> {
  const gone = await waitUntil(() => before.filter((pid) => sandboxes(root).includes(pid)).length <= 1, 3000);
  const left = before.filter((pid) => sandboxes(root).includes(pid));
  assert.ok(gone, `${what}: sandboxes still alive: ${left.join(", ")}`);
  if (left.length === 1) assert.notEqual((await status(h)).spare, "none", `${what}: the one left is the spare`);
}

/** The sandbox of session dir `root` is gone (allowing a moment for the kernel to reap it). */
async function assertSandboxGone(root: string, what: string): Promise<void> {
  const gone = await waitUntil(() => sandboxTree(root).length === 0, 3000);
  assert.ok(gone, `${what}: sandbox processes still alive: ${sandboxTree(root).join(", ")}`);
}

// --- harness --------------------------------------------------------------------------------------

/** A fresh temp cwd holding `files`, removed when the test ends (pass or fail). */
async function tempCwd(t: TestContext, files: Record<string, string> = {}): Promise<string> {
  const cwd = await mkdtemp(join(tmpdir(), "pi-python-e2e-cwd-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  for (const [name, content] of Object.entries(files)) await writeFile(join(cwd, name), content);
  return cwd;
}

/** A harness with this package loaded; disposed when the test ends (pass or fail). */
async function setup(t: TestContext, cwd?: string): Promise<PiHarness> {
  const h = await createPiHarness({ cwd: cwd ?? (await tempCwd(t)), extensionPaths: [PACKAGE_DIR] });
  t.after(() => h.dispose());
  assert.deepEqual(h.resourceLoader.getExtensions().errors, []);
  return h;
}

type Details = Record<string, any>;
interface CallResult {
  text: string;
  details: Details;
}

let callSeq = 0;
/** A direct call of the tool as pi's agent loop would make it (skipping pi's schema check). */
async function call(h: PiHarness, params: unknown, signal?: AbortSignal): Promise<CallResult> {
  const result = await h.getTool("python").execute(`direct-${++callSeq}`, params as never, signal, undefined);
  return { text: messageText(result), details: (result.details ?? {}) as Details };
}

async function status(h: PiHarness): Promise<Details> {
  const r = await call(h, { action: "status" });
  assert.equal(r.details.status, "ok");
  return r.details.report as Details;
}

/**
 * Waits for the spare that session_start began to be ready (so that process counts are settled)
 * and returns the status then: no interpreter yet, no call made.
 */
async function prestarted(h: PiHarness): Promise<Details> {
  let report = await status(h);
  for (let i = 0; i < 250 && report.spare !== "ready"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    report = await status(h);
  }
  assert.equal(report.spare, "ready", "session_start began the spare sandbox");
  assert.equal(report.workerRunning, false);
  assert.equal(report.generation, 0);
  assert.equal(report.executions, 0);
  return report;
}

/**
 * One agent turn: the faux model calls python with each of `calls`, then answers "done".
 * Returns the tool results of this turn exactly as the model received them in its next request.
 */
async function turn(h: PiHarness, calls: Record<string, unknown>[]): Promise<ToolResultMessage[]> {
  const seen: Context["messages"][] = [];
  h.faux.setResponses([
    fauxAssistantMessage(
      calls.map((args) => fauxToolCall("python", args)),
      { stopReason: "toolUse" },
    ),
    (context: Context) => {
      seen.push(structuredClone(context.messages));
      return fauxAssistantMessage("done");
    },
  ]);
  const added = await h.prompt(`run ${calls.length} python call(s)`);
  assert.equal(h.faux.getPendingResponseCount(), 0);
  assert.equal(seen.length, 1, "the model got a second request carrying the tool results");
  const final = added.at(-1);
  assert.ok(final?.role === "assistant" && messageText(final) === "done");
  const lastUser = seen[0].findLastIndex((m) => m.role === "user");
  const results = seen[0].slice(lastUser + 1).filter((m): m is ToolResultMessage => m.role === "toolResult");
  assert.equal(results.length, calls.length);
  return results;
}

function byteLength(s: string): number {
  return Buffer.byteLength(s, "utf8");
}

/** `prefix` followed by a comment, `bytes` UTF-8 bytes in all. */
function padTo(prefix: string, bytes: number): string {
  return prefix + "#".repeat(bytes - byteLength(prefix));
}

function lineCount(s: string): number {
  return s.split("\n").length;
}

// --- 1. loading -----------------------------------------------------------------------------------

test("loading (prewarm off): one sequential python tool, no errors, nothing started, status unverified", async (t) => {
  // With the spare on (the default) session_start begins it: the next test.
  const savedPrewarm = process.env.PI_SANDBOX_PREWARM;
  process.env.PI_SANDBOX_PREWARM = "0";
  t.after(() => {
    if (savedPrewarm === undefined) delete process.env.PI_SANDBOX_PREWARM;
    else process.env.PI_SANDBOX_PREWARM = savedPrewarm;
  });
  const cwd = await tempCwd(t);
  // The host probe (one bare bubblewrap, once per process, from session_start) is done first:
  // what is checked is that loading and status start no sandbox and no other process.
  await (createRequire(import.meta.url)("../index.cjs") as { sandboxProbe(): Promise<unknown> }).sandboxProbe();
  const childrenBefore = descendantsOf(process.pid);
  const dirsBefore = runtimeDirs();
  const rootExistedBefore = existsSync(runtimeRoot());

  const h = await setup(t, cwd);
  assert.deepEqual(h.extensionErrors, []);

  const active = h.session.agent.state.tools.filter((tool) => tool.name === "python");
  assert.equal(active.length, 1, "exactly one python tool");
  assert.equal(active[0].executionMode, "sequential");
  const registered = h.session.extensionRunner.getAllRegisteredTools().filter((r) => r.definition.name === "python");
  assert.equal(registered.length, 1);
  // pi's header names the extension after the folder of its index file: the package's folder, never `js`.
  const Interactive = (piAgent as unknown as { InteractiveMode: { prototype: object } }).InteractiveMode;
  const labels = (Object.create(Interactive.prototype) as { getCompactExtensionLabels(e: unknown): string[] })
    .getCompactExtensionLabels(h.resourceLoader.getExtensions().extensions);
  const ours = h.resourceLoader.getExtensions().extensions.findIndex((e) => e.path.startsWith(PACKAGE_DIR));
  assert.equal(labels[ours], basename(PACKAGE_DIR), `pi's header lists ${JSON.stringify(labels)}`);

  // Loading started nothing and made no directory.
  assert.deepEqual(descendantsOf(process.pid), childrenBefore, "loading created no child process");
  assert.deepEqual(runtimeDirs(), dirsBefore);
  assert.equal(existsSync(runtimeRoot()), rootExistedBefore);

  // status starts nothing either.
  const report = await status(h);
  assert.equal(report.available, "unverified");
  assert.equal(report.workerRunning, false);
  assert.equal(report.generation, 0);
  assert.equal(report.executions, 0);
  assert.equal(report.paths.scratchDir, undefined, "no scratch dir before the first execution");
  assert.equal(report.paths.logDir, undefined);
  assert.equal(report.paths.projectDir, realpathSync(cwd));
  assert.deepEqual(descendantsOf(process.pid), childrenBefore, "status created no child process");
  assert.deepEqual(runtimeDirs(), dirsBefore, "status created no directory");
  assert.deepEqual(h.extensionErrors, []);
});

test("session_start begins the spare sandbox, and the first call runs in it: no start on its path", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const report = await prestarted(h);
  const root = dirname(report.paths.scratchDir);
  const [spare] = sandboxes(root);
  assert.deepEqual(sandboxes(root), [spare], "one sandbox before any call: the spare");
  const first = await call(h, { code: "x = 41" });
  assert.equal(first.details.status, "ok", first.text);
  assert.equal(first.details.generation, 1);
  assert.equal(first.details.stateLost, false);
  assert.ok(sandboxes(root).includes(spare), "the spare became the session's interpreter");
  assert.equal((await status(h)).workerRunning, true);
  assert.match((await call(h, { code: "x + 1" })).text, /result: 42/);
});

// --- 2. direct calls ------------------------------------------------------------------------------

test("direct calls: state persists across calls in one interpreter", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const first = await call(h, { code: "x = 41" });
  assert.equal(first.details.status, "ok", first.text);
  const second = await call(h, { code: "x + 1" });
  assert.match(second.text, /result: 42/);
  assert.equal(second.details.status, "ok");
  assert.equal(second.details.isError, false);
  assert.equal(second.details.generation, 1);
  assert.equal(second.details.stateLost, false);

  // The session directory is where the README says: under the OS temp dir, per uid.
  const report = await status(h);
  assert.equal(report.available, "available");
  assert.equal(report.workerRunning, true);
  assert.equal(dirname(dirname(report.paths.scratchDir)), runtimeRoot());
});

test("plain mode events manual → edits → manual: the variable is kept (rollback on) or lost with the restart, which says so (off)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const mode = (m: string) => h.events.emit("tool-permissions:mode", { mode: m, readRoots: [] });
  const write = (name: string) =>
    `try:\n    open('/workspace/${name}', 'w').write('x')\n    print('wrote ${name}')\nexcept OSError as e:\n    print('refused ${name}', e.strerror)`;
  const first = await call(h, { code: `kept = 'kept-value'\n${write("before.txt")}` });
  assert.match(first.text, /refused before.txt Read-only file system/, "baseline: manual is read-only");
  mode("edits");
  const edits = await call(h, { code: `${write("edits.txt")}\nprint(kept)` });
  assert.match(edits.text, /wrote edits.txt/);
  mode("manual");
  const back = await call(h, { code: `${write("after.txt")}\nprint(kept)` });
  assert.match(back.text, /refused after.txt Read-only file system/);
  if (ROLLBACK) {
    for (const r of [edits, back]) {
      assert.match(r.text, /kept-value/, r.text);
      assert.equal(r.details.stateLost, false);
      assert.doesNotMatch(r.text, /restarted|fresh interpreter|state was lost/i);
    }
  } else {
    // The spec's recovery: the sandbox restarts for the change, the state goes, and the result says so.
    assert.match(edits.text, /the sandbox was restarted because the permission mode or read roots changed/);
    assert.match(edits.text, /NameError/);
    assert.equal(edits.details.stateLost, true);
    assert.match(back.text, /the sandbox was restarted because the permission mode or read roots changed/);
  }
});

// --- 3. agent turns -------------------------------------------------------------------------------

test("agent turn: the model sees the output; failures are isError, successes are not", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);

  const [ok] = await turn(h, [{ code: "print('hello from', 6 * 7)" }]);
  assert.equal(ok.toolName, "python");
  assert.equal(ok.isError, false);
  assert.match(messageText(ok), /hello from 42/);
  assert.match(messageText(ok), /^status: ok/);

  // Lean for an ordinary result: the status, the output, nothing about state or logs.
  const [hi] = await turn(h, [{ code: 'print("hi")' }]);
  const hiLines = messageText(hi).split("\n").filter((l) => l.trim() !== "");
  assert.ok(hiLines.length <= 4, `print("hi") gave ${hiLines.length} lines:\n${messageText(hi)}`);
  assert.doesNotMatch(messageText(hi), /Interpreter state|saved to/);

  const [failed, fine] = await turn(h, [{ code: 'raise ValueError("boom")' }, { code: "'still' + ' here'" }]);
  assert.equal(failed.isError, true);
  assert.match(messageText(failed), /\nValueError: boom\n/);
  assert.match(messageText(failed), /boom/);
  assert.match(messageText(failed), /Interpreter state kept: what ran before the error remains/, "after an error the model learns what stayed");
  assert.doesNotMatch(messageText(fine), /Interpreter state/);
  assert.equal(fine.isError, false);
  assert.match(messageText(fine), /result: 'still here'/);

  // The session keeps the details next to the error mark (tool_result only flips isError).
  const stored = h.toolResults().at(-2)!;
  assert.equal(stored.isError, true);
  assert.equal((stored.details as Details).status, "runtime_error");
  assert.equal((stored.details as Details).exceptionType, "ValueError");
});

// --- 4. parameter validation (direct execute) -------------------------------------------------------

test("direct execute validates parameters and rejects before touching the interpreter", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  assert.equal((await call(h, { code: "marker = 'kept'" })).details.status, "ok");
  const before = await status(h);

  const CODE_REQUIRED = /requires `code` \(a non-empty string\)/;
  const TIMEOUT = /timeoutSeconds must be an integer between 1 and 120/;
  const NOT_WITH_ACTION = /rejects `code` and `timeoutSeconds` when action is/;
  const cases: [string, unknown, RegExp][] = [
    ["missing code", {}, CODE_REQUIRED],
    ["empty code", { code: "" }, CODE_REQUIRED],
    ["non-string code", { code: 42 }, CODE_REQUIRED],
    ["code over 64 KiB", { code: padTo("marker = 'lost'\n", 65537) }, /exceeds the 64 KiB UTF-8 limit \(65537 bytes\)/],
    // "#" and 32,769 two-byte characters: 65,539 UTF-8 bytes although the JS length is 32,770.
    ["code over 64 KiB in UTF-8 bytes", { code: `#${"é".repeat(32769)}` }, /exceeds the 64 KiB UTF-8 limit \(65539 bytes\)/],
    ["timeoutSeconds 0", { code: "marker = 'lost'", timeoutSeconds: 0 }, TIMEOUT],
    ["timeoutSeconds 121", { code: "marker = 'lost'", timeoutSeconds: 121 }, TIMEOUT],
    ["timeoutSeconds 1.5", { code: "marker = 'lost'", timeoutSeconds: 1.5 }, TIMEOUT],
    ['timeoutSeconds "5"', { code: "marker = 'lost'", timeoutSeconds: "5" }, TIMEOUT],
    ["code with reset", { action: "reset", code: "marker = 'lost'" }, NOT_WITH_ACTION],
    ["timeoutSeconds with reset", { action: "reset", timeoutSeconds: 5 }, NOT_WITH_ACTION],
    ["code with status", { action: "status", code: "marker = 'lost'" }, NOT_WITH_ACTION],
    ["timeoutSeconds with status", { action: "status", timeoutSeconds: 5 }, NOT_WITH_ACTION],
    ["unknown action", { action: "foo", code: "marker = 'lost'" }, /Unknown action "foo"/],
    ["unknown key", { code: "marker = 'lost'", extra: 1 }, /does not take "extra"/],
    ["not an object", null, /takes an object/],
    ["an array", ["marker = 'lost'"], /takes an object/],
  ];
  for (const [name, params, message] of cases) {
    await assert.rejects(call(h, params), message, name);
  }

  // Nothing reached the interpreter: same worker, same execution count, marker intact.
  const afterReport = await status(h);
  assert.equal(afterReport.executions, before.executions, "no rejected call ran");
  assert.equal(afterReport.generation, 1);
  assert.equal(afterReport.workerRunning, true, "a rejected reset did not reset");
  const check = await call(h, { code: "marker" });
  assert.match(check.text, /result: 'kept'/);
  assert.equal(check.details.generation, 1);

  // Exactly 64 KiB is accepted.
  const exact = padTo("marker2 = 1\n", 65536);
  assert.equal(byteLength(exact), 65536);
  const accepted = await call(h, { code: exact });
  assert.equal(accepted.details.status, "ok", accepted.text);
  assert.match((await call(h, { code: "marker, marker2" })).text, /result: \('kept', 1\)/);
});

test(
  "direct execute rejects null for timeoutSeconds and action, as pi's schema does",
  async (t) => {
    if (skipWithoutSandbox(t)) return;
    const h = await setup(t);
    assert.equal((await call(h, { code: "marker = 'kept'" })).details.status, "ok");
    await assert.rejects(call(h, { code: "marker = 'lost'", timeoutSeconds: null }), /timeoutSeconds must be an integer/);
    await assert.rejects(call(h, { action: null, code: "marker = 'lost'" }), /Unknown action null/);
    assert.match((await call(h, { code: "marker" })).text, /result: 'kept'/);
  },
);

// --- 5. validation through a model turn -------------------------------------------------------------

test("model turn: pi's schema rejects timeoutSeconds 500 and no sandbox work happens", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  await prestarted(h);
  const dirsBefore = runtimeDirs();
  const processesBefore = sandboxProcesses();

  const [rejected] = await turn(h, [{ code: "open('/scratch/ran', 'w').write('x')", timeoutSeconds: 500 }]);
  assert.equal(rejected.isError, true);
  assert.match(messageText(rejected), /Validation failed for tool "python"/);
  // pi 0.73 says "must be <= 120", pi 1.x "expected <= 120".
  assert.match(messageText(rejected), /timeoutSeconds: (must be|expected) <= 120/);

  const report = await status(h);
  assert.equal(report.workerRunning, false, "nothing was started beyond the spare");
  assert.equal(report.generation, 0);
  assert.equal(report.executions, 0);
  assert.deepEqual(runtimeDirs(), dirsBefore);
  assert.deepEqual(sandboxProcesses(), processesBefore);
});

// --- 6. abort -------------------------------------------------------------------------------------

test("abort: a running call is cancelled promptly and rolled back (rollback on) or loses state (off)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  assert.equal((await call(h, { code: "kept = 1" })).details.status, "ok");
  const sessionRoot = dirname((await status(h)).paths.scratchDir);
  // The running interpreter and (once started) the spare.
  assert.ok(await waitUntil(() => sandboxes(sessionRoot).length === 2, 3000), "the active sandbox and its spare run");
  const sandboxesBefore = sandboxes(sessionRoot);

  const controller = new AbortController();
  let abortedAt = 0;
  const timer = setTimeout(() => {
    abortedAt = Date.now();
    controller.abort();
  }, 500);
  t.after(() => clearTimeout(timer));
  const started = Date.now();
  const r = await call(h, { code: "import time; time.sleep(30)" }, controller.signal);
  const returnedAt = Date.now();
  assert.ok(abortedAt > 0, "the call did not end before the abort");
  assert.ok(returnedAt - abortedAt < 5000, `returned ${returnedAt - abortedAt} ms after the abort`);
  assert.ok(returnedAt - started < 5500);
  assert.equal(r.details.status, "cancelled");
  assert.equal(r.details.isError, true);
  if (ROLLBACK) {
    // Every process of the sandbox but its PID 1 was killed, and the rollback point carries on
    // in the same sandbox; the spare is not needed.
    assert.equal(r.details.stateLost, false);
    assert.equal(r.details.rolledBack, true);
    assert.match(r.text, /The interpreter was rolled back to its state before this call \(variables, imports and definitions are as they were;/);
    assert.deepEqual(sandboxes(sessionRoot), sandboxesBefore, "the sandbox and its spare are kept");
    const next = await call(h, { code: "kept" });
    assert.equal(next.details.status, "ok", next.text);
    assert.match(next.text, /result: 1/);
    assert.equal(next.details.generation, 1);
    return;
  }
  assert.equal(r.details.stateLost, true);
  assert.match(r.text, /Interpreter state was LOST \(cancelled; rollback is off \(PI_PYTHON_TOOL_ROLLBACK=0\)\)/);
  await assertInterpreterGone(sessionRoot, sandboxesBefore, h, "after cancel");

  // The next call gets a fresh interpreter.
  const next = await call(h, { code: "kept" });
  assert.equal(next.details.status, "runtime_error");
  assert.equal(next.details.exceptionType, "NameError");
  assert.equal(next.details.generation, 2);
});

test("abort: an already-aborted signal cancels without starting the worker", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  await prestarted(h);
  const dirsBefore = runtimeDirs();
  const processesBefore = sandboxProcesses();
  const controller = new AbortController();
  controller.abort();
  const started = Date.now();
  const r = await call(h, { code: "open('/scratch/ran', 'w').write('x')" }, controller.signal);
  assert.ok(Date.now() - started < 5000);
  assert.equal(r.details.status, "cancelled");
  assert.equal(r.details.isError, true);
  assert.equal(r.details.stateLost, false, "there was no state to lose");

  const report = await status(h);
  assert.equal(report.workerRunning, false);
  assert.equal(report.spare, "ready", "the spare is left as it was");
  assert.equal(report.generation, 0);
  assert.equal(report.executions, 0);
  assert.deepEqual(runtimeDirs(), dirsBefore);
  assert.deepEqual(sandboxProcesses(), processesBefore);
});

// --- 7. reset and status ------------------------------------------------------------------------------

test("reset discards state and keeps scratch; status reports mode, limits and paths", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const write = await call(h, { code: "v = 7\nopen('/scratch/keep.txt', 'w').write('kept across reset')" });
  assert.equal(write.details.status, "ok", write.text);
  const report = await status(h);
  assert.ok(await waitUntil(() => sandboxes(dirname(report.paths.scratchDir)).length === 2, 3000), "the active sandbox and its spare run");
  const resetBefore = sandboxes(dirname(report.paths.scratchDir));

  const reset = await call(h, { action: "reset" });
  assert.equal(reset.details.status, "ok");
  assert.equal(reset.details.action, "reset");
  assert.match(reset.text, /[Ss]cratch files are preserved/);
  assert.equal(reset.details.scratchDir, report.paths.scratchDir);
  assert.ok(reset.text.includes(report.paths.scratchDir), "reset names the scratch dir");
  // With rollback on a reset is a fresh interpreter in the same sandbox (the spare waits).
  if (ROLLBACK) assert.deepEqual(sandboxes(dirname(report.paths.scratchDir)), resetBefore, "after reset: the sandbox and its spare are kept");
  else await assertInterpreterGone(dirname(report.paths.scratchDir), resetBefore, h, "after reset");

  const lost = await call(h, { code: "v" });
  assert.equal(lost.details.exceptionType, "NameError");
  assert.equal(lost.details.generation, 2);
  assert.match((await call(h, { code: "open('/scratch/keep.txt').read()" })).text, /result: 'kept across reset'/);

  const after = await status(h);
  assert.equal(after.workspaceMode, "read-only");
  assert.equal(after.limits.maxCodeBytes, 65536);
  assert.equal(after.limits.maxTimeoutSeconds, 120);
  assert.equal(after.limits.defaultTimeoutSeconds, 30);
  assert.equal(after.paths.sandboxProject, "/workspace");
  assert.equal(after.paths.sandboxScratch, "/scratch");
  assert.equal(after.lastResetReason, "explicit_reset");
  const statusCall = await call(h, { action: "status" });
  assert.match(statusCall.text, /-> \/workspace \(read-only\)/);
});

// --- 8. lifecycle ----------------------------------------------------------------------------------------

/** Runs code so that the session has a sandbox; returns its session dir, scratch and log dirs. */
async function startSandbox(h: PiHarness, code = "alive = True"): Promise<{ root: string; scratch: string; logs: string }> {
  const r = await call(h, { code: `${code}\nopen('/scratch/s.txt', 'w').write('s')\nprint('started')` });
  assert.equal(r.details.status, "ok", r.text);
  // The spare starts in the background: wait for it, so that process
  // counts are settled.
  let report = await status(h);
  for (let i = 0; i < 250 && report.spare !== "ready"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    report = await status(h);
  }
  assert.equal(report.spare, "ready", "the spare sandbox became ready");
  const scratch: string = report.paths.scratchDir;
  const logs: string = report.paths.logDir;
  assert.ok(existsSync(join(scratch, "s.txt")));
  assert.ok(readdirSync(logs).length > 0, "logs were written");
  const root = dirname(scratch);
  assert.ok(sandboxTree(root).length > 0, "the sandbox runs");
  return { root, scratch, logs };
}

async function assertDisposed(dirs: { root: string; scratch: string; logs: string }, what: string): Promise<void> {
  assert.equal(existsSync(dirs.scratch), false, `${what}: scratch dir deleted`);
  assert.equal(existsSync(dirs.logs), false, `${what}: log dir deleted`);
  assert.equal(existsSync(dirs.root), false, `${what}: session dir deleted`);
  await assertSandboxGone(dirs.root, what);
}

/** The tool works and runs a fresh interpreter: `name` (set before) is undefined. */
async function assertFreshInterpreter(h: PiHarness, name: string): Promise<void> {
  const r = await call(h, { code: name });
  assert.equal(r.details.status, "runtime_error", r.text);
  assert.equal(r.details.exceptionType, "NameError");
  assert.equal(r.details.generation, 1, "a new sandbox session");
  assert.match((await call(h, { code: "1 + 1" })).text, /result: 2/);
}

test("lifecycle: dispose (session_shutdown) deletes scratch and logs and kills the sandbox", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const dirsBefore = runtimeDirs();
  const h = await setup(t);
  await call(h, { code: "for i in range(3): print(i)" });
  const dirs = await startSandbox(h);
  await h.dispose();
  await assertDisposed(dirs, "dispose");
  assert.deepEqual(runtimeDirs(), dirsBefore);
});

test("lifecycle: three reloads each dispose the old sandbox; nothing accumulates", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const dirsBefore = runtimeDirs();
  const processesBefore = sandboxProcesses().length;
  const h = await setup(t);
  let dirs = await startSandbox(h, "before_reload = 1");
  const perSandbox = sandboxTree(dirs.root).length;
  for (let i = 1; i <= 3; i++) {
    await h.reload();
    assert.deepEqual(h.extensionErrors, [], `reload ${i}`);
    assert.equal(h.session.agent.state.tools.filter((tool) => tool.name === "python").length, 1);
    await assertDisposed(dirs, `reload ${i}`);
    // The new session's spare, begun at its session_start, is all that runs.
    const fresh = dirname((await prestarted(h)).paths.scratchDir);
    assert.deepEqual(runtimeDirs(), [...dirsBefore, basename(fresh)].sort(), `reload ${i}: no session dir left`);
    assert.equal(sandboxProcesses().length, processesBefore + sandboxTree(fresh).length, `reload ${i}: no sandbox process left`);
    await assertFreshInterpreter(h, "before_reload");
    dirs = await startSandbox(h, "before_reload = 1");
    assert.equal(sandboxProcesses().length, processesBefore + perSandbox, `reload ${i}: one sandbox's processes`);
    assert.deepEqual(runtimeDirs(), [...dirsBefore, basename(dirs.root)].sort());
  }
  // After the reloads the model loop and the failure marking still work.
  const [failed] = await turn(h, [{ code: "1/0" }]);
  assert.equal(failed.isError, true);
  assert.match(messageText(failed), /\nZeroDivisionError: division by zero\n/);
  await h.dispose();
  await assertDisposed(dirs, "final dispose");
});

test("lifecycle: tree navigation (session_tree) disposes the sandbox", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  h.faux.setResponses([fauxAssistantMessage("one"), fauxAssistantMessage("two")]);
  await h.prompt("first");
  await h.prompt("second");
  const dirs = await startSandbox(h, "before_tree = 1");

  const sessionBefore = h.session;
  const firstAnswer = h.session.sessionManager
    .getEntries()
    .find((e) => e.type === "message" && e.message.role === "assistant")!;
  const nav = await h.navigateTree(firstAnswer.id);
  assert.equal(nav.cancelled, false);
  assert.equal(h.session, sessionBefore, "same session, no shutdown");
  await assertDisposed(dirs, "session_tree");
  await assertFreshInterpreter(h, "before_tree");
});

test("lifecycle: /new and /fork dispose the sandbox and the new session's tool works", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  h.faux.setResponses([fauxAssistantMessage("one"), fauxAssistantMessage("two")]);
  await h.prompt("first");
  await h.prompt("second");
  let dirs = await startSandbox(h, "before_fork = 1");

  const secondUser = h.session.sessionManager
    .getEntries()
    .filter((e) => e.type === "message" && e.message.role === "user")[1];
  const forked = await h.fork(secondUser.id);
  assert.equal(forked.cancelled, false);
  assert.deepEqual(h.extensionErrors, []);
  await assertDisposed(dirs, "fork");
  await assertFreshInterpreter(h, "before_fork");

  dirs = await startSandbox(h, "before_new = 1");
  assert.deepEqual(await h.newSession(), { cancelled: false });
  assert.deepEqual(h.extensionErrors, []);
  await assertDisposed(dirs, "new session");
  await assertFreshInterpreter(h, "before_new");
  const [ok] = await turn(h, [{ code: "print('new session')" }]);
  assert.equal(ok.isError, false);
  assert.match(messageText(ok), /new session/);
});

// --- 9. working directory -------------------------------------------------------------------------------

test("cwd: /workspace is the session's cwd (read-only), for sessions in different directories", async (t) => {
  if (skipWithoutSandbox(t)) return;
  // pi 0.73 fixes ctx.cwd for the life of a session (ExtensionRunner.cwd = AgentSession's cwd), so
  // two sessions in two directories, one after the other.
  for (const content of ["alpha project", "beta project"]) {
    const cwd = await tempCwd(t, { "f.txt": content });
    const h = await setup(t, cwd);
    const r = await call(h, { code: "print(open('/workspace/f.txt').read())" });
    assert.equal(r.details.status, "ok", r.text);
    assert.match(r.text, new RegExp(content));
    assert.equal((await status(h)).paths.projectDir, realpathSync(cwd));
    const write = await call(h, { code: "open('/workspace/new.txt', 'w').write('x')" });
    assert.equal(write.details.status, "runtime_error");
    assert.match(write.text, /Read-only file system/);
    assert.equal(existsSync(join(cwd, "new.txt")), false);
    await h.dispose();
  }
});

test("cwd: /resume into a session of another directory mounts that directory", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const cwdA = await tempCwd(t, { "f.txt": "from A" });
  const cwdB = await tempCwd(t, { "f.txt": "from B" });
  const h = await setup(t, cwdA);
  h.faux.setResponses([fauxAssistantMessage("hi")]);
  await h.prompt("persist the session file");
  const dirs = await startSandbox(h, "in_a = 1");
  assert.match((await call(h, { code: "open('/workspace/f.txt').read()" })).text, /'from A'/);

  // The CLI's /resume of a session whose stored cwd is B (here: the same file, cwd overridden).
  const switched = await h.runtime.switchSession(h.session.sessionFile!, { cwdOverride: cwdB });
  assert.equal(switched.cancelled, false);
  await assertDisposed(dirs, "resume");
  const r = await call(h, { code: "open('/workspace/f.txt').read()" });
  assert.match(r.text, /'from B'/);
  assert.equal((await status(h)).paths.projectDir, realpathSync(cwdB));
});

test("cwd: a cwd change within one session replaces the sandbox (simulated)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  // pi 0.73 never changes ctx.cwd within a session; the extension still handles a host that does
  // (sandboxFor compares the realpath of ctx.cwd on every call). Simulated by moving the runner's cwd.
  const cwdA = await tempCwd(t, { "f.txt": "from A" });
  const cwdB = await tempCwd(t, { "f.txt": "from B" });
  const dirsBefore = runtimeDirs();
  const h = await setup(t, cwdA);
  const dirs = await startSandbox(h, "in_a = 1");
  (h.session.extensionRunner as unknown as { cwd: string }).cwd = cwdB;
  const r = await call(h, { code: "open('/workspace/f.txt').read()" });
  assert.match(r.text, /'from B'/);
  assert.equal(r.details.generation, 1, "a new sandbox session");
  assert.ok(await waitUntil(() => !existsSync(dirs.root), 3000), "the old session dir is deleted");
  await assertSandboxGone(dirs.root, "cwd change");
  const report = await status(h);
  assert.equal(report.paths.projectDir, realpathSync(cwdB));
  assert.deepEqual(runtimeDirs(), [...dirsBefore, basename(dirname(report.paths.scratchDir))].sort());
});

// --- 10. failure marking ----------------------------------------------------------------------------------

test("tool_result marks every failure status as isError for the model, ok as not", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const [runtimeError, timeout, ok] = await turn(h, [
    { code: "raise KeyError('k')" },
    { code: "import time; time.sleep(10)", timeoutSeconds: 1 },
    { code: "'fine'" },
  ]);
  assert.equal(runtimeError.isError, true);
  assert.match(messageText(runtimeError), /^status: runtime_error/);
  assert.equal(timeout.isError, true);
  assert.match(messageText(timeout), /^status: timeout/);
  assert.match(
    messageText(timeout),
    ROLLBACK
      ? /The interpreter was rolled back to its state before this call \(variables, imports and definitions are as they were;/
      : /Interpreter state was LOST \(timeout; rollback is off \(PI_PYTHON_TOOL_ROLLBACK=0\)\)/,
  );
  assert.equal(ok.isError, false);
  assert.match(messageText(ok), /^status: ok/);

  // cancelled: the user aborts the turn while python runs (the CLI's Esc). pi 0.73 still asks the
  // (already aborted) model once after the tool result, which consumes a scripted response and
  // records an "aborted" assistant message.
  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("python", { code: "import time; time.sleep(30)" })], { stopReason: "toolUse" }),
    fauxAssistantMessage("not shown: the turn was aborted"),
  ]);
  const timer = setTimeout(() => void h.session.abort(), 500);
  t.after(() => clearTimeout(timer));
  const started = Date.now();
  await h.prompt("run something slow");
  assert.ok(Date.now() - started < 6000, "the abort ended the turn promptly");
  const last = h.session.messages.at(-1)!;
  assert.ok(last.role === "assistant" && last.stopReason === "aborted");
  const cancelled = h.toolResults().at(-1)!;
  assert.equal((cancelled.details as Details).status, "cancelled");
  assert.equal(cancelled.isError, true);

  // What the model gets on the next turn: the cancelled result, marked as an error.
  const seen: Context["messages"][] = [];
  h.faux.setResponses([
    (context: Context) => {
      seen.push(structuredClone(context.messages));
      return fauxAssistantMessage("ok");
    },
  ]);
  await h.prompt("what happened?");
  const sawCancelled = seen[0].filter((m): m is ToolResultMessage => m.role === "toolResult").at(-1)!;
  assert.equal(sawCancelled.isError, true);
  assert.match(messageText(sawCancelled), /^status: cancelled/);
});

// --- 11. unavailable ----------------------------------------------------------------------------------------

test("unavailable: a missing interpreter is reported as an actionable error; pi keeps running", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const saved = process.env.PI_PYTHON_TOOL_INTERPRETER;
  process.env.PI_PYTHON_TOOL_INTERPRETER = "/nonexistent/python3";
  t.after(() => {
    if (saved === undefined) delete process.env.PI_PYTHON_TOOL_INTERPRETER;
    else process.env.PI_PYTHON_TOOL_INTERPRETER = saved;
  });
  const dirsBefore = runtimeDirs();
  const processesBefore = sandboxProcesses();
  const h = await setup(t);
  assert.deepEqual(h.extensionErrors, []);

  for (let i = 0; i < 2; i++) {
    const r = await call(h, { code: "print(1)" });
    assert.equal(r.details.status, "unavailable", r.text);
    assert.equal(r.details.isError, true);
    assert.match(r.text, /^status: unavailable/);
    assert.match(r.text, /Python interpreter not found at \/nonexistent\/python3/);
    assert.match(r.text, /PI_PYTHON_TOOL_INTERPRETER/, "names the setting to fix");
  }
  const [seen] = await turn(h, [{ code: "print(1)" }]);
  assert.equal(seen.isError, true);
  assert.match(messageText(seen), /Python interpreter not found/);

  const report = await status(h);
  assert.equal(report.available, "unavailable");
  assert.match(report.diagnostic, /\/nonexistent\/python3/);
  assert.equal(report.workerRunning, false);
  assert.deepEqual(sandboxProcesses(), processesBefore);
  assert.deepEqual(runtimeDirs(), dirsBefore, "no session dir for an unavailable sandbox");
  assert.deepEqual(h.extensionErrors, []);

  // pi itself is unaffected: a plain turn still works.
  h.faux.setResponses([fauxAssistantMessage("still here")]);
  const final = (await h.prompt("hello")).at(-1);
  assert.ok(final?.role === "assistant" && messageText(final) === "still here");
});

// --- 12. bounded model-facing text ------------------------------------------------------------------------

test("model-facing text stays within 50 KiB and 2,000 lines and points at the logs", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const [manyBytes, oneHugeLine, manyLines] = await turn(h, [
    { code: "import sys\nfor i in range(5000):\n    sys.stdout.write(str(i).rjust(1023, 'z') + '\\n')" },
    { code: "import sys; sys.stdout.write('q' * (5 * 1024 * 1024))" },
    { code: "for i in range(10000): print(i)" },
  ]);
  const stored = h.toolResults().slice(-3);

  for (const [name, seen, details] of [
    ["5 MB in lines", manyBytes, stored[0].details],
    ["5 MB on one line", oneHugeLine, stored[1].details],
  ] as const) {
    const text = messageText(seen);
    const d = details as Details;
    assert.equal(d.status, "output_limit", name);
    assert.equal(seen.isError, true, name);
    assert.equal(d.outputLimitExceeded, true);
    assert.equal(d.logComplete, false);
    assert.ok(byteLength(text) <= MAX_TEXT_BYTES, `${name}: ${byteLength(text)} bytes`);
    assert.ok(lineCount(text) <= MAX_TEXT_LINES, `${name}: ${lineCount(text)} lines`);
    // By the path the code opens: the session's log directory is /logs in the sandbox.
    assert.ok(text.includes(`/logs/${basename(d.logPaths.stdout)}`), `${name}: names the log path`);
    const logged = statSync(d.logPaths.stdout).size;
    assert.ok(logged > 0 && logged <= 1024 * 1024 + 64 * 1024, `${name}: partial log of ${logged} bytes`);
  }

  const text = messageText(manyLines);
  assert.equal(manyLines.isError, false);
  assert.equal((stored[2].details as Details).status, "ok");
  assert.ok(lineCount(text) <= MAX_TEXT_LINES, `${lineCount(text)} lines`);
  assert.ok(byteLength(text) <= MAX_TEXT_BYTES);
  assert.ok(text.split("\n").some((line) => /\d+ bytes omitted/.test(line)), "a line says how much is omitted");
  assert.match(text, /\n0\n1\n2\n/, "the head is kept");
  assert.match(text, /\n9999(\n|$)/, "the tail is kept");
  const log = readFileSync((stored[2].details as Details).logPaths.stdout, "utf8");
  assert.equal(lineCount(log.trimEnd()), 10000, "the log has every line");
});

// --- TUI and streaming ------------------------------------------------------------------------------

test("a long execution streams progress through onUpdate at a bounded rate", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const updates: { text: string; details: Details; at: number }[] = [];
  const started = Date.now();
  const r = await h.getTool("python").execute(
    "stream-1",
    { code: "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.5)" },
    undefined,
    (u: { content: { type: string; text?: string }[]; details: Details }) =>
      updates.push({ text: messageText(u as never), details: u.details, at: Date.now() - started }),
  );
  assert.equal((r.details as Details).status, "ok");
  assert.ok(updates.length >= 2 && updates.length <= 8, `${updates.length} updates in ~2 s`);
  for (const u of updates) assert.equal(u.details.status, "running");
  const elapsed = updates.map((u) => u.details.elapsedMs as number);
  assert.deepEqual(elapsed, [...elapsed].sort((a, b) => a - b), "elapsed time only grows");
  assert.match(updates[0].text, /^running \d+\.\ds · stdout \d+(\.\d)? (B|KiB) · stderr 0 B/);
  assert.match(updates.at(-1)!.text, /tick 2/, "the latest output is shown");
  assert.ok((updates.at(-1)!.details.stdoutBytes as number) >= 14);
});

test("renderCall: the first lines of the code, highlighted, how many more; expanded all of it", async (t) => {
  setupTui();
  const h = await setup(t);
  const { renderCall } = pythonRenderers(h);
  const code = ["", "", "import math", "def area(r):", "    return math.pi * r * r", ...Array.from({ length: 8 }, (_, i) => `print(area(${i}))`), ""].join("\n");
  const collapsed = renderCall({ code, timeoutSeconds: 5 }, theme(), context());
  assert.deepEqual(shown(collapsed).split("\n"), [
    "python (timeout 5s)",
    "import math",
    "def area(r):",
    "    return math.pi * r * r",
    "print(area(0))",
    "print(area(1))",
    "print(area(2))",
    "... (5 more lines, 13 lines total, ctrl+o to expand)",
  ]);
  // Highlighted as pi highlights Python: the keywords carry colours of their own.
  const raw = screen(collapsed).join("\n");
  assert.match(raw, /\x1b\[[0-9;]*m(import|def)\x1b\[39m/);
  const expanded = shown(renderCall({ code, timeoutSeconds: 5 }, theme(), context({ expanded: true })));
  assert.equal(expanded, ["python (timeout 5s)", ...code.trimEnd().split("\n")].join("\n"), "every line, the leading blank ones too");
  assert.doesNotMatch(expanded, /more line/);

  assert.equal(shown(renderCall({ code: "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\ng = 7" }, theme(), context())).split("\n").at(-1), "... (1 more line, 7 lines total, ctrl+o to expand)");
  assert.equal(shown(renderCall({ code: "print(1)" }, theme(), context())), "python\nprint(1)");
  assert.equal(shown(renderCall({ action: "status" }, theme(), context())), "python status");
  assert.equal(shown(renderCall({ action: "reset" }, theme(), context())), "python reset");
  // The model's code cannot reach the terminal as sequences.
  const hostile = screen(renderCall({ code: "print('\x1b]52;c;aGk=\x07\u202e')" }, theme(), context({ expanded: true }))).join("");
  assert.doesNotMatch(hostile, /\x1b\]|\x07|\u202e/);
  assert.match(plain(hostile), /␛\]52;c;aGk=␇<U\+202E>/);
});

test("refused parameters render as an error with its status word, in pi's own tool row", async (t) => {
  setupTui();
  const h = await setup(t);
  // pi's schema refuses one; the tool's own check (which throws) the other.
  const refused = await turn(h, [{ code: "1", timeoutSeconds: 500 }, { code: "" }]);
  const def = (h.session as never as { extensionRunner: { getToolDefinition(n: string): unknown } }).extensionRunner.getToolDefinition("python");
  const Row = (piAgent as unknown as {
    ToolExecutionComponent: new (...a: unknown[]) => { updateResult(r: unknown, p: boolean): void; render(w: number): string[] };
  }).ToolExecutionComponent;
  const { renderResult } = pythonRenderers(h);
  for (const [i, message] of [/timeoutSeconds: (must be|expected) <= 120/, /requires `code` \(a non-empty string\)/].entries()) {
    const r = refused[i];
    assert.equal(r.isError, true, messageText(r));
    assert.match(messageText(r), message);
    const row = new Row("python", `refused-${i}`, {}, { showImages: false }, def, { requestRender() {} }, process.cwd());
    row.updateResult({ content: r.content, details: r.details, isError: true }, false);
    const drawn = row.render(100).map((l) => plain(l).trimEnd()).join("\n");
    assert.match(drawn, /✗ python refused/, drawn);
    assert.doesNotMatch(drawn, /✓/, drawn);
    assert.match(drawn, message, "the reason is shown");
    // Whatever pi passes as the context, the result's own fields say it failed.
    const bare = shownResult(renderResult({ content: r.content, details: r.details }, { expanded: false, isPartial: false }, theme(), context({ isError: false })));
    assert.match(bare, /^✗ python refused\n/, bare);
  }
});

test("renderResult: never drops the first line; collapsed, the tail with counts and the log; expanded, every line", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const h = await setup(t);
  const { renderResult } = pythonRenderers(h);
  const render = (r: unknown, expanded: boolean, ctx: Record<string, unknown> = {}) =>
    shownResult(renderResult(r, { expanded, isPartial: false }, theme(), context({ expanded, ...ctx })));
  const tool = h.getTool("python");

  const statusResult = await tool.execute("s", { action: "status" }, undefined, undefined);
  const status = render(statusResult, false);
  assert.match(status, /^✓ python status\npython tool: not started yet/, "the report's first line is shown");
  assert.match(status, /more lines?, ctrl\+o to expand\)/);
  assert.match(render(statusResult, true), /hardening: default-deny seccomp/);
  assert.match(render(await tool.execute("r", { action: "reset" }, undefined, undefined), false), /^✓ python reset\nInterpreter reset: no interpreter was running;/);

  const quiet = await tool.execute("q", { code: "x = 1" }, undefined, undefined);
  assert.match(render(quiet, false), /^✓ python ok \d+\.\ds$/);

  const many = await tool.execute("m", { code: "for i in range(20000): print('line', i)" }, undefined, undefined);
  const d = many.details as Details;
  const collapsed = render(many, false).split("\n");
  assert.match(collapsed[0], /^✓ python ok \d+\.\ds$/);
  assert.match(collapsed[1], /^\.\.\. \([\d,]+ earlier lines, ctrl\+o to expand\)$/);
  const last = collapsed.indexOf("line 19999");
  assert.ok(last > 1, "the tail is shown");
  assert.deepEqual(collapsed.slice(last - 2, last + 1), ["line 19997", "line 19998", "line 19999"]);
  const note = collapsed.slice(last + 1).join(" ");
  assert.match(note, new RegExp(`^\\[Full stdout: ${d.logPaths.stdout} \\(20,000 lines, [\\d.]+KB\\)\\. [\\d,]+ lines, [\\d.]+KB left out of the result\\]$`));
  const expanded = render(many, true);
  const body = messageText(many as never).split("\n").filter((l) => !/^(status: |Full output saved to: )/.test(l));
  for (const line of body) assert.ok(expanded.includes(line), `expanded shows ${JSON.stringify(line)}`);
  assert.match(expanded, /^✓ python ok \d+\.\ds\nline 0\n/, "the head too");
  assert.match(expanded.replace(/\n/g, " "), /\(20,000 lines, /, "the same note expanded");

  // Output shown whole names no log.
  const few = await tool.execute("f", { code: "for i in range(3): print('row', i)" }, undefined, undefined);
  assert.equal(render(few, false).replace(/ok \d+\.\ds/, "ok"), "✓ python ok\nrow 0\nrow 1\nrow 2");

  const failed = await tool.execute("e", { code: "def f(x):\n    return 1 / x\nf(0)" }, undefined, undefined);
  const error = render(failed, false);
  assert.match(error, /^✗ python error /);
  assert.match(error, /return 1 \/ x\n.*\nZeroDivisionError: division by zero/, "the tail of the traceback, with its lines");

  const partial = { content: [{ type: "text", text: "running 1.5s · stdout 10 B · stderr 0 B\nhello" }], details: { status: "running" } };
  assert.equal(shown(renderResult(partial, { expanded: false, isPartial: true }, theme(), context())), "⋯ running 1.5s · stdout 10 B · stderr 0 B\nhello");
});

const AS_NOBODY_ENV = "PPS_EXTENSION_AS_NOBODY";

// Registered in one of the file's four CI runs only (none of it depends on the setting or pi's
// major): elsewhere there is no test, rather than one that passes doing nothing.
if (ROLLBACK && PI_HOST === "pi0") {
  test("as nobody: the tests where the user matters pass unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t: TestContext) => {
    rerunAsNobody(t, "__test__/extension.test.ts", AS_NOBODY_ENV, 5, "^(direct calls|lifecycle):");
  });
}
