/**
 * Grants that keep the interpreter: a read root granted while the sandbox runs, an allow once and
 * an unmasked secret reach the running sandbox, and the call runs again on the same interpreter
 * returned to its state before the call (a variable set by an earlier call is kept; a counter the
 * call increments before its read is incremented once, not twice). Through a real pi session with
 * the pi-tool-permissions stand-in (fixtures/permissions-client). The fallback is forced with
 * PI_SANDBOX_LIVE_GRANTS=0 and by rollback off (PI_PYTHON_TOOL_ROLLBACK=0): the sandbox restarts as
 * before, and the result says why state was lost. Both majors (scripts/pi1-host.mjs lists it); run
 * as root, the last test runs this whole file again as `nobody` (as bash-session.test.ts does: in a
 * private mount namespace where the checkout's entries are bound onto a tmpfs, so that a private
 * checkout folder is never traversed).
 */
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type ClientLog, configureClient } from "./fixtures/permissions-client/index.ts";
import { createPiHarness, messageText, type PiHarness, type UIHooks } from "./helpers/pi-session.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const CLIENT = fileURLToPath(new URL("./fixtures/permissions-client", import.meta.url));

interface Setup {
  h: PiHarness;
  project: string;
  outside: string;
  log: ClientLog;
  run(params: Record<string, unknown>): Promise<{ text: string; details: Record<string, any> }>;
}

async function setup(
  t: TestContext,
  opts: { readRoots?: (outside: string) => string[]; ui?: UIHooks; project?: string; outside?: string; rollbackOff?: boolean } = {},
): Promise<Setup | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  // The live path needs rollback's copy: on for these tests whatever the run's setting, off where a test says.
  withEnv(t, "PI_PYTHON_TOOL_ROLLBACK", opts.rollbackOff ? "0" : "1");
  let project = opts.project;
  if (!project) {
    const base = mkdtempSync("/var/tmp/pps-live-");
    t.after(() => rmSync(base, { recursive: true, force: true }));
    project = join(base, "project");
    mkdirSync(project);
  }
  let outside = opts.outside;
  if (!outside) {
    const dir = mkdtempSync("/var/tmp/pps-live-outside-");
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, "data.csv"), "a,b\n1,2\n");
    writeFileSync(join(dir, "sibling.txt"), "sibling-data\n");
    outside = dir;
  }
  const log = configureClient("manual", opts.readRoots?.(outside) ?? []);
  const h = await createPiHarness({ cwd: project, extensionPaths: [CLIENT, PACKAGE], ui: opts.ui });
  t.after(() => h.dispose());
  let n = 0;
  return {
    h,
    project,
    outside,
    log,
    async run(params) {
      const r = await h.getTool("python").execute(`call-${++n}`, params, undefined, undefined);
      return { text: messageText(r), details: r.details as Record<string, any> };
    },
  };
}

const choose = (prefix: string) => async (_title: string, options: string[]) => options.find((o) => o.startsWith(prefix));

/** A variable set before, a counter incremented by the call before its read, then the read. */
const READ_AFTER_COUNT = (path: string) => `counter += 1\ndata = open('${path}').read()\nprint('counter', counter)`;

async function keepsState(s: Setup, path: string, expect: RegExp): Promise<string> {
  const first = await s.run({ code: "kept = 'kept-value'\ncounter = 0" });
  assert.equal(first.details.status, "ok", first.text);
  const r = await s.run({ code: READ_AFTER_COUNT(path) });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /counter 1/, "the rerun started from the state before the call");
  assert.match(r.text, /ran again on the same interpreter, from its state before the call/);
  assert.doesNotMatch(r.text, /fresh interpreter|Interpreter state was lost|state was LOST/i);
  const after = await s.run({ code: "print(kept, counter, data)" });
  assert.match(after.text, /kept-value 1/);
  assert.match(after.text, expect);
  return r.text;
}

test("allow once: the file is mounted in the running sandbox; the variable is kept and the counter counts once", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  const text = await keepsState(s, `${s.outside}/data.csv`, /1,2/);
  assert.match(text, /just that file was mounted read-only in the running sandbox/);
  assert.equal(s.log.prompts.length, 1);
  // The status says which way grants go here.
  const st = await s.run({ action: "status" });
  assert.match(st.details.report.text, /grants: applied to the running sandbox; the call runs again with its state kept/);
});

test("a session grant (the client's mode event adds a read root): the variable is kept and the counter counts once", async (t) => {
  let typed = "";
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async () => typed } });
  if (!s) return;
  typed = s.outside;
  const text = await keepsState(s, `${s.outside}/data.csv`, /1,2/);
  assert.match(text, /was granted and mounted in the running sandbox/);
  assert.equal(s.log.answers[0].modeEvent, true);
  const note = s.h.notifications.find((n) => n.message.includes("read roots mounted read-only"))?.message ?? "";
  assert.match(note, /\(added to the running sandbox at its next execution; interpreter state kept\)/, note);
  assert.doesNotMatch(note, /applies from the next execution|discarded/, note);
  // The whole root came: a sibling needs no prompt.
  const sibling = await s.run({ code: `print(open('${s.outside}/sibling.txt').read())` });
  assert.match(sibling.text, /sibling-data/);
  assert.equal(s.log.prompts.length, 1);
});

