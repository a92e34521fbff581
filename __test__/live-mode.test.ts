/**
 * Permission-mode changes that keep the interpreter: manual ↔ edits replaces the project's mount
 * of the running sandbox in place (the protected entries bound read-only over a writable project
 * before it is reachable, the secret masks in both), the variables are kept, the interpreter's
 * working directory moves to the new /workspace, and the mount table equals a fresh start's in
 * the target mode. Through a real pi session with the pi-tool-permissions stand-in's mode events.
 * Attacks from inside, each with a baseline: a writer racing the change at a protected entry, a
 * protected name made during the change, a background process that keeps writing, changes what
 * its descriptors from edits reach, or holds a file open for writing across the change back; a
 * background process's working directory stays on the old, read-only tree. The
 * fallback (PI_SANDBOX_LIVE_GRANTS=0, rollback off) restarts as before. Both majors (scripts/pi1-host.mjs lists it); run as root, the last test runs
 * this whole file again as `nobody`.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { configureClient } from "./fixtures/permissions-client/index.ts";
import { createPiHarness, messageText, type PiHarness } from "./helpers/pi-session.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";
import { waitUntil } from "./helpers/sandbox-fixture.ts";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const CLIENT = fileURLToPath(new URL("./fixtures/permissions-client", import.meta.url));

interface Setup {
  h: PiHarness;
  project: string;
  run(params: Record<string, unknown>): Promise<{ text: string; details: Record<string, any> }>;
  mode(mode: string): void;
}

/** A project with a protected entry (.git) and a secret (.env), in `mode`. */
async function setup(
  t: TestContext,
  opts: { mode?: string; project?: string; rollbackOff?: boolean } = {},
): Promise<Setup | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  withEnv(t, "PI_PYTHON_TOOL_ROLLBACK", opts.rollbackOff ? "0" : "1");
  let project = opts.project;
  // The project goes after the session: a background process of its sandbox would write into it meanwhile.
  let disposeFirst: (() => Promise<void>) | undefined;
  if (!project) {
    const base = mkdtempSync("/var/tmp/pps-mode-");
    t.after(async () => {
      await disposeFirst?.();
      rmSync(base, { recursive: true, force: true });
    });
    project = join(base, "project");
    mkdirSync(join(project, ".git", "hooks"), { recursive: true });
    writeFileSync(join(project, ".git", "config"), "[core]\n");
    writeFileSync(join(project, ".env"), "TOKEN=secret-value\n");
    mkdirSync(join(project, "src"));
    writeFileSync(join(project, "src", "a.py"), "x = 1\n");
  }
  configureClient(opts.mode ?? "manual", []);
  const h = await createPiHarness({ cwd: project, extensionPaths: [CLIENT, PACKAGE] });
  disposeFirst = () => h.dispose();
  t.after(() => h.dispose());
  let n = 0;
  return {
    h,
    project,
    async run(params) {
      const r = await h.getTool("python").execute(`call-${++n}`, params, undefined, undefined);
      return { text: messageText(r), details: r.details as Record<string, any> };
    },
    mode(mode) {
      h.events.emit("tool-permissions:mode", { mode, readRoots: [] });
    },
  };
}

/** The mount table as live-grants.test.ts compares it: mount point, options, type (no ids, no peer groups). */
const MOUNTS =
  "import json\nrows = []\nfor line in open('/proc/self/mountinfo'):\n    a, b = line.rstrip('\\n').split(' - ')\n" +
  "    f = a.split(' ')\n    rows.append(' '.join([f[4].replace('/worker.pyc', '/worker.py'), f[5], b.split(' ')[0]]))\nprint(json.dumps(sorted(rows)))";
const table = (text: string) => JSON.parse(text.split("\n").find((l) => l.startsWith("["))!);

/** Try to write `path` (relative to the working directory when not absolute): ok or the error's name. */
const TRY_WRITE = (path: string, what = "x") =>
  `try:\n    open(${JSON.stringify(path)}, 'w').write(${JSON.stringify(what)})\n    print('wrote', ${JSON.stringify(path)})\n` +
  `except OSError as e:\n    print('refused', ${JSON.stringify(path)}, e.strerror)`;

const KEPT = /restarted|fresh interpreter|state was lost|discarded/i;

/**
 * Python that waits until file `path` exists (with `lines` lines at least), at most 20 s: a
 * background process has started (python can take over a second to start on a loaded machine).
 */
const WAIT_FOR = (path: string, lines = 0) =>
  `import os as _os, time as _time\n_end = _time.time() + 20\n` +
  `while _time.time() < _end and not (_os.path.exists(${JSON.stringify(path)}) and len(open(${JSON.stringify(path)}).read().splitlines()) >= ${lines}):\n` +
  `    _time.sleep(0.01)`;
