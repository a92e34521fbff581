/**
 * A test file run again as nobody from a root run: the checkout shown to nobody in a private mount
 * namespace (its own directory may be private), under the same pi host and rollback setting.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, realpathSync, rmSync } from "node:fs";
import { join, relative } from "node:path";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { skipWithoutSandbox } from "./sandbox-env.ts";

const PACKAGE = fileURLToPath(new URL("../..", import.meta.url));

export const NOBODY = 65534;
/**
 * `sh -c` words that show checkout `$0` at `$1` to nobody, then exec the rest: a tmpfs at `$1`
 * (mode 755) with each entry of the checkout bound onto it, so that the checkout's own directory,
 * which may be private (mode 700), is never traversed.
 */
export const SHOW_CHECKOUT =
  'mount -t tmpfs -o mode=755 pkg "$1" && for e in "$0"/* "$0"/.[!.]*; do [ -e "$e" ] || continue; ' +
  'n=${e##*/}; if [ -d "$e" ]; then mkdir "$1/$n"; else : > "$1/$n"; fi; mount --bind "$e" "$1/$n" || exit 1; done; ' +
  'shift && exec "$@"';

/**
 * Run test file `file` (relative to the checkout) again as nobody, with `flag`=1 set (the file
 * skips this rerun there); asserts `passes` tests passed and none failed. With `names` (a
 * `--test-name-pattern`), only the tests it matches run again.
 */
export function rerunAsNobody(t: TestContext, file: string, flag: string, passes: number, names?: string): void {
  if (process.getuid?.() !== 0) {
    t.diagnostic(`uid ${process.getuid?.()}: the tests above ran unprivileged`);
    return;
  }
  if (skipWithoutSandbox(t)) return;
  const pkgDir = realpathSync(PACKAGE);
  const base = mkdtempSync("/var/tmp/pps-nobody-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  chmodSync(base, 0o755);
  for (const d of ["pkg", "home"]) mkdirSync(join(base, d));
  spawnSync("chown", [`${NOBODY}:${NOBODY}`, join(base, "home")]);
  const pkg = join(base, "pkg");
  const real = realpathSync(process.execPath);
  const node = real.startsWith(`${pkgDir}/`) ? join(pkg, relative(pkgDir, real)) : real;
  const only = names === undefined ? [] : [`--test-name-pattern=${names}`];
  const argv = [node, ...process.execArgv, "--test", "--test-concurrency=1", ...only, join(pkg, file)];
  const cmd = [
    "unshare", "-m", "--propagation", "private", "sh", "-c", SHOW_CHECKOUT, pkgDir, pkg,
    "setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", "sh", "-c", 'cd "$0" && exec "$@"', pkg, ...argv,
  ];
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: join(base, "home"), TMPDIR: "/tmp", CI: "true", [flag]: "1" };
  for (const name of ["PI_HOST", "PI_PYTHON_TOOL_ROLLBACK"]) if (process.env[name] !== undefined) env[name] = process.env[name];
  const r = spawnSync(cmd[0], cmd.slice(1), { cwd: "/", env, encoding: "utf8", timeout: 300_000 });
  const out = `${r.stdout}${r.stderr}${r.error ? `\n${r.error.message}` : ""}`;
  assert.equal(r.status, 0, out);
  assert.match(out, new RegExp(`^# pass ${passes}$`, "m"), out);
  assert.match(out, /^# fail 0$/m);
}
