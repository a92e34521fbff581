/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * reset, timeout, cancel, worker death, startup failures, the host process's lifetime, the spare
 * sandbox and the stored worker bytecode.
 * Run: node --import tsx --test __test__/lifecycle.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 * The spare has its own suite, with makeFixtureWithSpare.
 * The suite runs with rollback on (the default) and off (PI_PYTHON_TOOL_ROLLBACK=0); where the two
 * differ (a failed call rolled back or its state lost, a reset in the same sandbox or a new one),
 * a test asserts the exact behaviour of the setting in force (ROLLBACK).
 */

/** What `sorted(pids of /proc), os.getpid()` shows right after a reset: PID 1 and the
 * interpreter alone (with rollback off the worker is pid 2 of a new sandbox; with it on, the
 * fresh interpreter PID 1 forked, at whatever pid the namespace gave it). */
const PROCS_AND_ME = "import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid()";
function assertOnlyInitAndInterpreter(repr: string | undefined): void {
  if (ROLLBACK) assert.match(repr ?? "", /^\(\[1, (\d+)\], \1\)$/);
  else assert.equal(repr, "([1, 2], 2)");
}
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { chmod, mkdir, readdir, readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, type TestContext, test } from "node:test";
import {
  assertFailedCallState,
  assertOk,
  INDEX_CJS,
  lit,
  hostPidsWithCmdline,
  makeFixture as makeFixtureWithSpare,
  makeFixtureWithoutSpare as makeFixture,
  py,
  replaceSandbox,
  sessionDirs,
  show,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { assertNoProcess, interpreterPids, parentOf } from "./helpers/host-procs.ts";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;

/**
 * Code that leaves a setsid() grandchild running whose command line carries `marker` and which
 * touches /scratch/heartbeat every 0.1 s, then sleeps in the interpreter for 30 s.
 */
function grandchildCode(marker: string): string {
  return py`
    import os, time
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sh", ["sh", "-c", "while :; do date +%s%N > /scratch/heartbeat; sleep 0.1; done", ${lit(marker)}])
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(30)
  `;
}

/** After a kill: the marked grandchild is gone from the host and its heartbeat has stopped. */
async function assertGrandchildGone(marker: string, scratchDir: string): Promise<void> {
  assert.ok(
    await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 5000),
    `setsid grandchild still alive: pids ${hostPidsWithCmdline(marker)}`,
  );
  const beat = join(scratchDir, "heartbeat");
  assert.ok(existsSync(beat), "the grandchild never ran (no heartbeat file)");
  const before = readFileSync(beat, "utf8");
  await sleep(400);
  assert.equal(readFileSync(beat, "utf8"), before, "heartbeat still changing after the kill");
}