/** Python that waits until the last line of `path` holds `text`, at most 20 s (the background process writes a row every 10 ms). */
const WAIT_LAST = (path: string, text: string) =>
  `import time as _time\n_end = _time.time() + 20\n` +
  `while _time.time() < _end and ${JSON.stringify(text)} not in (open(${JSON.stringify(path)}).read().splitlines() or [''])[-1]:\n` +
  `    _time.sleep(0.01)`;

test("manual → edits → manual keeps the variable; the project is writable in edits (also from the working directory) and read-only after the change back", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const first = await s.run({ code: `import os\nkept = 'kept-value'\n${TRY_WRITE("/workspace/before.txt")}` });
  assert.match(first.text, /refused \/workspace\/before.txt Read-only file system/, "baseline: manual is read-only");
  s.mode("edits");
  const edits = await s.run({ code: `print(kept, os.getcwd())\n${TRY_WRITE("/workspace/edits.txt")}\n${TRY_WRITE("relative.txt")}` });
  assert.equal(edits.details.status, "ok", edits.text);
  assert.match(edits.text, /kept-value \/workspace/);
  assert.match(edits.text, /wrote \/workspace\/edits.txt/);
  // The working directory is on the new tree: a relative write reaches the writable project.
  assert.match(edits.text, /wrote relative.txt/);
  assert.doesNotMatch(edits.text, KEPT);
  assert.equal(readFileSync(join(s.project, "relative.txt"), "utf8"), "x");
  assert.match(s.h.notifications.at(-1)!.message, /\/workspace is now read-write \(made writable in the running sandbox at its next execution; interpreter state kept\)/);
  s.mode("manual");
  assert.match(s.h.notifications.at(-1)!.message, /\/workspace is now read-only \(made read-only in the running sandbox now; interpreter state kept\)/);
  const back = await s.run({ code: `print(kept, os.getcwd())\n${TRY_WRITE("/workspace/after.txt")}\n${TRY_WRITE("relative2.txt")}` });
  assert.match(back.text, /kept-value \/workspace/);
  assert.match(back.text, /refused \/workspace\/after.txt Read-only file system/);
  assert.match(back.text, /refused relative2.txt Read-only file system/);
  assert.doesNotMatch(back.text, KEPT);
  assert.ok(existsSync(join(s.project, "edits.txt")));
  assert.ok(!existsSync(join(s.project, "after.txt")) && !existsSync(join(s.project, "relative2.txt")));
  // The secret stays masked in every mode.
  const env = await s.run({ code: "print(repr(open('/workspace/.env').read()))" });
  assert.doesNotMatch(env.text, /secret-value/);
});

test("after each live mode change the mount table equals a fresh start's in the target mode", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const cold: Record<string, string[]> = {};
  for (const mode of ["edits", "manual"]) {
    const f = await setup(t, { mode, project: s.project });
    if (!f) return;
    cold[mode] = table((await f.run({ code: MOUNTS })).text);
    await f.h.dispose();
  }
  assert.notDeepEqual(cold.edits, cold.manual, "baseline: the two modes mount the project differently");
  await s.run({ code: "kept = 1" });
  s.mode("edits");
  const edits = await s.run({ code: `print(kept)\n${MOUNTS}` });
  assert.doesNotMatch(edits.text, KEPT);
  assert.deepEqual(table(edits.text), cold.edits);
  assert.ok(table(edits.text).some((r: string) => r.startsWith("/workspace/.git ro,")), "the protected entry is bound read-only");
  s.mode("manual");
  const manual = await s.run({ code: `print(kept)\n${MOUNTS}` });
  assert.doesNotMatch(manual.text, KEPT);
  assert.deepEqual(table(manual.text), cold.manual);
});

/**
 * A background writer: every 2 ms, for 30 s (the sandbox's end stops it first), it tries to create
 * `path` anew (and, for a directory entry, write into it); it logs each write to `log`, and makes
 * `log`.started when it starts. The call returns once it has started.
 */
const RACER = (path: string, log: string) =>
  "import subprocess, sys\n" +
  `racer = subprocess.Popen([sys.executable, '-c', ${JSON.stringify(
    `import time, os\nopen(${JSON.stringify(`${log}.started`)}, 'w').close()\nend = time.time() + 30\nwhile time.time() < end:\n    try:\n        f = open(${JSON.stringify(path)}, 'w'); f.write('hook'); f.close()\n` +
      `        open(${JSON.stringify(log)}, 'a').write('ok\\n')\n        os.unlink(${JSON.stringify(path)})\n    except OSError:\n        pass\n    time.sleep(0.002)\n`,
  )}], start_new_session=True)\nprint('racer', racer.pid)\n${WAIT_FOR(`${log}.started`)}`;

