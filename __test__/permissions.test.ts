/**
 * Permission modes, read roots and read prompts, through a real pi session.
 * The test plays pi-tool-permissions' part on the bus: it emits
 * `tool-permissions:mode` and answers `tool-permissions:prompt`.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { fauxAssistantMessage } from "@mariozechner/pi-ai";
import { createPiHarness, messageText, type PiHarness } from "./helpers/pi-session.ts";
import { context, pythonRenderers, setupTui, shown, shownResult, theme } from "./helpers/render.ts";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";

/** What the waiting line says allowing costs, as a pattern: nothing with rollback on; the state without. */
const COST = ROLLBACK
  ? "allowing keeps the python interpreter's state: the grant is added to the running sandbox"
  : "allowing restarts the python sandbox: its interpreter state \\(variables, imports, loaded data\\) will be lost, because rollback is off \\(PI_PYTHON_TOOL_ROLLBACK=0\\), so no copy of the state before the call is kept";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));

interface Setup {
  h: PiHarness;
  project: string;
  /** A host directory outside every sandbox mount (not under /tmp). */
  outside: string;
  prompts: { id: number; path: string }[];
  run(params: Record<string, unknown>, signal?: AbortSignal): Promise<{ text: string; details: Record<string, any> }>;
  mode(mode: string, readRoots?: unknown): void;
}

async function setup(t: TestContext, opts: { hasUI?: boolean } = {}): Promise<Setup | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  // Not under /tmp: a read root there would be a reserved sandbox mount.
  const base = mkdtempSync("/var/tmp/pps-perm-");
  const project = join(base, "project");
  mkdirSync(project);
  writeFileSync(join(project, "data.txt"), "project-data\n");
  // /tmp is a reserved mount inside the sandbox, so the outside data lives elsewhere.
  const outside = mkdtempSync("/var/tmp/pps-outside-");
  writeFileSync(join(outside, "secret.txt"), "outside-data\n");
  t.after(() => {
    rmSync(base, { recursive: true, force: true });
    rmSync(outside, { recursive: true, force: true });
  });
  const h = await createPiHarness({ cwd: project, extensionPaths: [PACKAGE], hasUI: opts.hasUI });
  t.after(() => h.dispose());
  const prompts: { id: number; path: string }[] = [];
  h.events.on("tool-permissions:prompt", (p: unknown) => prompts.push(p as { id: number; path: string }));
  let n = 0;
  return {
    h,
    project,
    outside,
    prompts,
    async run(params, signal) {
      const r = await h.getTool("python").execute(`call-${++n}`, params, signal, undefined);
      return { text: messageText(r), details: r.details as Record<string, any> };
    },
    mode(mode, readRoots = []) {
      h.events.emit("tool-permissions:mode", { mode, readRoots });
    },
  };
}

/** Answer every prompt as pi-tool-permissions does: on allow, the mode event first. */
function answerPrompts(s: Setup, answer: (path: string) => { outcome: "allow" | "deny"; root?: string } | null) {
  s.h.events.on("tool-permissions:prompt", (p: unknown) => {
    const { id, path } = p as { id: number; path: string };
    const a = answer(path);
    if (!a) return;
    if (a.outcome === "allow") s.mode("manual", [a.root]);
    s.h.events.emit("tool-permissions:promptResult", { id, outcome: a.outcome });
  });
}

test("without any mode event /workspace is read-only and nothing extra is mounted", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const r = await s.run({ code: "open('/workspace/new.txt', 'w')" });
  assert.equal(r.details.status, "runtime_error");
  assert.match(r.text, /Read-only file system/);
  assert.equal(existsSync(join(s.project, "new.txt")), false);
  const st = await s.run({ action: "status" });
  assert.equal(st.details.report.workspaceMode, "read-only");
  assert.deepEqual(st.details.report.readRoots, []);
});