// ---------------------------------------------------------------------------------------------
describe("lifecycle: reset, timeout, cancel, worker death", { concurrency: CONCURRENCY }, () => {
  test("reset discards state, keeps scratch files and reports explicit_reset", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    assertOk(await sb.execute("x = 1\nopen('/scratch/keep.txt', 'w').write('kept')"));
    const scratchDir = sb.status().paths.scratchDir;
    assert.ok(scratchDir);
    assert.equal(await readFile(join(scratchDir, "keep.txt"), "utf8"), "kept");
    const sandbox = hostPidsWithCmdline(runtimeRoot);
    const interpreter = interpreterPids(scratchDir);
    const reset = await sb.reset();
    assert.equal(reset.scratchDir, scratchDir);
    const s = sb.status();
    assert.equal(s.rollback, ROLLBACK, "the tests read the setting as the addon does");
    assert.equal(s.lastResetReason, "explicit_reset");
    if (ROLLBACK) {
      // The same sandbox: its PID 1 forked a fresh interpreter at once.
      assert.equal(interpreter.length, 1, `one interpreter before the reset: ${interpreter}`);
      assert.equal(s.workerRunning, true);
      assert.equal(s.generation, 2);
      assert.deepEqual(hostPidsWithCmdline(runtimeRoot), sandbox, "the sandbox is kept");
      assert.ok(await waitUntil(() => !interpreterPids(scratchDir).includes(interpreter[0]), 3000), "the old interpreter is gone");
    } else {
      assert.equal(s.workerRunning, false);
      assert.equal(s.generation, 1);
      await assertNoProcess(runtimeRoot);
    }
    assert.equal(await readFile(join(scratchDir, "keep.txt"), "utf8"), "kept", "scratch survives reset (host)");
    const gone = await sb.execute("x");
    assert.equal(gone.status, "runtime_error", show(gone));
    assert.equal(gone.exception?.type, "NameError");
    assert.equal(gone.generation, 2);
    const file = await sb.execute("open('/scratch/keep.txt').read()");
    assert.equal(file.repr, "'kept'", "scratch survives reset (sandbox)");
    assert.equal(sb.status().paths.scratchDir, scratchDir);
  });

  test("reset kills every process the code left running", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    const marker = `pps-reset-${randomUUID()}`;
    const r = await sb.execute(
      `import subprocess\nprocs = [subprocess.Popen(["sh", "-c", "sleep 30; :", ${lit(marker)}]) for _ in range(20)]\nlen(procs)`,
      10,
    );
    assert.equal(r.repr, "20", show(r));
    assert.equal(hostPidsWithCmdline(marker).length, 20);
    const sandbox = hostPidsWithCmdline(runtimeRoot).filter((pid) => !hostPidsWithCmdline(marker).includes(pid));
    await sb.reset();
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 5000), "background processes survived reset");
    if (ROLLBACK) assert.deepEqual(hostPidsWithCmdline(runtimeRoot), sandbox, "the sandbox is kept");
    else await assertNoProcess(runtimeRoot);
    assertOnlyInitAndInterpreter((await sb.execute(PROCS_AND_ME)).repr);
  });

  test("cancel() without an id cancels the running call", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const pending = sb.execute("import time\ntime.sleep(30)", 60);
    assert.ok(await waitUntil(() => sb.status().busy && sb.status().workerRunning, 5000));
    await sleep(300);
    assert.equal(sb.cancel(), true);
    const r = await pending;
    assert.equal(r.status, "cancelled", show(r));
    assert.ok(r.durationMs < 10_000, `${r.durationMs} ms`);
    assert.equal(sb.cancel(), false, "nothing is running any more");
  });

  test("timeout: rolled back (rollback on) or the interpreter killed and the next call on a fresh one (off)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("x = 1"));
    const started = Date.now();
    const r = await sb.execute("while True:\n    pass", 1);
    const took = Date.now() - started;
    assert.equal(r.status, "timeout", show(r));
    assert.equal(r.isError, true);
    assertFailedCallState(r, { reason: "timeout" });
    assert.ok(took >= 900 && took < 6000, `timeout result after ${took} ms`);
    const next = await sb.execute("'x' in globals()");
    assertOk(next);
    assert.equal(next.repr, ROLLBACK ? "True" : "False");
    assert.equal(next.generation, r.generation + (ROLLBACK ? 0 : 1));
  });

  test("a timeout and a cancel keep the output printed before the kill; the code never runs again", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    // Each run bumps a counter in /scratch, which outlives the interpreter.
    const code = (tag: string) => py`
      import os, sys, time
      n = int(open("/scratch/runs").read()) + 1 if os.path.exists("/scratch/runs") else 1
      open("/scratch/runs", "w").write(str(n))
      print("${tag} out", n, flush=True)
      print("${tag} err", file=sys.stderr, flush=True)
      open("/scratch/printed-${tag}", "w").close()
      time.sleep(30)
    `;
    const timedOut = await sb.execute(code("before-timeout"), 1);
    assert.equal(timedOut.status, "timeout", show(timedOut));
    assert.equal(timedOut.stdout, "before-timeout out 1\n");
    assert.equal(timedOut.stderr, "before-timeout err\n");
    assertFailedCallState(timedOut, { reason: "timeout", fresh: true });
    const sandbox = hostPidsWithCmdline(runtimeRoot);
    const pending = sb.execute(code("before-cancel"), 60, 77);
    // Cancelled once its output is written.
    const printed = join(sb.status().paths.scratchDir as string, "printed-before-cancel");
    assert.ok(await waitUntil(() => existsSync(printed), 10_000), "the call never printed");
    sb.cancel(77);
    const cancelled = await pending;
    assert.equal(cancelled.status, "cancelled", show(cancelled));
    assert.equal(cancelled.stdout, "before-cancel out 2\n");
    assert.equal(cancelled.stderr, "before-cancel err\n");
    assertFailedCallState(cancelled, { reason: "cancelled", fresh: true });
    if (ROLLBACK) assert.deepEqual(hostPidsWithCmdline(runtimeRoot), sandbox, "the sandbox is kept");
    else await assertNoProcess(runtimeRoot);
    const scratch = sb.status().paths.scratchDir as string;
    assert.equal(readFileSync(join(scratch, "runs"), "utf8"), "2", "a killed call was run again");
    assertOk(await sb.execute("1"));
    assert.equal(readFileSync(join(scratch, "runs"), "utf8"), "2", "the next call replayed a killed one");
  });

  test("timeout also kills setsid grandchildren", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const marker = `pps-timeout-${randomUUID()}`;
    const pending = sb.execute(grandchildCode(marker), 2);
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length > 0, 5000), "grandchild never appeared");
    const r = await pending;
    assert.equal(r.status, "timeout", show(r));
    assertFailedCallState(r, { reason: "timeout", fresh: true });
    const scratchDir = sb.status().paths.scratchDir;
    assert.ok(scratchDir);
    await assertGrandchildGone(marker, scratchDir);
  });

  test("cancel kills a running call and its setsid grandchildren", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("x = 1"));
    const marker = `pps-cancel-${randomUUID()}`;
    const pending = sb.execute(grandchildCode(marker), 60, 4242);
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length > 0, 5000), "grandchild never appeared");
    await sleep(300);
    assert.equal(sb.status().busy, true);
    const cancelledAt = Date.now();
    assert.equal(sb.cancel(4242), true);
    const r = await pending;
    assert.ok(Date.now() - cancelledAt < 3000, `cancel settled after ${Date.now() - cancelledAt} ms`);
    assert.equal(r.status, "cancelled", show(r));
    assertFailedCallState(r, { reason: "cancelled" });
    const scratchDir = sb.status().paths.scratchDir;
    assert.ok(scratchDir);
    await assertGrandchildGone(marker, scratchDir);
    const next = await sb.execute("'x' in globals()");
    assert.equal(next.repr, ROLLBACK ? "True" : "False");
    assert.equal(next.generation, r.generation + (ROLLBACK ? 0 : 1));
  });

  test("cancel before execute returns cancelled without starting a sandbox", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    assert.equal(sb.cancel(), false, "nothing is running");
    assert.equal(sb.cancel(77), true);
    const r = await sb.execute("open('/scratch/ran', 'w').write('x')", 5, 77);
    assert.equal(r.status, "cancelled", show(r));
    assert.equal(r.stateLost, false);
    const s = sb.status();
    assert.equal(s.workerRunning, false);
    assert.equal(s.generation, 0);
    assert.equal(s.available, "unverified");
    assert.equal(existsSync(runtimeRoot), false, "nothing was created");
    const next = await sb.execute("1", 5, 77);
    assertOk(next);
    assert.equal(next.generation, 1);
  });

  test("a cancel as the call starts: its code was stopped (as the setting says) or never reached the interpreter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    // A queued call is cancelled the moment the call before it returns: some cancels land while
    // it starts, before its request reached the interpreter, which then ran nothing and has
    // nothing to roll back, lose or kill.
    const CALLS = 12;
    let untouched = 0;
    for (let i = 0; i < CALLS; i++) {
      const before = sb.execute("import time\ntime.sleep(0.05)", 10, 500 + i);
      // Busy, or (a loaded machine can hold this thread past its 50 ms) already done.
      let done = false;
      void before.then(() => (done = true));
      assert.ok(await waitUntil(() => sb.status().busy || done, 5000, 1), `call ${i} never became busy`);
      const queued = sb.execute("import time\ntime.sleep(30)", 60, 900 + i);
      assertOk(await before);
      sb.cancel(900 + i);
      const r = await queued;
      assert.equal(r.status, "cancelled", `call ${i}: ${show(r)}`);
      if (r.diagnostic === "Cancelled before execution; the interpreter was not touched.") {
        untouched++;
        assert.equal(r.stateLost, false, show(r));
        assert.equal(r.rolledBack, false, show(r));
      } else {
        assertFailedCallState(r, { reason: "cancelled" });
      }
    }
    t.diagnostic(`${untouched} of ${CALLS} cancels landed before the request`);
    // A call that never reached the interpreter is not counted as an execution.
    assert.equal(sb.status().executions, 1 + CALLS * 2 - untouched);
    if (ROLLBACK) {
      const kept = await sb.execute("kept");
      assert.equal(kept.repr, "1", "a cancel lost the state");
      assert.equal(kept.generation, 1);
    }
  });

  test("cancel of a queued call leaves the running call alone", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const running = sb.execute("import time\ntime.sleep(1)\n'first'", 10, 1);
    await sleep(200);
    const queued = sb.execute("kept = 2", 10, 2);
    await sleep(100);
    assert.equal(sb.cancel(2), true);
    const q = await queued;
    assert.equal(q.status, "cancelled", show(q));
    assert.equal(q.stateLost, false);
    const r = await running;
    assertOk(r);
    assert.equal(r.repr, "'first'");
    const after = await sb.execute("kept");
    assert.equal(after.repr, "1", "the cancelled queued code never ran");
    assert.equal(after.generation, 1);
  });

  test("worker death mid-call is a worker_error with partial output; rolled back (on) or the next call fresh (off)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const r = await sb.execute("print('partial')\nimport os\nos._exit(7)");
    assert.equal(r.status, "worker_error", show(r));
    assertFailedCallState(r);
    assert.equal(r.stdout, "partial\n");
    // With rollback on PID 1 recorded how the interpreter ended.
    assert.match(r.diagnostic ?? "", ROLLBACK ? /^The interpreter exited with code 7; every process of the sandbox was killed\./ : /worker died/);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, ROLLBACK ? "True" : "False");
    assert.equal(next.generation, r.generation + (ROLLBACK ? 0 : 1));
  });

  test(
    "worker death diagnostic reports the worker's exit code",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb } = await makeFixture(t);
      // The report races the kill; several deaths make a lucky pass unlikely.
      for (let i = 0; i < 5; i++) {
        const r = await sb.execute("import os\nos._exit(7)");
        assert.equal(r.status, "worker_error", show(r));
        assert.match(r.diagnostic ?? "", /code 7/, `death ${i + 1}`);
      }
    },
  );

  test("a worker killed while idle is reported by the next result, which still runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    // pid 2 in the sandbox's pid namespace is the worker (pid 1 is bwrap's init, or with rollback
    // on the keeper). The killer outlives the 1 s drain window, so the kill lands after the
    // result, while idle.
    const first = await sb.execute(
      "import os, subprocess\nx = 41\nsubprocess.Popen(['sh', '-c', 'sleep 1.5; kill -9 2'])\nos.getpid()",
      10,
    );
    assertOk(first);
    assert.equal(first.repr, "2");
    if (ROLLBACK) {
      // The interpreter dies; the sandbox and its PID 1 stay (and the copy it made for the next
      // call, now PID 1's child, until that call replaces the interpreter).
      const scratchDir = sb.status().paths.scratchDir as string;
      const sandbox = hostPidsWithCmdline(runtimeRoot);
      const [interpreter] = interpreterPids(scratchDir);
      assert.ok(interpreter, "the interpreter is found");
      assert.ok(await waitUntil(() => !interpreterPids(scratchDir).includes(interpreter), 8000), "the interpreter was not killed");
      assert.deepEqual(hostPidsWithCmdline(runtimeRoot), sandbox, "the sandbox is kept");
    } else {
      await assertNoProcess(runtimeRoot, 8000);
    }
    const next = await sb.execute("'x' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.stateLost, true);
    assert.match(next.stateLostReason ?? "", /died while idle/);
    assert.equal(next.generation, first.generation + 1);
    assert.equal(sb.status().workerRunning, true);
  });
});

