/**
 * The project's own host path inside the python sandbox, through real pi sessions: pi tells the
 * model its working directory is the host path, and pi's own tools use it; in the sandbox that
 * path is a link to /workspace (the one mount of the project), so reading works, writing works in
 * the writable modes, and the masks and protections are the same under either name. A path inside
 * the project is never asked about. Projects under /var/tmp (the link is made in the sandbox's
 * root) and under the OS temp directory (/tmp: the sandbox's own tmpfs) are both tried.
 * Each result is checked in the model's text and in the lines pi's TUI shows (pi's theme
 * initialised; collapsed and expanded, at 120 and 80 columns).
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { configureClient } from "./fixtures/permissions-client/index.ts";
import { createPiHarness, messageText, type PiHarness } from "./helpers/pi-session.ts";
import { context, pythonRenderers, setupTui, shownResult, theme } from "./helpers/render.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const CLIENT = fileURLToPath(new URL("./fixtures/permissions-client", import.meta.url));

interface Ran {
  text: string;
  details: Record<string, any>;
  /** The result as pi's TUI shows it at `width` (colours out; wrapped words read as one line). */
  tui(width: number, expanded: boolean): string;
}

interface Setup {
  h: PiHarness;
  /** The project's canonical host path. */
  project: string;
  /** The working directory pi was given (the project, or a link to it). */
  cwd: string;
  /** A host directory outside every sandbox mount. */
  outside: string;
  prompts: string[];
  run(code: string): Promise<Ran>;
  mode(mode: string): void;
}

async function setup(
  t: TestContext,
  opts: { base?: string; client?: string; linkedCwd?: boolean } = {},
): Promise<Setup | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  const base = realpathSync(mkdtempSync(join(opts.base ?? "/var/tmp", "pps-hostpath-")));
  const project = join(base, "project");
  mkdirSync(join(project, ".git"), { recursive: true });
  writeFileSync(join(project, ".git", "config"), "[core]\n");
  writeFileSync(join(project, "numbers.csv"), "n\n1\n2\n3\n");
  writeFileSync(join(project, ".env"), "TOKEN=host-path-secret\n");
  const outside = mkdtempSync("/var/tmp/pps-hostpath-outside-");
  writeFileSync(join(outside, "data.txt"), "outside-data\n");
  symlinkSync(outside, join(project, "out-link"));
  t.after(() => {
    rmSync(base, { recursive: true, force: true });
    rmSync(outside, { recursive: true, force: true });
  });
  let cwd = project;
  if (opts.linkedCwd) {
    cwd = join(base, "via-link");
    symlinkSync(project, cwd);
  }
  if (opts.client) configureClient(opts.client, []);
  setupTui();
  const h = await createPiHarness({ cwd, extensionPaths: opts.client ? [CLIENT, PACKAGE] : [PACKAGE] });
  t.after(() => h.dispose());
  const prompts: string[] = [];
  h.events.on("tool-permissions:prompt", (p: unknown) => prompts.push((p as { path: string }).path));
  let n = 0;
  return {
    h,
    project,
    cwd,
    outside,
    prompts,
    async run(code) {
      const r = await h.getTool("python").execute(`call-${++n}`, { code }, undefined, undefined);
      const details = r.details as Record<string, any>;
      const { renderResult } = pythonRenderers(h);
      const tui = (width: number, expanded: boolean) =>
        shownResult(
          renderResult({ content: r.content, details }, { expanded, isPartial: false }, theme(), context({ expanded, isError: details.status !== "ok" })) as never,
          width,
        ).replace(/\s+/g, " ");
      return { text: messageText(r), details, tui };
    },
    mode(mode) {
      h.events.emit("tool-permissions:mode", { mode, readRoots: [] });
    },
  };
}

const squash = (s: string) => s.replace(/\s+/g, "");
/** What pi's TUI shows of `r`, collapsed and expanded, at 120 and 80 columns, includes `what`. */
function tuiShows(r: Ran, what: string): void {
  for (const width of [120, 80]) {
    for (const expanded of [false, true]) assert.ok(squash(r.tui(width, expanded)).includes(squash(what)), `${width} columns, expanded ${expanded}:\n${r.tui(width, expanded)}`);
  }
}
/** Nothing pi's TUI shows of `r` (expanded: the most) matches `what`, at 120 and 80 columns. */
function tuiNever(r: Ran, what: RegExp): void {
  for (const width of [120, 80]) assert.doesNotMatch(r.tui(width, true), what);
}

for (const [where, base] of [["/var/tmp (a link in the sandbox's root)", "/var/tmp"], ["the OS temp directory (a link in the sandbox's /tmp)", tmpdir()]]) {
  test(`reading through the project's host path under ${where}: a file, a listing, the same files as /workspace`, async (t) => {
    const s = await setup(t, { base });
    if (!s) return;
    const p = JSON.stringify(s.project);
    const r = await s.run(
      `import os\nrows = open(${p} + '/numbers.csv').read().split()\n` +
        `(rows, sorted(os.listdir(${p})) == sorted(os.listdir('/workspace')), os.path.realpath(${p}), os.getcwd())`,
    );
    assert.equal(r.details.status, "ok", r.text);
    assert.match(r.text, /result: \(\['n', '1', '2', '3'\], True, '\/workspace', '\/workspace'\)$/, r.text);
    tuiShows(r, "result: (['n', '1', '2', '3'], True, '/workspace', '/workspace')");
    tuiNever(r, /outside the sandbox mounts|copy the data into the project/);
    assert.deepEqual(s.prompts, []);
  });
}