for (const mode of ["edits", "auto", "yolo"]) {
  test(`${mode} mode makes /workspace writable; a write reaches the host`, async (t) => {
    const s = await setup(t);
    if (!s) return;
    s.mode(mode);
    const r = await s.run({ code: `open('/workspace/${mode}.txt', 'w').write('from-${mode}')` });
    assert.equal(r.details.status, "ok", r.text);
    assert.equal(readFileSync(join(s.project, `${mode}.txt`), "utf8"), `from-${mode}`);
  });
}

test("leaving a writable mode makes the sandbox read-only (in place with rollback on; a restart with it off, the spec's recovery), says so, and keeps scratch", async (t) => {
  const s = await setup(t);
  if (!s) return;
  s.mode("yolo");
  const first = await s.run({ code: "kept = 1\nopen('/scratch/keep.txt', 'w').write('scratch-kept')" });
  assert.equal(first.details.status, "ok", first.text);
  s.mode("manual");
  const note = s.h.notifications.at(-1)?.message ?? "";
  assert.match(note, /\/workspace is now read-only/);
  const after = await s.run({ code: "try:\n    open('/workspace/x.txt', 'w')\nexcept OSError as e:\n    print(e.strerror)\nprint(kept)" });
  assert.match(after.text, /Read-only file system/);
  if (ROLLBACK) {
    // The project's mount was replaced in the running sandbox: nothing was lost.
    assert.match(note, /made read-only in the running sandbox now; interpreter state kept/);
    assert.equal(after.details.stateLost, false, after.text);
    assert.match(after.text, /^1$/m);
  } else {
    assert.match(note, /interpreter state discarded/);
    assert.equal(after.details.stateLost, true);
    assert.match(after.details.stateLostReason, /permission mode or read roots changed/);
    // The call itself lost nothing: it ran on the new interpreter.
    assert.match(after.text, /Earlier interpreter state was discarded before this call \(the sandbox was restarted because the permission mode or read roots changed\); this call ran on a fresh interpreter, and what ran before the error remains\./);
    assert.doesNotMatch(after.text, /Interpreter state was LOST/);
  }
  const scratch = await s.run({ code: "open('/scratch/keep.txt').read()" });
  assert.match(scratch.text, /result: 'scratch-kept'/);
  // The same payload again changes nothing and says nothing.
  const count = s.h.notifications.length;
  s.mode("manual");
  assert.equal(s.h.notifications.length, count);
});

test("malformed mode payloads never grant anything", async (t) => {
  const s = await setup(t);
  if (!s) return;
  for (const payload of [null, 42, "yolo", { mode: 7 }, { mode: "root", readRoots: [s.outside] }, { readRoots: "/etc" }]) {
    s.h.events.emit("tool-permissions:mode", payload);
  }
  const st = await s.run({ action: "status" });
  assert.equal(st.details.report.workspaceMode, "read-only");
  assert.deepEqual(st.details.report.readRoots, []);
  assert.deepEqual(s.h.extensionErrors, []);
});

test("read roots: mounted read-only at their host path, each skip named", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const nested = join(s.outside, "nested");
  mkdirSync(nested);
  const link = `${s.outside}-link`;
  symlinkSync(s.outside, link);
  t.after(() => rmSync(link, { force: true }));
  s.mode("manual", [link, nested, "relative/dir", "/tmp/pi-scratch-root", "/usr/share", join(s.project, "sub")]);
  const note = s.h.notifications.at(-1)?.message ?? "";
  assert.match(note, new RegExp(`read roots mounted read-only: ${s.outside} \\(requested as ${link}\\)`));
  assert.match(note, new RegExp(`${nested} \\(covered by ${s.outside}\\)`));
  // A relative root is taken from the project (pi-tool-permissions sends the text its editor held).
  assert.match(note, /relative\/dir \(inside the project, already readable under \/workspace\)/);
  assert.match(note, /\/tmp\/pi-scratch-root \(reserved sandbox mount \/tmp\)/);
  assert.match(note, /\/usr\/share \(reserved sandbox mount \/usr\)/);
  assert.match(note, /sub \(inside the project, already readable under \/workspace\)/);
  const r = await s.run({ code: `print(open('${s.outside}/secret.txt').read())\nopen('${s.outside}/w.txt', 'w')` });
  assert.match(r.text, /outside-data/);
  assert.match(r.text, /Read-only file system/);
  assert.equal(existsSync(join(s.outside, "w.txt")), false);
});

