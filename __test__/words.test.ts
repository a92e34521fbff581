/**
 * What the model and the user read says what happened, once, in plain words (issue #23), through
 * a REAL pi session (helpers/pi-session.ts; pi 1.x through scripts/pi1-host.mjs) and the real
 * sandbox, with the setting in force (PI_PYTHON_TOOL_ROLLBACK: run with it unset and with 0):
 * - a failure tells its exception once (no header over the traceback, whose last line says it);
 * - a refused read is told once; one block of stdout has no header over it;
 * - a tool that cannot run here (no addon, no interpreter; bubblewrap and user namespaces are
 *   the same probe's) is said at session start, with the fix, and `status` says "unavailable"
 *   with the cause before any call;
 * - `status` is a few lines (the rest under "details:", shown on expand), true for the setting
 *   in force after a timeout, in plain words; a reset says "sandbox killed" only when it was;
 * - the demo's headings say what the setting in force does, and the next call shows it.
 * Run: node --import tsx --test __test__/words.test.ts
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { after, type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { createPiHarness, messageText, modelSees, type PiHarness } from "./helpers/pi-session.ts";
import { ROLLBACK, skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";
import { waitUntil } from "./helpers/sandbox-fixture.ts";
import { context, pythonRenderers, setupTui, shownResult, theme } from "./helpers/render.ts";

// Real and without a trailing slash: the node binary inside it (pi 1.x's) is found by prefix.
const PACKAGE_DIR = realpathSync(fileURLToPath(new URL("..", import.meta.url)));

// A private TMPDIR: the sandboxes' runtime root belongs to this file.
const PRIVATE_TMP = mkdtempSync(join(tmpdir(), "pi-python-words-"));
const SAVED_TMPDIR = process.env.TMPDIR;
process.env.TMPDIR = PRIVATE_TMP;
after(() => {
  if (SAVED_TMPDIR === undefined) delete process.env.TMPDIR;
  else process.env.TMPDIR = SAVED_TMPDIR;
  rmSync(PRIVATE_TMP, { recursive: true, force: true });
});

async function setup(t: TestContext): Promise<PiHarness> {
  const cwd = await mkdtemp(join(tmpdir(), "pi-python-words-cwd-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE_DIR] });
  t.after(() => h.dispose());
  assert.deepEqual(h.resourceLoader.getExtensions().errors, []);
  return h;
}

const occurrences = (text: string, what: string) => text.split(what).length - 1;

/** The status text's short part and its details. */
function statusParts(text: string): { short: string; details: string } {
  const at = text.indexOf("\ndetails:\n");
  assert.ok(at > 0, `a details section:\n${text}`);
  return { short: text.slice(0, at), details: text.slice(at + "\ndetails:\n".length) };
}

const UNPLAIN = [/generation/, /rollback point/, /spare/, /\b1 entries\b/, /last reset reason/];

test("an exception is told once: the traceback, no header, the message not repeated", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const r = await modelSees(h, { code: "def f():\n    raise ValueError('bad thing here')\nf()" });
  const text = messageText(r);
  assert.equal(r.isError, true);
  assert.doesNotMatch(text, /---/, text);
  assert.equal(occurrences(text, "ValueError: bad thing here"), 1, text);
  // Once in the code line of the traceback, once in its last line.
  assert.equal(occurrences(text, "bad thing here"), 2, text);
  assert.match(text, /^Traceback \(most recent call last\):$/m);
  assert.equal(occurrences(text, "Interpreter state kept"), 1, text);
});

test("a refused read is told once", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const path = "/opt/pi-words-nowhere/data.csv";
  const text = messageText(await modelSees(h, { code: `open('${path}').read()` }));
  assert.equal(occurrences(text, "outside the sandbox mounts"), 1, text);
  assert.equal(occurrences(text, "SandboxReadDenied"), 0, text);
  // The code line of the traceback, and the one sentence that says why and what to do.
  assert.equal(occurrences(text, path), 2, text);
  assert.match(text, /To allow it, grant read access/);
  assert.doesNotMatch(text, /---/, text);
});

