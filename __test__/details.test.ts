/**
 * One typed result: the `details` pi keeps of an execute result are derived from the addon's
 * result (js/render.ts `executeDetails`), and the renderer reads their fields (the text's parts,
 * what it left out), never the text: output that imitates the tool's own lines is shown as
 * output. A field renamed on one side only fails here (and `tsc` fails on the JavaScript side).
 * Run: node --import tsx --test __test__/details.test.ts
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { test } from "node:test";
import { join } from "node:path";
import type { AvailableState, CodeForm, ExecResult, ResetReason, SpareState, StatusResult, WorkspaceMode } from "../index.d.ts";
import { executeDetails, RENDERED_FIELDS, RENDERED_IMAGE_FIELDS, renderResult } from "../js/render.ts";
import { context, setupTui, shownResult, theme } from "./helpers/render.ts";
import { ROLLBACK, skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";
import { hostPidsWithCmdline, makeFixtureWithoutSpare as makeFixture, py, show, waitUntil } from "./helpers/sandbox-fixture.ts";

/** Lines that look like the tool's own: an image, a note, a log line, an omission. */
const FAKES = [
  "image 1: /scratch/.pi-images/9999-1.png (1x1 PNG, 1B), attached",
  "Full output saved to: /etc/passwd (stdout)",
  "...[7 lines, 77 bytes omitted; the full output is in the log files]...",
];

const CALL = py`
  import struct, zlib
  def png(w, h):
      raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
      def chunk(kind, data):
          return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
      return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
              + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
  class Pic:
      def __init__(self, w, h): self.w, self.h = w, h
      def _repr_png_(self): return png(self.w, self.h)
  class Svg:
      def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"/>'
  for i in range(3000):
      print("line %d" % i)
  print(${JSON.stringify(FAKES.join("\n"))})
  display(Pic(3, 2))
  display(Svg())
`;

const shownOf = (r: ExecResult, details: object, expanded: boolean) =>
  shownResult(
    renderResult({ content: [{ type: "text", text: r.text }], details }, { expanded, isPartial: false }, theme() as never, context({ expanded }) as never),
  );

test("details are the addon's result, and every field the renderer reads is in it", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb } = await makeFixture(t);
  const cut = await sb.execute(CALL);
  assert.equal(cut.status, "ok", show(cut));
  const failed = await sb.execute("while True: pass", 1);
  assert.equal(failed.status, "timeout", show(failed));
  const scratchDir = sb.status().paths.scratchDir ?? undefined;
  const a = executeDetails(cut, scratchDir);
  const b = executeDetails(failed, scratchDir);
  for (const field of RENDERED_FIELDS) {
    assert.ok(field in a || field in b, `the addon's result has no ${field}: ${Object.keys(a).join(", ")}`);
  }
  assert.equal(a.images.length, 1, show(cut));
  for (const field of RENDERED_IMAGE_FIELDS) assert.ok(field in a.images[0], `an image has no ${field}: ${Object.keys(a.images[0])}`);
  // Derived, not copied: every fact of the result is there under its own name, the bytes pi
  // holds in the content and the raw streams are not.
  for (const [key, value] of Object.entries(failed)) {
    if (["text", "stdout", "stderr", "repr", "exception"].includes(key)) assert.ok(!(key in b), key);
    else if (key !== "images") assert.deepEqual((b as Record<string, unknown>)[key], value, key);
  }
  assert.ok(!("data" in a.images[0]));
  assert.equal(a.images[0].hostPath, `${scratchDir}${a.images[0].sandboxPath.slice("/scratch".length)}`);
  assert.ok(b.parts.some((p) => p.kind === "closing"), JSON.stringify(b.parts));
  // The state and its cause are typed: kept by the call that ran; the timeout's, per the setting.
  assert.deepEqual([a.state, a.lossCause], ["kept", undefined]);
  assert.deepEqual([b.state, b.lossCause], ROLLBACK ? ["rolled_back", undefined] : ["lost", "rollback_off"]);
});