test("an unmasked secret of the project: its mask is detached live; the variable is kept and the counter counts once", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  writeFileSync(join(s.project, ".env"), "API_KEY=env-secret-value\n");
  writeFileSync(join(s.project, ".env.production"), "API_KEY=prod-secret-value\n");
  const text = await keepsState(s, "/workspace/.env", /env-secret-value/);
  assert.match(text, /just that path was unmasked in the running sandbox/);
  // The status says which mask went: .env is unmasked by the grant, .env.production still shown empty.
  const st = (await s.run({ action: "status" })).details.report.text as string;
  const masks = st.split("\n").find((l) => l.startsWith("secret masks")) ?? "";
  assert.match(masks, /shown empty\): \/workspace\/\.env\.production; unmasked by a grant: \/workspace\/\.env(;|$)/, masks);
  // Just that file: the other secret stays masked.
  s.h.ui.select = choose("Deny once");
  const other = await s.run({ code: "print(repr(open('/workspace/.env.production').read()))" });
  assert.doesNotMatch(other.text, /prod-secret-value/);
});

test("two files in one call, each allowed once: asked once per file, both printed, the counter counts once", async (t) => {
  let dialogs = 0;
  const s = await setup(t, { ui: { select: async (_t, options) => (++dialogs <= 4 ? options[0] : "Deny once") } });
  if (!s) return;
  await s.run({ code: "counter = 0" });
  const r = await s.run({
    code: `counter += 1\nprint(open('${s.outside}/data.csv').read())\nprint(open('${s.outside}/sibling.txt').read())\nprint('counter', counter)`,
  });
  assert.equal(r.details.status, "ok", r.text);
  assert.deepEqual(s.log.prompts.map((p) => p.path), [`${s.outside}/data.csv`, `${s.outside}/sibling.txt`]);
  assert.match(r.text, /1,2/);
  assert.match(r.text, /sibling-data/);
  assert.match(r.text, /counter 1/);
});

test("a granted root's host secrets are masked before it is reachable (baseline: unlisted, the grant shows the token)", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-live-vault-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  mkdirSync(join(base, "vault"));
  writeFileSync(join(base, "vault", "token"), "vault-token-value\n");
  writeFileSync(join(base, "notes.txt"), "notes\n");
  const code = `print(open('${base}/notes.txt').read())\ntry:\n    print(repr(open('${base}/vault/token').read()))\nexcept OSError as e:\n    print('error', e)`;
  const grant = (s: { h: PiHarness }) => {
    s.h.ui.select = choose("Allow reads from");
    s.h.ui.editor = async () => base;
  };
  {
    const s = await setup(t, {});
    if (!s) return;
    grant(s);
    await s.run({ code: "kept = 1" });
    const r = await s.run({ code });
    assert.match(r.text, /mounted in the running sandbox/);
    assert.match(r.text, /vault-token-value/, "baseline: unlisted, the grant carries the token along");
    await s.h.dispose();
  }
  withEnv(t, "PI_PYTHON_TOOL_HOST_SECRETS", `${base}/vault`);
  const s = await setup(t, {});
  if (!s) return;
  grant(s);
  await s.run({ code: "kept = 1" });
  const r = await s.run({ code });
  assert.match(r.text, /mounted in the running sandbox/);
  assert.match(r.text, /notes/);
  assert.doesNotMatch(r.text, /vault-token-value/);
});

test("a granted root that contains the project shows the project's secrets masked at its host path (baseline: a file beside them reads)", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-live-parent-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const project = join(base, "project");
  mkdirSync(project);
  writeFileSync(join(project, ".env"), "API_KEY=project-secret-value\n");
  writeFileSync(join(project, "notes.txt"), "project-notes\n");
  writeFileSync(join(base, "other.txt"), "other-data\n");
  const read = (p: string) => `try:\n    print('${p}', repr(open('${p}').read()))\nexcept OSError as e:\n    print('${p}', 'error', e)`;
  const code = [`${base}/other.txt`, `${project}/notes.txt`, `${project}/.env`].map(read).join("\n");
  // The grant of the parent; a prompt about anything else would take a grant of its directory.
  let asked = 0;
  const select = async (_title: string, options: string[]) => (++asked > 3 ? undefined : options.find((o) => o.startsWith("Allow reads from")));
  const s = await setup(t, { project, outside: base, ui: { select, editor: async () => base } });
  if (!s) return;
  await s.run({ code: "kept = 1" });
  const r = await s.run({ code });
  assert.match(r.text, /mounted in the running sandbox/);
  assert.match(r.text, /other-data/);
  // Baseline: the project is reachable at its host path through the grant.
  assert.match(r.text, /project-notes/);
  assert.doesNotMatch(r.text, /project-secret-value/);
  // Masked as on a start with the same root, and refused without asking, in words that name it the
  // project's secret (before: asked about for ever, each grant changing nothing).
  assert.match(r.text, new RegExp(`${project}/\\.env is the project's secret /workspace/\\.env`));
  assert.equal(asked, 1, "one dialog: the parent's");
});

