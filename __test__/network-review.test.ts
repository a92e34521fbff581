/**
 * The network review through a real pi session (this package's bash, pi's `ctx.ui.select` answered
 * by the harness's fake UI): a destination no entry of the trusted configuration matches opens one
 * dialog per host and port however many connections wait on it; "Allow this connection" lets
 * exactly one through; "for this command" every connection of the command; "for this session" the
 * later commands too; "Deny", an abort and a timeout refuse and close the dialog; with no UI the
 * connection is refused at once; in yolo mode it is allowed unless `review.yolo` is "review".
 *
 * The origin is a local HTTP server on the address this machine's own name resolves to, reached by
 * that name (a name is reviewed; an address never is) through an `allowPrivate` entry for the
 * address. Both majors (scripts/pi1-host.mjs lists it); run as root, the last test runs this whole
 * file again as `nobody` (as live-grants.test.ts does).
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import type { UIHooks } from "./helpers/pi-session.ts";
import { httpOrigin, type NetSession, netSession, type Origin } from "./helpers/network.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";

interface Setup extends NetSession {
  o: Origin;
}

/** A session whose only entry for the origin is its address in allowPrivate: its name is reviewed. */
async function setup(
  t: import("node:test").TestContext,
  opts: { ui?: UIHooks; hasUI?: boolean; mode?: string; reviewYolo?: "allow" | "review"; config?: Record<string, unknown> } = {},
): Promise<Setup | undefined> {
  const o = await httpOrigin(t);
  const network = {
    mode: "proxy",
    allowedDomains: [],
    deniedDomains: ["*:22"],
    allowPrivate: [`${o.address}:${o.port}`],
    ...(opts.reviewYolo ? { review: { yolo: opts.reviewYolo } } : {}),
  };
  const s = await netSession(t, network, { ui: opts.ui, hasUI: opts.hasUI, mode: opts.mode, config: opts.config });
  return s && { ...s, o };
}

/** `count` curls at once to the origin by name; each prints its HTTP status (000: no answer). */
const curls = (o: Origin, count: number) =>
  `for i in $(seq ${count}); do curl -s -m 30 -o /dev/null -w '%{http_code}\\n' http://${o.name}:${o.port}/ & done; wait`;
const one = (o: Origin) => `curl -sS -m 30 http://${o.name}:${o.port}/ 2>&1; echo "rc=$?"`;
const statuses = (text: string) => text.split("\n").filter((l) => /^\d{3}$/.test(l));

/** Answers with the option whose text starts with `prefix` (or matches it), after `delay` ms. */
const pick =
  (prefix: string | RegExp, delay = 0) =>
  async (_title: string, options: string[]) => {
    await new Promise((r) => setTimeout(r, delay));
    return options.find((o) => (typeof prefix === "string" ? o.startsWith(prefix) : prefix.test(o)));
  };

test("20 parallel connections to one host open one dialog; allowed for the command, every one goes through", async (t) => {
  const s = await setup(t, { ui: { select: pick(/for this command$/, 300) } });
  if (!s) return;
  const out = await s.bash(curls(s.o, 20));
  assert.deepEqual(statuses(out), Array(20).fill("200"), out);
  assert.equal(s.h.selects.length, 1, JSON.stringify(s.h.selects));
  const [dialog] = s.h.selects;
  assert.ok(dialog.title.includes(`${s.o.name}:${s.o.port}`) && dialog.title.includes("seq 20"), dialog.title);
  assert.deepEqual(dialog.options, [
    "Allow this connection",
    `Allow ${s.o.name}:${s.o.port} for this command`,
    `Allow ${s.o.name}:${s.o.port} for this session`,
    "Deny",
  ]);
  assert.equal(s.o.hits(), 20);
  // The command's grant ends with it: the next command is reviewed again, and denied.
  s.h.ui.select = pick("Deny");
  const denied = await s.bash(one(s.o));
  assert.equal(s.h.selects.length, 2);
  assert.match(denied, /refused at review/, denied);
  assert.doesNotMatch(denied, /ORIGIN-BODY/);
  assert.equal(s.o.hits(), 20);
});

test("a one-connection grant is used by exactly one connection", async (t) => {
  let dialogs = 0;
  const s = await setup(t, { ui: { select: async (_t, options) => (++dialogs === 1 ? options[0] : "Deny") } });
  if (!s) return;
  const out = await s.bash(`${one(s.o)}; ${one(s.o)}`);
  assert.match(out, /^ORIGIN-BODY\nrc=0$/m, out);
  assert.match(out, /refused at review/, out);
  assert.equal(s.o.hits(), 1);
  assert.equal(dialogs, 2);
});

test("a session grant reaches the later commands without a dialog", async (t) => {
  const s = await setup(t, { ui: { select: pick(/for this session$/) } });
  if (!s) return;
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/);
  s.h.ui.select = pick("Deny");
  const later = await s.bash(one(s.o));
  assert.match(later, /ORIGIN-BODY\nrc=0/, later);
  assert.equal(s.h.selects.length, 1);
  assert.equal(s.o.hits(), 2);
});