test("one block of stdout has no header; stdout and stderr keep theirs", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const one = messageText(await modelSees(h, { code: "print('one line')" }));
  assert.match(one, /^status: ok \(\d+\.\ds, [^)]*\)\n\none line$/, one);
  const two = messageText(await modelSees(h, { code: "import sys\nprint('out')\nprint('err', file=sys.stderr)" }));
  assert.match(two, /\n--- stdout ---\nout\n--- stderr ---\nerr$/, two);
});

test("a missing interpreter: a warning with the fix at session start, and status says unavailable before any call", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const saved = process.env.PI_PYTHON_TOOL_INTERPRETER;
  process.env.PI_PYTHON_TOOL_INTERPRETER = "/nonexistent/words/python3";
  t.after(() => {
    if (saved === undefined) delete process.env.PI_PYTHON_TOOL_INTERPRETER;
    else process.env.PI_PYTHON_TOOL_INTERPRETER = saved;
  });
  const h = await setup(t);
  const warned = () => h.notifications.filter((n) => /cannot run here/.test(n.message));
  assert.ok(await waitUntil(() => warned().length > 0, 15_000), `a warning at session start: ${JSON.stringify(h.notifications)}`);
  const [warning] = warned();
  assert.equal(warning.type, "warning");
  assert.match(warning.message, /Python interpreter not found at \/nonexistent\/words\/python3/);
  assert.match(warning.message, /set PI_PYTHON_TOOL_INTERPRETER to a Python 3\.10\+ binary/, "the fix");
  assert.equal(warned().length, 1, "said once");

  const r = await h.getTool("python").execute("s", { action: "status" } as never, undefined, undefined);
  const text = messageText(r);
  assert.match(text, /^python tool: unavailable\ncause: Python interpreter not found at \/nonexistent\/words\/python3/, text);
  assert.doesNotMatch(text, /not started yet/);
  const report = (r.details as { report: { available: string; diagnostic: string } }).report;
  assert.equal(report.available, "unavailable");
  assert.match(report.diagnostic, /\/nonexistent\/words\/python3/);
});

test("no addon (a missing platform package): a warning with the fix at session start, and status says unavailable", () => {
  // A child process: the addon is loaded once per process.
  const out = spawnSync(process.execPath, [...process.execArgv, fileURLToPath(new URL("fixtures/session-start-notes.ts", import.meta.url))], {
    cwd: PACKAGE_DIR,
    encoding: "utf8",
    timeout: 60_000,
    env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: "/nonexistent/words/addon.node" },
  });
  assert.equal(out.status, 0, out.stderr);
  const seen = JSON.parse(out.stdout.trim().split("\n").at(-1)!) as { notifications: { message: string; type: string }[]; status: string };
  const warned = seen.notifications.filter((n) => /cannot run here/.test(n.message));
  assert.equal(warned.length, 1, JSON.stringify(seen.notifications));
  assert.equal(warned[0].type, "warning");
  assert.match(warned[0].message, /native addon could not be loaded: NAPI_RS_NATIVE_LIBRARY_PATH=\/nonexistent\/words\/addon\.node/);
  assert.match(warned[0].message, /To fix it, build the addon in this checkout .*`npm ci && npm run build`/, "the fix");
  assert.match(seen.status, /^status: unavailable\n\npython tool unavailable: The sandbox's native addon could not be loaded/);
});

// --- where no sandbox can start: each cause made for real, in a process of its own ---------------

const NOBODY = 65534;
/**
 * `sh -c` words run as root in a mount namespace of their own, `$0` the checkout, `$1` a folder:
 * with SHOW, the checkout's entries bound onto a world-readable tmpfs at `$1` (for nobody: the
 * checkout's own directory may be private); with HIDE, /usr/bin read-only through an overlay whose
 * upper layer removes `bwrap` (a host without the bubblewrap package; /bin is a link to /usr/bin
 * or has none either, asserted by the baseline); then the rest is run.
 */
const SHOW =
  'mount -t tmpfs -o mode=755 pkg "$1"; for e in "$0"/* "$0"/.[!.]*; do [ -e "$e" ] || continue; ' +
  'n=${e##*/}; if [ -d "$e" ]; then mkdir "$1/$n"; else : > "$1/$n"; fi; mount --bind "$e" "$1/$n"; done; ';
const HIDE =
  'w=$(mktemp -d); mount -t tmpfs -o mode=755 nobwrap "$w"; mknod "$w/bwrap" c 0 0; ' +
  'mount -t overlay -o ro,lowerdir="$w":/usr/bin nobwrap /usr/bin; ';