/**
 * Plants from inside: `os.symlink` and `os.mkdir` at each path given, once before the grant and, from
 * a process left running, again and again while the grant is applied. Prints what the first round
 * did (`made` or the errno's name) and, at the end, whether any later attempt succeeded.
 */
const PLANT = (paths: string[], target: string) =>
  [
    "import errno, json, os, subprocess, sys",
    `PATHS, TARGET = ${JSON.stringify(paths)}, ${JSON.stringify(target)}`,
    "def plant(p):",
    "    out = []",
    "    for f in (lambda: os.symlink(TARGET, p), lambda: os.mkdir(p)):",
    "        try:",
    "            f()",
    "            out.append('made')",
    "        except OSError as e:",
    "            out.append(errno.errorcode.get(e.errno, str(e.errno)))",
    "    return out",
    "print('first', json.dumps([plant(p) for p in PATHS]))",
    "print('through', json.dumps([os.path.realpath(p) for p in PATHS]))",
    'LOOP = """import os, sys',
    "while True:",
    "    for p in sys.argv[2:]:",
    "        try:",
    "            if os.path.islink(p):",
    "                os.unlink(p)",
    "            os.symlink(sys.argv[1], p)",
    "            open('/scratch/planted', 'a').write(p + ' ')",
    "        except OSError:",
    "            pass",
    '"""',
    "planter = subprocess.Popen([sys.executable, '-c', LOOP, TARGET, *PATHS])",
  ].join("\n");

test("attack: a link the sandbox plants at the grant's mount point or a parent, before and during the grant, is never followed (baseline: in its own /tmp the same plants are made)", async (t) => {
  let typed = "";
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async () => typed } });
  if (!s) return;
  typed = s.outside;
  const parent = s.outside.slice(0, s.outside.lastIndexOf("/"));
  // Baseline: where the sandbox may write, each plant is made and a link there is followed.
  const base = await s.run({ code: `${PLANT(["/tmp/point", "/tmp/parent"], "/scratch")}\nimport time\nfor _ in range(100):\n    if os.path.exists('/scratch/planted'):\n        break\n    time.sleep(0.05)\nplanter.kill()\nprint('planted', os.path.exists('/scratch/planted'))` });
  assert.match(base.text, /first \[\["made", "EEXIST"\], \["made", "EEXIST"\]\]/, base.text);
  assert.match(base.text, /through \["\/scratch", "\/scratch"\]/, "baseline: the links are followed");
  assert.match(base.text, /planted True/, "baseline: the racing planter succeeds where it may write");
  await s.run({ code: "import os\nos.remove('/scratch/planted')\nkept = 'kept-value'\ncounter = 0" });
  // The attack: the grant's mount point and its parents, planted before the read and all the while.
  const targets = [s.outside, `${s.outside}/data.csv`, parent, `${parent}/x`];
  const plant = await s.run({ code: PLANT(targets, "/scratch") });
  assert.match(plant.text, /first \[(\["(EROFS|EEXIST|ENOENT)", "(EROFS|EEXIST|ENOENT)"\],? ?){4}\]/, plant.text);
  assert.doesNotMatch(plant.text, /made/);
  const through = plant.text.split("\n").find((l) => l.startsWith("through "))?.slice(8) ?? "null";
  assert.deepEqual(JSON.parse(through), targets, "nothing on the way is a link");
  const r = await s.run({ code: `counter += 1\ndata = open('${s.outside}/data.csv').read()\nprint('counter', counter, data)\nplanter.kill()` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /was granted and mounted in the running sandbox/);
  assert.match(r.text, /counter 1 a,b/);
  const after = await s.run({
    code: `import os\nprint('planted', os.path.exists('/scratch/planted'))\nprint('link', os.path.islink('${s.outside}'), os.path.realpath('${s.outside}/data.csv'))\n` +
      `rows = [l.split(' ')[4] for l in open('/proc/self/mountinfo')]\nprint('at', [r for r in rows if r.startswith('${parent}') or r.startswith('/scratch')])\nprint(kept)`,
  });
  assert.match(after.text, /planted False/);
  assert.match(after.text, new RegExp(`link False ${s.outside}/data.csv`));
  assert.match(after.text, new RegExp(`at \\['${s.outside}', '/scratch'\\]|at \\['/scratch', '${s.outside}'\\]`), after.text);
  assert.match(after.text, /kept-value/);
});

