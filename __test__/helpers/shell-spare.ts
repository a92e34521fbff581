/** Shell commands through the addon, and the bash tool's spare they leave, for the spare's tests. */
import assert from "node:assert/strict";
import type { PythonSandbox } from "../../index.js";

let nextId = 1;

/** A fresh id for a shell command of this process. */
export const nextShellId = (): number => nextId++;

/** Run `command` in `cwd`: its exit code and its output. */
export async function sh(sb: PythonSandbox, cwd: string, command: string): Promise<{ code: number | null | undefined; out: string }> {
  let out = "";
  const r = await sb.execShell(nextShellId(), command, { cwd }, (t: string) => {
    out += t;
  });
  return { code: r.exitCode, out };
}

/** Run a command, then wait for the spare it leaves: ready; its pid. */
export async function withSpare(sb: PythonSandbox, cwd: string, command = "true"): Promise<number> {
  await sh(sb, cwd, command);
  const spare = await sb.awaitShellSpare();
  assert.equal(spare.state, "ready", JSON.stringify(spare));
  assert.ok(spare.pid, "a ready spare has a pid");
  return spare.pid;
}