const BARE_BWRAP = ["bwrap", "--unshare-user", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--", "/usr/bin/true"];

type Cause = "no bubblewrap" | "no user namespaces";
type Seen = {
  uid: number;
  notifications: { message: string; type: string }[];
  python?: { text: string; isError: boolean; startFailure?: string };
  bash?: { text: string; isError: boolean };
  status: string;
};

/**
 * Runs `argv` (from the checkout, or its copy at base/pkg for nobody) where `cause` holds or not,
 * as root or nobody: root's mount namespace for the overlay and the copy; the seccomp filter of
 * helpers/no-userns.py (as a container's profile refuses user namespaces) around `argv`.
 */
function runWhere(base: string, cause: Cause | undefined, asNobody: boolean, argv: (pkg: string) => string[]) {
  const pkg = asNobody ? join(base, "pkg") : PACKAGE_DIR;
  const filtered = cause === "no user namespaces" ? ["python3", join(pkg, "__test__", "helpers", "no-userns.py"), ...argv(pkg)] : argv(pkg);
  const user = asNobody ? ["setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups"] : [];
  const script = `set -e; ${asNobody ? SHOW : ""}${cause === "no bubblewrap" ? HIDE : ""}shift; exec "$@"`;
  const cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, PACKAGE_DIR, pkg, ...user, "sh", "-c", 'cd "$0" && exec "$@"', pkg, ...filtered];
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: join(base, "home"), TMPDIR: join(base, "tmp") };
  for (const name of ["CI", "PI_HOST", "PI_PYTHON_TOOL_ROLLBACK"]) if (process.env[name] !== undefined) env[name] = process.env[name];
  const r = spawnSync(cmd[0], cmd.slice(1), { cwd: "/", env, encoding: "utf8", timeout: 120_000 });
  return { status: r.status, stdout: r.stdout, out: `${r.stdout}${r.stderr}${r.error ? `\n${r.error.message}` : ""}` };
}

