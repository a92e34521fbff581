/**
 * The network review over pi's event bus, through a real pi session: a reviewer extension
 * (`fixtures/network-reviewer`, loaded before this package) announces itself when the sandbox asks
 * at session start, gets `sandbox:network-review` for a destination no entry matches, and its
 * `sandbox:network-decision` decides instead of the dialog; "ask" hands the decision to the user's
 * dialog; an abort or the command's timeout sends `sandbox:network-cancel`; a reviewer decides
 * without a UI as well; without a reviewer (or after it withdrew) the dialog is the review.
 *
 * The origin is a local HTTP server reached by this machine's name (reviewed) through an
 * `allowPrivate` entry for its address, as in network-review.test.ts. Both majors
 * (scripts/pi1-host.mjs lists it); run as root, the last test runs this file again as `nobody`.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { networkReviewBus } from "../js/netreview.ts";
import { configureReviewer, type ReviewerLog } from "./fixtures/network-reviewer/index.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { httpOrigin, type NetSession, netSession, type Origin } from "./helpers/network.ts";
import type { UIHooks } from "./helpers/pi-session.ts";
import { displayLine } from "../js/display.ts";

const REVIEWER = fileURLToPath(new URL("./fixtures/network-reviewer", import.meta.url));

interface Setup extends NetSession {
  o: Origin;
  log: ReviewerLog;
}

/** A session with the reviewer (unless `reviewer` is false) and the origin's name unmatched. */
async function setup(
  t: import("node:test").TestContext,
  decide: ReviewerLog["decide"],
  opts: { ui?: UIHooks; hasUI?: boolean; reviewer?: boolean; delayMs?: number; config?: Record<string, unknown> } = {},
): Promise<Setup | undefined> {
  const o = await httpOrigin(t);
  const log = configureReviewer(decide, opts.delayMs ?? 0);
  const network = { mode: "proxy", allowedDomains: [], deniedDomains: [], allowPrivate: [`${o.address}:${o.port}`] };
  const s = await netSession(t, network, {
    ui: opts.ui ?? { select: async () => "Deny" },
    hasUI: opts.hasUI,
    extensions: opts.reviewer === false ? [] : [REVIEWER],
    config: opts.config,
  });
  return s && { ...s, o, log };
}

const one = (o: Origin) => `curl -sS -m 30 http://${o.name}:${o.port}/ 2>&1; echo "rc=$?"`;
const curls = (o: Origin, count: number) =>
  `for i in $(seq ${count}); do curl -s -m 30 -o /dev/null -w '%{http_code}\\n' http://${o.name}:${o.port}/ & done; wait`;

test("a reviewer's decision replaces the dialog: the request names the tool, host, port and command", async (t) => {
  const s = await setup(t, () => "once");
  if (!s) return;
  // A comment of the model's with a title sequence and a second line: `command` is safe to show.
  const raw = "# \u001b]0;FORGED\u0007 \u202e\n";
  const command = `${raw}${one(s.o)}; ${one(s.o)}`;
  const out = await s.bash(command);
  // "once" lets exactly one connection through; the second is asked about again.
  assert.equal(s.log.reviews.length, 2, JSON.stringify(s.log.reviews));
  assert.match(out, /^ORIGIN-BODY\nrc=0$/m, out);
  assert.equal(s.o.hits(), 2);
  assert.equal(s.h.selects.length, 0, "no dialog");
  const [review] = s.log.reviews;
  assert.equal(typeof review.id, "number");
  assert.deepEqual(
    { ...review, id: 0 },
    {
      id: 0,
      kind: "network",
      tool: "bash",
      authority: `${s.o.name}:${s.o.port}`,
      host: s.o.name,
      port: s.o.port,
      unicode: null,
      mixedScripts: false,
      command: displayLine(command),
      commandExact: command,
      decisions: ["once", "command", "session", "deny", "ask"],
      timeoutMs: 60_000,
    },
  );
  // The shown form holds no control, bidi or line break; the exact one is the model's text.
  assert.doesNotMatch(review.command as string, /[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/u, review.command as string);
  assert.match(review.command as string, /^# ␛\]0;FORGED␇ <U\+202E>␊curl /, review.command as string);
  assert.ok((review.commandExact as string).includes("\u001b]0;FORGED\u0007"), "the exact text is unchanged");
  assert.deepEqual(s.log.cancels, []);
});

test("a reviewer's deny refuses, with no dialog; its session grant reaches later commands", async (t) => {
  let decision = "deny";
  const s = await setup(t, () => decision, { ui: { select: async (_t, options) => options[0] } });
  if (!s) return;
  const denied = await s.bash(one(s.o));
  assert.match(denied, /refused at review/, denied);
  assert.doesNotMatch(denied, /ORIGIN-BODY/);
  assert.equal(s.o.hits(), 0);
  decision = "session";
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/);
  decision = "deny";
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/, "the session grant needs no review");
  assert.equal(s.log.reviews.length, 2);
  assert.equal(s.h.selects.length, 0);
  assert.equal(s.o.hits(), 2);
});

test("20 parallel connections send one review; the reviewer's grant for the command lets all through", async (t) => {
  const s = await setup(t, () => "command", { delayMs: 300 });
  if (!s) return;
  const out = await s.bash(curls(s.o, 20));
  assert.deepEqual(out.split("\n").filter((l) => /^\d{3}$/.test(l)), Array(20).fill("200"), out);
  assert.equal(s.log.reviews.length, 1);
  assert.equal(s.o.hits(), 20);
});