test("attack: a read of a host secret is refused at once, without a dialog, and the sandbox keeps running (baseline: unlisted, it is asked about and mounted live)", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-live-hostsecret-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  mkdirSync(join(base, "vault"));
  writeFileSync(join(base, "vault", "token"), "vault-token-value\n");
  const code = `print(open('${base}/vault/token').read())`;
  {
    const s = await setup(t, { ui: { select: choose("Allow once") } });
    if (!s) return;
    await s.run({ code: "kept = 1" });
    const r = await s.run({ code });
    assert.equal(s.log.prompts.length, 1, "baseline: asked");
    assert.match(r.text, /vault-token-value/, "baseline: allowed once, the token is read");
    assert.match(r.text, /mounted read-only in the running sandbox/);
    await s.h.dispose();
  }
  withEnv(t, "PI_PYTHON_TOOL_HOST_SECRETS", `${base}/vault`);
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  await s.run({ code: "kept = 'kept-value'" });
  const r = await s.run({ code });
  assert.equal(r.details.status, "permission_needed");
  assert.equal(s.log.prompts.length, 0, "no dialog");
  assert.match(r.text, /can never be made readable: a host secret/);
  assert.doesNotMatch(r.text, /vault-token-value/);
  // A session grant naming the secret itself (typed in the editor of another read's dialog) mounts nothing.
  writeFileSync(join(base, "notes.txt"), "notes\n");
  s.h.ui.select = choose("Allow reads from");
  s.h.ui.editor = async () => `${base}/vault`;
  const other = await s.run({ code: `print(open('${base}/notes.txt').read())\n${code}` });
  assert.doesNotMatch(other.text, /vault-token-value/);
  const left = await s.run({ code: `import os\nprint(kept, [l.split(' ')[4] for l in open('/proc/self/mountinfo') if l.split(' ')[4].startswith('${base}')])` });
  // Only the file read: the secret is no mount point, and the notification says why it was not mounted.
  assert.match(left.text, new RegExp(`kept-value \\['${base}/notes.txt'\\]`), left.text);
  const note = s.h.notifications.map((n) => n.message).join("\n");
  assert.match(note, new RegExp(`read roots not mounted: ${base}/vault \\(a host secret`), note);
});

/**
 * The sandbox's mount table without mount ids or device numbers: mount point, options, type. The
 * worker's file is /worker.py in a process's first sandbox and /worker.pyc (its compiled form) in
 * later ones: one name for both.
 */
const MOUNTS =
  "import json\nrows = []\nfor line in open('/proc/self/mountinfo'):\n    a, b = line.rstrip('\\n').split(' - ')\n" +
  "    f = a.split(' ')\n    rows.append(' '.join([f[4].replace('/worker.pyc', '/worker.py'), f[5], b.split(' ')[0]]))\nprint(json.dumps(sorted(rows)))";

test("after a live grant the mount table equals a fresh start's with the same read root", async (t) => {
  let typed = "";
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async () => typed } });
  if (!s) return;
  typed = s.outside;
  await s.run({ code: "kept = 1" });
  const r = await s.run({ code: `open('${s.outside}/data.csv').read()\n${MOUNTS}` });
  assert.match(r.text, /mounted in the running sandbox/);
  const live = JSON.parse(r.text.split("\n").find((l) => l.startsWith("["))!);
  await s.h.dispose();
  const fresh = await setup(t, { project: s.project, outside: s.outside, readRoots: (o) => [o] });
  if (!fresh) return;
  const f = await fresh.run({ code: MOUNTS });
  const cold = JSON.parse(f.text.split("\n").find((l) => l.startsWith("["))!);
  assert.ok(live.some((row: string) => row.startsWith(`${s.outside} `)), "the root is in the live table");
  assert.deepEqual(live, cold);
});

test("a revoked read root is detached from the running sandbox at once: the variable and an open file are kept, new opens fail, and the mount table equals a fresh start's without it", async (t) => {
  const s = await setup(t, { readRoots: (o) => [o], ui: { select: choose("Deny once") } });
  if (!s) return;
  const held = await s.run({ code: `kept = 'kept-value'\nf = open('${s.outside}/data.csv')\nprint(open('${s.outside}/sibling.txt').read())` });
  assert.match(held.text, /sibling-data/, "the root is mounted at the start");
  s.h.events.emit("tool-permissions:mode", { mode: "manual", readRoots: [] });
  const r = await s.run({
    code: `print(kept, f.read())\ntry:\n    print(open('${s.outside}/sibling.txt').read())\nexcept Exception as e:\n    print('refused', type(e).__name__)\n${MOUNTS}`,
  });
  assert.match(r.text, /kept-value a,b\n1,2/, "the variable and the open file are kept");
  assert.match(r.text, /refused (FileNotFoundError|SandboxReadDenied|PermissionError)|denied/, r.text);
  assert.doesNotMatch(r.text, /sibling-data/);
  assert.doesNotMatch(r.text, /restarted|fresh interpreter|state was lost/i);
  // The user is told what happened when it happened: detached now, state kept.
  const note = s.h.notifications.find((n) => n.message.includes("read roots cleared"))?.message ?? "";
  assert.match(note, /read roots cleared \(detached from the running sandbox now; interpreter state kept\)/, note);
  assert.doesNotMatch(note, /applies from the next execution|discarded/, note);
  const live = JSON.parse(r.text.split("\n").find((l) => l.startsWith("["))!);
  await s.h.dispose();
  const fresh = await setup(t, { project: s.project, outside: s.outside });
  if (!fresh) return;
  const f = await fresh.run({ code: MOUNTS });
  const cold = JSON.parse(f.text.split("\n").find((l) => l.startsWith("["))!);
  assert.ok(!live.some((row: string) => row.startsWith(`${s.outside} `)), "the root is gone from the live table");
  assert.deepEqual(live, cold);
});