test("yolo: a write through the host path reaches the host; .git stays read-only and .env masked under that name", async (t) => {
  const s = await setup(t);
  if (!s) return;
  s.mode("yolo");
  const p = JSON.stringify(s.project);
  const w = await s.run(`open(${p} + '/written.txt', 'w').write('via-host-path')`);
  assert.equal(w.details.status, "ok", w.text);
  assert.equal(readFileSync(join(s.project, "written.txt"), "utf8"), "via-host-path");
  tuiShows(w, "result: 13");
  // Baseline: /workspace is writable in yolo, and .git is not, under either name.
  const git = await s.run(
    `import os\nout = []\nfor base in ('/workspace', ${p}):\n` +
      `    try:\n        open(base + '/.git/config', 'a').write('x')\n        out.append('wrote')\n` +
      `    except OSError as e:\n        out.append(e.strerror)\nout`,
  );
  assert.match(git.text, /result: \['Read-only file system', 'Read-only file system'\]$/, git.text);
  tuiShows(git, "result: ['Read-only file system', 'Read-only file system']");
  assert.equal(readFileSync(join(s.project, ".git", "config"), "utf8"), "[core]\n");
  // The secret is the same empty mask under both names (stat and a subprocess: no read hook).
  const env = await s.run(
    `import os, subprocess\n[os.path.getsize(b + '/.env') for b in ('/workspace', ${p})] + ` +
      `[subprocess.run(['cat', ${p} + '/.env'], capture_output=True).stdout]`,
  );
  assert.match(env.text, /result: \[0, 0, b''\]$/, env.text);
  assert.doesNotMatch(env.text, /host-path-secret/);
  tuiShows(env, "result: [0, 0, b'']");
  tuiNever(env, /host-path-secret/);
});

test("manual (read-only): a write through the host path fails, and a read of .env there is refused as the project's secret", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const p = JSON.stringify(s.project);
  const w = await s.run(`open(${p} + '/new.txt', 'w')`);
  assert.equal(w.details.status, "runtime_error", w.text);
  assert.match(w.text, /Read-only file system/);
  assert.equal(existsSync(join(s.project, "new.txt")), false);
  tuiShows(w, "Read-only file system");
  const env = await s.run(`open(${p} + '/.env').read()`);
  assert.equal(env.details.status, "permission_needed", env.text);
  assert.match(env.text, /\/workspace\/\.env looks like a secret/, env.text);
  assert.doesNotMatch(env.text, /host-path-secret/);
  tuiShows(env, "/workspace/.env looks like a secret");
  tuiNever(env, /host-path-secret/);
  assert.deepEqual(s.prompts, []);
});

test("with a permission client: nothing inside the project is asked about, under either name", async (t) => {
  const s = await setup(t, { client: "manual" });
  if (!s) return;
  const p = JSON.stringify(s.project);
  const r = await s.run(`open(${p} + '/numbers.csv').read()`);
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /result: 'n\\n1\\n2\\n3\\n'$/);
  tuiShows(r, "result: 'n\\n1\\n2\\n3\\n'");
  // A link in the project to a directory outside: refused at once, with what to do, no prompt.
  for (const base of [s.project, "/workspace"]) {
    const out = await s.run(`open(${JSON.stringify(base)} + '/out-link/data.txt').read()`);
    assert.equal(out.details.status, "permission_needed", out.text);
    assert.match(out.text, /is in the project, but it leads outside the sandbox mounts through a link; it was refused without asking/, out.text);
    assert.doesNotMatch(out.text, /outside-data|cannot be mounted/);
    tuiShows(out, "is in the project, but it leads outside the sandbox mounts through a link; it was refused without asking");
    tuiNever(out, /outside-data|cannot be mounted/);
  }
  assert.deepEqual(s.prompts, [], "no prompt was shown");
});

test("a working directory that is a link to the project: both names work inside the sandbox", async (t) => {
  const s = await setup(t, { linkedCwd: true });
  if (!s) return;
  assert.notEqual(s.cwd, s.project);
  const r = await s.run(
    `[open(b + '/numbers.csv').read().split()[-1] for b in (${JSON.stringify(s.cwd)}, ${JSON.stringify(s.project)}, '/workspace')]`,
  );
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /result: \['3', '3', '3'\]$/, r.text);
  tuiShows(r, "result: ['3', '3', '3']");
  s.mode("yolo");
  const w = await s.run(`open(${JSON.stringify(s.cwd)} + '/via-cwd.txt', 'w').write('cwd')`);
  assert.equal(w.details.status, "ok", w.text);
  assert.equal(readFileSync(join(s.project, "via-cwd.txt"), "utf8"), "cwd");
  tuiShows(w, "result: 3");
});
