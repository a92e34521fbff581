/**
 * The bash tool's spare: a sandbox started ahead of need for the next command, whose payload waits
 * for the command's text. It is used once, only for the same inputs; a mode change, a grant, a
 * secret or a `.git` that appeared on the host drops it, and a dispose leaves none of its processes.
 * The spare's reader, the memfd its command comes through and its held start differ for an
 * unprivileged user: run as root, the last test runs this file again as `nobody`.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import type { PythonSandbox } from "../index.js";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { makeFixture } from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { sh, withSpare } from "./helpers/shell-spare.ts";

/** Whether `pid` is a live process (a zombie counts as gone). */
function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

async function gone(pid: number): Promise<boolean> {
  for (let i = 0; i < 100 && alive(pid); i++) await new Promise((r) => setTimeout(r, 20));
  return !alive(pid);
}

test("a command runs in the spare made after the last one, which is then used up, with the argv, environment and descriptors a cold start gives", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const cold = f.open({ prewarm: false });
  const probe = `env | sort; echo "[$0] [$SHLVL]"; ls /proc/$$/fd; printf '%s\\n' 'a\\b  c'; exit 3\n\n`;
  const baseline = await sh(cold, f.project, probe);
  assert.equal(cold.shellSpare().state, "none", "no spare without prewarming");
  const pid = await withSpare(f.sb, f.project);
  const warm = await sh(f.sb, f.project, probe);
  assert.equal(f.sb.shellSpare().used, 1, "the command ran in the spare");
  assert.deepEqual(warm, baseline);
  assert.equal(warm.code, 3);
  assert.ok(await gone(pid), "the spare's sandbox ends with its command");
  // A new spare for the next command, never the used one.
  const next = await withSpare(f.sb, f.project, "true");
  assert.notEqual(next, pid);
  // Its /tmp is its own.
  await sh(f.sb, f.project, "echo left > /tmp/mark");
  await f.sb.awaitShellSpare();
  assert.equal((await sh(f.sb, f.project, "cat /tmp/mark 2>&1 || echo none")).out.trim().split("\n").pop(), "none");
  assert.equal(f.sb.shellSpare().used, 3);
});

test("an idle spare runs nothing of a command before it is claimed", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  await withSpare(f.sb, f.project);
  // Nothing was written by the spare while it waited.
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(existsSync(join(f.project, "ran")), false);
  const r = await sh(f.sb, f.project, "touch ran; echo done");
  assert.equal(r.out, "done\n");
  assert.equal(f.sb.shellSpare().used, 1);
  assert.equal(existsSync(join(f.project, "ran")), true);
});

test("a mode change drops the spare (its process ends) and the next command has the new mode", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const pid = await withSpare(f.sb, f.project);
  assert.match((await sh(f.sb, f.project, "touch x 2>&1; echo $?")).out, /Read-only file system\n1\n/, "baseline: manual is read-only");
  const pid2 = (await f.sb.awaitShellSpare()).pid!;
  assert.ok(await gone(pid));
  f.sb.applyModeEvent({ mode: "yolo", readRoots: [] });
  assert.equal(f.sb.shellSpare().state, "none");
  assert.ok(await gone(pid2), "the spare's process ends at the mode change");
  const used = f.sb.shellSpare().used;
  assert.equal((await sh(f.sb, f.project, "touch x; echo $?")).out, "0\n");
  assert.equal(f.sb.shellSpare().used, used, "the command started cold");
});

test("a read root granted between commands drops the spare and the next command reads it", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const root = mkdtempSync(join("/var/tmp", "pps-spare-root-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  writeFileSync(join(root, "note.txt"), "granted\n");
  const pid = await withSpare(f.sb, f.project);
  assert.notEqual((await sh(f.sb, f.project, `cat ${root}/note.txt 2>/dev/null; echo end`)).out, "granted\nend\n", "baseline");
  await f.sb.awaitShellSpare();
  assert.ok(await gone(pid));
  f.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
  assert.equal(f.sb.shellSpare().state, "none");
  assert.equal((await sh(f.sb, f.project, `cat ${root}/note.txt; echo end`)).out, "granted\nend\n");
});

test("a .env made on the host between commands drops the spare: the next command sees it empty", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const pid = await withSpare(f.sb, f.project);
  writeFileSync(join(f.project, ".env"), "TOKEN=appeared\n");
  assert.equal(readFileSync(join(f.project, ".env"), "utf8"), "TOKEN=appeared\n", "baseline: it is there on the host");
  const used = f.sb.shellSpare().used;
  assert.equal((await sh(f.sb, f.project, "cat .env; echo end")).out, "end\n");
  assert.equal(f.sb.shellSpare().used, used, "the spare was not used");
  assert.ok(await gone(pid));
});

test("a .git made on the host between commands drops the spare: the next command cannot write it", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  // Baseline: without a .git, a command writes the same path.
  assert.equal((await sh(f.sb, f.project, "mkdir -p sub/.git && echo x > sub/.git/config && echo wrote; rm -rf sub")).out, "wrote\n");
  const pid = await withSpare(f.sb, f.project);
  mkdirSync(join(f.project, ".git"));
  writeFileSync(join(f.project, ".git", "config"), "[core]\n");
  const used = f.sb.shellSpare().used;
  const r = await sh(f.sb, f.project, "{ echo '[alias]' >> .git/config; } 2>/dev/null && echo wrote || echo refused");
  assert.equal(r.out, "refused\n");
  assert.equal(readFileSync(join(f.project, ".git", "config"), "utf8"), "[core]\n");
  assert.equal(f.sb.shellSpare().used, used, "the spare was not used");
  assert.ok(await gone(pid));
});

test("a dispose with a spare ready leaves none of its processes", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const pid = await withSpare(f.sb, f.project);
  assert.ok(alive(pid), "baseline: the spare runs");
  await f.sb.dispose("test");
  assert.ok(await gone(pid), "the spare's bubblewrap is gone");
  assert.equal(f.sb.shellSpare().state, "none");
});

const AS_NOBODY_ENV = "PPS_BASH_SPARE_AS_NOBODY";

test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t: TestContext) => {
  rerunAsNobody(t, "__test__/bash-spare.test.ts", AS_NOBODY_ENV, 7);
});