function cannotStart(t: TestContext, cause: Cause, asNobody: boolean): void {
  if (skipWithoutSandbox(t)) return;
  if (process.getuid?.() !== 0) {
    // The overlay and setpriv need root; CI runs as root.
    assert.ok(process.env.CI !== "true", "CI runs as root: this test makes its host condition with root's mounts");
    t.skip("needs root to make the host condition");
    return;
  }
  if (cause === "no user namespaces" && !["x64", "arm64"].includes(process.arch)) {
    assert.ok(process.env.CI !== "true", `no seccomp filter for ${process.arch}`);
    t.skip(`helpers/no-userns.py has no filter for ${process.arch}`);
    return;
  }
  const base = mkdtempSync(join("/var/tmp", "pps-words-cannot-"));
  t.after(() => rmSync(base, { recursive: true, force: true }));
  chmodSync(base, 0o755);
  for (const d of ["pkg", "home", "tmp", "project"]) mkdirSync(join(base, d));
  if (asNobody) for (const d of ["home", "tmp", "project"]) chownSync(join(base, d), NOBODY, NOBODY);
  const project = join(base, "project");

  // The condition is real and the only difference: a bare bubblewrap run works without it, not with it.
  const look = 'id -u; for b in /usr/bin/bwrap /bin/bwrap /usr/local/bin/bwrap; do [ -e "$b" ] && echo "$b"; done; exec "$@"';
  const bare = (c: Cause | undefined) => runWhere(base, c, asNobody, () => ["sh", "-c", look, "sh", ...BARE_BWRAP]);
  const works = bare(undefined);
  assert.equal(works.status, 0, `baseline: bubblewrap makes a sandbox here: ${works.out}`);
  assert.match(works.stdout, new RegExp(`^${asNobody ? NOBODY : 0}\n/usr/bin/bwrap\n`));
  const refused = bare(cause);
  assert.notEqual(refused.status, 0, refused.out);
  if (cause === "no bubblewrap") assert.equal(refused.stdout, `${asNobody ? NOBODY : 0}\n`, "no bwrap where the sandbox looks for it");
  else assert.match(refused.out, /bwrap: No permissions to create new namespace/, refused.out);

  const real = realpathSync(process.execPath);
  const r = runWhere(base, cause, asNobody, (pkg) => {
    const node = real.startsWith(`${PACKAGE_DIR}/`) ? join(pkg, relative(PACKAGE_DIR, real)) : real;
    return [node, ...process.execArgv, join(pkg, "__test__", "fixtures", "cannot-start.ts"), project];
  });
  assert.equal(r.status, 0, r.out);
  const seen = JSON.parse(r.stdout.trim().split("\n").at(-1)!) as Seen;
  assert.equal(seen.uid, asNobody ? NOBODY : 0);
  const [why, fix] =
    cause === "no bubblewrap"
      ? [/bubblewrap \(bwrap\) was not found/, /Install it with `sudo apt-get install bubblewrap`/]
      : [/bwrap: No permissions to create new namespace.*Common causes: unprivileged user namespaces are disabled/s, /Fix: allow them for bubblewrap .*run pi where user namespaces are available/s];
  const warned = seen.notifications.filter((n) => /cannot run here/.test(n.message));
  assert.equal(warned.length, 1, `one warning at session start: ${JSON.stringify(seen.notifications)}`);
  assert.equal(warned[0].type, "warning");
  assert.match(warned[0].message, /the python and bash tools cannot run here/);
  assert.match(warned[0].message, why, warned[0].message);
  assert.match(warned[0].message, fix, warned[0].message);
  for (const tool of ["python", "bash"] as const) {
    const first = seen[tool];
    assert.ok(first, `the model got the ${tool} result`);
    assert.equal(first.isError, true, first.text);
    assert.match(first.text, why, `${tool}: ${first.text}`);
    assert.match(first.text, fix, `${tool}: ${first.text}`);
    assert.doesNotMatch(first.text, /\.\./, `${tool}: ${first.text}`);
    assert.ok(!existsSync(join(project, `${tool}-ran`)), `${tool} ran on the host`);
  }
  assert.match(seen.python!.text, /^status: unavailable /, seen.python!.text);
  // The cause is also a field of the result's details.
  assert.equal(seen.python!.startFailure, cause === "no bubblewrap" ? "bwrap_missing" : "user_namespaces");
  assert.match(seen.bash!.text, /^The command was not run \([^)]*it never runs on the host\): /, seen.bash!.text);
  assert.doesNotMatch(seen.bash!.text, /python/i, "bash's result names the python tool");
  assert.match(seen.status, /^python tool: unavailable\ncause: /, seen.status);
  assert.match(seen.status, why, seen.status);
}

for (const cause of ["no bubblewrap", "no user namespaces"] as const) {
  for (const asNobody of [false, true]) {
    test(`${cause}${asNobody ? ", as nobody" : ""}: the session-start warning and each tool's first result say the cause and the fix`, (t) =>
      cannotStart(t, cause, asNobody));
  }
}

for (const prewarm of [false, true]) {
  test(`a tool that can run: no warning at session start; status before any call is short and plain (spare ${prewarm ? "on" : "off"})`, async (t) => {
    if (skipWithoutSandbox(t)) return;
    // With the spare on (the default) session_start begins it: the tool is then known to run.
    const saved = process.env.PI_SANDBOX_PREWARM;
    if (!prewarm) process.env.PI_SANDBOX_PREWARM = "0";
    t.after(() => {
      if (saved === undefined) delete process.env.PI_SANDBOX_PREWARM;
      else process.env.PI_SANDBOX_PREWARM = saved;
    });
    const h = await setup(t);
    // The probe (once per process) has answered when a call could see it.
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual(h.notifications.filter((n) => /cannot run here/.test(n.message)), []);
    const status = () => h.getTool("python").execute("s", { action: "status" } as never, undefined, undefined);
    let result = await status();
    for (let i = 0; prewarm && i < 250 && (result.details as { report: { spare: string } }).report.spare !== "ready"; i++) {
      await new Promise((r) => setTimeout(r, 20));
      result = await status();
    }
    const text = messageText(result);
    const { short } = statusParts(text);
    assert.match(
      short,
      prewarm
        ? /^python tool: available\ninterpreter: Python 3\.\d+\.\d+, none in use \(0 calls so far; the next call takes the one started ahead\)\nmode: /
        : /^python tool: not started yet \(no call so far\)\ninterpreter: not running \(one starts on the first call\)\nmode: /,
    );
    assert.ok(short.split("\n").length <= 7, short);
    assert.match(short, /^containment: .+; no network; seccomp filter; no capabilities$/m);
    for (const word of UNPLAIN) assert.doesNotMatch(text, word, text);
  });
}