test('"ask" hands the decision to the dialog; without a UI it refuses', async (t) => {
  const s = await setup(t, () => "ask", { ui: { select: async (_t, options) => options[0] } });
  if (!s) return;
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/);
  assert.equal(s.log.reviews.length, 1);
  assert.equal(s.h.selects.length, 1);
  assert.ok(s.h.selects[0].title.includes(`${s.o.name}:${s.o.port}`), s.h.selects[0].title);
  await s.h.dispose();
  const n = await setup(t, () => "ask", { hasUI: false });
  if (!n) return;
  const out = await n.bash(one(n.o));
  assert.match(out, /the review of \S+ was cancelled or timed out/, out);
  assert.equal(n.o.hits(), 0);
});

test("without a UI a reviewer still decides; without a reviewer the connection is refused at once", async (t) => {
  const s = await setup(t, () => "once", { hasUI: false });
  if (!s) return;
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/);
  assert.equal(s.log.reviews.length, 1);
  await s.h.dispose();
  // Baseline: the same session without the reviewer.
  const n = await setup(t, () => "once", { hasUI: false, reviewer: false });
  if (!n) return;
  const out = await n.bash(one(n.o));
  assert.match(out, /no one can review it/, out);
  assert.equal(n.log.reviews.length, 0);
  assert.equal(n.o.hits(), 0);
});

test("a withdrawn reviewer gets nothing: the dialog reviews again", async (t) => {
  const s = await setup(t, () => "once");
  if (!s) return;
  s.h.events.emit("sandbox:network-reviewer", { name: "test-reviewer", active: false });
  const out = await s.bash(one(s.o));
  assert.match(out, /refused at review/, out);
  assert.equal(s.log.reviews.length, 0);
  assert.equal(s.h.selects.length, 1);
  // Announcing again (at any time, not only when asked) brings it back.
  s.h.events.emit("sandbox:network-reviewer", { name: "test-reviewer" });
  assert.match(await s.bash(one(s.o)), /ORIGIN-BODY\nrc=0/);
  assert.equal(s.log.reviews.length, 1);
});

test("an abort and the command's timeout send sandbox:network-cancel for the open review; nothing went through", { timeout: 120_000 }, async (t) => {
  const s = await setup(t, () => undefined);
  if (!s) return;
  // Until the reviewer holds an open review (30 s at most).
  const asked = async () => {
    for (let i = 0; i < 1500 && s.log.reviews.length <= s.log.cancels.length; i++) await new Promise((r) => setTimeout(r, 20));
    assert.ok(s.log.reviews.length > s.log.cancels.length, "the reviewer got the review");
  };
  const abort = new AbortController();
  const run = s.bash(one(s.o), { signal: abort.signal });
  await asked();
  assert.deepEqual(s.log.cancels, []);
  abort.abort();
  await assert.rejects(run, /aborted/);
  assert.deepEqual(s.log.cancels, [{ id: s.log.reviews[0].id, reason: "aborted" }]);
  await assert.rejects(s.bash(one(s.o), { timeout: 3 }), /timed out after 3 seconds/);
  assert.equal(s.log.reviews.length, 2);
  assert.deepEqual(s.log.cancels[1], { id: s.log.reviews[1].id, reason: "aborted" });
  // A decision after the cancel changes nothing.
  s.h.events.emit("sandbox:network-decision", { id: s.log.reviews[1].id, decision: "session" });
  assert.equal(s.o.hits(), 0);
  assert.equal(s.h.selects.length, 0);
});

test("the user's !command is reviewed on the bus as \"!command\"", async (t) => {
  const s = await setup(t, () => "once", { config: { userBash: "sandbox" } });
  if (!s) return;
  const out = await s.userBash(one(s.o));
  assert.match(out, /ORIGIN-BODY\nrc=0/, out);
  assert.equal(s.log.reviews.length, 1);
  assert.equal(s.log.reviews[0].tool, "!command");
  assert.equal(s.h.selects.length, 0);
});

test("the bus's own deadline: a review with no decision is refused and sandbox:network-cancel says \"timeout\"; a late decision changes nothing", async (t) => {
  const s = await setup(t, () => undefined);
  if (!s) return;
  // The package's bus waits 60 s; this one, over the same session's bus with the same reviewer, 300 ms.
  const bus = networkReviewBus({ events: s.h.events }, 300);
  t.after(() => bus.close());
  bus.query();
  const dialog = bus.dialogFor("bash", undefined);
  assert.ok(dialog, "the reviewer announced itself to this bus");
  const request = { authority: `${s.o.name}:${s.o.port}`, host: s.o.name, port: s.o.port, unicode: null, mixedScripts: false };
  const guard = new Promise<string>((r) => setTimeout(() => r("no answer within 20 s"), 20_000).unref());
  const choice = await Promise.race([dialog(request, "curl x", new AbortController().signal), guard]);
  assert.equal(choice, "cancel");
  const review = s.log.reviews.at(-1);
  assert.equal(review?.timeoutMs, 300);
  assert.deepEqual(s.log.cancels, [{ id: review?.id, reason: "timeout" }]);
  // The reviewer's answer after the deadline finds nothing open.
  s.h.events.emit("sandbox:network-decision", { id: review?.id, decision: "session" });
  assert.equal(s.log.cancels.length, 1);
  assert.equal(s.h.selects.length, 0);
});

const AS_NOBODY_ENV = "PPS_NET_BUS_AS_NOBODY";
test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t) => {
  rerunAsNobody(t, "__test__/network-bus.test.ts", AS_NOBODY_ENV, 9);
});
