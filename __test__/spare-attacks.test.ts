/**
 * Attacks on the sandboxes started ahead of need (the bash tool's spare, the python sandbox begun
 * at session start): each tries to make a command or call run in a sandbox whose confinement no
 * longer matches the settings in force when it runs, with a baseline that shows what the attempt
 * would give without the defence; and one on what a command mounts after the python sandbox was
 * stopped for a secret. As root, the file runs again as nobody.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import type { PythonSandbox } from "../index.js";
import { type ExecResult, makeFixture, show } from "./helpers/sandbox-fixture.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { workerPids } from "./helpers/host-procs.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { nextShellId, sh, withSpare } from "./helpers/shell-spare.ts";

/** A read root (a home-like tree: `~/` secrets apply in it) with an empty `.config`. */
function readRoot(t: { after(fn: () => void): void }): string {
  const root = mkdtempSync(join("/var/tmp", "pps-spare-attack-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  mkdirSync(join(root, ".config"));
  writeFileSync(join(root, "note.txt"), "granted\n");
  return root;
}

/** `root/.config` replaced by a tree that holds `~/.config/age/keys.txt` (a host secret). */
function replaceConfig(root: string): void {
  const staging = mkdtempSync(join("/var/tmp", "pps-spare-staging-"));
  mkdirSync(join(staging, ".config", "age"), { recursive: true });
  writeFileSync(join(staging, ".config", "age", "keys.txt"), "AGE-SECRET-KEY-1\n");
  renameSync(join(root, ".config"), join(root, ".config-old"));
  renameSync(join(staging, ".config"), join(root, ".config"));
  rmSync(staging, { recursive: true, force: true });
}

test("bash: a host secret that appears under a read root by a rename of its parent keeps the spare from being used", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const root = readRoot(t);
  f.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  const probe = `cat ${root}/.config/age/keys.txt 2>/dev/null; echo end`;
  // Baseline: a command started cold after the same rename finds the secret masked.
  const cold = f.open({ prewarm: false });
  cold.applyModeEvent({ mode: "manual", readRoots: [root] });
  await withSpare(f.sb, f.project);
  replaceConfig(root);
  assert.equal((await sh(cold, f.project, probe)).out, "end\n", "baseline: a cold start masks it");
  const used = f.sb.shellSpare().used;
  assert.equal((await sh(f.sb, f.project, probe)).out, "end\n");
  assert.equal(f.sb.shellSpare().used, used, "the spare was not used");
});

async function until(check: () => boolean, ms = 10_000): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await new Promise((r) => setTimeout(r, 20))) if (check()) return true;
  return check();
}

test("python: a host secret that appears under a read root by a rename of its parent keeps the sandbox begun ahead from being used", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const root = readRoot(t);
  const probe = `import pathlib; p = pathlib.Path(${JSON.stringify(join(root, ".config/age/keys.txt"))}); print(repr(p.read_text() if p.exists() else None))`;
  // Baseline: a sandbox that ran before the rename is replaced at the next call (the check each
  // call makes), and the secret is masked in the new one.
  const cold = f.open({ prewarm: false });
  cold.applyModeEvent({ mode: "manual", readRoots: [root] });
  assert.equal((await cold.execute("1")).status, "ok");
  f.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  await f.sb.prestart();
  assert.ok(await until(() => f.sb.status().spare === "ready"), `spare: ${f.sb.status().spare}`);
  replaceConfig(root);
  const base = await cold.execute(probe);
  assert.match(base.stdout, /^(''|None)\n$/, JSON.stringify(base));
  const r = await f.sb.execute(probe);
  assert.match(r.stdout, /^(''|None)\n$/, JSON.stringify(r));
});

/** How long a watch is given to stop a sandbox before the code in it goes on (not a bound). */
const WATCH_GRACE_MS = 2000;

/**
 * Run `command` in `sb`; once it prints `ready`, call `change` (on the host), then, once the
 * command ended or after a grace, make `root`/go, which the command waits for.
 */
async function shWhenReady(sb: PythonSandbox, cwd: string, command: string, root: string, change: () => void): Promise<string> {
  let out = "";
  let signal: () => void = () => {};
  const ready = new Promise<void>((r) => (signal = r));
  const run = sb.execShell(nextShellId(), command, { cwd, timeoutSeconds: 30 }, (s: string) => {
    out += s;
    if (out.includes("ready\n")) signal();
  });
  await Promise.race([ready, run]);
  change();
  await Promise.race([run, new Promise((r) => setTimeout(r, WATCH_GRACE_MS))]);
  writeFileSync(join(root, "go"), "");
  await run;
  return out;
}

/** The shell words that print `ready`, then wait (at most 20 s) for `root`/go. */
const waitForGo = (root: string) => `echo ready; i=0; while [ ! -e ${root}/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; `;