test("attack: a writer racing the change to edits never writes into the protected .git (baseline: the same writer in a plain directory does)", async (t) => {
  const s = await setup(t);
  if (!s) return;
  // The log is in /tmp (the sandbox's own): what the racer managed to write.
  await s.run({ code: `kept = 1\n${RACER("/workspace/.git/hooks/pre-commit", "/tmp/git.log")}\n${RACER("/workspace/src/plain.txt", "/tmp/plain.log")}` });
  await new Promise((r) => setTimeout(r, 300));
  s.mode("edits");
  // The change to a writable mode is made at the next execution; the racers run on after it.
  const swapped = await s.run({ code: "print(kept)" });
  assert.doesNotMatch(swapped.text, KEPT);
  // Until the plain racer has written once (at most 20 s): the racers ran on past the change.
  const r = await s.run({
    code: `${WAIT_FOR("/tmp/plain.log", 1)}\n` + "import os\nfor n in ('git', 'plain'):\n    p = '/tmp/%s.log' % n\n    print(n, len(open(p).read().split()) if os.path.exists(p) else 0)\nprint(kept)",
  });
  assert.doesNotMatch(r.text, KEPT);
  assert.match(r.text, /plain [1-9]\d*/, "baseline: the racer writes a plain file once the project is writable");
  assert.match(r.text, /git 0\b/, "nothing was ever written under .git");
  assert.ok(!existsSync(join(s.project, ".git", "hooks", "pre-commit")));
});

test("attack: a protected name made by a background process during the change to edits is made inert (baseline: a plain name it makes stays)", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const maker =
    "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', " +
    JSON.stringify(
      "import time\nend = time.time() + 30\nleft = ['.envrc', 'plain-name']\nwhile left and time.time() < end:\n    for n in list(left):\n        try:\n            open('/workspace/' + n, 'x').write('echo pwned')\n            left.remove(n)\n        except OSError:\n            pass\n    time.sleep(0.002)\n",
    ) +
    "], start_new_session=True)\nkept = 1";
  await s.run({ code: maker });
  await new Promise((r) => setTimeout(r, 200));
  s.mode("edits");
  // Each name is made once, as soon as the project is writable.
  await new Promise((r) => setTimeout(r, 1500));
  const r = await s.run({ code: "print(kept)" });
  assert.doesNotMatch(r.text, KEPT);
  // The maker and the host's watch run on after the call: wait (at most 20 s) for both names.
  const made = (names: string[]) => names.includes("plain-name") && names.some((n) => n.startsWith(".envrc"));
  await waitUntil(() => made(readdirSync(s.project)), 20_000);
  const names = readdirSync(s.project);
  assert.ok(names.includes("plain-name"), `baseline: the plain name was made (${names})`);
  assert.ok(!names.includes(".envrc"), `no active .envrc (${names})`);
  assert.ok(names.some((n) => n.startsWith(".envrc.pi-inert")), `the .envrc made was renamed inert (${names})`);
});

/**
 * Whether the change back to manual met a write in flight: the kernel refuses a read-only mount
 * then (EBUSY), and the sandbox restarts, as the holder's test below shows. That attempt is run
 * again, twice at most (a background process that writes every 10 ms is in a write now and then,
 * the more so on a loaded machine).
 */
function metWrite(s: Setup, t: TestContext, attempt: number): boolean {
  const note = s.h.notifications.at(-1)?.message ?? "";
  if (attempt >= 3 || !/not applied to the running sandbox: .*(Device or resource busy|EBUSY)/i.test(note)) return false;
  t.diagnostic(`attempt ${attempt}: the change back met a write in flight; again (${note})`);
  return true;
}