/**
 * The mount table during the rerun of a call that reads `path` (allowed once by the dialog), in
 * the running sandbox (live) and in the sandbox started fresh with the same grant (the restart
 * PI_SANDBOX_LIVE_GRANTS=0 makes for it: a new sandbox, as at a session's start, with the path).
 */
async function tablesAfterAllowOnce(t: TestContext, path: (s: Setup) => string, prepare: (s: Setup) => void, live: RegExp) {
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return undefined;
  prepare(s);
  await s.run({ code: "kept = 1" });
  const r = await s.run({ code: `open('${path(s)}').read()\n${MOUNTS}` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, live);
  const liveTable = JSON.parse(r.text.split("\n").find((l) => l.startsWith("["))!);
  await s.h.dispose();
  withEnv(t, "PI_SANDBOX_LIVE_GRANTS", "0");
  const fresh = await setup(t, { project: s.project, outside: s.outside, ui: { select: choose("Allow once") } });
  if (!fresh) return undefined;
  await fresh.run({ code: "kept = 1" });
  const f = await fresh.run({ code: `open('${path(s)}').read()\n${MOUNTS}` });
  assert.equal(f.details.status, "ok", f.text);
  assert.match(f.text, /fresh interpreter/, "the comparison's sandbox is a new one");
  const coldTable = JSON.parse(f.text.split("\n").find((l) => l.startsWith("["))!);
  return { s, live: liveTable as string[], cold: coldTable as string[] };
}

test("after an allow once made live the mount table equals a fresh start's with the same path allowed", async (t) => {
  const got = await tablesAfterAllowOnce(t, (s) => `${s.outside}/data.csv`, () => {}, /just that file was mounted read-only in the running sandbox/);
  if (!got) return;
  assert.ok(got.live.some((row) => row.startsWith(`${got.s.outside}/data.csv `)), "the file is in the live table");
  assert.deepEqual(got.live, got.cold);
});

test("after a secret unmasked live the mount table equals a fresh start's with the same secret unmasked", async (t) => {
  const got = await tablesAfterAllowOnce(
    t,
    () => "/workspace/.env",
    (s) => {
      writeFileSync(join(s.project, ".env"), "API_KEY=env-secret-value\n");
      writeFileSync(join(s.project, ".env.production"), "API_KEY=prod-secret-value\n");
    },
    /just that path was unmasked in the running sandbox/,
  );
  if (!got) return;
  assert.ok(!got.live.some((row) => row.startsWith("/workspace/.env ")), "the mask is gone from the live table");
  assert.ok(got.live.some((row) => row.startsWith("/workspace/.env.production ")), "the other secret's mask stays");
  assert.deepEqual(got.live, got.cold);
});

/**
 * The attack on a revoked read root: `hold` (Python, run in the interpreter while the root is
 * granted, in the root's folder `root`) keeps something in the root; after the revoke a file is
 * made there and `read` (Python) tries to read it. Returns the second call's text.
 */
async function readAfterRevoke(t: TestContext, rollback: string, hold: (root: string) => string, read: string[]) {
  withEnv(t, "PI_PYTHON_TOOL_ROLLBACK", rollback);
  const base = mkdtempSync("/var/tmp/pps-live-revoke-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const project = join(base, "project");
  const root = join(base, "granted");
  mkdirSync(project);
  mkdirSync(root);
  writeFileSync(join(root, "before.txt"), "before-revoke\n");
  const { PythonSandbox } = await import("./helpers/sandbox-fixture.ts");
  const sb = new PythonSandbox({ projectDir: project, runtimeRoot: join(base, "runtime"), prewarm: false });
  t.after(() => sb.dispose("test end").catch(() => {}));
  sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  const held = await sb.execute(`${hold(root)}\nprint(open(${JSON.stringify(join(root, "before.txt"))}).read())`);
  assert.match(held.text, /before-revoke/, held.text);
  const change = sb.applyModeEvent({ mode: "manual", readRoots: [] });
  assert.deepEqual(change.readRoots, []);
  writeFileSync(join(root, "after.txt"), "made-after-the-revoke\n");
  await new Promise((r) => setTimeout(r, 600));
  const r = await sb.execute(
    [
      "import os",
      "def attempt(what, f):",
      "    try:",
      "        print(what, f())",
      "    except Exception as e:",
      "        print(what, 'refused', type(e).__name__)",
      `attempt("by path", lambda: open(${JSON.stringify(join(root, "after.txt"))}).read())`,
      ...read,
    ].join("\n"),
  );
  // Baseline: the revoke took the path away (documented: new opens fail).
  assert.match(r.text, /by path refused/, r.text);
  return { text: r.text, sb };
}

const HOLD_ALL = (root: string) =>
  `import os, subprocess\nos.chdir(${JSON.stringify(root)})\nd = os.open(".", os.O_RDONLY)\n` +
  `bg = subprocess.Popen(["/bin/sh", "-c", "cd ${root} && while :; do cat *.txt > /scratch/seen 2>/dev/null; sleep 0.1; done"])`;
const READ_ALL = [
  `attempt("by cwd", lambda: open("after.txt").read())`,
  "attempt('by fd', lambda: sorted(os.listdir(d)))",
  "attempt('background', lambda: open('/scratch/seen').read())",
];

for (const rollback of ["1", "0"]) {
  test(`attack (rollback ${rollback === "1" ? "on" : "off"}): a working directory or a directory descriptor held in a revoked read root would keep the whole tree readable, files made after the revoke too: the sandbox restarts and says why (baseline: a new open by its path fails)`, async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { text } = await readAfterRevoke(t, rollback, HOLD_ALL, READ_ALL);
    // The attempt: before the fix, with rollback on, each of these read the revoked tree, the new file included.
    assert.doesNotMatch(text, /made-after-the-revoke|after\.txt/, text);
    // The interpreter was restarted: its variable is gone, and the result says why.
    assert.match(text, /by fd refused NameError/, text);
    if (rollback === "1") assert.match(text, /held its working directory in the revoked read root|held an open directory in the revoked read root/, text);
    else assert.match(text, /rollback is off/, text);
  });
}

test("attack: a thread with a working directory of its own (unshare CLONE_FS) in a revoked read root, the interpreter's elsewhere: the sandbox restarts (baseline: a new open by its path fails)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const hold = (root: string) =>
    [
      "import ctypes, os, threading, time",
      "def reader():",
      "    ctypes.CDLL(None, use_errno=True).unshare(0x200)  # CLONE_FS: a working directory of its own",
      `    os.chdir(${JSON.stringify(root)})`,
      "    while True:",
      "        try:",
      "            open('/scratch/thread-seen', 'w').write(' '.join(sorted(os.listdir('.'))) + open('after.txt').read())",
      "        except OSError:",
      "            pass",
      "        time.sleep(0.1)",
      "threading.Thread(target=reader, daemon=True).start()",
      "time.sleep(0.3)",
      "print('interpreter in', os.getcwd())",
    ].join("\n");
  const { text } = await readAfterRevoke(t, "1", hold, [
    "attempt('thread', lambda: open('/scratch/thread-seen').read())",
    "attempt('cwd', lambda: os.getcwd())",
  ]);
  assert.doesNotMatch(text, /made-after-the-revoke/, text);
  assert.match(text, /held its working directory in the revoked read root/, text);
});