test("after a timeout, status and reset say what the setting in force did", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const tool = h.getTool("python");
  await modelSees(h, { code: "kept = 1" });
  await modelSees(h, { code: "warm = 2" });
  const timeout = messageText(await modelSees(h, { code: "while True: pass", timeoutSeconds: 1 }));
  assert.match(timeout, /^status: timeout/);
  const text = messageText(await tool.execute("s", { action: "status" } as never, undefined, undefined));
  const { short } = statusParts(text);
  for (const word of UNPLAIN) assert.doesNotMatch(text, word, text);
  assert.match(
    short,
    ROLLBACK
      ? /^interpreter: Python 3\.\d+\.\d+, running \(3 calls so far\)$/m
      : /^interpreter: Python 3\.\d+\.\d+, (not running \(3 calls so far; one starts on the next call\)|none in use \(3 calls so far; the next call takes the one started ahead\))$/m,
  );
  const survived = messageText(await modelSees(h, { code: "'kept' in globals()" }));
  if (ROLLBACK) {
    assert.match(short, /^last failed call: a timeout, rolled back \(the interpreter kept its state from before that call\)$/m);
    assert.doesNotMatch(short, /discarded/);
    assert.match(short, /^after a timeout, a cancel, too much output or a crash: the interpreter goes back to its state before that call/m);
    assert.match(survived, /result: True/);
  } else {
    assert.match(short, /^interpreter state last discarded by: a timeout$/m);
    assert.doesNotMatch(short, /rolled back/);
    assert.match(short, /^after a timeout, a cancel, too much output or a crash: the sandbox is killed and interpreter state is lost \(PI_PYTHON_TOOL_ROLLBACK=0\)$/m);
    assert.match(survived, /result: False/);
  }
  const reset = messageText(await tool.execute("r", { action: "reset" } as never, undefined, undefined));
  if (ROLLBACK) {
    assert.doesNotMatch(reset, /killed/, reset);
    assert.match(reset, /a fresh interpreter is ready in the same sandbox/);
  } else {
    assert.match(reset, /^Interpreter reset: sandbox killed/);
  }
});

test("the TUI shows status's short part collapsed and its details on expand", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const h = await setup(t);
  const { renderResult } = pythonRenderers(h);
  const r = await h.getTool("python").execute("s", { action: "status" } as never, undefined, undefined);
  const { short } = statusParts(messageText(r));
  for (const width of [120, 80]) {
    const render = (expanded: boolean) =>
      shownResult(renderResult(r, { expanded, isPartial: false }, theme(), context({ expanded })) as never, width);
    const collapsed = render(false);
    assert.doesNotMatch(collapsed, /^details:$|hardening:/m, collapsed);
    assert.match(collapsed, /^✓ python status\npython tool: not started yet/);
    assert.match(collapsed, /containment: /);
    assert.match(collapsed, /\(details: \d+ more lines, ctrl\+o to expand\)$/);
    assert.ok(collapsed.split("\n").length <= short.split("\n").length * 3 + 2, collapsed);
    const expanded = render(true);
    assert.match(expanded, /\ndetails:\n/);
    assert.match(expanded, /hardening: default-deny seccomp/);
  }
});

test("the demo's headings say what the setting in force does", (t) => {
  if (skipWithoutSandbox(t)) return;
  const out = spawnSync(process.execPath, ["scripts/demo.mjs"], { cwd: PACKAGE_DIR, encoding: "utf8", timeout: 120_000 });
  assert.equal(out.status, 0, out.stderr);
  const blocks = out.stdout.split("\n=== ").slice(1);
  const after = (heading: RegExp) => {
    const at = blocks.findIndex((b) => heading.test(b.split("\n")[0]));
    assert.ok(at >= 0, `a heading ${heading}:\n${out.stdout}`);
    return [blocks[at], blocks[at + 1]];
  };
  if (ROLLBACK) {
    const [timeout, next] = after(/^A timeout rolls the interpreter back to its state before the call$/);
    assert.match(timeout, /rolled back to its state before this call/);
    assert.match(next, /^The variables survive it\n/);
    assert.match(next, /result: True/);
  } else {
    const [timeout, next] = after(/^A timeout kills the sandbox \(rollback is off: PI_PYTHON_TOOL_ROLLBACK=0\)$/);
    assert.match(timeout, /Interpreter state was LOST/);
    assert.match(next, /^A fresh interpreter after it: the variables are gone\n/);
    assert.match(next, /result: False/);
  }
  assert.doesNotMatch(out.stdout, ROLLBACK ? /kills the sandbox/ : /rolls the interpreter back/);
  const status = out.stdout.slice(out.stdout.lastIndexOf("\n=== status\n"));
  for (const word of UNPLAIN) assert.doesNotMatch(status, word, status);
});