// ---------------------------------------------------------------------------------------------
describe("startup failures", { concurrency: CONCURRENCY }, () => {
  test("a missing interpreter is unavailable with an actionable diagnostic", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const sb = fx.open({ interpreter: "/nonexistent/python3" });
    const r = await sb.execute("1");
    assert.equal(r.status, "unavailable", show(r));
    assert.match(r.diagnostic ?? "", /not found at \/nonexistent\/python3/);
    assert.match(r.diagnostic ?? "", /Install Python 3\.10\+|PI_PYTHON_TOOL_INTERPRETER/);
    const s = sb.status();
    assert.equal(s.available, "unavailable");
    assert.equal(s.workerRunning, false);
    assert.equal(s.generation, 0);
    assert.equal(existsSync(fx.runtimeRoot), false, "nothing was prepared for an unusable interpreter");
  });

  test("a relative interpreter is unavailable and asks for an absolute path", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const sb = fx.open({ interpreter: "python3" });
    const r = await sb.execute("1");
    assert.equal(r.status, "unavailable", show(r));
    assert.match(r.diagnostic ?? "", /absolute path/);
    assert.equal(sb.status().generation, 0);
  });

  test("an interpreter that exits at once is a worker_error, without hanging", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    // Outside /usr, so the sandbox mounts its prefix (the directory above bin/).
    const bin = join(fx.base, "fakepy", "bin");
    await mkdir(bin, { recursive: true });
    await writeFile(join(bin, "python3"), "#!/bin/sh\nexit 3\n");
    await chmod(join(bin, "python3"), 0o755);
    for (const interpreter of [join(bin, "python3"), "/usr/bin/false"]) {
      const sb = fx.open({ interpreter });
      for (let attempt = 1; attempt <= 2; attempt++) {
        const started = Date.now();
        const r = await sb.execute("1");
        assert.ok(Date.now() - started < 5000, `${interpreter}: took ${Date.now() - started} ms`);
        assert.equal(r.status, "worker_error", show(r));
        assert.match(r.diagnostic ?? "", /did not start/);
        assert.match(r.diagnostic ?? "", interpreter === "/usr/bin/false" ? /code 1/ : /code 3/);
      }
      const s = sb.status();
      assert.equal(s.workerRunning, false);
      assert.equal(s.lastResetReason, "startup_failure");
    }
  });
});