test("a revoke that finds nothing held stops and continues the sandbox's processes: the interpreter, its rollback copy and a background process carry on (a failed call still rolls back)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { text, sb } = await readAfterRevoke(
    t,
    "1",
    () => "import subprocess\nkept = 'kept-value'\nbg = subprocess.Popen(['/bin/sh', '-c', 'while :; do date +%s%N > /scratch/tick; sleep 0.05; done'])",
    ["import time", "a = open('/scratch/tick').read(); time.sleep(0.3); b = open('/scratch/tick').read()", "print(kept, 'ticks on' if a != b else 'stopped', bg.poll())"],
  );
  assert.match(text, /kept-value ticks on None/, text);
  assert.doesNotMatch(text, /restarted|state was lost/i, text);
  const failed = await sb.execute("kept = 'changed'\nwhile True: pass", 1);
  assert.equal(failed.rolledBack, true, failed.text);
  assert.match((await sb.execute("print(kept)")).text, /kept-value/);
});

for (const change of ["revoke", "read-only"] as const) {
  test(`attack: a bash command running when ${change === "revoke" ? "a read root is revoked" : "the mode turns read-only"} would keep ${change === "revoke" ? "reading the root" : "writing the project"} until it ends: it is stopped, and says why (baseline: a command started after the change cannot)`, async (t) => {
    if (skipWithoutSandbox(t)) return;
    const base = mkdtempSync("/var/tmp/pps-live-bash-");
    t.after(() => rmSync(base, { recursive: true, force: true }));
    const project = join(base, "project");
    const root = join(base, "granted");
    mkdirSync(project);
    mkdirSync(root);
    const { PythonSandbox } = await import("./helpers/sandbox-fixture.ts");
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot: join(base, "runtime"), prewarm: false });
    t.after(() => sb.dispose("test end").catch(() => {}));
    sb.applyModeEvent({ mode: change === "revoke" ? "manual" : "yolo", readRoots: [root] });
    const attempt =
      change === "revoke"
        ? `cat ${root}/after.txt 2>&1; ls ${root} 2>&1`
        : `echo written-after-the-change > ${project}/late.txt 2>&1; cat ${project}/late.txt 2>&1`;
    let out = "";
    let started!: () => void;
    const go = new Promise<void>((r) => (started = r));
    const running = sb.execShell(900, `echo started; sleep 3; ${attempt}`, { cwd: project, timeoutSeconds: 30 }, (text: string) => {
      out += text;
      if (out.includes("started")) started();
    });
    await go;
    sb.applyModeEvent({ mode: "manual", readRoots: [] });
    if (change === "revoke") writeFileSync(join(root, "after.txt"), "made-after-the-revoke\n");
    // Baseline: a command started after the change cannot.
    let later = "";
    await sb.execShell(901, attempt, { cwd: project, timeoutSeconds: 30 }, (text: string) => (later += text));
    if (change === "revoke") assert.doesNotMatch(later, /made-after-the-revoke/, later);
    else assert.match(later, /Read-only|Permission denied|read-only/i, later);
    const r = await running;
    if (change === "revoke") assert.doesNotMatch(out, /made-after-the-revoke|after\.txt/, out);
    else assert.doesNotMatch(out, /^written-after-the-change$/m, out);
    assert.equal(r.ending, "stopped", JSON.stringify(r));
    assert.match(r.notes.join("\n"), /The command was stopped: the permission mode or the read roots changed while it ran/);
  });
}

