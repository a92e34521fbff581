/**
 * Per-test fixture for the PythonSandbox integration tests, plus the host-side probes they use.
 *
 * Every fixture owns one temp directory holding the project (`project/data.txt` =
 * "fixture-content\n") and the runtime root (`runtime/`, created by the addon on first use). Its
 * sandboxes are disposed and the directory removed in `t.after`, so cleanup runs even when the
 * test fails.
 */
import assert from "node:assert/strict";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import type { ExecResult, PythonSandbox as PythonSandboxClass, SandboxOptions } from "../../index.d.ts";
import { ROLLBACK } from "./sandbox-env.ts";

export type { ExecResult, StatusResult } from "../../index.d.ts";

/** The addon's loader, for tests that start another Node process. */
export const INDEX_CJS = fileURLToPath(new URL("../../index.cjs", import.meta.url));

const addon = createRequire(import.meta.url)("../../index.cjs") as {
  PythonSandbox: new (options: SandboxOptions) => PythonSandboxClass;
};
export const PythonSandbox = addon.PythonSandbox;
export type PythonSandbox = PythonSandboxClass;

export const FIXTURE_CONTENT = "fixture-content\n";

export interface Fixture {
  /** The test's own temp directory (parent of `project` and `runtimeRoot`). */
  base: string;
  project: string;
  runtimeRoot: string;
  /** The fixture's first sandbox. */
  sb: PythonSandbox;
  /** Another sandbox over the same project and runtime root, disposed with the fixture. */
  open(options?: Partial<SandboxOptions>): PythonSandbox;
}

export async function makeFixture(t: TestContext, options: Partial<SandboxOptions> = {}): Promise<Fixture> {
  const base = await mkdtemp(join(tmpdir(), "pps-test-"));
  const sandboxes: PythonSandbox[] = [];
  t.after(async () => {
    await Promise.all(sandboxes.map((s) => s.dispose("test end").catch(() => {})));
    await rm(base, { recursive: true, force: true });
  });
  const project = join(base, "project");
  const runtimeRoot = join(base, "runtime");
  await mkdir(project);
  await writeFile(join(project, "data.txt"), FIXTURE_CONTENT);
  const open = (extra: Partial<SandboxOptions> = {}) => {
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot, ...options, ...extra });
    sandboxes.push(sb);
    return sb;
  };
  return { base, project, runtimeRoot, sb: open(), open };
}

/**
 * A fixture whose sandboxes keep no spare, for the suites that check the engine's own lifecycle
 * ("nothing is left after a reset"): a spare starting in the background would be counted too.
 */
export const makeFixtureWithoutSpare: typeof makeFixture = (t, options = {}) => makeFixture(t, { prewarm: false, ...options });

/** A fake interpreter outside /usr (its prefix gets mounted), running `script` with /bin/sh. */
export async function fakeInterpreter(fx: Fixture, name: string, script: string): Promise<string> {
  const bin = join(fx.base, name, "bin");
  await mkdir(bin, { recursive: true });
  const path = join(bin, "python3");
  await writeFile(path, `#!/bin/sh\n${script}\n`);
  await chmod(path, 0o755);
  return path;
}

/** Python source from an indented template literal (raw: backslashes reach Python as written). */
export function py(strings: TemplateStringsArray, ...values: unknown[]): string {
  const text = String.raw({ raw: strings.raw }, ...values);
  const lines = text.split("\n");
  if (lines.length > 0 && lines[0].trim() === "") lines.shift();
  if (lines.length > 0 && lines[lines.length - 1].trim() === "") lines.pop();
  const indents = lines.filter((l) => l.trim() !== "").map((l) => l.length - l.trimStart().length);
  const cut = indents.length ? Math.min(...indents) : 0;
  return lines.map((l) => l.slice(cut)).join("\n");
}

/** A one-line summary of a result for assertion messages. */
export function show(r: ExecResult): string {
  return JSON.stringify({ ...r, text: undefined }).slice(0, 4000);
}

/** A `py` literal for a JS string (JSON string syntax is valid Python for these values). */
export const lit = (s: string) => JSON.stringify(s);

export function assertOk(r: ExecResult): void {
  assert.equal(r.status, "ok", show(r));
  assert.equal(r.isError, false, show(r));
}