// ---------------------------------------------------------------------------------------------

/**
 * A separate Node host process that opens a sandbox, leaves a marked background process running
 * in it, prints "ready", then either ends on its own (`end`) or stays alive (`hold`).
 */
function spawnHost(t: TestContext, project: string, runtimeRoot: string, marker: string, mode: "end" | "hold") {
  const script = `
    const { PythonSandbox } = require(${JSON.stringify(INDEX_CJS)});
    const { PPS_PROJECT: project, PPS_RUNTIME_ROOT: runtimeRoot, PPS_MARKER: marker, PPS_MODE: mode } = process.env;
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot });
    sb.execute("import subprocess\\nsubprocess.Popen(['sh', '-c', 'sleep 30; :', " + JSON.stringify(marker) + "])\\nNone")
      .then((r) => {
        console.log("ready " + r.status);
        if (mode === "hold") setInterval(() => {}, 1000);
      });
  `;
  // Everything reaches the host through its environment, so that its own command line never
  // matches the marker or the runtime root that the assertions look for.
  const child: ChildProcess = spawn(process.execPath, ["-e", script], {
    stdio: ["ignore", "pipe", "inherit"],
    env: { ...process.env, PPS_PROJECT: project, PPS_RUNTIME_ROOT: runtimeRoot, PPS_MARKER: marker, PPS_MODE: mode },
  });
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  let out = "";
  const ready = new Promise<string>((resolve, reject) => {
    child.stdout?.on("data", (d) => {
      out += d;
      if (out.includes("\n")) resolve(out.trim());
    });
    child.on("exit", () => resolve(out.trim()));
    child.on("error", reject);
  });
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { child, ready, exited };
}

