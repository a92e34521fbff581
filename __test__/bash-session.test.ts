/**
 * The bash tool's acceptance checks through a real pi session (fixtures/bash-session.ts: this
 * package's bash; a home's key, /etc/shadow, .env and pi's API key out of reach; manual and yolo
 * writes; /tmp per command; background processes and timeouts; escapes in the content and the
 * full-output file; the user's !cmd; the trusted configuration; a host where no sandbox can start),
 * as the user running the tests and, when that is root, again as `nobody`. Both majors: this file
 * is in scripts/pi1-host.mjs's list, and the fixture runs under the same Node and flags as it.
 *
 * As nobody the fixture cannot assume it may read the checkout (CI's is in a private folder): it
 * runs in a mount namespace of its own where the checkout's entries are bound onto a world-readable
 * tmpfs (the checkout's own directory is never traversed), and its files (home, project, agent dir) are nobody's own.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readdirSync, realpathSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { NOBODY, SHOW_CHECKOUT } from "./helpers/as-nobody.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const PACKAGE_DIR = realpathSync(fileURLToPath(new URL("..", import.meta.url)));
const FIXTURE = join("__test__", "fixtures", "bash-session.ts");
const KEY = "sk-fixture-secret-key";
const NO_USERNS = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"';

const CHECKS = [
  "the tool named bash is this package's",
  "a key of the home by its absolute path is not readable",
  ".env prints nothing and pi's API key is empty in the command",
  "in manual mode touch x fails read-only",
  "/tmp does not carry over between commands",
  "sleep 100 & does not outlive its command",
  "a timeout gives pi's text and leaves no process",
  "a terminal escape is absent raw from the content and the full-output file",
  "in yolo touch x works, .git/config and .pi/ stay read-only, a new .envrc is inert",
  "!cmd runs on the host by default",
  "!cmd runs in the sandbox when configured",
  "a malformed configuration is named",
];

/** A fixture base outside /tmp (the sandbox's own): a home with a key, a project, an agent dir. */
function makeBase(t: TestContext, owner?: number): string {
  const base = mkdtempSync(join("/var/tmp", "pps-bash-session-"));
  t.after(() => rmSync(base, { recursive: true, force: true }));
  chmodSync(base, 0o755);
  mkdirSync(join(base, "home", ".ssh"), { recursive: true });
  writeFileSync(join(base, "home", ".ssh", "id_rsa"), "PRIVATE-KEY-MATERIAL\n");
  const project = join(base, "project");
  mkdirSync(join(project, ".git"), { recursive: true });
  writeFileSync(join(project, ".git", "config"), "[core]\n");
  mkdirSync(join(project, ".pi"));
  writeFileSync(join(project, ".env"), "TOKEN=project-secret\n");
  mkdirSync(join(base, "agent"));
  mkdirSync(join(base, "pkg"));
  // The temp dir of the runs in a user namespace of their own: the host's /tmp/pi-python-sandbox-0
  // is not theirs there.
  mkdirSync(join(base, "tmp"));
  if (owner !== undefined) chownTree(base, owner);
  return base;
}

function chownTree(path: string, uid: number): void {
  chownSync(path, uid, uid);
  if (!statSync(path).isDirectory()) return;
  for (const name of readdirSync(path)) chownTree(join(path, name), uid);
}

function fixtureEnv(base: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: join(base, "home"),
    TMPDIR: "/tmp",
    PI_CODING_AGENT_DIR: join(base, "agent"),
    ANTHROPIC_API_KEY: KEY,
  };
  for (const name of ["CI", "PI_HOST", "PI_PYTHON_TOOL_ROLLBACK", "PI_SANDBOX_LOG"]) {
    if (process.env[name] !== undefined) env[name] = process.env[name];
  }
  return env;
}

