/**
 * The python tool next to a stand-in that behaves as the real
 * pi-tool-permissions does (fixtures/permissions-client: its first mode
 * event in its own session_start, "Allow once" without a mode event, DIR =
 * the parent of the prompt's path, the editor's raw text as a root, a
 * dialog that outlives the tool's wait). Runs on both pi majors.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type ClientLog, configureClient } from "./fixtures/permissions-client/index.ts";
import { createPiHarness, messageText, type PiHarness, type UIHooks } from "./helpers/pi-session.ts";
import { ROLLBACK, skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const CLIENT = fileURLToPath(new URL("./fixtures/permissions-client", import.meta.url));

interface Setup {
  h: PiHarness;
  project: string;
  /** A host directory outside every sandbox mount (not under /tmp, a reserved mount). */
  outside: string;
  log: ClientLog;
  run(params: Record<string, unknown>, signal?: AbortSignal): Promise<{ text: string; details: Record<string, any> }>;
}

async function setup(
  t: TestContext,
  opts: { mode?: string; readRoots?: (outside: string, project: string) => string[]; ui?: UIHooks } = {},
): Promise<Setup | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  const base = mkdtempSync("/var/tmp/pps-client-");
  const project = join(base, "project");
  mkdirSync(project);
  const outside = mkdtempSync("/var/tmp/pps-client-outside-");
  writeFileSync(join(outside, "data.csv"), "a,b\n1,2\n");
  writeFileSync(join(outside, "sibling.txt"), "sibling-data\n");
  mkdirSync(join(outside, "listing"));
  writeFileSync(join(outside, "listing", "inside.txt"), "inside-data\n");
  t.after(() => {
    rmSync(base, { recursive: true, force: true });
    rmSync(outside, { recursive: true, force: true });
  });
  const log = configureClient(opts.mode ?? "manual", opts.readRoots?.(outside, project) ?? []);
  // The stand-in first: its session_start runs before the tool's, as pi orders them.
  const h = await createPiHarness({ cwd: project, extensionPaths: [CLIENT, PACKAGE], ui: opts.ui });
  t.after(() => h.dispose());
  let n = 0;
  return {
    h,
    project,
    outside,
    log,
    async run(params, signal) {
      const r = await h.getTool("python").execute(`call-${++n}`, params, signal, undefined);
      return { text: messageText(r), details: r.details as Record<string, any> };
    },
  };
}

/** Pick the dialog's choice that starts with `prefix`. */
const choose = (prefix: string) => async (_title: string, options: string[]) => options.find((o) => o.startsWith(prefix));

