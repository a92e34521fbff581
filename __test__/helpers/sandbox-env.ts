/**
 * Whether this host can run the real sandbox, and the one way tests skip:
 * loudly, with the reason, and never under CI=true (where a skip fails).
 */
import { spawnSync } from "node:child_process";
import type { TestContext } from "node:test";

let cached: string | null | undefined;

/** Why the sandbox cannot run here, or null when it can. */
export function sandboxSkipReason(): string | null {
  if (cached !== undefined) return cached;
  if (process.platform !== "linux") return (cached = `not Linux (${process.platform})`);
  const r = spawnSync(
    "bwrap",
    ["--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
     "--symlink", "usr/lib64", "/lib64", "--", "/usr/bin/python3", "-I", "-S", "-c", "pass"],
    { encoding: "utf8", timeout: 15_000 },
  );
  if (r.error) cached = `bwrap cannot be run: ${r.error.message} (apt-get install bubblewrap)`;
  else if (r.status !== 0) cached = `bwrap cannot create a sandbox here: ${(r.stderr || "").trim() || `exit ${r.status}`}`;
  else cached = null;
  return cached;
}

/** Call at the top of a sandbox test; returns true when the test must stop (skipped). */
export function skipWithoutSandbox(t: TestContext): boolean {
  const reason = sandboxSkipReason();
  if (reason === null) return false;
  if (process.env.CI === "true") throw new Error(`sandbox test cannot be skipped under CI: ${reason}`);
  console.log(`# SKIP ${t.name}: ${reason}`);
  t.skip(reason);
  return true;
}

/**
 * Whether failed calls roll back in this run: PI_PYTHON_TOOL_ROLLBACK unset (the default users
 * get) or anything but `0`, `false`, `off` and `no`, read as the addon reads it. The suites run
 * in both settings (scripts/test.mjs); a test whose expectation depends on it asserts the exact
 * behaviour of the one in force (and `status().rollback` says the addon agrees).
 */
export const ROLLBACK: boolean = !/^(0|false|off|no)$/i.test(process.env.PI_PYTHON_TOOL_ROLLBACK?.trim() ?? "");

/** What each test's first `withEnv` of a name found, restored after the test. */
const envBefore = new WeakMap<TestContext, Map<string, string | undefined>>();

/**
 * Set (or, with undefined, unset) environment variable `name` for test `t`, or each of `vars`;
 * restored after it to what the test's first `withEnv` of that name found (so a test may set a
 * name again, as often as it likes).
 */
export function withEnv(t: TestContext, name: string, value: string | undefined): void;
export function withEnv(t: TestContext, vars: Record<string, string | undefined>): void;
export function withEnv(t: TestContext, nameOrVars: string | Record<string, string | undefined>, value?: string): void {
  const vars = typeof nameOrVars === "string" ? { [nameOrVars]: value } : nameOrVars;
  let before = envBefore.get(t);
  if (before === undefined) {
    const saved = new Map<string, string | undefined>();
    envBefore.set(t, saved);
    t.after(() => {
      for (const [k, v] of saved) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    });
    before = saved;
  }
  for (const [k, v] of Object.entries(vars)) {
    if (!before.has(k)) before.set(k, process.env[k]);
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
}