describe("host process lifetime", { concurrency: CONCURRENCY }, () => {
  test("the sandbox dies with its host process (SIGKILL)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { project, runtimeRoot } = await makeFixture(t);
    const marker = `pps-host-kill-${randomUUID()}`;
    const host = spawnHost(t, project, runtimeRoot, marker, "hold");
    assert.equal(await host.ready, "ready ok");
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length > 0, 3000), "marked process never appeared");
    host.child.kill("SIGKILL");
    await host.exited;
    assert.ok(
      await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 5000),
      `sandbox processes outlived their host: ${hostPidsWithCmdline(marker)}`,
    );
    // The spare may be starting when the host dies: bubblewrap gives the namespace's first process
    // its parent-death signal only at the end of its setup, so that one ends when its setup does
    // and its worker finds no host (seconds on a loaded machine), not at once.
    await assertNoProcess(runtimeRoot, 30_000);
  });

  test("a host process that ends normally kills its sandboxes and deletes their directories", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { project, runtimeRoot } = await makeFixture(t);
    const marker = `pps-host-end-${randomUUID()}`;
    const host = spawnHost(t, project, runtimeRoot, marker, "end");
    assert.equal(await host.ready, "ready ok");
    assert.equal(await host.exited, 0);
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 5000), "sandbox outlived its host");
    await assertNoProcess(runtimeRoot);
    assert.deepEqual(sessionDirs(runtimeRoot), [], "session directory left behind");
  });
});