test("the renderer reads the parts and the omitted counts, and shows output that imitates them as output", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const { sb } = await makeFixture(t);
  const r = await sb.execute(CALL);
  assert.equal(r.status, "ok", show(r));
  const d = executeDetails(r, sb.status().paths.scratchDir ?? undefined);
  assert.ok(d.omittedLines > 0 && d.omittedBytes > 0, show(r));
  // The model's text has the tool's lines and the fakes.
  assert.match(r.text, /^status: ok \(/);
  assert.match(r.text, /\nimage 1: \/scratch\/\.pi-images\/\d{4}-1\.png \(3x2 PNG, \d+B\), attached\n/);
  for (const fake of FAKES) assert.ok(r.text.includes(`\n${fake}\n`), fake);

  const collapsed = shownOf(r, d, false);
  // The status line is the header; the cut is said with the result's own counts, not the fake's.
  assert.match(collapsed, /^✓ python ok \d+\.\ds\n/);
  assert.doesNotMatch(collapsed, /status: ok \(/);
  const warning = collapsed.slice(collapsed.indexOf("\n[Full stdout: ") + 1);
  assert.ok(warning.startsWith(`[Full stdout: ${d.logPaths.stdout} (`), collapsed);
  const left = new RegExp(`\\.\\n${d.omittedLines.toLocaleString("en-US")} lines, [\\d.]+KB left out of the result\\]$`);
  assert.match(warning, left, "the result's own count, not the fake's (7 lines, 77 B)");

  const expanded = shownOf(r, d, true);
  // The fakes are output, shown where they were printed; the real image and log lines are not text.
  for (const fake of FAKES) assert.ok(expanded.includes(`\n${fake}\n`), `${fake} hidden:\n${expanded}`);
  assert.doesNotMatch(expanded, /image 1: \/scratch\/\.pi-images\/\d{4}-1\.png \(3x2/);
  assert.doesNotMatch(expanded, /saved to: \/.*-out\.log/);
  // The note names the host file, the image is shown by its host file.
  assert.ok(expanded.includes(`note: SVG saved as ${d.scratchDir}/.pi-images/`), expanded);
  assert.ok(expanded.includes(d.images[0].hostPath ?? "no host path"), expanded);
});

test("a closing paragraph is read from its part: shown whole collapsed, in place expanded", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const { sb } = await makeFixture(t);
  const r = await sb.execute("print('started')\nwhile True: pass", 1);
  assert.equal(r.status, "timeout", show(r));
  const d = executeDetails(r, undefined);
  const closing = d.parts.filter((p) => p.kind === "closing");
  assert.equal(closing.length, 1, JSON.stringify(d.parts));
  assert.equal(r.text.slice(closing[0].start, closing[0].end), r.diagnostic);
  const collapsed = shownOf(r, d, false);
  const flat = (s: string) => s.replace(/\s+/g, " ");
  assert.ok(flat(collapsed).endsWith(flat(r.diagnostic ?? "no diagnostic")), collapsed);
  assert.match(collapsed, /^✗ python timeout \d+\.\ds\nstarted\n/);
  // Expanded, the same paragraph is in its place, once.
  const expanded = shownOf(r, d, true);
  assert.equal(expanded.split("Execution exceeded the 1s deadline").length, 2, expanded);
});

test("the state discarded before a call is a typed cause: a mode change, a death while idle", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb } = await makeFixture(t);
  const first = await sb.execute("x = 1");
  assert.equal(first.status, "ok", show(first));
  assert.equal(first.lostBeforeCause, undefined, "nothing was discarded before the first call");
  // With rollback on the change would be made in place (state kept): the live path off, it restarts.
  const saved = process.env.PI_SANDBOX_LIVE_GRANTS;
  process.env.PI_SANDBOX_LIVE_GRANTS = "0";
  try {
    assert.ok(sb.applyModeEvent({ mode: "edits", readRoots: [] }).discarded, "the change restarts the sandbox");
  } finally {
    if (saved === undefined) delete process.env.PI_SANDBOX_LIVE_GRANTS;
    else process.env.PI_SANDBOX_LIVE_GRANTS = saved;
  }
  const remounted = await sb.execute("x = 2");
  assert.equal(remounted.status, "ok", show(remounted));
  assert.deepEqual([remounted.state, remounted.lostBeforeCause], ["kept", "remounted"], show(remounted));
  assert.match(remounted.lostBefore ?? "", /permission mode or read roots changed/);
  // The interpreter (pid 2) is killed after the result, while idle; the next call once the killer
  // (named by its $0) is done.
  const marker = `pps-killer-${randomUUID()}`;
  const killer = `import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 1.5; kill -9 2', ${JSON.stringify(marker)}])`;
  assert.equal((await sb.execute(killer, 10)).status, "ok");
  assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 20_000), "the killer never ended");
  const died = await sb.execute("'x' in globals()");
  assert.equal(died.repr, "False", show(died));
  assert.deepEqual([died.state, died.lostBeforeCause], ["kept", "died_idle"], show(died));
  assert.match(died.lostBefore ?? "", /died while idle/);
});