test("a mode change's notification names only the roots newly skipped, and status names the mode", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  // Outside /tmp, which the sandbox mounts itself (a read root there is skipped).
  const real = await mkdtemp("/var/tmp/pi-python-words-root-");
  t.after(() => rm(real, { recursive: true, force: true }));
  const missing = "/nonexistent/pi-words-missing-root";
  const notes = () => h.notifications.filter((n) => /^python sandbox: /.test(n.message)).map((n) => n.message);
  h.events.emit("tool-permissions:mode", { mode: "manual", readRoots: [missing, real] });
  h.events.emit("tool-permissions:mode", { mode: "edits", readRoots: [missing, real] });
  const [first, second] = notes();
  assert.equal(notes().length, 2, JSON.stringify(h.notifications));
  assert.ok(first.includes(`read roots mounted read-only: ${real}`), first);
  assert.match(first, /skipped: \/nonexistent\/pi-words-missing-root/, first);
  assert.match(second, /^python sandbox: \/workspace is now read-write/, second);
  assert.doesNotMatch(second, /pi-words-missing-root/, "told once, not with every change");
  const text = messageText(await h.getTool("python").execute("s", { action: "status" } as never, undefined, undefined));
  assert.ok(text.includes(`\nmode: edits; /workspace read-write; read roots: ${real}\n`), text);
  assert.match(text, /read roots skipped: \/nonexistent\/pi-words-missing-root/, "status keeps the whole list");
  // No spare is prepared while the project is writable: status does not say "none yet".
  assert.match(text, /^next sandbox started ahead \(so that a restart is quick\): none while \/workspace is writable/m, text);
});

test("a writable mode whose project could not be protected: status says /workspace is read-only in this sandbox, as the first result does (baseline: within the bound, read-write)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const cwd = await mkdtemp(join(tmpdir(), "pi-python-words-big-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  for (let i = 0; i < 20; i++) writeFileSync(join(cwd, `f${i}.txt`), "x");
  const statusIn = async (bound: string | undefined) => {
    withEnv(t, "PI_SANDBOX_SCAN_ENTRIES", bound);
    const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE_DIR] });
    try {
      h.events.emit("tool-permissions:mode", { mode: "yolo", readRoots: [] });
      const first = messageText(await modelSees(h, { code: "open('/workspace/new.txt', 'w').close()" }));
      const status = messageText(await h.getTool("python").execute("s", { action: "status" } as never, undefined, undefined));
      return { first, status };
    } finally {
      await h.dispose();
    }
  };
  const held = await statusIn("5");
  // Said once, by the line that says what the mode change did (the start's note of it is left out).
  assert.match(held.first, /^python sandbox: \/workspace stays read-only although the mode allows writes: the project has more than 5 entries/m, held.first);
  assert.match(held.first, /Read-only file system/, held.first);
  assert.match(held.status, /^mode: yolo; \/workspace read-only in this sandbox although the mode allows writes \(the project could not be protected\); /m, held.status);
  assert.match(held.status, /-> \/workspace \(read-only\)/, held.status);
  const free = await statusIn(undefined);
  assert.match(free.first, /^status: ok/, free.first);
  assert.match(free.status, /^mode: yolo; \/workspace read-write; /m, free.status);
});