test("an abort and a timeout close the open dialog; nothing went through", async (t) => {
  const signals: AbortSignal[] = [];
  const opened: (() => void)[] = [];
  // A dialog nobody answers: it ends only through its signal.
  const s = await setup(t, {
    ui: {
      select: (_t, _o, opts) =>
        new Promise((resolve) => {
          assert.ok(opts?.signal, "the dialog has a signal");
          signals.push(opts.signal);
          opened.shift()?.();
          opts.signal.addEventListener("abort", () => resolve(undefined), { once: true });
        }),
    },
  });
  if (!s) return;
  const abort = new AbortController();
  const shown = new Promise<void>((r) => opened.push(r));
  const run = s.bash(one(s.o), { signal: abort.signal });
  await shown;
  assert.equal(signals[0].aborted, false);
  abort.abort();
  await assert.rejects(run, /aborted/);
  assert.equal(signals[0].aborted, true, "the abort closed the dialog");
  // The bash tool's timeout: the dialog closes with the command.
  const timedOut = s.bash(one(s.o), { timeout: 3 });
  await assert.rejects(timedOut, /timed out after 3 seconds/);
  assert.equal(signals.length, 2);
  assert.equal(signals[1].aborted, true, "the timeout closed the dialog");
  assert.equal(s.o.hits(), 0);
});

test("with no UI an unmatched name is refused at once, with the line that would allow it", async (t) => {
  const s = await setup(t, { hasUI: false });
  if (!s) return;
  const out = await s.bash(one(s.o));
  assert.match(out, /no one can review it/, out);
  assert.ok(out.includes(`network.allowedDomains "${s.o.name}:${s.o.port}"`), out);
  assert.equal(s.h.selects.length, 0);
  assert.equal(s.o.hits(), 0);
});

test("yolo allows an unmatched name without a dialog; review.yolo \"review\" asks", async (t) => {
  const s = await setup(t, { mode: "yolo", ui: { select: pick("Deny") } });
  if (!s) return;
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/);
  assert.equal(s.h.selects.length, 0);
  await s.h.dispose();
  const r = await setup(t, { mode: "yolo", reviewYolo: "review", ui: { select: pick("Deny") } });
  if (!r) return;
  assert.match(await r.bash(one(r.o)), /refused at review/);
  assert.equal(r.h.selects.length, 1);
  // Baseline: the same refusal in manual mode, where yolo's allow does not apply.
  const m = await setup(t, { mode: "manual", ui: { select: pick("Deny") } });
  if (!m) return;
  assert.match(await m.bash(one(m.o)), /refused at review/);
});

test("the user's !command through the sandbox: its destination is reviewed in the dialog titled !command", async (t) => {
  const s = await setup(t, { config: { userBash: "sandbox" }, ui: { select: pick("Allow this connection") } });
  if (!s) return;
  const out = await s.userBash(`${one(s.o)}; ${one(s.o)}`);
  assert.equal(out.match(/^ORIGIN-BODY\nrc=0$/gm)?.length, 2, out);
  assert.equal(s.h.selects.length, 2, "a one-connection grant: the second connection is reviewed again");
  assert.ok(s.h.selects[0].title.startsWith(`!command: the command asks to connect to ${s.o.name}:${s.o.port}`), s.h.selects[0].title);
  assert.equal(s.o.hits(), 2);
  // Denied at review, as for the model's bash.
  s.h.ui.select = pick("Deny");
  assert.match(await s.userBash(one(s.o)), /refused at review/);
  assert.equal(s.o.hits(), 2);
});

test("/sandbox allow host:port writes allowedDomains of the trusted file and applies to the next command; a malformed entry changes nothing", async (t) => {
  const s = await setup(t, { ui: { select: pick("Deny") } });
  if (!s) return;
  const file = join(process.env.PI_CODING_AGENT_DIR ?? assert.fail("no agent dir"), "extensions", "pi-python-sandbox", "config.json");
  const notes = () => s.h.notifications.map((n) => n.message);
  // Baseline: reviewed, and denied.
  assert.match(await s.bash(one(s.o)), /refused at review/);
  assert.equal(s.h.selects.length, 1);

  let seen = s.h.notifications.length;
  await s.h.prompt(`/sandbox allow ${s.o.name.toUpperCase()}.:${s.o.port}`);
  const said = notes().slice(seen).join("\n");
  assert.ok(said.includes(`Allowed ${s.o.name.toUpperCase()}.:${s.o.port}: added to network.allowedDomains of ${file} (now ${s.o.name}:${s.o.port})`), said);
  const written = JSON.parse(readFileSync(file, "utf8"));
  assert.deepEqual(written.network.allowedDomains, [`${s.o.name.toUpperCase()}.:${s.o.port}`]);
  assert.deepEqual(written.network.allowPrivate, [`${s.o.address}:${s.o.port}`], "the other keys are kept");
  assert.deepEqual(written.network.deniedDomains, ["*:22"]);
  const out = await s.bash(one(s.o));
  assert.match(out, /ORIGIN-BODY\nrc=0/, out);
  assert.equal(s.h.selects.length, 1, "no review: the entry allows it");
  assert.equal(s.o.hits(), 1);

  // A wildcard of one label, a bare `*`: refused by the grammar, the file put back as it was.
  const before = readFileSync(file, "utf8");
  for (const bad of ["*.com", "*"]) {
    seen = s.h.notifications.length;
    await s.h.prompt(`/sandbox allow ${bad}`);
    const refused = notes().slice(seen).join("\n");
    assert.match(refused, /^Nothing was allowed: .*allowedDomains.*is as it was\.$/s, refused);
    assert.equal(readFileSync(file, "utf8"), before);
  }
  // The session keeps the allowed entry (the refused write did not turn the network off).
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/);
  assert.equal(s.o.hits(), 2);
});

const AS_NOBODY_ENV = "PPS_NET_REVIEW_AS_NOBODY";
test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t) => {
  rerunAsNobody(t, "__test__/network-review.test.ts", AS_NOBODY_ENV, 8);
});