test("what a kill was for is a typed field: timeout, abort, output bound, violation, remount, dispose", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb } = await makeFixture(t);
  const ok = await sb.execute("1 + 1");
  assert.deepEqual([ok.status, ok.killedFor], ["ok", undefined], show(ok));
  const sleep = "import time\nprint('started', flush=True)\ntime.sleep(30)";
  const later = (ms: number, what: () => void) => new Promise<void>((resolve) => setTimeout(() => (what(), resolve()), ms));

  const timeout = await sb.execute("while True: pass", 1);
  assert.deepEqual([timeout.status, timeout.killedFor], ["timeout", "timeout"], show(timeout));
  const [aborted] = await Promise.all([sb.execute(sleep, 30, 41), later(1500, () => assert.ok(sb.cancel(41), "the call runs"))]);
  assert.deepEqual([aborted.status, aborted.killedFor], ["cancelled", "abort"], show(aborted));
  const flood = await sb.execute('while True:\n    print("y" * 499)', 60);
  assert.deepEqual([flood.status, flood.killedFor], ["output_limit", "output_limit"], show(flood));
  const violation = await sb.execute('import os\nos.write(4, b"\\x00\\x00\\x00\\x05hello")');
  assert.match(violation.diagnostic ?? "", /Protocol violation/, show(violation));
  assert.equal(violation.killedFor, "violation", show(violation));
  // An interpreter that ends on its own was not killed.
  const exited = await sb.execute("import os\nos._exit(7)");
  assert.deepEqual([exited.status, exited.killedFor], ["worker_error", undefined], show(exited));
  assert.equal(exited.startFailure, undefined);
  // Writable between calls, then back to read-only under a running call (never made under it).
  sb.applyModeEvent({ mode: "edits", readRoots: [] });
  const [remounted] = await Promise.all([
    sb.execute(sleep, 30),
    later(1500, () => sb.applyModeEvent({ mode: "manual", readRoots: [] })),
  ]);
  assert.match(remounted.diagnostic ?? "", /permission mode or read roots changed while the code ran/, show(remounted));
  assert.equal(remounted.killedFor, "remount", show(remounted));
  const [disposed] = await Promise.all([sb.execute(sleep, 30), later(1500, () => void sb.dispose())]);
  assert.match(disposed.diagnostic ?? "", /disposed while the code ran/, show(disposed));
  assert.equal(disposed.killedFor, "dispose", show(disposed));
});

test("a kill by the memory cap is killedFor memory", async (t) => {
  if (skipWithoutSandbox(t)) return;
  // The cap is read at each start: this test's sandbox gets 256 MiB.
  const before = process.env.PI_PYTHON_TOOL_MAX_MEMORY;
  process.env.PI_PYTHON_TOOL_MAX_MEMORY = "256M";
  t.after(() => {
    if (before === undefined) delete process.env.PI_PYTHON_TOOL_MAX_MEMORY;
    else process.env.PI_PYTHON_TOOL_MAX_MEMORY = before;
  });
  const { sb } = await makeFixture(t);
  const c = sb.status().containment;
  if (c.memory === "none") {
    // No memory cap on this host, and status says so (as containment.test.ts checks): nothing to kill for.
    assert.match(c.text, /memory NOT contained/);
    t.diagnostic(`no memory cap here: ${c.text}`);
    return;
  }
  const r = await sb.execute("block = b'\\x01' * (400 << 20)\nprint('held')");
  assert.equal(r.status, "worker_error", show(r));
  assert.match(r.diagnostic ?? "", /out of memory/, show(r));
  assert.equal(r.killedFor, "memory", show(r));
});

test("why a sandbox did not start is a typed field", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const fx = await makeFixture(t);
  // bubblewrap refuses to mount a project that is a file.
  const file = join(fx.base, "not-a-dir");
  await writeFile(file, "x");
  const sb = fx.open({ projectDir: file });
  const r = await sb.execute("1");
  assert.equal(r.status, "worker_error", show(r));
  assert.match(r.diagnostic ?? "", /did not start/, show(r));
  assert.deepEqual([r.startFailure, r.killedFor, r.state], ["other", undefined, "untouched"], show(r));
  const ok = await fx.sb.execute("1");
  assert.deepEqual([ok.status, ok.startFailure], ["ok", undefined], show(ok));
});

/** Every value of the union, so that a variant renamed or added on the Rust side fails `tsc` here. */
const RESET_REASONS: Record<ResetReason, true> = {
  explicit_reset: true,
  startup_failure: true,
  mounts_changed: true,
  worker_error: true,
  worker_died_idle: true,
  timeout: true,
  cancelled: true,
  output_limit: true,
  remounted: true,
  disposed: true,
};

