/**
 * What a result tells the model and the user, through a REAL pi session
 * (helpers/pi-session.ts; pi 1.x through scripts/pi1-host.mjs) and the real sandbox, in the text
 * the model receives and in the lines pi's TUI shows (pi's theme initialised), with the setting
 * in force (PI_PYTHON_TOOL_ROLLBACK: run with it unset and with 0):
 * - a failed call (a timeout, a cancel, an output flood, a mode change while the code runs, an
 *   ordinary error after a mode change) states what became of interpreter state once, truly for
 *   the setting in force;
 * - an interpreter death gives its exit code or its signal;
 * - a cut result names a log the code can open (/logs, read-only); the TUI names the host file;
 * - a host secret masked inside a granted directory is said, not read as an empty file.
 * Run: node --import tsx --test __test__/words-results.test.ts
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { fauxAssistantMessage, fauxToolCall } from "@mariozechner/pi-ai";
import { createPiHarness, messageText, modelSees, type PiHarness } from "./helpers/pi-session.ts";
import { context, pythonRenderers, setupTui, shownResult, theme } from "./helpers/render.ts";
import { ROLLBACK, skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));

// A private TMPDIR: the sandboxes' runtime root belongs to this file.
const PRIVATE_TMP = mkdtempSync(join(tmpdir(), "pi-python-results-"));
const SAVED_TMPDIR = process.env.TMPDIR;
process.env.TMPDIR = PRIVATE_TMP;
after(() => {
  if (SAVED_TMPDIR === undefined) delete process.env.TMPDIR;
  else process.env.TMPDIR = SAVED_TMPDIR;
  rmSync(PRIVATE_TMP, { recursive: true, force: true });
});

async function setup(t: TestContext, cwd?: string): Promise<PiHarness> {
  if (!cwd) {
    cwd = mkdtempSync(join(tmpdir(), "pi-python-results-cwd-"));
    const made = cwd;
    t.after(() => rmSync(made, { recursive: true, force: true }));
  }
  setupTui();
  const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE_DIR] });
  t.after(() => h.dispose());
  assert.deepEqual(h.resourceLoader.getExtensions().errors, []);
  return h;
}

/** The last result as pi's TUI shows it, at `width`, collapsed and expanded. */
function tui(h: PiHarness, width: number): { collapsed: string; expanded: string } {
  const { renderResult } = pythonRenderers(h);
  const r = h.toolResults().at(-1)!;
  const render = (expanded: boolean) =>
    shownResult(
      renderResult({ content: r.content, details: r.details }, { expanded, isPartial: false }, theme(), context({ expanded, isError: true })) as never,
      width,
    );
  return { collapsed: render(false), expanded: render(true) };
}

/** Words wrapped by the TUI read as one line again. */
const flat = (s: string) => s.replace(/\s+/g, " ");
const count = (text: string, what: RegExp) => (flat(text).match(new RegExp(what.source, "gi")) ?? []).length;
/** Any sentence about interpreter state. */
const STATE = /interpreter state|interpreter was rolled back/;

test("a timeout's result states interpreter state once, truly for the setting in force, in the model's text and the TUI", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  await modelSees(h, { code: "before = 1" });
  const r = await modelSees(h, { code: "before = 2\nwhile True: pass", timeoutSeconds: 1 });
  const text = messageText(r);
  assert.equal(r.isError, true);
  assert.match(text, /^status: timeout/);
  assert.equal(count(text, STATE), 1, text);
  const said = ROLLBACK ? /The interpreter was rolled back to its state before this call/ : /Interpreter state was LOST \(/;
  assert.match(text, said);
  assert.doesNotMatch(text, ROLLBACK ? /LOST|discarded|preserved/ : /rolled back|preserved|kept/, text);
  for (const width of [120, 80]) {
    const { collapsed, expanded } = tui(h, width);
    assert.equal(count(collapsed, STATE), 1, collapsed);
    assert.equal(count(expanded, STATE), 1, expanded);
    assert.ok(flat(collapsed).includes(flat(said.source.replace(/\\/g, ""))), collapsed);
  }
  // What it says is what the next call finds.
  const next = messageText(await modelSees(h, { code: "globals().get('before', 'gone')" }));
  assert.match(next, ROLLBACK ? /result: 1$/ : /result: 'gone'$/, next);
});

