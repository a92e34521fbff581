// `npm run soak`: the long soak of the sandbox addon, outside the test suite's time budget.
//
//   phase 1  one session: 2,000 sequential executions and 50 resets
//   phase 2  16 concurrent sessions doing the same, the per-session count scaled so that the
//            whole soak fits its time budget (default 300 s) on this machine
//
// Every execution's result is checked (output, repr, errors kept as runtime_error, state kept
// across calls and gone after a reset, worker generation), and each session checks that it never
// sees another session's variables, scratch files or /tmp files. The host process's descriptor
// count and RSS are taken at the start, the middle and the end (with every session disposed) and
// must stay flat within the stated tolerance; no sandbox process or session directory may be
// left. The last line is `N passed, M failed`; the exit code is 1 when anything failed.
//
// Options: --budget=SECONDS  --executions=N  --resets=N  --sessions=N  --per-session=N
// The short variant runs in CI from __test__/faults.test.ts through the exported `soak()`.
import { readdirSync, readFileSync, rmSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { hostPidsWithCmdline } from "./lib/procs.mjs";
import { sessionDirs } from "./lib/runtime-root.mjs";

const root = fileURLToPath(new URL("..", import.meta.url));
const MiB = 1024 * 1024;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export function fdCount() {
  return readdirSync("/proc/self/fd").length;
}

export function rssBytes() {
  const line = readFileSync("/proc/self/status", "utf8").split("\n").find((l) => l.startsWith("VmRSS:"));
  return Number(line.split(/\s+/)[1]) * 1024;
}


async function settle(runtimeRoot) {
  for (let i = 0; i < 200 && hostPidsWithCmdline(runtimeRoot).length > 0; i++) await sleep(25);
  globalThis.gc?.();
  await sleep(50);
  globalThis.gc?.();
}

/** A running tally of named checks; failures keep their message (the first 50 are kept). */
class Tally {
  passed = 0;
  failed = 0;
  failures = [];
  check(ok, what) {
    if (ok) this.passed++;
    else {
      this.failed++;
      if (this.failures.length < 50) this.failures.push(what);
    }
    return ok;
  }
}

const brief = (r) => JSON.stringify({ status: r.status, repr: r.repr, stdout: r.stdout?.slice(0, 200), exception: r.exception, diagnostic: r.diagnostic, generation: r.generation });

/**
 * One session's loop: `executions` checked executions with `resets` resets spread evenly.
 * `tag` names the session; with `leakChecks` it also checks, at its start, after every reset
 * and at its end, that only its own variables and files are visible.
 */
/** The first folder of `project`'s host path under /tmp, where the sandbox's link to /workspace sits. */
function linkTopOf(project) {
  return project.startsWith("/tmp/") ? project.slice("/tmp/".length).split("/")[0] : undefined;
}

async function runSession(sb, { tag, executions, resets, leakChecks, tally, onProgress, linkTop }) {
  const resetAt = new Set(Array.from({ length: resets }, (_, i) => Math.floor(((i + 1) * executions) / (resets + 1))));
  let n = 0; // the interpreter's counter, as it should be
  let generation = 0;
  let scratchFiles = 0;
  const init = async () => {
    // Fresh state after every (re)start: nothing of ours, nothing of anyone else's.
    const r = await sb.execute(
      // (the worker may define helpers of its own; only this loop's names matter)
      `left = sorted(k for k in globals() if k in ("TAG", "n", "json", "os", "left") or k.startswith("MARK_"))\n` +
        `import json, os\n` +
        `TAG = ${JSON.stringify(tag)}\nMARK_${tag} = 1\nn = 0\n` +
        `open(f"/tmp/{TAG}-tmp", "w").write(TAG)\nprint(json.dumps(left))\nNone`,
    );
    generation++;
    n = 0;
    tally.check(r.status === "ok" && r.stdout.trim() === "[]", `${tag}: init after start ${generation}: ${brief(r)}`);
    tally.check(r.generation === generation, `${tag}: generation ${r.generation}, expected ${generation}`);
  };
  const leakCheck = async (when) => {
    const r = await sb.execute(
      `import json, os\nprint(json.dumps([sorted(k for k in globals() if k.startswith("MARK_")), ` +
        `sorted(os.listdir("/scratch")), sorted(os.listdir("/tmp"))]))\nNone`,
    );
    if (!tally.check(r.status === "ok", `${tag}: leak check ${when}: ${brief(r)}`)) return;
    const [marks, scratch, tmp] = JSON.parse(r.stdout.trim());
    tally.check(JSON.stringify(marks) === JSON.stringify([`MARK_${tag}`]), `${tag}: ${when}: variables ${marks}`);
    tally.check(scratch.every((f) => f.startsWith(`${tag}-`)), `${tag}: ${when}: foreign scratch files ${scratch}`);
    // The project's host path is a link to /workspace in the sandbox's root: under /tmp, the
    // folders that hold it are in the sandbox's /tmp (the only entry there not made by a call).
    const own = (f) => f.startsWith(`${tag}-`) || f === linkTop;
    tally.check(tmp.every(own), `${tag}: ${when}: foreign /tmp files ${tmp}`);
    tally.check(scratch.length === scratchFiles, `${tag}: ${when}: ${scratch.length} scratch files, expected ${scratchFiles}`);
  };

  await init();
  if (leakChecks) await leakCheck("at start");
  for (let i = 1; i <= executions; i++) {
    if (resetAt.has(i)) {
      await sb.reset();
      await init();
      if (leakChecks) await leakCheck(`after reset at ${i}`);
    }
    n++;
    if (i % 7 === 0) {
      const r = await sb.execute(`n += 1\nraise ValueError(f"{TAG} {n}")`);
      tally.check(
        r.status === "runtime_error" && r.exception?.type === "ValueError" && r.exception.message === `${tag} ${n}` && !r.stateLost,
        `${tag}: execution ${i} (error): ${brief(r)}`,
      );
    } else if (i % 13 === 0) {
      const r = await sb.execute(`n += 1\nopen(f"/scratch/{TAG}-${i}.txt", "w").write(str(n))\nn`);
      scratchFiles++;
      tally.check(r.status === "ok" && r.repr === String(n), `${tag}: execution ${i} (file): ${brief(r)}`);
    } else {
      const r = await sb.execute(`n += 1\nprint(TAG, n)\nn`);
      tally.check(
        r.status === "ok" && r.stdout === `${tag} ${n}\n` && r.repr === String(n) && r.generation === generation,
        `${tag}: execution ${i}: expected ${tag} ${n} in generation ${generation}: ${brief(r)}`,
      );
    }
    if (onProgress && i % 100 === 0) onProgress(i);
  }
  if (leakChecks) await leakCheck("at end");
  tally.check(sb.status().generation === resets + 1, `${tag}: ${sb.status().generation} generations for ${resets} resets`);
}

/**
 * Run the soak. Returns the tally and the figures; `log` receives progress lines.
 * `perSession` (phase 2) defaults to what fits `budgetSeconds` after phase 1.
 * @param {{ executions?: number, resets?: number, sessions?: number, perSession?: number,
 *   perSessionResets?: number, budgetSeconds?: number, fdTolerance?: number,
 *   rssToleranceMiB?: number, log?: (line: string) => void }} [options]
 */
export async function soak({
  executions = 2000,
  resets = 50,
  sessions = 16,
  perSession,
  perSessionResets,
  budgetSeconds = 300,
  fdTolerance = 4,
  rssToleranceMiB = 32,
  log = console.log,
} = {}) {
  const { PythonSandbox } = createRequire(import.meta.url)(join(root, "index.cjs"));
  const tally = new Tally();
  const base = mkdtempSync(join(tmpdir(), "pps-soak-"));
  const project = join(base, "project");
  const runtimeRoot = join(base, "runtime");
  mkdirSync(project);
  writeFileSync(join(project, "data.txt"), "soak\n");
  const open = () => new PythonSandbox({ projectDir: project, runtimeRoot });
  const started = Date.now();
  const figures = [];
  const sample = (label) => {
    const f = { label, fds: fdCount(), rssMiB: +(rssBytes() / MiB).toFixed(1), seconds: +((Date.now() - started) / 1000).toFixed(1) };
    figures.push(f);
    log(`# ${label.padEnd(28)} fds ${String(f.fds).padStart(4)}  rss ${String(f.rssMiB).padStart(6)} MiB  at ${f.seconds} s`);
    return f;
  };
  try {
    // Warm-up: the runtime's threads, epoll and signal descriptors open lazily on first use.
    {
      const sb = open();
      tally.check((await sb.execute("1")).status === "ok", "warm-up execution");
      await sb.reset();
      tally.check((await sb.execute("1")).status === "ok", "warm-up after reset");
      await sb.dispose();
      await settle(runtimeRoot);
    }
    const start = sample("start (after warm-up)");

    // Phase 1.
    log(`# phase 1: 1 session, ${executions} executions, ${resets} resets`);
    const t1 = Date.now();
    let peakFds = start.fds;
    {
      const sb = open();
      await runSession(sb, {
        tag: "solo", executions, resets, leakChecks: true, tally, linkTop: linkTopOf(project),
        onProgress: (i) => {
          peakFds = Math.max(peakFds, fdCount());
          if (i % 500 === 0) log(`#   ${i} executions, ${((Date.now() - t1) / 1000).toFixed(1)} s`);
        },
      });
      await sb.dispose();
    }
    const phase1Ms = Date.now() - t1;
    const perExecMs = phase1Ms / (executions + 2 * resets + 2);
    await settle(runtimeRoot);
    const middle = sample("middle (after phase 1)");
    log(`# phase 1 took ${(phase1Ms / 1000).toFixed(1)} s (${perExecMs.toFixed(2)} ms per call, resets included); peak fds ${peakFds}`);

    // Phase 2, scaled to the remaining budget: the sessions share the machine's cores.
    const cores = Math.max(1, availableParallelism());
    const remainingMs = budgetSeconds * 1000 - (Date.now() - started) - 10_000;
    const fit = Math.floor((remainingMs * Math.min(cores, sessions)) / (sessions * perExecMs * 1.5));
    const per = perSession ?? Math.max(20, Math.min(executions, fit));
    const perResets = perSessionResets ?? Math.max(1, Math.round((resets * per) / executions));
    log(`# phase 2: ${sessions} concurrent sessions, ${per} executions and ${perResets} resets each` +
      (perSession === undefined && per < executions ? ` (scaled from ${executions} to fit ${budgetSeconds} s on ${cores} cores)` : ""));
    const t2 = Date.now();
    const sbs = Array.from({ length: sessions }, open);
    let done = 0;
    await Promise.all(
      sbs.map((sb, i) =>
        runSession(sb, {
          tag: `s${i}`, executions: per, resets: perResets, leakChecks: true, tally, linkTop: linkTopOf(project),
          onProgress: () => {
            peakFds = Math.max(peakFds, fdCount());
            if (++done % (4 * sessions) === 0) log(`#   ${done * 100} executions, ${((Date.now() - t2) / 1000).toFixed(1)} s`);
          },
        }),
      ),
    );
    const scratchDirs = sbs.map((sb) => sb.status().paths.scratchDir);
    tally.check(new Set(scratchDirs).size === sessions, "every session has its own scratch directory");
    await Promise.all(sbs.map((sb) => sb.dispose()));
    log(`# phase 2 took ${((Date.now() - t2) / 1000).toFixed(1)} s; peak fds ${peakFds}`);
    await settle(runtimeRoot);
    const end = sample("end (after phase 2)");

    // Flat: compared with the start, allowing `fdTolerance` descriptors and `rssToleranceMiB`.
    const fdGrowth = end.fds - start.fds;
    const rssGrowth = end.rssMiB - start.rssMiB;
    tally.check(Math.abs(middle.fds - start.fds) <= fdTolerance, `fds start ${start.fds} -> middle ${middle.fds} (tolerance ${fdTolerance})`);
    tally.check(Math.abs(fdGrowth) <= fdTolerance, `fds start ${start.fds} -> end ${end.fds} (tolerance ${fdTolerance})`);
    tally.check(rssGrowth <= rssToleranceMiB, `rss start ${start.rssMiB} -> end ${end.rssMiB} MiB (tolerance ${rssToleranceMiB} MiB)`);
    tally.check(hostPidsWithCmdline(runtimeRoot).length === 0, `sandbox processes left: ${hostPidsWithCmdline(runtimeRoot)}`);
    const leftDirs = sessionDirs(runtimeRoot);
    tally.check(leftDirs.length === 0, `session directories left: ${leftDirs}`);
    log(`# growth: fds ${fdGrowth >= 0 ? "+" : ""}${fdGrowth} (tolerance ${fdTolerance}), rss ${rssGrowth >= 0 ? "+" : ""}${rssGrowth.toFixed(1)} MiB (tolerance ${rssToleranceMiB} MiB)`);
    log(`# ran: phase 1 ${executions} executions + ${resets} resets; phase 2 ${sessions} x (${per} executions + ${perResets} resets); ${((Date.now() - started) / 1000).toFixed(1)} s in all`);
    return { passed: tally.passed, failed: tally.failed, failures: tally.failures, figures, phase2: { sessions, perSession: per, perSessionResets: perResets } };
  } catch (err) {
    tally.check(false, `soak aborted: ${err?.stack ?? err}`);
    return { passed: tally.passed, failed: tally.failed, failures: tally.failures, figures };
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const arg = (name) => {
    const a = process.argv.find((x) => x.startsWith(`--${name}=`));
    return a === undefined ? undefined : Number(a.split("=")[1]);
  };
  const result = await soak({
    budgetSeconds: arg("budget") ?? 300,
    executions: arg("executions") ?? 2000,
    resets: arg("resets") ?? 50,
    sessions: arg("sessions") ?? 16,
    perSession: arg("per-session"),
  });
  for (const f of result.failures) console.log(`FAILED: ${f}`);
  console.log(`${result.passed} passed, ${result.failed} failed`);
  process.exit(result.failed === 0 ? 0 : 1);
}
