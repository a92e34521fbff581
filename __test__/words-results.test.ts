/**
 * What a result tells the model and the user (issue #23), through a REAL pi session
 * (helpers/pi-session.ts; pi 1.x through scripts/pi1-host.mjs) and the real sandbox, in the text
 * the model receives and in the lines pi's TUI shows (pi's theme initialised), with the setting
 * in force (PI_PYTHON_TOOL_ROLLBACK: run with it unset and with 0):
 * - a failed call states what became of interpreter state once, truly for the setting in force;
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
  for (const width of [120, 80]) assert.equal(count(tui(h, width).expanded, STATE), 1, tui(h, width).expanded);
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