test("status's last reset is a typed cause: mounts_changed and worker_error (rollback off), remounted, explicit_reset, disposed", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb } = await makeFixture(t);
  const reason = () => {
    const r = sb.status().lastResetReason;
    assert.ok(r === undefined || r in RESET_REASONS, `not a ResetReason: ${r}`);
    return r;
  };
  assert.equal(reason(), undefined, "nothing was discarded yet");
  assert.equal((await sb.execute("x = 1")).status, "ok");
  // Writable between calls: made in place with rollback on, a restart with it off.
  sb.applyModeEvent({ mode: "edits", readRoots: [] });
  assert.equal((await sb.execute("x = 2")).status, "ok");
  assert.equal(reason(), ROLLBACK ? undefined : "mounts_changed");
  // Back to read-only while a call runs: never made under the call.
  const sleep = "import time\nprint('started', flush=True)\ntime.sleep(30)";
  const later = (ms: number, what: () => void) => new Promise<void>((resolve) => setTimeout(() => (what(), resolve()), ms));
  const [remounted] = await Promise.all([sb.execute(sleep, 30), later(1500, () => sb.applyModeEvent({ mode: "manual", readRoots: [] }))]);
  assert.equal(remounted.killedFor, "remount", show(remounted));
  assert.equal(reason(), "remounted");
  await sb.reset();
  assert.equal(reason(), "explicit_reset");
  const exited = await sb.execute("import os\nos._exit(7)");
  assert.equal(exited.status, "worker_error", show(exited));
  // Rolled back, the interpreter's death is the last failure, not a reset.
  assert.equal(reason(), ROLLBACK ? "explicit_reset" : "worker_error", show(exited));
  await sb.dispose();
  assert.equal(reason(), "disposed");
  assert.match(sb.status().text, /interpreter state last discarded by: the session's dispose\n/);
});

test("the docs list every ResetReason, and nothing else, as status().lastResetReason's values", async () => {
  const doc = await readFile(join(import.meta.dirname, "..", "docs", "architecture.md"), "utf8");
  const listed = /`status\(\)\.lastResetReason`[^]*?`ResetReason`: ([^;]*);/.exec(doc.replace(/\n/g, " "));
  assert.ok(listed, "docs/architecture.md names lastResetReason's values");
  const values = [...listed[1].matchAll(/`([a-z_]+)`/g)].map((m) => m[1]);
  assert.deepEqual(values.sort(), Object.keys(RESET_REASONS).sort());
});

/** Every value of status()'s other unions, so that a variant renamed or added on the Rust side fails `tsc` here. */
const AVAILABLE: Record<AvailableState, true> = { unverified: true, available: true, unavailable: true };
const WORKSPACE_MODES: Record<WorkspaceMode, true> = { "read-only": true, "read-write": true };
const SPARE_STATES: Record<SpareState, true> = { none: true, starting: true, ready: true };
const CODE_FORMS: Record<CodeForm, true> = { source: true, bytecode: true };
const STATUS_UNIONS: [keyof StatusResult, string, Record<string, true>][] = [
  ["available", "AvailableState", AVAILABLE],
  ["workspaceMode", "WorkspaceMode", WORKSPACE_MODES],
  ["spare", "SpareState", SPARE_STATES],
  ["workerCode", "CodeForm", CODE_FORMS],
];

test("status()'s states are string unions in index.d.ts, and the docs list each union's values and nothing else", async () => {
  const dts = await readFile(join(import.meta.dirname, "..", "index.d.ts"), "utf8");
  const doc = (await readFile(join(import.meta.dirname, "..", "docs", "architecture.md"), "utf8")).replace(/\n/g, " ");
  const status = /export interface StatusResult \{([^]*?)\n\}/.exec(dts);
  assert.ok(status, "index.d.ts declares StatusResult");
  for (const [field, union, values] of STATUS_UNIONS) {
    assert.match(status[1], new RegExp(`\\n  ${field}\\??: ${union}\\n`), `StatusResult.${field} is the union ${union}`);
    const declared = new RegExp(`export type ${union} = ([^\\n]*)`).exec(dts);
    assert.ok(declared, `index.d.ts declares the union ${union}`);
    const members = [...declared[1].matchAll(/'([^']*)'/g)].map((m) => m[1]);
    const listed = new RegExp(`\`${field}\` is \`${union}\` \\(([^)]*)\\)`).exec(doc);
    assert.ok(listed, `docs/architecture.md lists ${union}'s values for status().${field}`);
    const words = [...listed[1].matchAll(/`([a-z_-]+)`/g)].map((m) => m[1]);
    assert.deepEqual(members.sort(), Object.keys(values).sort(), `${union} in index.d.ts`);
    assert.deepEqual(words.sort(), Object.keys(values).sort(), `${union} in the docs`);
  }
});