test("a late 'Allow once' (after the call stopped waiting) lifts the denial and says so: the next read needs no dialog, is mounted live, and keeps the variable", async (t) => {
  let answerLate: (choice: string | undefined) => void = () => {};
  const s = await setup(t, { ui: { select: () => new Promise((resolve) => (answerLate = resolve)) } });
  if (!s) return;
  await s.run({ code: "kept = 'kept-value'" });
  // The call stops waiting (an abort here; the 30 s timeout takes the same way in the wrapper).
  const ac = new AbortController();
  s.h.events.on("tool-permissions:prompt", () => setTimeout(() => ac.abort(), 100));
  const file = `${s.outside}/data.csv`;
  const r = await s.h.getTool("python").execute("late-1", { code: `print(open('${file}').read())` }, ac.signal, undefined);
  assert.match(messageText(r), /the call was aborted/);
  assert.equal(s.log.open, 1, "the client's dialog is still open");
  answerLate("Allow once");
  for (let i = 0; i < 50 && s.log.answers.length === 0; i++) await new Promise((res) => setTimeout(res, 20));
  assert.deepEqual(s.log.answers.map((a) => [a.outcome, a.modeEvent]), [["allow", false]]);
  const note = s.h.notifications.at(-1)?.message ?? "";
  assert.match(note, new RegExp(`your allow of the read of ${file} came after the tool had stopped waiting .*the denial that made is lifted`));
  s.h.ui.select = choose("Deny once");
  const next = await s.run({ code: `print(open('${file}').read(), kept)` });
  assert.equal(next.details.status, "ok", next.text);
  assert.match(next.text, /1,2\n kept-value/);
  assert.match(next.text, /mounted read-only in the running sandbox/);
  assert.equal(s.log.prompts.length, 1, "no second dialog");
  // Once: a later read of another file in that directory asks again.
  const other = await s.run({ code: `print(open('${s.outside}/sibling.txt').read())` });
  assert.equal(s.log.prompts.length, 2, other.text);
});

/** Processes of this user whose command line holds `marker` (the sandbox's, seen from the host). */
function running(marker: string): number {
  let n = 0;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(marker)) n++;
    } catch {
      // gone, or not ours
    }
  }
  return n;
}