/** The last stdout line of an ok result, parsed as JSON. */
export function jsonOut<T = any>(r: ExecResult): T {
  assertOk(r);
  const lines = r.stdout.trim().split("\n");
  return JSON.parse(lines[lines.length - 1]);
}

/**
 * What a failed call (a timeout, a cancel, a death, a broken frame) did to the interpreter state,
 * for the setting in force: with rollback on it was rolled back (`fresh`: to the fresh
 * interpreter of the call that was its first) and the result says so; with rollback off it was
 * lost, for `reason` when given, and the result says that rollback is off.
 */
export function assertFailedCallState(r: ExecResult, opts: { reason?: string; fresh?: boolean } = {}): void {
  if (ROLLBACK) {
    assert.equal(r.rolledBack, true, show(r));
    assert.deepEqual([r.state, r.lossCause], ["rolled_back", undefined], show(r));
    assert.equal(r.stateLost, false, show(r));
    assert.equal(r.stateLostReason, undefined, show(r));
    const kept = opts.fresh
      ? "a fresh interpreter: this was its first call; "
      : "variables, imports and definitions are as they were; ";
    assert.ok(
      r.text.includes(`The interpreter was rolled back to its state before this call (${kept}files in /workspace and /scratch keep what the call wrote).`),
      r.text,
    );
  } else {
    assert.equal(r.rolledBack, false, show(r));
    assert.deepEqual([r.state, r.lossCause], ["lost", "rollback_off"], show(r));
    assert.equal(r.stateLost, true, show(r));
    if (opts.reason !== undefined) assert.equal(r.stateLostReason, opts.reason, show(r));
    assert.ok(
      r.text.includes(`Interpreter state was LOST (${r.stateLostReason}; rollback is off (PI_PYTHON_TOOL_ROLLBACK=0)).`),
      r.text,
    );
  }
}

/**
 * After a failure of a call that ran after `kept = 1`: with rollback on the next call has `kept`
 * (the same interpreter generation); with rollback off the sandbox was killed and the next call
 * runs in a fresh interpreter (the next generation).
 */
export async function assertRecovers(sb: { execute(code: string): Promise<ExecResult> }, failed: ExecResult): Promise<void> {
  const next = await sb.execute("'kept' in globals()");
  assertOk(next);
  if (ROLLBACK) {
    assert.equal(next.repr, "True", "the failed call was not rolled back");
    assert.equal(next.generation, failed.generation);
  } else {
    assert.equal(next.repr, "False", "interpreter state survived a fault that killed the sandbox");
    assert.equal(next.generation, failed.generation + 1);
  }
}

/**
 * Makes the next call start a new sandbox, in either setting: with rollback off a reset does;
 * with rollback on a reset keeps the sandbox (its PID 1 forks a fresh interpreter), and a
 * permission-mode change that restarts (the live path off for it) is what replaces it.
 */
export async function replaceSandbox(sb: PythonSandbox): Promise<void> {
  if (!ROLLBACK) {
    await sb.reset();
    return;
  }
  // A mode change made in place keeps the sandbox: the live path off, it restarts it.
  const mode = sb.status().workspaceMode === "read-only" ? "yolo" : "manual";
  const saved = process.env.PI_SANDBOX_LIVE_GRANTS;
  process.env.PI_SANDBOX_LIVE_GRANTS = "0";
  try {
    assert.equal(sb.applyModeEvent({ mode, readRoots: [] }).changed, true, `a change to ${mode}`);
  } finally {
    if (saved === undefined) delete process.env.PI_SANDBOX_LIVE_GRANTS;
    else process.env.PI_SANDBOX_LIVE_GRANTS = saved;
  }
}

export { hostPidsWithCmdline } from "../../scripts/lib/procs.mjs";
export { sessionDirs } from "../../scripts/lib/runtime-root.mjs";

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Poll `check` until it holds or `ms` pass; returns whether it held. */
export async function waitUntil(check: () => boolean, ms: number, step = 25): Promise<boolean> {
  const end = Date.now() + ms;
  for (;;) {
    if (check()) return true;
    if (Date.now() >= end) return false;
    await sleep(step);
  }
}