test("what a mode change did is the next result's first line; a first mode event that only skips roots still notifies", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const notes = () => h.notifications.filter((n) => /^python sandbox: /.test(n.message)).map((n) => n.message);
  const missing = "/nonexistent/pi-words-only-skipped";
  h.events.emit("tool-permissions:mode", { mode: "manual", readRoots: [missing] });
  assert.equal(notes().length, 1, JSON.stringify(h.notifications));
  assert.match(notes()[0], /^python sandbox: read roots not mounted: \/nonexistent\/pi-words-only-skipped \(/, notes()[0]);

  h.events.emit("tool-permissions:mode", { mode: "edits", readRoots: [missing] });
  const change = notes()[1];
  assert.match(change, /^python sandbox: \/workspace is now read-write/, change);
  const result = await modelSees(h, { code: "print('after the change')" });
  const lines = messageText(result).split("\n");
  assert.match(lines[0], /^status: ok /);
  const what = change.replace(/ \((the sandbox was restarted|applies from)[^)]*\)/, "");
  assert.equal(lines[1], what, "the line under the status says what the change did (the state statement says the rest)");
  // The TUI's body starts with it (the status line is the header).
  setupTui();
  const { renderResult } = pythonRenderers(h);
  const r = h.toolResults().at(-1)!;
  const shown = shownResult(renderResult({ content: r.content, details: r.details }, { expanded: false, isPartial: false }, theme(), context({})));
  const flat = (x: string) => x.replace(/\s+/g, " ");
  assert.ok(flat(shown).includes(flat(what)), shown);
  // Told once: the result after it has no such line.
  const next = messageText(await modelSees(h, { code: "print(1)" }));
  assert.doesNotMatch(next, /python sandbox: /, next);
});

test("a change to a writable mode whose project cannot be protected: the notification and the next result say /workspace stays read-only (baseline: within the bound, read-write)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const cwd = await mkdtemp(join(tmpdir(), "pi-python-words-held-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  for (let i = 0; i < 20; i++) writeFileSync(join(cwd, `f${i}.txt`), "x");
  // `running`: a call ran in manual mode first, so the change reaches a running sandbox.
  const change = async (bound: string | undefined, running: boolean) => {
    withEnv(t, "PI_SANDBOX_SCAN_ENTRIES", bound);
    const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE_DIR] });
    try {
      h.events.emit("tool-permissions:mode", { mode: "manual", readRoots: [] });
      if (running) assert.match(messageText(await modelSees(h, { code: "x = 41" })), /^status: ok/);
      h.events.emit("tool-permissions:mode", { mode: "yolo", readRoots: [] });
      const notes = h.notifications.filter((n) => /^python sandbox: /.test(n.message)).map((n) => n.message);
      const note = notes.at(-1) ?? "";
      const first = messageText(await modelSees(h, { code: "open('/workspace/new.txt', 'w').close()" }));
      const kept = running ? messageText(await modelSees(h, { code: "print(x + 1)" })) : "";
      const status = messageText(await h.getTool("python").execute("s", { action: "status" } as never, undefined, undefined));
      return { note, first, kept, status };
    } finally {
      await h.dispose();
      rmSync(join(cwd, "new.txt"), { force: true });
    }
  };
  for (const running of [false, true]) {
    const held = await change("5", running);
    assert.doesNotMatch(held.note, /read-write|writable/, held.note);
    assert.match(held.note, /^python sandbox: \/workspace stays read-only although the mode allows writes: the project has more than 5 entries/, held.note);
    assert.match(held.first, /Read-only file system/, held.first);
    const lines = held.first.split("\n");
    assert.match(lines[1], /^python sandbox: \/workspace stays read-only although the mode allows writes/, held.first);
    // Told once: the start's note of the same fact is left out.
    assert.equal(occurrences(held.first, "more than 5 entries or is deeper"), 1, held.first);
    assert.match(held.status, /^mode: yolo; \/workspace read-only in this sandbox although the mode allows writes/m, held.status);
    // What the note says of the interpreter is what happened to it.
    if (running) {
      const keptState = /\n42\n|^42$/m.test(held.kept);
      assert.equal(/interpreter state kept/.test(held.note), keptState, `${held.note}\n---\n${held.kept}`);
      // With rollback on the change is live: the sandbox already has the project read-only, and keeps its interpreter.
      if (ROLLBACK) assert.ok(keptState, held.kept);
    }
    const free = await change(undefined, running);
    assert.match(free.note, /^python sandbox: \/workspace is now read-write/, free.note);
    assert.match(free.first, /^status: ok/, free.first);
  }
});