test("a background process started in edits that keeps writing: after the change back it runs on and every write fails (baseline: before it, they land)", async (t) => {
  for (let attempt = 1; ; attempt++) {
    const s = await setup(t, { mode: "edits" });
    if (!s) return;
    const writer =
      "import subprocess, sys\nw = subprocess.Popen([sys.executable, '-c', " +
      JSON.stringify(
        "import time, os\nos.chdir('/workspace')\nn = 0\nend = time.time() + 30\nwhile time.time() < end:\n    n += 1\n    try:\n        with open('bg.txt', 'a') as f: f.write('%d\\n' % n)\n        open('/tmp/bg.log', 'a').write('ok\\n')\n    except OSError as e:\n        open('/tmp/bg.log', 'a').write('refused %s\\n' % e.strerror)\n    time.sleep(0.01)\n",
      ) +
      "], start_new_session=True)\nkept = 1\n" +
      WAIT_FOR("/tmp/bg.log", 4);
    await s.run({ code: writer });
    const before = readFileSync(join(s.project, "bg.txt"), "utf8").split("\n").length;
    assert.ok(before > 3, "baseline: the writer's lines land in edits");
    s.mode("manual");
    if (metWrite(s, t, attempt)) continue;
    const atChange = readFileSync(join(s.project, "bg.txt"), "utf8");
    const r = await s.run({ code: `${WAIT_LAST("/tmp/bg.log", "refused")}\nprint(kept, w.poll())\nprint(open('/tmp/bg.log').read().splitlines()[-1])` });
    assert.doesNotMatch(r.text, KEPT);
    assert.match(r.text, /1 None/, "the writer still runs");
    assert.match(r.text, /refused Read-only file system/);
    // At most the write in flight at the change lands after it.
    const after = readFileSync(join(s.project, "bg.txt"), "utf8");
    assert.ok(after.split("\n").length <= atChange.split("\n").length + 1, "nothing more lands");
    return;
  }
});

test("a background process started in manual keeps the old project, read-only, as its working directory after the change to edits: a relative write fails, a /workspace path works (baseline: the interpreter's relative write works)", async (t) => {
  const s = await setup(t);
  if (!s) return;
  // Started from the interpreter's working directory, /workspace of the read-only mount.
  const writer =
    "import subprocess, sys\nw = subprocess.Popen([sys.executable, '-c', " +
    JSON.stringify(
      "import os, time\ndef one(name, path):\n    try:\n        open(path, 'w').write('x')\n        return name + ' ok'\n    except OSError as e:\n        return name + ' ' + e.strerror\n" +
        "def cwd():\n    try:\n        return os.getcwd()\n    except OSError as e:\n        return 'getcwd ' + e.strerror\n" +
        "end = time.time() + 30\nwhile time.time() < end:\n    row = [cwd(), one('relative', 'bg-rel.txt'), one('absolute', '/workspace/bg-abs.txt')]\n" +
        "    open('/tmp/cwd.log', 'a').write(' | '.join(row) + '\\n')\n    time.sleep(0.01)\n",
    ) +
    "], start_new_session=True)\nkept = 1\n" +
    WAIT_FOR("/tmp/cwd.log", 1);
  await s.run({ code: writer });
  const before = await s.run({ code: "print(open('/tmp/cwd.log').read().splitlines()[-1])" });
  assert.match(before.text, /\/workspace \| relative Read-only file system \| absolute Read-only file system/, `baseline: manual is read-only: ${before.text}`);
  s.mode("edits");
  // The change is made at this execution; the interpreter's working directory moves with it.
  const moved = await s.run({ code: `print(kept)\n${TRY_WRITE("interp-rel.txt")}` });
  assert.doesNotMatch(moved.text, KEPT);
  assert.match(moved.text, /wrote interp-rel.txt/, "baseline: the interpreter's relative write reaches the writable project");
  const r = await s.run({ code: `${WAIT_LAST("/tmp/cwd.log", "absolute ok")}\nprint(kept, w.poll())\nprint(open('/tmp/cwd.log').read().splitlines()[-1])` });
  assert.match(r.text, /1 None/, "the writer still runs");
  // Its directory is still the old tree, read-only, and no longer reachable from the root.
  assert.match(r.text, /getcwd No such file or directory \| relative Read-only file system \| absolute ok/, r.text);
  assert.ok(existsSync(join(s.project, "bg-abs.txt")) && !existsSync(join(s.project, "bg-rel.txt")));
});