test("status()'s states: unverified, then available with the worker's code form; the spare's state; the project read-only where it could not be protected (baseline: read-write)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb } = await makeFixture(t);
  const states = () => {
    const s = sb.status();
    for (const [field, union, values] of STATUS_UNIONS) {
      const value = s[field];
      assert.ok(value === undefined || (typeof value === "string" && value in values), `not a ${union}: ${String(value)}`);
    }
    return [s.available, s.workspaceMode, s.spare, s.workerCode];
  };
  assert.deepEqual(states(), ["unverified", "read-only", "none", undefined]);
  assert.equal((await sb.execute("1")).status, "ok");
  const [available, mode, spare, code] = states();
  assert.deepEqual([available, mode, spare], ["available", "read-only", "none"]);
  assert.ok(code === "source" || code === "bytecode", String(code));
  // Writable: read-write while the project's walk is within its bound (the baseline)...
  sb.applyModeEvent({ mode: "yolo", readRoots: [] });
  assert.equal((await sb.execute("open('/workspace/new.txt', 'w').close()")).status, "ok");
  assert.equal(states()[1], "read-write");
  await sb.dispose();
  // ...and read-only, as the text says, in a sandbox whose project walk passed its bound.
  withEnv(t, "PI_SANDBOX_SCAN_ENTRIES", "5");
  const { sb: held, project } = await makeFixture(t);
  for (let i = 0; i < 20; i++) await writeFile(join(project, `f${i}.txt`), "x");
  held.applyModeEvent({ mode: "yolo", readRoots: [] });
  const refused = await held.execute("open('/workspace/new.txt', 'w').close()");
  assert.match(refused.text, /Read-only file system/, show(refused));
  assert.match(held.status().text, /\/workspace read-only in this sandbox although the mode allows writes/);
  assert.equal(held.status().workspaceMode, "read-only");
});

test("status names where each setting in force comes from: the caller's option, the environment under the name it was read as", async (t) => {
  withEnv(t, "PI_SANDBOX_TMP_SIZE", undefined);
  withEnv(t, "PI_PYTHON_TOOL_TMP_SIZE", "64M");
  withEnv(t, "PI_PYTHON_TOOL_ROLLBACK", "0");
  const { sb, open } = await makeFixture(t);
  const line = (s: typeof sb) => /^settings: .*$/m.exec(s.status().text)?.[0] ?? "";
  // The fixture's sandboxes are made with `prewarm: false`.
  assert.match(line(sb), /^settings: from the caller's options \(over the environment\): PI_SANDBOX_PREWARM; /, line(sb));
  assert.match(line(sb), /from the environment: PI_PYTHON_TOOL_ROLLBACK, .*PI_PYTHON_TOOL_TMP_SIZE \(for PI_SANDBOX_TMP_SIZE\)/, line(sb));
  const given = open({ rollback: true });
  assert.match(line(given), /^settings: from the caller's options \(over the environment\): PI_SANDBOX_PREWARM, PI_PYTHON_TOOL_ROLLBACK; from the environment: /, line(given));
  assert.doesNotMatch(line(given), /environment: [^;]*PI_PYTHON_TOOL_ROLLBACK/, line(given));
});

test("a status report collapsed is cut at the count its report gives, not at a line that reads 'details:'", () => {
  setupTui();
  const text = "python tool: available\ndetails:\nmode: manual\ndetails:\nhardening: on";
  const shown = (expanded: boolean, summaryLines?: number) =>
    shownResult(
      renderResult(
        { content: [{ type: "text", text }], details: { action: "status", status: "ok", isError: false, report: { summaryLines } } },
        { expanded, isPartial: false },
        theme() as never,
        context({ expanded }) as never,
      ),
    );
  const collapsed = shown(false, 3);
  assert.match(collapsed, /^✓ python status\npython tool: available\ndetails:\nmode: manual\n/, collapsed);
  assert.doesNotMatch(collapsed, /hardening/, collapsed);
  assert.match(collapsed, /details: 1 more line/, collapsed);
  // Expanded, or without the count (a report kept from before it), every line.
  for (const all of [shown(true, 3), shown(false)]) assert.match(all, /mode: manual\ndetails:\nhardening: on/, all);
});