test("an ordinary error keeps state and says so once; a mode change before it is not a second statement", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  await modelSees(h, { code: "before = 1" });
  h.events.emit("tool-permissions:mode", { mode: "edits", readRoots: [] });
  const r = await modelSees(h, { code: "1/0" });
  const text = messageText(r);
  assert.equal(count(text, STATE), 1, text);
  // With rollback on the change is made in place (state kept); with it off the sandbox restarted
  // before this call, which the one statement says.
  const said = ROLLBACK
    ? "Interpreter state kept: what ran before the error remains."
    : "this call ran on a fresh interpreter, and what ran before the error remains.";
  assert.ok(flat(text).includes(said), text);
  if (!ROLLBACK) assert.match(text, /Earlier interpreter state was discarded before this call \(/, text);
  for (const width of [120, 80]) {
    const { collapsed, expanded } = tui(h, width);
    assert.equal(count(expanded, STATE), 1, expanded);
    assert.equal(count(collapsed, STATE), 1, collapsed);
    assert.ok(flat(collapsed).includes(said), collapsed);
  }
  assert.match(messageText(await modelSees(h, { code: "globals().get('before', 'gone')" })), ROLLBACK ? /result: 1$/ : /result: 'gone'$/);
  const error = messageText(await modelSees(h, { code: "before = 3\nraise KeyError('k')" }));
  assert.equal(count(error, STATE), 1, error);
  assert.match(error, /Interpreter state kept: what ran before the error remains/);
  assert.match(messageText(await modelSees(h, { code: "before" })), /result: 3$/);
});