test("attack: descriptors a background process opened in edits (a file read-only, a directory) change nothing after the change back: fchmod, futimens, a create beneath the directory (baseline: before it, each works)", async (t) => {
  for (let attempt = 1; ; attempt++) {
    const s = await setup(t, { mode: "edits" });
    if (!s) return;
    // The create opens read-only: a file open for writing at the change back would (rightly) turn it into a restart.
    const prober =
      "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', " +
      JSON.stringify(
        "import os, time\nf = os.open('/workspace/src/a.py', os.O_RDONLY)\nd = os.open('/workspace/src', os.O_RDONLY | os.O_DIRECTORY)\n" +
          "def one(name, act):\n    try:\n        act()\n        return name + ' ok'\n    except OSError as e:\n        return name + ' ' + (e.strerror or str(e.errno))\n" +
          "n = 0\nend = time.time() + 30\nwhile time.time() < end:\n    n += 1\n" +
          "    row = [one('fchmod', lambda: os.fchmod(f, 0o755 if n % 2 else 0o644)), one('futimens', lambda: os.utime(f, (n, n))),\n" +
          "           one('create', lambda: os.close(os.open('made-%d' % n, os.O_CREAT | os.O_RDONLY, 0o644, dir_fd=d)))]\n" +
          "    open('/tmp/meta.log', 'a').write(' | '.join(row) + '\\n')\n    time.sleep(0.01)\n",
      ) +
      "], start_new_session=True)\nkept = 1\n" +
      WAIT_FOR("/tmp/meta.log", 1);
    await s.run({ code: prober });
    const before = await s.run({ code: "print(open('/tmp/meta.log').read().splitlines()[-1])" });
    assert.match(before.text, /fchmod ok \| futimens ok \| create ok/, `baseline: each works in edits: ${before.text}`);
    s.mode("manual");
    if (metWrite(s, t, attempt)) continue;
    const madeAtChange = readdirSync(join(s.project, "src")).filter((n) => n.startsWith("made-")).length;
    const r = await s.run({ code: `${WAIT_LAST("/tmp/meta.log", "fchmod Read-only")}\nprint(kept, p.poll())\nprint(open('/tmp/meta.log').read().splitlines()[-1])` });
    assert.doesNotMatch(r.text, KEPT);
    assert.match(r.text, /1 None/, "the prober still runs");
    assert.match(r.text, /fchmod Read-only file system \| futimens Read-only file system \| create Read-only file system/, r.text);
    // At most the create in flight at the change lands after it.
    const madeAfter = readdirSync(join(s.project, "src")).filter((n) => n.startsWith("made-")).length;
    assert.ok(madeAfter <= madeAtChange + 1, `nothing more is made (${madeAtChange} → ${madeAfter})`);
    return;
  }
});

test("a background process holding a project file open for writing across the change back: the sandbox restarts as before and says so", async (t) => {
  const s = await setup(t, { mode: "edits" });
  if (!s) return;
  await s.run({ code: `import subprocess, sys\nkept = 1\nholder = subprocess.Popen([sys.executable, '-c', \"import time\\nf = open('/workspace/held.txt', 'w')\\ntime.sleep(30)\"], start_new_session=True)\n${WAIT_FOR("/workspace/held.txt")}` });
  s.mode("manual");
  // The kernel refuses a read-only project while a file is open for writing on it.
  assert.match(s.h.notifications.at(-1)!.message, /interpreter state discarded.*not applied to the running sandbox: .*Device or resource busy|interpreter state discarded.*not applied to the running sandbox: .*EBUSY/i);
  const r = await s.run({ code: `${TRY_WRITE("/workspace/after.txt")}\nprint(kept)` });
  assert.match(r.text, /the sandbox was restarted because the permission mode or read roots changed/);
  assert.match(r.text, /refused \/workspace\/after.txt Read-only file system/);
  assert.match(r.text, /NameError/);
});

/** The fallback: a change to edits restarts the sandbox (the write works, `kept` is gone) and says why. */
async function restartsOnEdits(s: Setup): Promise<void> {
  await s.run({ code: "kept = 1" });
  s.mode("edits");
  const r = await s.run({ code: `${TRY_WRITE("/workspace/e.txt")}\nprint(kept)` });
  assert.match(r.text, /wrote \/workspace\/e.txt/);
  assert.match(r.text, /the sandbox was restarted because the permission mode or read roots changed/);
  assert.match(r.text, /NameError/);
}

test("PI_SANDBOX_LIVE_GRANTS=0: a mode change restarts the sandbox as before", async (t) => {
  withEnv(t, "PI_SANDBOX_LIVE_GRANTS", "0");
  const s = await setup(t);
  if (!s) return;
  await restartsOnEdits(s);
});

test("rollback off: a mode change restarts the sandbox, the spec's behaviour", async (t) => {
  const s = await setup(t, { rollbackOff: true });
  if (!s) return;
  await restartsOnEdits(s);
  s.mode("manual");
  const back = await s.run({ code: `${TRY_WRITE("/workspace/m.txt")}\nkept = 2` });
  assert.match(back.text, /refused \/workspace\/m.txt Read-only file system/);
  assert.match(back.text, /restarted/);
});

const AS_NOBODY_ENV = "PPS_LIVE_MODE_AS_NOBODY";

test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t) => {
  rerunAsNobody(t, "__test__/live-mode.test.ts", AS_NOBODY_ENV, 10);
});