test("start-up: the client's first mode event, sent before this tool's session_start, is applied and reported", async (t) => {
  const s = await setup(t, { mode: "yolo", readRoots: (o) => [o, "/usr/share", `${o}/missing`] });
  if (!s) return;
  const note = s.h.notifications.find((n) => n.message.includes("from pi-tool-permissions at start"))?.message ?? "";
  assert.match(note, /\/workspace is now read-write/);
  assert.match(note, new RegExp(`read roots mounted read-only: ${s.outside}`));
  assert.match(note, /skipped: .*\/usr\/share \(reserved sandbox mount \/usr\)/);
  assert.match(note, /missing \(cannot be resolved/);
  const r = await s.run({ code: `open('/workspace/w.txt', 'w').write('x')\nprint(open('${s.outside}/data.csv').read())` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /1,2/);
  const st = await s.run({ action: "status" });
  assert.deepEqual(
    st.details.report.skippedRoots.map((k: { root: string }) => k.root),
    ["/usr/share", `${s.outside}/missing`],
  );
  assert.match(st.details.report.text, /read roots skipped: \/usr\/share \(reserved sandbox mount \/usr\)/);
});

test("start-up in a writable mode whose project cannot be protected: the report says /workspace stays read-only (baseline: within the bound, read-write)", async (t) => {
  const startNote = async (bound: string | undefined) => {
    if (bound !== undefined) withEnv(t, "PI_SANDBOX_SCAN_ENTRIES", bound);
    const s = await setup(t, {
      mode: "yolo",
      readRoots: (_outside, project) => {
        for (let i = 0; i < 20; i++) writeFileSync(join(project, `f${i}.txt`), "x");
        return [];
      },
    });
    if (!s) return undefined;
    const note = s.h.notifications.find((n) => n.message.includes("from pi-tool-permissions at start"))?.message ?? "";
    const r = await s.run({ code: "open('/workspace/w.txt', 'w').write('x')" });
    return { note, text: r.text };
  };
  const free = await startNote(undefined);
  if (!free) return;
  assert.match(free.note, /\/workspace is now read-write/, free.note);
  assert.match(free.text, /^status: ok/, free.text);
  const held = await startNote("5");
  assert.ok(held);
  assert.doesNotMatch(held.note, /read-write/, held.note);
  assert.match(held.note, /^python sandbox \(from pi-tool-permissions at start\): \/workspace stays read-only although the mode allows writes: the project has more than 5 entries/, held.note);
  assert.match(held.text, /Read-only file system/, held.text);
});

test("a symlinked root that resolves to a mounted one is named, with both names", async (t) => {
  const link = `/var/tmp/pps-client-link-${process.pid}`;
  rmSync(link, { force: true });
  t.after(() => rmSync(link, { force: true }));
  const s = await setup(t, {
    readRoots: (o) => {
      symlinkSync(o, link);
      return [o, link];
    },
  });
  if (!s) return;
  const note = s.h.notifications.find((n) => n.message.includes("from pi-tool-permissions at start"))?.message ?? "";
  assert.match(note, new RegExp(`${link} \\(the same directory as ${s.outside} \\(both resolve to ${s.outside}\\)\\)`));
});

test("allow once: exactly the file read is mounted for the replay, not its directory, and not after a restart", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  const file = `${s.outside}/data.csv`;
  const r = await s.run({ code: `rows = open('${file}').read().splitlines()\nprint(rows)` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /\['a,b', '1,2'\]/);
  assert.deepEqual(s.log.answers, [{ id: s.log.prompts[0].id, outcome: "allow", modeEvent: false }]);
  assert.match(r.text, new RegExp(`Read access to ${file} was allowed once`));
  assert.match(r.text, /stays readable until the sandbox restarts .* and is not mounted again after that/);
  assert.doesNotMatch(r.text, /Interpreter state was LOST/);
  // The replay's state is kept; the file stays readable until the sandbox restarts.
  const again = await s.run({ code: `print(len(rows), open('${file}').read().count(','))` });
  assert.match(again.text, /2 2/);
  const st = await s.run({ action: "status" });
  assert.deepEqual(st.details.report.allowedOnce, [file]);
  // Never wider than asked: the sibling in the same directory is not readable.
  s.h.ui.select = choose("Deny once");
  const sibling = await s.run({ code: `open('${s.outside}/sibling.txt').read()` });
  assert.equal(sibling.details.status, "permission_needed");
  assert.equal(s.log.prompts.length, 2, "the sibling needs its own prompt");
  assert.doesNotMatch(sibling.text, /sibling-data/);
  // A reset restarts the sandbox: the file is gone (and its directory is denied now).
  await s.run({ action: "reset" });
  const after = await s.run({ code: `open('${file}').read()` });
  assert.equal(after.details.status, "permission_needed");
  assert.doesNotMatch(after.text, /1,2/);
  assert.deepEqual((await s.run({ action: "status" })).details.report.allowedOnce, []);
});

test("allow once, two files outside the project in one call: asked once per file, both printed", async (t) => {
  // Bounded by the test: past four dialogs the stand-in denies, so a loop that asks p, q, p, q... ends.
  let dialogs = 0;
  const s = await setup(t, { ui: { select: async (_t, options) => (++dialogs <= 4 ? options[0] : "Deny once") } });
  if (!s) return;
  const code = `print(open('${s.outside}/data.csv').read())\nprint(open('${s.outside}/sibling.txt').read())`;
  const r = await s.run({ code });
  assert.deepEqual(
    s.log.prompts.map((p) => p.path),
    [`${s.outside}/data.csv`, `${s.outside}/sibling.txt`],
    "one prompt per file",
  );
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /1,2/);
  assert.match(r.text, /sibling-data/);
  assert.ok(s.log.answers.every((a) => a.outcome === "allow" && !a.modeEvent));
});

test("allow once is not remembered: after a reset the same read asks again", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  const code = `print(open('${s.outside}/data.csv').read())`;
  assert.match((await s.run({ code })).text, /1,2/);
  await s.run({ action: "reset" });
  s.h.ui.select = choose("Deny once");
  const after = await s.run({ code });
  assert.equal(after.details.status, "permission_needed");
  assert.equal(s.log.prompts.length, 2, "asked again");
  assert.doesNotMatch(after.text, /1,2/);
});

