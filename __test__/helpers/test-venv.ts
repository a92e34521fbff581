/**
 * A virtualenv with real packages from PyPI (numpy, matplotlib, pillow, pandas), made once per
 * machine and interpreter version, for tests of the user's own Python packages.
 */
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";

export const VENV_PACKAGES = ["numpy", "matplotlib", "pillow", "pandas"];

let venvCache: { path?: string; reason?: string } | undefined;

/** The test venv's path, or why it cannot be made. Its marker names the packages it holds, so a
 * venv made for a shorter list is made again. */
export function testVenv(): { path?: string; reason?: string } {
  if (venvCache) return venvCache;
  const minor = spawnSync("/usr/bin/python3", ["-c", "import sys; print('%d%d' % sys.version_info[:2])"], { encoding: "utf8" });
  const path = join(tmpdir(), `pps-test-venv-py${minor.stdout.trim()}`);
  const ready = join(path, ".pps-ready");
  const want = VENV_PACKAGES.join(" ");
  if (existsSync(ready) && readFileSync(ready, "utf8") === want) return (venvCache = { path });
  rmSync(path, { recursive: true, force: true });
  const make = spawnSync("/usr/bin/python3", ["-m", "venv", path], { encoding: "utf8" });
  if (make.status !== 0) return (venvCache = { reason: `python3 -m venv failed (apt-get install python3-venv): ${make.stderr.trim()}` });
  const pip = spawnSync(join(path, "bin", "pip"), ["install", "-q", ...VENV_PACKAGES], { encoding: "utf8", timeout: 600_000 });
  if (pip.status !== 0) {
    rmSync(path, { recursive: true, force: true });
    const why = (pip.stderr || "").trim().split("\n").pop();
    return (venvCache = { reason: `pip could not install ${VENV_PACKAGES.join(", ")} from PyPI: ${why}` });
  }
  writeFileSync(ready, want);
  return (venvCache = { path });
}

/** The test venv, or skip (loudly; never under CI) when it cannot be made. */
export function venvOrSkip(t: TestContext): string | undefined {
  const v = testVenv();
  if (v.path) return v.path;
  if (process.env.CI === "true") throw new Error(`the test venv is required under CI: ${v.reason}`);
  console.log(`# SKIP ${t.name}: ${v.reason}`);
  t.skip(v.reason);
  return undefined;
}