for (const [name, code, cause] of [
  ["os._exit(3)", "import os\nos._exit(3)", /exited with code 3/],
  ["a segfault", "import ctypes\nctypes.string_at(0)", /signal 11 \(SIGSEGV/],
] as const) {
  test(`an interpreter death (${name}) gives its cause in the model's text and the TUI`, async (t) => {
    if (skipWithoutSandbox(t)) return;
    const h = await setup(t);
    await modelSees(h, { code: "before = 1" });
    const r = await modelSees(h, { code });
    const text = messageText(r);
    assert.equal(r.isError, true);
    assert.match(text, /^status: worker_error/, text);
    assert.match(text, cause, text);
    assert.equal(count(text, STATE), 1, text);
    for (const width of [120, 80]) assert.match(flat(tui(h, width).collapsed), cause);
  });
}

test("a cut result names its log by the path the code opens (/logs, read-only); the TUI names the host file", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const r = await modelSees(h, { code: "for i in range(5000):\n    print('row', i, 'x' * 30)" });
  const text = messageText(r);
  const omitted = text.match(/\.\.\.\[(\d+) lines, (\d+) bytes omitted; the full output is in the log files\]\.\.\./);
  assert.ok(omitted, text.slice(0, 2000));
  const named = text.match(/^Full output saved to: (\/logs\/(\d{4})-out\.log) \(stdout\)$/m);
  assert.ok(named, text.slice(-500));
  const [, path, seq] = named;
  // The model's next call opens it, and cannot change it.
  const read = messageText(
    await modelSees(h, {
      code:
        `lines = open('${path}').read().splitlines()\nprint(len(lines), lines[-1])\n` +
        `try:\n    open('${path}', 'a').write('x')\nexcept OSError as e:\n    print('write:', e.strerror)\n` +
        "print(sorted(n for n in __import__('os').listdir('/logs') if not n.endswith('.log')))",
    }),
  );
  assert.match(read, /^5000 row 4999 x{30}$/m, read);
  assert.match(read, /^write: Read-only file system$/m, read);
  assert.match(read, /^\[\]$/m, "only the calls' logs: the engine's debug log is not there");
  // The TUI names the host file, which exists, and not the sandbox's path.
  const logDir = (h.toolResults().at(-2)!.details as { logPaths?: { stdout?: string } }).logPaths?.stdout;
  assert.ok(logDir && existsSync(logDir) && logDir.endsWith(`/${seq}-out.log`), String(logDir));
  for (const width of [120, 80]) {
    const { renderResult } = pythonRenderers(h);
    const cut = h.toolResults().at(-2)!;
    const shown = shownResult(renderResult({ content: cut.content, details: cut.details }, { expanded: false, isPartial: false }, theme(), context({})) as never, width);
    assert.ok(flat(shown).replace(/ /g, "").includes(`Fullstdout:${logDir}`), shown);
    assert.doesNotMatch(flat(shown), /stdout: \/logs\//, shown);
    assert.match(flat(shown), new RegExp(`${Number(omitted[1]).toLocaleString("en-US")} lines, [\\d.]+ ?[KM]?B left out of the result`), shown);
  }
});

/** A directory outside /tmp with notes.txt and vault/token; `vault` a host secret when `secret`. */
function vault(t: TestContext, secret: boolean): string {
  const base = mkdtempSync("/var/tmp/pps-results-vault-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  mkdirSync(join(base, "vault"));
  writeFileSync(join(base, "vault", "token"), "vault-token-value\n");
  writeFileSync(join(base, "notes.txt"), "notes\n");
  withEnv(t, "PI_SANDBOX_HOST_SECRETS", secret ? `${base}/vault` : undefined);
  withEnv(t, "PI_PYTHON_TOOL_HOST_SECRETS", undefined);
  return base;
}

const READ_BOTH = (base: string) => `print(open('${base}/notes.txt').read().strip())\nprint(repr(open('${base}/vault/token').read()))`;

for (const when of ["granted before the first call", "granted while the sandbox runs"] as const) {
  test(`a host secret masked inside a directory ${when}: the read says so and why, in the model's text and the TUI (baseline: unlisted, it is read)`, async (t) => {
    if (skipWithoutSandbox(t)) return;
    for (const secret of [false, true]) {
      const base = vault(t, secret);
      const h = await setup(t);
      if (when === "granted while the sandbox runs") await modelSees(h, { code: "kept = 1" });
      h.events.emit("tool-permissions:mode", { mode: "manual", readRoots: [base] });
      const r = await modelSees(h, { code: READ_BOTH(base) });
      const text = messageText(r);
      if (!secret) {
        assert.equal(r.isError, false, text);
        assert.match(text, /^notes\n'vault-token-value\\n'$/m, "baseline: unlisted, the grant shows the token");
        await h.dispose();
        continue;
      }
      assert.equal(r.isError, true, text);
      assert.doesNotMatch(text, /vault-token-value|^''$/m, "never the token, and never silently empty");
      assert.match(text, /^notes$/m);
      const said = `${base}/vault/token is a host secret (under ${base}/vault: a credential store or history that the host-secret list names), so the sandbox hides it in every mode and no grant unmasks it`;
      assert.ok(flat(text).includes(said), text);
      assert.match(flat(text), /see PI_SANDBOX_HOST_SECRETS/);
      for (const width of [120, 80]) assert.ok(flat(tui(h, width).collapsed).includes(flat(said)), tui(h, width).collapsed);
    }
  });
}

test("a failure's collapsed view at 80 columns: the state sentence on one line, the exception and a refused read told once", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  await modelSees(h, { code: "before = 1" });
  const r = await modelSees(h, { code: "def f():\n    raise ValueError('bad thing here')\nf()" });
  const text = messageText(r);
  assert.equal(count(text, STATE), 1, text);
  for (const width of [80, 120]) {
    const { collapsed } = tui(h, width);
    const lines = collapsed.split("\n");
    const state = lines.filter((l) => /Interpreter state kept/.test(l));
    assert.equal(state.length, 1, collapsed);
    assert.match(state[0], /^Interpreter state kept: what ran before the error remains\.$/, `one line at ${width} columns:\n${collapsed}`);
    assert.equal(count(collapsed, /ValueError: bad thing here/), 1, collapsed);
  }
  const path = "/opt/pi-results-nowhere/data.csv";
  await modelSees(h, { code: `open('${path}').read()` });
  for (const width of [80, 120]) {
    const { collapsed, expanded } = tui(h, width);
    assert.equal(count(expanded, /outside the sandbox mounts/), 1, expanded);
    assert.equal(count(collapsed, /SandboxReadDenied/), 0, collapsed);
  }
});

/**
 * A failed call's statement of state, checked where it is read: once in the model's text and in
 * the TUI (collapsed and expanded, 120 and 80 columns), the sentence for `said`, and true (the
 * next call finds `before` as it says).
 */
async function statesOnce(h: PiHarness, text: string, said: "rolled back" | "lost"): Promise<void> {
  const sentence = said === "rolled back" ? "The interpreter was rolled back to its state before this call" : "Interpreter state was LOST (";
  assert.equal(count(text, STATE), 1, text);
  assert.ok(text.includes(sentence), text);
  assert.doesNotMatch(text, said === "rolled back" ? /LOST|discarded|preserved|state kept/ : /rolled back|preserved|state kept/, text);
  for (const width of [120, 80]) {
    const { collapsed, expanded } = tui(h, width);
    assert.equal(count(collapsed, STATE), 1, collapsed);
    assert.equal(count(expanded, STATE), 1, expanded);
    assert.ok(flat(collapsed).includes(sentence), collapsed);
  }
  const next = messageText(await modelSees(h, { code: "globals().get('before', 'gone')" }));
  assert.match(next, said === "rolled back" ? /result: 1$/ : /result: 'gone'$/, next);
}

test("a cancel (the user aborts the turn): one statement of state, truly for the setting in force, in the model's text and the TUI", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  await modelSees(h, { code: "before = 1" });
  // pi 0.73 asks the aborted model once more after the result: a second scripted response.
  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("python", { code: "before = 2\nimport time\ntime.sleep(30)" })], { stopReason: "toolUse" }),
    fauxAssistantMessage("not shown: the turn was aborted"),
  ]);
  const timer = setTimeout(() => void h.session.abort(), 600);
  t.after(() => clearTimeout(timer));
  await h.prompt("run something slow");
  // The session's result is what the model is given on the next turn.
  const r = h.toolResults().at(-1)!;
  const text = messageText(r);
  assert.equal(r.isError, true);
  assert.match(text, /^status: cancelled/, text);
  if (!ROLLBACK) assert.match(text, /rollback is off \(PI_PYTHON_TOOL_ROLLBACK=0\)/, "a loss says why");
  await statesOnce(h, text, ROLLBACK ? "rolled back" : "lost");
});