test("cancelling the client's editor is an allow once as well", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async () => undefined } });
  if (!s) return;
  const r = await s.run({ code: `print(open('${s.outside}/data.csv').read())` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /1,2/);
  assert.equal(s.log.answers[0].modeEvent, false);
  assert.match(r.text, /was allowed once/);
});

test("a listing: the prompt says isDirectory, and allow once mounts the listed directory, not the client's DIR", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  const dir = `${s.outside}/listing`;
  const r = await s.run({ code: `print(sorted(__import__('os').listdir('${dir}')))` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /\['inside\.txt'\]/);
  assert.deepEqual(s.log.prompts.map((p) => [p.path, p.isDirectory]), [[dir, true]]);
  s.h.ui.select = choose("Deny once");
  const parent = await s.run({ code: `open('${s.outside}/sibling.txt').read()` });
  assert.equal(parent.details.status, "permission_needed", "the parent the client offered was not mounted");
  assert.doesNotMatch(parent.text, /sibling-data/);
});

test("a session grant: the editor's raw text (relative, /**) is normalised and mounted, and the replay says its state is kept", async (t) => {
  let typed = "";
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async () => typed } });
  if (!s) return;
  typed = `../../${basename(s.outside)}/**`;
  const r = await s.run({ code: `kept = open('${s.outside}/data.csv').read()\nprint(kept)` });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /1,2/);
  assert.equal(s.log.answers[0].modeEvent, true);
  const note = s.h.notifications.at(-1)?.message ?? "";
  assert.match(note, new RegExp(`read roots mounted read-only: ${s.outside} \\(requested as \\.\\./\\.\\./${basename(s.outside)}/\\*\\*\\)`));
  if (ROLLBACK) {
    assert.match(r.text, /was granted and mounted in the running sandbox; this call ran again on the same interpreter, from its state before the call/);
  } else {
    // Rollback off: no copy of the state before the call, so the grant restarts the sandbox and says why.
    assert.match(r.text, /so the sandbox restarted with it and this call ran again\. Interpreter state was lost: rollback is off/);
  }
  assert.doesNotMatch(r.text, /Interpreter state was LOST|A fresh interpreter starts on the next execution/);
  const next = await s.run({ code: "print(len(kept))" });
  assert.match(next.text, /^8$/m);
  // A sibling is covered by the granted directory: no second prompt.
  const sibling = await s.run({ code: `print(open('${s.outside}/sibling.txt').read())` });
  assert.match(sibling.text, /sibling-data/);
  assert.equal(s.log.prompts.length, 1);
});

test("host secrets: a granted directory masks them, the note names them (baseline: unlisted, the same file is read)", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-client-vault-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  mkdirSync(join(base, "vault"));
  writeFileSync(join(base, "vault", "token"), "vault-token-value\n");
  writeFileSync(join(base, "notes.txt"), "notes\n");
  const code = `import os\nprint(open('${base}/notes.txt').read())\nprint(os.listdir('${base}/vault'))\n` +
    `try:\n    print(repr(open('${base}/vault/token').read()))\nexcept OSError as e:\n    print('error', e)`;
  // Baseline: not on the list, the grant carries the token along.
  {
    const s = await setup(t, { readRoots: () => [base] });
    if (!s) return;
    const r = await s.run({ code });
    assert.match(r.text, /vault-token-value/);
    await s.h.dispose();
  }
  withEnv(t, "PI_PYTHON_TOOL_HOST_SECRETS", `${base}/vault`);
  const s = await setup(t, { readRoots: () => [base] });
  if (!s) return;
  const note = s.h.notifications.find((n) => n.message.includes("from pi-tool-permissions at start"))?.message ?? "";
  assert.match(note, new RegExp(`${base} \\(host secrets masked: ${base}/vault\\)`));
  const r = await s.run({ code });
  assert.match(r.text, /notes/);
  // The interpreter's listing of the masked directory is refused, and says why (a subprocess sees it empty).
  assert.ok(r.text.includes(`${base}/vault is a host secret (under ${base}/vault`), r.text);
  assert.doesNotMatch(r.text, /vault-token-value/);
  const ls = await s.run({ code: `import subprocess
print(repr(subprocess.run(['ls', '-A', '${base}/vault'], capture_output=True, text=True).stdout))` });
  assert.match(ls.text, /^''$/m, "the masked directory is empty");
  const st = await s.run({ action: "status" });
  assert.deepEqual(st.details.report.maskedHostSecrets, [`${base}/vault`]);
  // The secret itself is never mounted, also when allowed once.
  s.h.ui.select = choose("Allow once");
  const direct = await s.run({ code: `open('${base}/vault/token').read()` });
  assert.doesNotMatch(direct.text, /vault-token-value/);
  // Asked for itself (a root inside the secret): refused, and said why.
  const again = await s.run({ code: `import os; os.listdir('${base}/vault')` });
  assert.doesNotMatch(again.text, /token/);
  assert.equal(existsSync(join(base, "vault", "token")), true);
});