test("bash: a host secret that appears under a read root by a rename of its parent while a command runs stops it, as one made in place does", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { prewarm: false });
  const root = readRoot(t);
  f.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  const probe = `${waitForGo(root)}cat ${root}/.config/age/keys.txt 2>/dev/null; echo end`;
  // Baseline: the secret made in place, the watch stops the command before it reads it.
  const inPlace = await shWhenReady(f.sb, f.project, probe, root, () => {
    mkdirSync(join(root, ".config", "age"));
    writeFileSync(join(root, ".config", "age", "keys.txt"), "AGE-SECRET-KEY-1\n");
  });
  assert.equal(inPlace, "ready\n");
  rmSync(join(root, ".config", "age"), { recursive: true });
  rmSync(join(root, "go"));
  const renamed = await shWhenReady(f.sb, f.project, probe, root, () => replaceConfig(root));
  assert.equal(renamed, "ready\n");
});

test("python: a host secret that appears under a read root by a rename of its parent during a call stops it, as one made in place does", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { prewarm: false });
  const root = readRoot(t);
  f.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  const code = [
    "import pathlib, time",
    "pathlib.Path('/scratch/ready').write_text('')",
    `go = pathlib.Path(${JSON.stringify(join(root, "go"))})`,
    "for _ in range(400):",
    "    if go.exists(): break",
    "    time.sleep(0.05)",
    `p = pathlib.Path(${JSON.stringify(join(root, ".config/age/keys.txt"))})`,
    "print(repr(p.read_text() if p.exists() else None))",
  ].join("\n");
  const scratches = () => (existsSync(f.runtimeRoot) ? readdirSync(f.runtimeRoot).map((d) => join(f.runtimeRoot, d, "scratch")) : []);
  const during = async (change: () => void): Promise<ExecResult> => {
    const call = f.sb.execute(code, 30);
    assert.ok(await until(() => scratches().some((s) => existsSync(join(s, "ready")))), "the call started");
    change();
    await Promise.race([call, new Promise((r) => setTimeout(r, WATCH_GRACE_MS))]);
    writeFileSync(join(root, "go"), "");
    const r = await call;
    for (const s of scratches()) rmSync(join(s, "ready"), { force: true });
    return r;
  };
  // Baseline: the secret made in place, the watch stops the call before it reads it.
  const inPlace = await during(() => {
    mkdirSync(join(root, ".config", "age"));
    writeFileSync(join(root, ".config", "age", "keys.txt"), "AGE-SECRET-KEY-1\n");
  });
  assert.equal(inPlace.killedFor, "host_secret", show(inPlace));
  rmSync(join(root, ".config", "age"), { recursive: true });
  rmSync(join(root, "go"));
  const renamed = await during(() => replaceConfig(root));
  assert.equal(renamed.killedFor, "host_secret", show(renamed));
  assert.doesNotMatch(renamed.stdout, /AGE-SECRET/);
});

test("bash: a .env that appears in the project inside a directory moved in keeps the spare from being used", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  mkdirSync(join(f.project, "sub"));
  await withSpare(f.sb, f.project);
  const staging = mkdtempSync(join(f.base, "staging-"));
  mkdirSync(join(staging, "sub"));
  writeFileSync(join(staging, "sub", ".env"), "TOKEN=moved-in\n");
  renameSync(join(f.project, "sub"), join(f.base, "sub-old"));
  renameSync(join(staging, "sub"), join(f.project, "sub"));
  const cold = f.open({ prewarm: false });
  assert.equal((await sh(cold, f.project, "cat sub/.env; echo end")).out, "end\n", "baseline: a cold start masks it");
  assert.equal((await sh(f.sb, f.project, "cat sub/.env; echo end")).out, "end\n");
});

test("bash: a command with a NUL byte runs in the spare exactly as it does cold (not cut at the NUL)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const command = "echo first\u0000echo second";
  const cold = f.open({ prewarm: false });
  const run = async (sb: PythonSandbox) => {
    try {
      return `ran: ${JSON.stringify(await sh(sb, f.project, command))}`;
    } catch (e) {
      return `refused: ${(e as Error).message}`;
    }
  };
  const baseline = await run(cold);
  t.diagnostic(baseline);
  await withSpare(f.sb, f.project);
  assert.equal(await run(f.sb), baseline);
});

test("bash: a read root revoked between commands drops the spare: the next command cannot read it", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const root = readRoot(t);
  f.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  const probe = `cat ${root}/note.txt 2>/dev/null; echo end`;
  assert.equal((await sh(f.sb, f.project, probe)).out, "granted\nend\n", "baseline: the root is read while granted");
  assert.equal((await f.sb.awaitShellSpare()).state, "ready");
  f.sb.applyModeEvent({ mode: "manual", readRoots: [] });
  assert.equal((await sh(f.sb, f.project, probe)).out, "end\n");
});