test("a read root that contains the project is kept", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const parent = join(s.project, "..");
  s.mode("manual", [parent]);
  const r = await s.run({ code: `open('${join(s.project, "data.txt")}').read()` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /project-data/);
});

test("allow: the root reaches the running sandbox and the code runs once more, from the interpreter's state before the call", async (t) => {
  const s = await setup(t);
  if (!s) return;
  answerPrompts(s, () => ({ outcome: "allow", root: s.outside }));
  s.mode("manual");
  const code = [
    "import os",
    "n = int(open('/scratch/count').read()) + 1 if os.path.exists('/scratch/count') else 1",
    "open('/scratch/count', 'w').write(str(n))",
    `print(open('${s.outside}/secret.txt').read())`,
  ].join("\n");
  const r = await s.run({ code });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /outside-data/);
  assert.deepEqual(s.prompts.map((p) => p.path), [`${s.outside}/secret.txt`]);
  // Once before the prompt, once after the grant (a file the first run wrote stays, as after a
  // rollback); the interpreter's own state is the one from before the call.
  const count = await s.run({ code: "open('/scratch/count').read()" });
  assert.match(count.text, /result: '2'/);
  if (ROLLBACK) {
    assert.equal(r.details.stateLost, false, "the grant reached the running sandbox");
    assert.match(r.text, /ran again on the same interpreter, from its state before the call/);
  } else {
    // Rollback off: the spec's restart, and the reason.
    assert.equal(r.details.stateLost, true, "the relaunch discarded the old interpreter");
    assert.match(r.text, /Interpreter state was lost: rollback is off/);
  }
});

test("deny: the path is named, the directory is remembered, no second prompt", async (t) => {
  const s = await setup(t);
  if (!s) return;
  answerPrompts(s, () => ({ outcome: "deny" }));
  s.mode("manual");
  const code = `open('${s.outside}/secret.txt').read()`;
  const first = await s.run({ code: `x = 5\n${code}` });
  assert.equal(first.details.status, "permission_needed");
  assert.equal(first.details.permissionPath, `${s.outside}/secret.txt`);
  assert.match(first.text, /denied by the user/);
  assert.equal(first.details.stateLost, false);
  const second = await s.run({ code });
  assert.equal(second.details.status, "permission_needed");
  assert.match(second.text, /denied earlier in this session/);
  assert.equal(s.prompts.length, 1);
  const state = await s.run({ code: "x" });
  assert.match(state.text, /result: 5/);
});