test("a host secret outside the project is refused at once with the reason, without a dialog (baseline: unlisted, it is asked about)", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-client-hostsecret-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  mkdirSync(join(base, "vault"));
  writeFileSync(join(base, "vault", "token"), "vault-token-value\n");
  const code = `open('${base}/vault/token').read()`;
  {
    const s = await setup(t, { ui: { select: choose("Deny once") } });
    if (!s) return;
    await s.run({ code });
    assert.equal(s.log.prompts.length, 1, "baseline: asked");
    await s.h.dispose();
  }
  withEnv(t, "PI_PYTHON_TOOL_HOST_SECRETS", `${base}/vault`);
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  const r = await s.run({ code });
  assert.equal(r.details.status, "permission_needed");
  assert.equal(s.log.prompts.length, 0, "no dialog");
  assert.match(r.text, /can never be made readable: a host secret/);
  assert.doesNotMatch(r.text, /vault-token-value/);
});

test("granting /etc for /etc/hostname masks /etc/shadow and the sudoers files", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async (_t, prefill) => prefill } });
  if (!s) return;
  const r = await s.run({
    code: "import os\nprint(open('/etc/hostname').read().strip() != '')\n" +
      "print(repr(open('/etc/shadow').read()) if os.path.exists('/etc/shadow') else 'no shadow')",
  });
  assert.equal(r.details.status, existsSync("/etc/shadow") ? "permission_needed" : "ok", r.text);
  assert.equal(s.log.sessionReadRoots[0], "/etc", "the client offered the parent of the file");
  const note = s.h.notifications.at(-1)?.message ?? "";
  assert.match(note, /read roots mounted read-only: \/etc \(host secrets masked: [^)]*\/etc\/shadow/);
  if (process.getuid?.() === 0 && existsSync("/etc/shadow")) {
    assert.notEqual(readFileSync("/etc/shadow", "utf8"), "", "baseline: the host's file has content and root reads it");
  }
  assert.match(r.text, /^True$/m);
  if (existsSync("/etc/shadow")) {
    // Masked, and the interpreter's read says so (a subprocess reads it empty).
    assert.match(r.text, /^\/etc\/shadow is a host secret \(under \/etc\/shadow: .*no grant unmasks it/m, r.text);
    const cat = await s.run({ code: "import subprocess\nprint(repr(subprocess.run(['cat', '/etc/shadow'], capture_output=True, text=True).stdout))" });
    assert.match(cat.text, /^''$/m, cat.text);
  } else {
    assert.match(r.text, /no shadow/m);
  }
});

test("the tool stops waiting: promptCancel goes out, and a late grant reaches the running sandbox (named in the notification)", async (t) => {
  let answerLate: (choice: string | undefined) => void = () => {};
  const s = await setup(t, {
    ui: {
      select: () => new Promise((resolve) => (answerLate = resolve)),
      editor: async (_title, prefill) => prefill,
    },
  });
  if (!s) return;
  const ac = new AbortController();
  s.h.events.on("tool-permissions:prompt", () => setTimeout(() => ac.abort(), 100));
  const r = await s.run({ code: `x = 1\nopen('${s.outside}/data.csv').read()` }, ac.signal);
  assert.equal(r.details.status, "permission_needed");
  assert.match(r.text, /the call was aborted/);
  assert.deepEqual(s.log.cancels, [s.log.prompts[0].id]);
  assert.equal(s.log.open, 1, "the client's dialog is still open");
  answerLate(`Allow reads from ${s.outside} (this session)`);
  for (let i = 0; i < 50 && s.log.answers.length === 0; i++) await new Promise((res) => setTimeout(res, 20));
  assert.equal(s.log.answers[0]?.modeEvent, true);
  const note = s.h.notifications.at(-1)?.message ?? "";
  assert.match(note, /late answer to the prompt about .*data\.csv/);
  if (ROLLBACK) {
    // The late grant reached the running sandbox: the next call reads it, and no state was lost.
    const next = await s.run({ code: `print(open('${s.outside}/data.csv').read(), x)` });
    assert.match(next.text, /1,2\n 1/);
    assert.doesNotMatch(next.text, /restarted/);
    assert.equal(next.details.stateLost, false);
  } else {
    const next = await s.run({ code: `print(open('${s.outside}/data.csv').read())` });
    assert.match(next.text, /1,2/);
    assert.match(next.text, /restarted for a late answer to the read prompt about .*data\.csv/);
    assert.equal(next.details.stateLost, true);
  }
});

