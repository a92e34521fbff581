/**
 * Raw system-call probes for the escape catalogue: one Python snippet that makes every call of a
 * table through ctypes and prints each answer, run once in the sandbox and once in an unfiltered
 * bubblewrap baseline (see unfiltered.ts), so that each call can then be asserted in its own test.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, type TestContext } from "node:test";
import { sandboxSkipReason, skipWithoutSandbox } from "./sandbox-env.ts";
import { jsonOut, lit, PythonSandbox, py } from "./sandbox-fixture.ts";
import { unfiltered } from "./unfiltered.ts";

/** What one call answered. */
export type Answer = { ret: number; errno: number };

/** The x86_64 system call numbers of the probes are meaningless elsewhere: skip loudly. */
export function skipUnlessX64(t: TestContext): boolean {
  if (process.arch === "x64") return false;
  console.log(`# SKIP ${t.name}: the probes use x86_64 system call numbers, this is ${process.arch}`);
  t.skip(`x86_64 system call numbers; this is ${process.arch}`);
  return true;
}

/** Skip (loudly, never under CI) without a sandbox or off x86_64. */
export const skipProbe = (t: TestContext) => skipWithoutSandbox(t) || skipUnlessX64(t);

/** The last stdout line, as JSON. */
export const lastJson = (out: string) => JSON.parse(out.trim().split("\n").at(-1) ?? "null");

/** Python that makes each call (title, number, arguments) and prints `{title: answer}`. */
export function tableProbe(probes: { title: string; nr: number; args: number[] }[]): string {
  return py`
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def call(nr, args):
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        return {"ret": ret, "errno": ctypes.get_errno()}
    probes = json.loads(${lit(JSON.stringify(probes.map((p) => [p.title, p.nr, p.args])))})
    print(json.dumps({title: call(nr, args) for title, nr, args in probes}))
  `;
}

/**
 * In the enclosing describe: run the table once inside a sandbox and once unfiltered (before its
 * tests; cleaned up after). The getters are undefined where the probes could not run.
 */
export function probeTable(
  tag: string,
  probes: { title: string; nr: number; args: number[] }[],
): { inside(): Record<string, Answer> | undefined; outside(): Record<string, Answer> | undefined } {
  let inside: Record<string, Answer> | undefined;
  let outside: Record<string, Answer> | undefined;
  let base: string | undefined;
  let sandbox: PythonSandbox | undefined;
  before(async () => {
    if (sandboxSkipReason() !== null || process.arch !== "x64") return;
    base = mkdtempSync(join(tmpdir(), `pps-${tag}-`));
    await mkdir(join(base, "project"));
    sandbox = new PythonSandbox({ projectDir: join(base, "project"), runtimeRoot: join(base, "runtime") });
    const code = tableProbe(probes);
    const [r, baseline] = await Promise.all([sandbox.execute(code), unfiltered(code)]);
    inside = jsonOut(r);
    outside = lastJson(baseline);
  });
  after(async () => {
    await sandbox?.dispose("test end");
    if (base) rmSync(base, { recursive: true, force: true });
  });
  return { inside: () => inside, outside: () => outside };
}