describe("spare sandbox", () => {
  // With rollback on, a reset and a timeout stay in the sandbox (a fresh interpreter from its
  // PID 1, a rollback): the spare waits, untouched, for a mode change.
  test("a reset and a timeout: a ready spare takes over (rollback off) or waits (on); no state is carried", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixtureWithSpare(t);
    assert.equal(sb.status().spare, "none", "nothing starts before the first execution");
    assertOk(await sb.execute("secret = 'first'"));
    assert.ok(await waitUntil(() => sb.status().spare === "ready", 5000), "the spare became ready");
    const spareAndActive = hostPidsWithCmdline(runtimeRoot);
    await sb.reset();
    const afterReset = await sb.execute("'secret' in globals()");
    assert.equal(afterReset.repr, "False");
    assert.equal(afterReset.generation, 2);
    assert.ok(await waitUntil(() => sb.status().spare === "ready", 5000), "a new spare was started");
    if (ROLLBACK) assert.deepEqual(hostPidsWithCmdline(runtimeRoot), spareAndActive, "the sandbox and its spare are kept");
    const timedOut = await sb.execute("secret = 'second'\nwhile True: pass", 1);
    assert.equal(timedOut.status, "timeout");
    assertFailedCallState(timedOut, { reason: "timeout" });
    const afterTimeout = await sb.execute("'secret' in globals()");
    assert.equal(afterTimeout.repr, "False");
    assert.equal(afterTimeout.generation, ROLLBACK ? 2 : 3);
    if (ROLLBACK) {
      assert.equal(sb.status().spare, "ready");
      assert.deepEqual(hostPidsWithCmdline(runtimeRoot), spareAndActive, "the sandbox and its spare are kept");
    } else {
      assert.ok(await waitUntil(() => hostPidsWithCmdline(runtimeRoot).length <= spareAndActive.length, 5000), "no sandbox piles up");
    }
  });

  test("mode changes racing the spare's start leave one ready spare that status reports", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixtureWithSpare(t);
    // Each change lands while the spare for the previous mounts is waiting or starting; the
    // next call starts another. A start that was discarded must not take the slot.
    for (let i = 0; i < 8; i++) {
      assertOk(await sb.execute("1"));
      sb.applyModeEvent({ mode: i % 2 === 0 ? "yolo" : "manual", readRoots: [] });
    }
    assertOk(await sb.execute("1"));
    assert.ok(await waitUntil(() => sb.status().spare === "ready", 5000), `spare: ${sb.status().spare}`);
    const sandboxes = () => hostPidsWithCmdline(runtimeRoot).filter((pid) => parentOf(pid) === process.pid);
    assert.ok(await waitUntil(() => sandboxes().length === 2, 5000), `expected the active sandbox and one spare: ${sandboxes().length}`);
    assert.equal(sb.status().spare, "ready");
    await sleep(300);
    assert.equal(sandboxes().length, 2, "a discarded start came back");
  });

  test("a mount change discards the spare; prewarm off keeps none", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, open } = await makeFixtureWithSpare(t);
    assertOk(await sb.execute("1"));
    assert.ok(await waitUntil(() => sb.status().spare === "ready", 5000));
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    assert.equal(sb.status().spare, "none");
    const write = await sb.execute("open('/workspace/w.txt', 'w').write('x')");
    assertOk(write);
    const off = open({ prewarm: false });
    assertOk(await off.execute("1"));
    await sleep(300);
    assert.equal(off.status().spare, "none");
    assert.equal(off.status().prewarm, false);
  });
});