/** This Node with this file's flags (tsx, or pi 1.x's hook), the fixture, its arguments; from `pkg`. */
function fixtureArgv(pkg: string, what: string, base: string): string[] {
  const real = realpathSync(process.execPath);
  const node = real.startsWith(`${PACKAGE_DIR}/`) ? join(pkg, relative(PACKAGE_DIR, real)) : real;
  return [node, ...process.execArgv, join(pkg, FIXTURE), what, base];
}

/** Runs `argv` as root, or as nobody in a mount namespace where the checkout is at `base`/pkg. */
function spawn(argv: string[], base: string, asNobody: boolean, env: NodeJS.ProcessEnv = {}) {
  const cmd = asNobody
    ? [
        "unshare", "-m", "--propagation", "private", "sh", "-c", SHOW_CHECKOUT,
        PACKAGE_DIR, join(base, "pkg"), "setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", ...argv,
      ]
    : argv;
  const r = spawnSync(cmd[0], cmd.slice(1), {
    cwd: asNobody ? "/" : PACKAGE_DIR,
    env: { ...fixtureEnv(base), ...env },
    encoding: "utf8",
    timeout: 120_000,
  });
  return { status: r.status, out: `${r.stdout}${r.stderr}${r.error ? `\n${r.error.message}` : ""}` };
}

function runAs(t: TestContext, asNobody: boolean): void {
  const base = makeBase(t, asNobody ? NOBODY : undefined);
  const pkg = asNobody ? join(base, "pkg") : PACKAGE_DIR;
  // The flags name pi 1.x's hook relative to the checkout: run from it.
  const argv = fixtureArgv(pkg, "checks", base);
  const r = spawn(asNobody ? ["sh", "-c", 'cd "$0" && exec "$@"', pkg, ...argv] : argv, base, asNobody);
  assert.equal(r.status, 0, r.out);
  assert.match(r.out, new RegExp(`^uid ${asNobody ? NOBODY : process.getuid?.()}$`, "m"));
  for (const check of [...CHECKS, process.getuid?.() === 0 && !asNobody ? "/etc/shadow is not readable as root" : "/etc/shadow is not readable"]) {
    assert.ok(r.out.includes(`ok ${check}\n`), `missing: ${check}\n${r.out}`);
  }

  // A host where bubblewrap cannot make a sandbox: a user namespace that may make no more of them.
  const baselineMarker = join(base, "project", "baseline-ran");
  const inner = (command: string[]) => ["unshare", "-Ur", "sh", "-c", NO_USERNS, "sh", ...command];
  const baseline = spawn(
    asNobody ? ["sh", "-c", 'cd "$0" && exec "$@"', pkg, ...inner(["touch", baselineMarker])] : inner(["touch", baselineMarker]),
    base,
    asNobody,
  );
  assert.equal(baseline.status, 0, `baseline: ${baseline.out}`);
  assert.ok(statSync(baselineMarker).isFile(), "baseline: a command there runs");
  const refused = spawn(
    asNobody
      ? ["sh", "-c", 'cd "$0" && exec "$@"', pkg, ...inner(fixtureArgv(pkg, "cannot-start", base))]
      : inner(fixtureArgv(pkg, "cannot-start", base)),
    base,
    asNobody,
    { TMPDIR: join(base, "tmp") },
  );
  assert.equal(refused.status, 0, refused.out);
  assert.match(refused.out, /^ok where no sandbox can start a command is refused with the fix and nothing runs on the host$/m);
  assert.match(refused.out, /^ok session start warns with the cause and the fix$/m);
}

test("through a pi session the bash tool keeps every promise of its issue", (t) => {
  if (skipWithoutSandbox(t)) return;
  runAs(t, false);
});

test("through a pi session run as nobody the bash tool keeps every promise of its issue", (t) => {
  if (skipWithoutSandbox(t)) return;
  if (process.getuid?.() !== 0) {
    assert.ok(process.env.CI !== "true", "CI runs as root: this test runs its pi session as nobody");
    t.skip("needs root to run a pi session as nobody");
    return;
  }
  runAs(t, true);
});
