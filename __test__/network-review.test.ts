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
import { spawnSync } from "node:child_process";
import { lookup } from "node:dns/promises";
import { once } from "node:events";
import { chmodSync, mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { hostname } from "node:os";
import { join, relative } from "node:path";
import { after, type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { configureClient } from "./fixtures/permissions-client/index.ts";
import { createPiHarness, messageText, type PiHarness, type UIHooks } from "./helpers/pi-session.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const CLIENT = fileURLToPath(new URL("./fixtures/permissions-client", import.meta.url));

const SAVED = { PI_CODING_AGENT_DIR: process.env.PI_CODING_AGENT_DIR, PI_SANDBOX_BASH: process.env.PI_SANDBOX_BASH };
after(() => {
  for (const [name, value] of Object.entries(SAVED)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

interface Origin {
  /** This machine's name, as a command names the origin. */
  name: string;
  port: number;
  /** Requests it answered. */
  hits: () => number;
}

/** An HTTP origin on the address this machine's name resolves to. */
async function origin(t: TestContext): Promise<Origin & { address: string }> {
  const name = hostname().toLowerCase();
  const found = await lookup(name, { family: 4 }).catch((e) => assert.fail(`this machine's name ${name} does not resolve: ${e}`));
  let hits = 0;
  const server = createServer((_req, res) => {
    hits++;
    res.end("ORIGIN-BODY\n");
  });
  server.listen(0, found.address);
  await once(server, "listening");
  t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { name, address: found.address, port: (server.address() as AddressInfo).port, hits: () => hits };
}

interface Setup {
  h: PiHarness;
  o: Origin;
  bash(command: string, opts?: { signal?: AbortSignal; timeout?: number }): Promise<string>;
}

async function setup(
  t: TestContext,
  opts: { ui?: UIHooks; hasUI?: boolean; mode?: string; reviewYolo?: "allow" | "review" } = {},
): Promise<Setup | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  const o = await origin(t);
  const base = mkdtempSync("/var/tmp/pps-net-review-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const project = join(base, "project");
  mkdirSync(project);
  const agent = join(base, "agent");
  mkdirSync(join(agent, "extensions", "pi-python-sandbox"), { recursive: true });
  const network = {
    mode: "proxy",
    allowedDomains: [],
    deniedDomains: ["*:22"],
    allowPrivate: [`${o.address}:${o.port}`],
    ...(opts.reviewYolo ? { review: { yolo: opts.reviewYolo } } : {}),
  };
  writeFileSync(join(agent, "extensions", "pi-python-sandbox", "config.json"), JSON.stringify({ network }));
  // The trusted configuration is read when the extension loads.
  process.env.PI_CODING_AGENT_DIR = agent;
  delete process.env.PI_SANDBOX_BASH;
  configureClient(opts.mode ?? "manual", []);
  const h = await createPiHarness({ cwd: project, extensionPaths: [CLIENT, PACKAGE], ui: opts.ui, hasUI: opts.hasUI });
  t.after(() => h.dispose());
  let n = 0;
  return {
    h,
    o,
    async bash(command, { signal, timeout } = {}) {
      const r = await h.getTool("bash").execute(`bash-${++n}`, { command, ...(timeout ? { timeout } : {}) }, signal, undefined);
      return messageText(r);
    },
  };
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

const NOBODY = 65534;
const AS_NOBODY_ENV = "PPS_NET_REVIEW_AS_NOBODY";
/** `sh -c` words that show checkout `$0` at `$1` to nobody, then exec the rest (bash-session.test.ts's). */
const SHOW_CHECKOUT =
  'mount -t tmpfs -o mode=755 pkg "$1" && for e in "$0"/* "$0"/.[!.]*; do [ -e "$e" ] || continue; ' +
  'n=${e##*/}; if [ -d "$e" ]; then mkdir "$1/$n"; else : > "$1/$n"; fi; mount --bind "$e" "$1/$n" || exit 1; done; ' +
  'shift && exec "$@"';

test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t) => {
  if (process.getuid?.() !== 0) {
    t.diagnostic(`uid ${process.getuid?.()}: the tests above ran unprivileged`);
    return;
  }
  if (skipWithoutSandbox(t)) return;
  const pkgDir = realpathSync(PACKAGE);
  const base = mkdtempSync("/var/tmp/pps-net-review-nobody-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  chmodSync(base, 0o755);
  for (const d of ["pkg", "home"]) mkdirSync(join(base, d));
  spawnSync("chown", [`${NOBODY}:${NOBODY}`, join(base, "home")]);
  const pkg = join(base, "pkg");
  const real = realpathSync(process.execPath);
  const node = real.startsWith(`${pkgDir}/`) ? join(pkg, relative(pkgDir, real)) : real;
  const argv = [node, ...process.execArgv, "--test", "--test-concurrency=1", join(pkg, "__test__", "network-review.test.ts")];
  const cmd = [
    "unshare", "-m", "--propagation", "private", "sh", "-c", SHOW_CHECKOUT, pkgDir, pkg,
    "setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", "sh", "-c", 'cd "$0" && exec "$@"', pkg, ...argv,
  ];
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: join(base, "home"), TMPDIR: "/tmp", CI: "true", [AS_NOBODY_ENV]: "1" };
  if (process.env.PI_HOST !== undefined) env.PI_HOST = process.env.PI_HOST;
  const r = spawnSync(cmd[0], cmd.slice(1), { cwd: "/", env, encoding: "utf8", timeout: 300_000 });
  const out = `${r.stdout}${r.stderr}${r.error ? `\n${r.error.message}` : ""}`;
  assert.equal(r.status, 0, out);
  assert.match(out, /^# pass 6$/m, out);
  assert.match(out, /^# fail 0$/m);
});