describe("worker bytecode", () => {
  /** The one stored image under `runtimeRoot`. */
  async function storedImage(runtimeRoot: string): Promise<string> {
    const names = await readdir(join(runtimeRoot, ".worker-code"));
    assert.equal(names.length, 1, `one image: ${names}`);
    assert.match(names[0], /^worker-[0-9a-f]{16}\.pyc$/);
    return join(runtimeRoot, ".worker-code", names[0]);
  }

  const failing = py`
    def inner():
        return 1 / 0
    def outer():
        return inner()
    outer()
  `;

  test("the first sandbox stores the compiled worker; later ones run it and behave the same", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    const first = await sb.execute(failing);
    assert.equal(sb.status().workerCode, "source");
    const image = await storedImage(runtimeRoot);
    const info = await stat(image);
    assert.equal(info.mode & 0o777, 0o400);
    assert.equal((await stat(join(runtimeRoot, ".worker-code"))).mode & 0o777, 0o700);
    const magic = (await readFile(image)).subarray(0, 4);
    const versionMagic = await sb.execute("import importlib.util\nimportlib.util.MAGIC_NUMBER.hex()");
    assert.equal(versionMagic.repr, `'${magic.toString("hex")}'`, "the image carries this interpreter's magic number");

    await replaceSandbox(sb);
    const second = await sb.execute(failing);
    assert.equal(sb.status().workerCode, "bytecode");
    // Tracebacks still hide the worker's frames and show the user's.
    assert.equal(second.status, "runtime_error", show(second));
    // The same traceback, but for the execution's own name (<python-1>, then <python-3>).
    const named = (tb: string | undefined) => (tb ?? "").replace(/<python-\d+>/g, "<python-N>");
    assert.equal(named(second.exception?.traceback), named(first.exception?.traceback));
    assert.match(second.exception?.traceback ?? "", /line 4, in outer\n    return inner\(\)\n(.*\^.*\n)?.*line 2, in inner\n    return 1 \/ 0\n/);
    assert.doesNotMatch(second.exception?.traceback ?? "", /worker/);
    const state = await sb.execute("x = 41\nx + 1");
    assert.equal(state.repr, "42");
    assert.equal((await sb.execute("x")).repr, "41", "state persists under the bytecode worker");
    const visible = await sb.execute("import os\n[os.path.exists(p) for p in ('/worker.py', '/worker.pyc')]");
    assert.equal(visible.repr, "[False, True]", `only the image is mounted: ${show(visible)}`);
    assert.equal((await stat(image)).mtimeMs, info.mtimeMs, "the image is not rewritten by later starts");
  });

  test("a stored image that does not start is deleted and the start is made from source, unseen", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    assertOk(await sb.execute("1"));
    const image = await storedImage(runtimeRoot);
    await chmod(image, 0o600);
    await writeFile(image, Buffer.concat([Buffer.from([0, 0, 13, 10]), Buffer.alloc(64, 0x2a)]));
    await replaceSandbox(sb);
    const r = await sb.execute("'fresh'");
    assert.equal(r.repr, "'fresh'", show(r));
    assert.equal(sb.status().workerCode, "source");
    assert.equal((await stat(image)).mode & 0o777, 0o400, "a new image replaced the broken one");
    await replaceSandbox(sb);
    assertOk(await sb.execute("1"));
    assert.equal(sb.status().workerCode, "bytecode");
  });
});