test("a secret of the project: allow once unmasks just it for the replay; a deny covers just it", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow once") } });
  if (!s) return;
  writeFileSync(join(s.project, ".env"), "API_KEY=env-secret-value\n");
  writeFileSync(join(s.project, ".env.production"), "API_KEY=prod-secret-value\n");
  const r = await s.run({ code: "print(open('/workspace/.env').read())" });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /env-secret-value/);
  assert.deepEqual(s.log.prompts.map((p) => [p.path, p.isDirectory]), [["/workspace/.env", false]]);
  assert.match(r.text, /looks like a secret, was allowed once/);
  // Just that file: the other secret stays masked.
  s.h.ui.select = choose("Deny once");
  const other = await s.run({ code: "print(repr(open('/workspace/.env.production').read()))" });
  assert.equal(other.details.status, "permission_needed");
  assert.doesNotMatch(other.text, /prod-secret-value/);
  // After a restart the allowed one is masked again, and its earlier deny of the other did not cover it.
  await s.run({ action: "reset" });
  const again = await s.run({ code: "print(open('/workspace/.env').read())" });
  assert.equal(again.details.status, "permission_needed");
  assert.doesNotMatch(again.text, /env-secret-value/);
  assert.equal(s.log.prompts.length, 3, "asked again: the deny was about .env.production alone");
});

test("a secret of the project: the client's 'Allow reads from /workspace' grant unmasks the secrets under it", async (t) => {
  const s = await setup(t, { ui: { select: choose("Allow reads from"), editor: async (_t, prefill) => prefill } });
  if (!s) return;
  mkdirSync(join(s.project, "conf"));
  writeFileSync(join(s.project, "conf", ".env"), "API_KEY=conf-secret-value\n");
  const r = await s.run({ code: "print(open('/workspace/conf/.env').read())" });
  assert.equal(r.details.status, "ok", r.text);
  assert.match(r.text, /conf-secret-value/);
  assert.equal(s.log.sessionReadRoots[0], "/workspace/conf", "the client offered the sandbox path's parent");
  const note = s.h.notifications.at(-1)?.message ?? "";
  assert.match(note, new RegExp(`secrets no longer masked at or under: ${join(s.project, "conf")}`));
  // A lasting grant: still readable after a restart.
  await s.run({ action: "reset" });
  assert.match((await s.run({ code: "print(open('/workspace/conf/.env').read())" })).text, /conf-secret-value/);
});

test("/sandbox shows the session's denials and clear-denials forgets them: the next read asks again", async (t) => {
  const s = await setup(t, { ui: { select: choose("Deny once") } });
  if (!s) return;
  const file = `${s.outside}/data.csv`;
  const first = await s.run({ code: `open('${file}').read()` });
  assert.equal(first.details.status, "permission_needed");
  assert.equal(s.log.prompts.length, 1);
  // Denied for the session: refused again without a dialog.
  await s.run({ code: `open('${file}').read()` });
  assert.equal(s.log.prompts.length, 1, "the denial is remembered");

  const notes = () => s.h.notifications.map((n) => n.message);
  const before = s.h.notifications.length;
  await s.h.prompt("/sandbox");
  const report = notes().slice(before).join("\n");
  assert.match(report, /^python tool: available$/m, report);
  assert.match(report, /^mode: manual; \/workspace read-only/m, "the mode and the mounts");
  assert.ok(report.includes(`denied this session (reads there are refused without asking): ${s.outside}`), report);
  assert.match(report, /\/sandbox clear-denials forgets them\./, report);

  const cleared = s.h.notifications.length;
  await s.h.prompt("/sandbox clear-denials");
  assert.deepEqual(notes().slice(cleared), ["Cleared 1 denied directory: a read there asks again."]);
  const again = await s.run({ code: `open('${file}').read()` });
  assert.equal(again.details.status, "permission_needed");
  assert.equal(s.log.prompts.length, 2, "asked again after the clear");

  const last = s.h.notifications.length;
  await s.h.prompt("/sandbox nonsense");
  assert.match(notes().slice(last).join("\n"), /Unknown \/sandbox subcommand nonsense; one of: clear-denials, allow\./);
});