test("a host secret that appears in a root granted live stops the sandbox at once, as in one granted at the start (baseline: until it appears, the sandbox's reader keeps running)", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-live-watch-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  chmodSync(base, 0o755);
  writeFileSync(join(base, "notes.txt"), "notes\n");
  withEnv(t, "PI_PYTHON_TOOL_HOST_SECRETS", `${base}/vault`);
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async () => base } });
  if (!s) return;
  await s.run({ code: "kept = 1" });
  const r = await s.run({ code: `print(open('${base}/notes.txt').read())` });
  assert.match(r.text, /was granted and mounted in the running sandbox/);
  const marker = `pps-live-watch-reader-${process.pid}-${Date.now()}`;
  t.after(() => {
    for (const pid of readdirSync("/proc")) {
      try {
        if (/^\d+$/.test(pid) && readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(marker)) process.kill(Number(pid), "SIGKILL");
      } catch {}
    }
  });
  // A reader left running in the sandbox: it would read the secret the moment it appears.
  await s.run({
    code: `import subprocess, sys\nreader = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True:\\n    try:\\n        open("${base}/vault/token").read()\\n    except OSError:\\n        pass\\n    time.sleep(0.01)', '${marker}'])`,
  });
  await new Promise((res) => setTimeout(res, 1000));
  assert.equal(running(marker), 1, "baseline: the reader runs while no secret is there");
  mkdirSync(join(base, "vault"));
  writeFileSync(join(base, "vault", "token"), "vault-token-value\n");
  let left = 1;
  for (let i = 0; i < 100 && left > 0; i++) {
    await new Promise((res) => setTimeout(res, 20));
    left = running(marker);
  }
  assert.equal(left, 0, "the sandbox was stopped at once, not at the next call");
  const next = await s.run({ code: "print('next')" });
  assert.match(next.text, /a host secret appeared in a read root/);
  assert.doesNotMatch(next.text, /vault-token-value/);
});

test("a read root inside the project (it unmasks the project's secrets) restarts the sandbox, and the notification says so, not that the mode changed", async (t) => {
  const s = await setup(t);
  if (!s) return;
  mkdirSync(join(s.project, "conf"));
  writeFileSync(join(s.project, "conf", ".env"), "TOKEN=inside\n");
  const masked = await s.run({ code: "kept = 1\nprint(repr(open('/workspace/conf/.env').read()))" });
  assert.match(masked.text, /permission_needed|''/, masked.text);
  s.h.events.emit("tool-permissions:mode", { mode: "manual", readRoots: [join(s.project, "conf")] });
  const note = s.h.notifications.find((n) => n.message.includes("secrets no longer masked"))?.message ?? "";
  assert.match(note, /interpreter state discarded.* not applied to the running sandbox: .*a read root inside the project changes which of its secrets are masked/, note);
  assert.doesNotMatch(note, /mode change/, note);
  const r = await s.run({ code: "print(open('/workspace/conf/.env').read())" });
  assert.match(r.text, /TOKEN=inside/, r.text);
});

test("PI_SANDBOX_LIVE_GRANTS=0: the grant restarts the sandbox, and the prompt, result and status say state is lost and why", async (t) => {
  withEnv(t, "PI_SANDBOX_LIVE_GRANTS", "0");
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  await s.run({ code: "kept = 'kept-value'\ncounter = 0" });
  const r = await s.run({ code: `data = open('${s.outside}/data.csv').read()\nprint(data)` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /1,2/);
  assert.match(r.text, /live grants are off \(PI_SANDBOX_LIVE_GRANTS=0\)/);
  assert.match(r.text, /fresh interpreter/);
  const warn = s.h.notifications.find((n) => n.message.includes("may the code read"))?.message ?? "";
  assert.match(warn, /interpreter state .* will be lost, because live grants are off/);
  const after = await s.run({ code: "print(kept)" });
  assert.match(after.text, /NameError/);
  const st = await s.run({ action: "status" });
  assert.match(st.details.report.text, /grants: restart the sandbox \(interpreter state is lost\): live grants are off/);
});

test("PI_SANDBOX_LIVE_GRANTS=0: a session grant's notification says the sandbox restarted and why", async (t) => {
  withEnv(t, "PI_SANDBOX_LIVE_GRANTS", "0");
  let typed = "";
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async () => typed } });
  if (!s) return;
  typed = s.outside;
  await s.run({ code: "kept = 1" });
  const r = await s.run({ code: `print(open('${s.outside}/data.csv').read())` });
  assert.match(r.text, /1,2/);
  const note = s.h.notifications.find((n) => n.message.includes("read roots mounted read-only"))?.message ?? "";
  assert.match(note, /the sandbox was restarted; interpreter state discarded.* not applied to the running sandbox: live grants are off \(PI_SANDBOX_LIVE_GRANTS=0\)/);
});

test("rollback off: a grant restarts the sandbox as the spec's recovery does, and says why", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow once") }, rollbackOff: true });
  if (!s) return;
  await s.run({ code: "kept = 'kept-value'" });
  const r = await s.run({ code: `print(open('${s.outside}/data.csv').read())` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /1,2/);
  assert.match(r.text, /rollback is off \(PI_PYTHON_TOOL_ROLLBACK=0\)/);
  const after = await s.run({ code: "print(kept)" });
  assert.match(after.text, /NameError/);
});

const AS_NOBODY_ENV = "PPS_LIVE_GRANTS_AS_NOBODY";

test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t) => {
  rerunAsNobody(t, "__test__/live-grants.test.ts", AS_NOBODY_ENV, 24);
});