test("bash: a variable of the host's environment changed between commands reaches the next command", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const had = process.env.LC_PPS_SPARE;
  t.after(() => {
    if (had === undefined) delete process.env.LC_PPS_SPARE;
    else process.env.LC_PPS_SPARE = had;
  });
  process.env.LC_PPS_SPARE = "before";
  await withSpare(f.sb, f.project);
  process.env.LC_PPS_SPARE = "after";
  const cold = f.open({ prewarm: false });
  const probe = 'echo "$LC_PPS_SPARE"';
  assert.equal((await sh(cold, f.project, probe)).out, "after\n", "baseline: a cold start has the new value");
  assert.equal((await sh(f.sb, f.project, probe)).out, "after\n");
});

test("bash: a command in another working directory does not run in the spare made for the last one's", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  mkdirSync(join(f.project, "sub"));
  await withSpare(f.sb, f.project);
  const used = f.sb.shellSpare().used;
  assert.equal((await sh(f.sb, join(f.project, "sub"), "pwd")).out, `${join(f.project, "sub")}\n`);
  assert.equal(f.sb.shellSpare().used, used, "the spare was not used");
});

test("bash: a project directory replaced by another at the same path between commands: the next command sees the new one", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  await withSpare(f.sb, f.project);
  renameSync(f.project, join(f.base, "project-old"));
  mkdirSync(f.project);
  writeFileSync(join(f.project, "data.txt"), "new-project\n");
  const cold = f.open({ prewarm: false, workspaceWritable: true });
  const probe = "cat data.txt; touch wrote";
  assert.equal((await sh(cold, f.project, probe)).out, "new-project\n", "baseline: a cold start shows the new one");
  rmSync(join(f.project, "wrote"));
  assert.equal((await sh(f.sb, f.project, probe)).out, "new-project\n");
  assert.ok(existsSync(join(f.project, "wrote")), "it wrote the project");
  assert.ok(!existsSync(join(f.base, "project-old", "wrote")), "not the directory that was the project");
});

test("bash: a project replaced by a link to another directory between commands: the next command sees the link's target, as cold", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  await withSpare(f.sb, f.project);
  const other = join(f.base, "other");
  mkdirSync(other);
  writeFileSync(join(other, "data.txt"), "other\n");
  renameSync(f.project, join(f.base, "project-old"));
  symlinkSync(other, f.project);
  const cold = f.open({ prewarm: false });
  const probe = "cat data.txt; pwd";
  const baseline = (await sh(cold, f.project, probe)).out;
  assert.equal(baseline, `other\n${other}\n`, "baseline: a cold start shows the target");
  assert.equal((await sh(f.sb, f.project, probe)).out, baseline);
});

test("python: a project directory replaced by another at the same path after the sandbox begun ahead: the first call sees the new one", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  await f.sb.prestart();
  assert.ok(await until(() => f.sb.status().spare === "ready"), `spare: ${f.sb.status().spare}`);
  renameSync(f.project, join(f.base, "project-old"));
  mkdirSync(f.project);
  writeFileSync(join(f.project, "data.txt"), "new-project\n");
  const probe = "print(open('/workspace/data.txt').read(), end='')";
  const cold = f.open({ prewarm: false });
  assert.equal((await cold.execute(probe)).stdout, "new-project\n", "baseline: a cold start shows the new one");
  assert.equal((await f.sb.execute(probe)).stdout, "new-project\n");
});

test("bash: a scratch the python sandbox left in doubt (stopped because a host secret appeared) is set aside before the next command mounts it", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { prewarm: false });
  const root = readRoot(t);
  f.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  // What code in the python sandbox wrote to /scratch (in the attack: a copy of the secret, made
  // in the moment between its appearing and the watch's kill).
  assert.equal((await f.sb.execute("open('/scratch/leak', 'w').write('copied')")).status, "ok");
  const probe = "cat /scratch/leak 2>/dev/null; echo end";
  assert.equal((await sh(f.sb, f.project, probe)).out, "copiedend\n", "baseline: a command reads what it wrote");
  assert.ok(workerPids(f.runtimeRoot).length > 0, "the python sandbox runs");
  writeFileSync(join(root, ".netrc"), "machine x password y\n");
  assert.ok(await until(() => workerPids(f.runtimeRoot).length === 0), "its watch stopped the python sandbox");
  const r = await sh(f.sb, f.project, probe);
  t.diagnostic(JSON.stringify(r));
  assert.equal(r.out, "end\n");
  // The python side says what happened, and has the same empty /scratch.
  const next = await f.sb.execute("import os; print(os.listdir('/scratch'))");
  t.diagnostic(JSON.stringify({ text: next.text, notes: next.notes }));
  assert.equal(next.stdout, "[]\n", show(next));
  assert.match(next.text, /host secret/, show(next));
});

const AS_NOBODY_ENV = "PPS_SPARE_ATTACKS_AS_NOBODY";

test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t: TestContext) => {
  rerunAsNobody(t, "__test__/spare-attacks.test.ts", AS_NOBODY_ENV, 13);
});