test("while the prompt waits, progress says what for; the duration includes the wait; the advice shows collapsed", async (t) => {
  const s = await setup(t);
  if (!s) return;
  setupTui();
  s.mode("manual");
  const path = `${s.outside}/secret.txt`;
  s.h.events.on("tool-permissions:prompt", (p: unknown) => {
    setTimeout(() => s.h.events.emit("tool-permissions:promptResult", { id: (p as { id: number }).id, outcome: "deny" }), 1600);
  });
  const updates: { text: string; details: Record<string, any> }[] = [];
  const result = await s.h.getTool("python").execute("wait-1", { code: `open('${path}')` }, undefined, (u: unknown) => {
    const update = u as { content: { type: string; text?: string }[]; details: Record<string, any> };
    updates.push({ text: messageText(update as never), details: update.details });
  });
  const { renderResult } = pythonRenderers(s.h);
  const waiting = updates.filter((u) => u.details.status === "waiting");
  assert.ok(waiting.length >= 2, `the wait is reported, and again as it goes on (${waiting.length} updates)`);
  assert.equal(waiting[0].details.waitingFor, path);
  const partial = shown(renderResult({ content: [{ type: "text", text: waiting.at(-1)!.text }], details: waiting.at(-1)!.details }, { expanded: false, isPartial: true }, theme(), context()), 300);
  // A long waiting line wraps at the width: one line for the match.
  assert.match(partial.replace(/\n/g, " "), new RegExp(`^⋯ waiting for your answer: may the code read ${path}\\? \\(${COST}; no answer in 30 s counts as no\\) 1s$`));

  const details = result.details as Record<string, any>;
  const text = messageText(result);
  assert.equal(details.status, "permission_needed");
  assert.ok(details.durationMs >= 1600, `the duration includes the wait: ${details.durationMs} ms`);
  assert.ok(details.waitedMs >= 1600);
  assert.match(text, /^status: permission_needed \((1\.[6-9]|[2-9]\.\d)s, (1\.[6-9]|[2-9]\.\d)s of it waiting for the user, worker generation 1\)/);
  assert.doesNotMatch(text, /worker\.py|in hook/, "the tool's own frames never appear");

  const collapsed = shownResult(renderResult(result, { expanded: false, isPartial: false }, theme(), context()), 400);
  assert.match(collapsed, /^✗ python permission_needed (1\.[6-9]|[2-9]\.\d)s\n/);
  const advice = (details.diagnostic as string).trim();
  assert.match(advice, /denied by the user.*grant read access/);
  assert.ok(collapsed.endsWith(advice), `the advice is visible collapsed:\n${collapsed}`);
});

test("abort while the prompt is open counts as a denial", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const ac = new AbortController();
  s.h.events.on("tool-permissions:prompt", () => setTimeout(() => ac.abort(), 50));
  s.mode("manual");
  const started = Date.now();
  const r = await s.run({ code: `open('${s.outside}/secret.txt')` }, ac.signal);
  assert.equal(r.details.status, "permission_needed");
  assert.match(r.text, /the call was aborted/);
  assert.ok(Date.now() - started < 10_000);
});

test("no pi-tool-permissions (no mode event ever): immediate denial that says how to grant", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const started = Date.now();
  const r = await s.run({ code: "open('/etc/hostname')" });
  assert.equal(r.details.status, "permission_needed");
  assert.equal(r.details.permissionPath, "/etc/hostname");
  assert.match(r.text, /no permission extension/);
  assert.match(r.text, /To allow it, grant read access/);
  assert.equal(s.prompts.length, 0);
  assert.doesNotMatch(r.text, /worker\.py|in hook/, "the tool's own frames never appear");
  assert.ok(Date.now() - started < 10_000, "no 30 s wait for nobody");
});

test("no UI (print mode): immediate denial, no prompt", async (t) => {
  const s = await setup(t, { hasUI: false });
  if (!s) return;
  s.mode("manual");
  const r = await s.run({ code: "open('/etc/hostname')" });
  assert.equal(r.details.status, "permission_needed");
  assert.match(r.text, /no UI to ask/);
  assert.equal(s.prompts.length, 0);
});

test("a denial is remembered for the pi session, also after /tree replaces the sandbox", async (t) => {
  const s = await setup(t);
  if (!s) return;
  answerPrompts(s, () => ({ outcome: "deny" }));
  s.mode("manual");
  const code = `open('${s.outside}/secret.txt').read()`;
  assert.equal((await s.run({ code })).details.status, "permission_needed");
  assert.equal(s.prompts.length, 1);
  s.h.faux.setResponses([fauxAssistantMessage("one"), fauxAssistantMessage("two")]);
  await s.h.prompt("first");
  await s.h.prompt("second");
  const firstAnswer = s.h.session.sessionManager
    .getEntries()
    .find((e) => e.type === "message" && e.message.role === "assistant")!;
  await s.h.navigateTree(firstAnswer.id);
  const again = await s.run({ code });
  assert.equal(again.details.status, "permission_needed");
  assert.match(again.text, /denied earlier in this session/);
  assert.equal(s.prompts.length, 1, "no second prompt");
});