test("an output flood: one statement of state, truly for the setting in force, in the model's text and the TUI", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  await modelSees(h, { code: "before = 1" });
  const r = await modelSees(h, { code: "before = 2\nimport sys\nwhile True: sys.stdout.write('x' * 65536)" });
  const text = messageText(r);
  assert.equal(r.isError, true);
  assert.match(text, /^status: output_limit/, text);
  if (!ROLLBACK) assert.match(text, /rollback is off \(PI_PYTHON_TOOL_ROLLBACK=0\)/, "a loss says why");
  await statesOnce(h, text, ROLLBACK ? "rolled back" : "lost");
});

test("a mode change while the code runs ends the call: state lost in both settings, said once with its cause, in the model's text and the TUI", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  h.events.emit("tool-permissions:mode", { mode: "edits", readRoots: [] });
  await modelSees(h, { code: "before = 1" });
  const call = modelSees(h, { code: "import time\ntime.sleep(30)" });
  const timer = setTimeout(() => h.events.emit("tool-permissions:mode", { mode: "manual", readRoots: [] }), 600);
  t.after(() => clearTimeout(timer));
  const r = await call;
  const text = messageText(r);
  assert.equal(r.isError, true);
  assert.match(text, /^status: worker_error/, text);
  assert.match(text, /The permission mode or read roots changed while the code ran/, text);
  await statesOnce(h, text, "lost");
});
