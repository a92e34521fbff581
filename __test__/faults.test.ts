/**
 * Faults, resource bombs, bad input and a short soak, against the real sandbox.
 * Run: node --import tsx --test __test__/faults.test.ts
 *
 * Each fault must give a clear result, leave no process, descriptor or directory behind, and
 * the next call must work. Not repeated from the addon suites: os._exit deaths, an interpreter
 * that exits at once and the host dying with one idle sandbox (lifecycle.test.ts); protocol
 * violations, a malformed, oversize, cut-short or forged reply frame, closing fd 3 or 4, bad
 * frames from a starting worker (protocol.test.ts); one 600 MiB allocation, the 16 MiB file
 * limit, EMFILE at 128 files (limits.test.ts); NUL bytes, lone surrogates (errors.test.ts); 64 KiB
 * of newlines, code over 64 KiB, bad timeouts, concurrent calls on one session, calls after
 * dispose (api.test.ts). Unknown tool actions are in extension.test.ts. The long soak is
 * `npm run soak` (scripts/soak.mjs).
 * The suite runs with rollback on (the default) and off (PI_PYTHON_TOOL_ROLLBACK=0); where the two
 * differ, a test asserts the exact behaviour of the setting in force (ROLLBACK).
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, test } from "node:test";
import { assertNoProcess, describeProcess, fdDiff, fdTable, ownZombies, parentOf, workerPids } from "./helpers/host-procs.ts";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import {
  assertFailedCallState,
  assertOk,
  assertRecovers,
  type ExecResult,
  fakeInterpreter,
  hostPidsWithCmdline,
  INDEX_CJS,
  lit,
  makeFixture,
  py,
  replaceSandbox,
  sessionDirs,
  show,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { soak } from "../scripts/soak.mjs";

const CONCURRENCY = 4;
const MiB = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
describe("worker faults", { concurrency: CONCURRENCY }, () => {
  test("SIGKILL of the worker from the host mid-execution is a worker_error naming the signal", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const marker = `pps-sigkill-${randomUUID()}`;
    const pending = sb.execute(
      `import subprocess, time\nsubprocess.Popen(["sh", "-c", "sleep 30; :", ${lit(marker)}])\nprint("before", flush=True)\ntime.sleep(30)`,
      60,
    );
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length > 0, 5000), "the marked child never appeared");
    // The marked shell's parent is the worker running this execution (not a spare).
    const worker = parentOf(hostPidsWithCmdline(marker)[0]);
    assert.ok(worker, "no parent for the marked child");
    assert.match(readFileSync(`/proc/${worker}/cmdline`, "utf8"), /\/worker\.py/);
    await sleep(100);
    process.kill(worker, "SIGKILL");
    const r = await pending;
    assert.equal(r.status, "worker_error", show(r));
    assertFailedCallState(r);
    assert.equal(r.stdout, "before\n", "output written before the kill is kept");
    assert.match(r.diagnostic ?? "", /signal 9 \(SIGKILL\)/);
    await assertNoProcess(marker);
    await assertRecovers(sb, r);
  });

  test("a worker that never becomes ready is a worker_error after the 10 s deadline; nothing is left", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const sb = fx.open({ interpreter: await fakeInterpreter(fx, "silent", "exec sleep 1000") });
    const started = Date.now();
    const r = await sb.execute("1", 60);
    const took = Date.now() - started;
    assert.equal(r.status, "worker_error", show(r));
    assert.match(r.diagnostic ?? "", /did not report ready within 10s/);
    assert.ok(took >= 9500 && took < 17_000, `the deadline fired after ${took} ms`);
    const s = sb.status();
    assert.equal(s.workerRunning, false);
    assert.equal(s.lastResetReason, "startup_failure");
    // A spare started after the failure may still be waiting out its own deadline; dispose ends it.
    const lingering = hostPidsWithCmdline(fx.runtimeRoot).length;
    if (lingering > 0) t.diagnostic(`${lingering} sandbox processes still starting after the failed call (a spare)`);
    await sb.dispose();
    await assertNoProcess(fx.runtimeRoot);
  });

  test("a sandbox killed at any moment of its start leaves no process behind", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Each start is cancelled a little later than the one before, so that some kills land while
    // bubblewrap is still building the sandbox (before its namespace init exists or has tied
    // itself to its parent). The interpreter never becomes ready and would live for 999 s.
    const fx = await makeFixture(t);
    const marker = "999.0417";
    const sb = fx.open({ interpreter: await fakeInterpreter(fx, "slowstart", `exec sleep ${marker}`), prewarm: false });
    const STARTS = 40;
    for (let i = 0; i < STARTS; i++) {
      const pending = sb.execute("1", 60, 100 + i);
      await sleep(i % 20);
      sb.cancel(100 + i);
      const r = await pending;
      assert.equal(r.status, "cancelled", `start ${i}: ${show(r)}`);
    }
    await assertNoProcess(fx.runtimeRoot, 3000);
    await assertNoProcess(marker, 1000);
    await sb.dispose();
  });

  test("bubblewrap, the namespace's init and the interpreter are all in the process group a kill signals", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t, { prewarm: false });
    assertOk(await sb.execute("1"));
    const scratch = sb.status().paths.scratchDir as string;
    const bwraps = hostPidsWithCmdline(scratch);
    const outer = bwraps.find((pid) => parentOf(pid) === process.pid);
    assert.ok(outer, `no bubblewrap child of this process among ${bwraps.map(describeProcess).join("; ")}`);
    // With rollback off the worker runs under bubblewrap's init (a second bwrap process); with
    // it on, PID 1 is the worker's keeper, the interpreter its child and the next call's rollback
    // point the interpreter's (made once the first call is over: wait for it).
    let workers = workerPids(scratch);
    for (let i = 0; i < 200 && workers.length < (ROLLBACK ? 3 : 1); i++) {
      await new Promise((r) => setTimeout(r, 10));
      workers = workerPids(scratch);
    }
    assert.equal(workers.length, ROLLBACK ? 3 : 1, `workers: ${workers.map(describeProcess).join("; ")}`);
    const group = (pid: number) => {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      return { pgid: Number(fields[2]), sid: Number(fields[3]) };
    };
    const members = [...new Set([...bwraps, ...workers])];
    assert.equal(bwraps.length, ROLLBACK ? 1 : 2, `bubblewrap processes: ${bwraps.map(describeProcess).join("; ")}`);
    assert.equal(members.length, ROLLBACK ? 4 : 3, `expected bubblewrap, its init and the interpreter (and its copy): ${members.map(describeProcess).join("; ")}`);
    for (const pid of members) {
      assert.deepEqual(group(pid), { pgid: outer, sid: outer }, describeProcess(pid));
    }
  });

  test("a project directory that vanished is unavailable; once it is back the next call works", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project, base } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    await replaceSandbox(sb);
    await rename(project, join(base, "moved-away"));
    const r = await sb.execute("1");
    assert.equal(r.status, "unavailable", show(r));
    assert.match(r.diagnostic ?? "", /Working directory .* is not accessible/);
    await rename(join(base, "moved-away"), project);
    const back = await sb.execute("open('data.txt').read()");
    assertOk(back);
    assert.equal(back.repr, "'fixture-content\\n'");
  });

  test("a project path that is a file makes bubblewrap fail: worker_error with its message", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const file = join(fx.base, "not-a-dir");
    await writeFile(file, "x");
    const sb = fx.open({ projectDir: file });
    const r = await sb.execute("1");
    assert.equal(r.status, "worker_error", show(r));
    assert.match(r.diagnostic ?? "", /did not start: the sandbox exited with code 1/);
    assert.match(r.diagnostic ?? "", /bwrap: .*workspace/);
    await sb.dispose();
    await assertNoProcess(fx.runtimeRoot);
  });

  test("an interpreter prefix that cannot be mounted any more makes bubblewrap fail; restored, it works", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    // A wrapper outside /usr: its prefix (the directory above bin/) is bind-mounted.
    const interpreter = await fakeInterpreter(fx, "wrapped-py", 'exec /usr/bin/python3 "$@"');
    const prefix = join(fx.base, "wrapped-py");
    // Without a spare, every start after the first is a cold start that mounts the prefix.
    const sb = fx.open({ interpreter, prewarm: false });
    assertOk(await sb.execute("kept = 1"));
    await rename(prefix, `${prefix}-gone`);
    await replaceSandbox(sb);
    const r = await sb.execute("1");
    assert.equal(r.status, "worker_error", show(r));
    assert.match(r.diagnostic ?? "", new RegExp(`bwrap: Can't find source path ${prefix}`));
    assert.equal(sb.status().workerRunning, false);
    await rename(`${prefix}-gone`, prefix);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
  });
});

// ---------------------------------------------------------------------------------------------
describe("resource bombs stay contained", { concurrency: CONCURRENCY }, () => {
  test("a growing memory bomb stops at the address-space limit with MemoryError; the worker survives", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, subprocess, sys
      chunks = []
      try:
          while True:
              chunks.append(bytearray(16 * 1024 * 1024))
      except MemoryError:
          held = len(chunks) * 16
      del chunks
      # The same in a subprocess, which has the same limit.
      child = subprocess.run([sys.executable, "-c", "x = []\nwhile True: x.append(bytearray(16 << 20))"],
                             capture_output=True, text=True)
      print(json.dumps({"held_mib": held, "child": child.returncode, "child_error": child.stderr.strip().splitlines()[-1]}))
    `);
    assertOk(r);
    const out = JSON.parse(r.stdout.trim());
    assert.ok(out.held_mib > 256 && out.held_mib <= 512, `held ${out.held_mib} MiB before MemoryError`);
    assert.equal(out.child, 1);
    assert.equal(out.child_error, "MemoryError");
    const after = await sb.execute("len(bytearray(64 * 1024 * 1024))");
    assert.equal(after.repr, String(64 * MiB));
    assert.equal(after.generation, r.generation);
  });

  // 120 shells, each with its sleep: 240 tasks, within the sandbox's task cap of 256
  // (containment.test.ts is where the cap itself is hit).
  test("a fork bomb of 120 processes: the host stays responsive and a reset removes them all", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const marker = `pps-forks-${randomUUID()}`;
    const started = Date.now();
    const r = await fx.sb.execute(
      `import subprocess\nprocs = [subprocess.Popen(["sh", "-c", "sleep 60; :", ${lit(marker)}]) for _ in range(120)]\nlen(procs)`,
      60,
    );
    assert.equal(r.repr, "120", show(r));
    t.diagnostic(`120 processes started in ${Date.now() - started} ms`);
    assert.equal(hostPidsWithCmdline(marker).length, 120);
    // The host: its event loop, a process spawn, and another sandbox all answer promptly.
    const tick = Date.now();
    await sleep(50);
    const loopLag = Date.now() - tick - 50;
    const spawnStart = Date.now();
    assert.equal(spawnSync("true").status, 0);
    const spawnMs = Date.now() - spawnStart;
    const other = fx.open();
    const otherStart = Date.now();
    assertOk(await other.execute("sum(range(1000))"));
    const otherMs = Date.now() - otherStart;
    t.diagnostic(`with 120 sandboxed processes: event loop lag ${loopLag} ms, spawn ${spawnMs} ms, another sandbox's first call ${otherMs} ms`);
    assert.ok(loopLag < 1000 && spawnMs < 2000 && otherMs < 10_000, "the host was not responsive");
    assertOk(await fx.sb.execute("sum(p.poll() is None for p in procs)"));
    await fx.sb.reset();
    await assertNoProcess(marker);
    // PID 1 and the interpreter alone: with rollback off the worker of a new sandbox (pid 2); with
    // it on, the fresh interpreter the sandbox's PID 1 forked.
    const fresh = await fx.sb.execute("import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid()");
    if (ROLLBACK) assert.match(fresh.repr ?? "", /^\(\[1, (\d+)\], \1\)$/);
    else assert.equal(fresh.repr, "([1, 2], 2)");
  });

  test("deep recursion that overflows the C stack is a worker_error naming SIGSEGV; the next call works", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    // __getattr__ recursing through the C getattr machinery: every level is a C frame.
    const r = await sb.execute(py`
      import sys
      sys.setrecursionlimit(10**6)
      class Deep:
          def __getattr__(self, name):
              return getattr(self, name)
      Deep().anything
    `);
    assert.equal(r.status, "worker_error", show(r));
    assertFailedCallState(r);
    assert.match(r.diagnostic ?? "", /signal 11 \(SIGSEGV\)/);
    await assertRecovers(sb, r);
  });

  test("the worker keeps answering with its descriptor table full", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      held = []
      try:
          while True:
              held.append(open("/dev/null"))
      except OSError as e:
          full = e.errno
      (full, len(held))
    `);
    assertOk(r);
    // 128 less the worker's own 13 (0-4, and the placeholders at 10-17).
    assert.match(r.repr ?? "", /^\(24, 11\d\)$/, "EMFILE after about 115 files");
    const blocked = await sb.execute("import subprocess\nsubprocess.run(['true'])");
    assert.equal(blocked.status, "runtime_error", show(blocked));
    assert.equal(blocked.exception?.type, "OSError");
    const freed = await sb.execute("for f in held:\n    f.close()\ndel held\nimport subprocess\nsubprocess.run(['true']).returncode");
    assertOk(freed);
    assert.equal(freed.repr, "0");
    assert.equal(freed.generation, r.generation, "the interpreter was never restarted");
  });
});

// ---------------------------------------------------------------------------------------------
describe("bad input at the addon boundary", { concurrency: CONCURRENCY }, () => {
  test("non-string code, a 10 MB parameter and malformed payloads are refused; the interpreter is untouched", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const before = sb.status();
    const call = sb.execute as (...args: unknown[]) => Promise<ExecResult>;
    for (const bad of [123, null, undefined, {}, ["x"], true, 10n, Symbol("x"), new String("1")]) {
      await assert.rejects(async () => call.call(sb, bad), { code: "StringExpected" }, `code ${String(bad)}`);
    }
    for (const bad of ["5", 5n, {}, true]) {
      await assert.rejects(async () => call.call(sb, "1", bad), { code: "NumberExpected" }, `timeout ${String(bad)}`);
    }
    const started = Date.now();
    await assert.rejects(sb.execute("x".repeat(10 * MiB)), { code: "InvalidArg", message: /64 KiB/ });
    assert.ok(Date.now() - started < 3000, `a 10 MB parameter took ${Date.now() - started} ms to refuse`);
    const deep: Record<string, unknown> = {};
    let cur = deep;
    for (let i = 0; i < 10_000; i++) cur = (cur.a = {}) as Record<string, unknown>;
    assert.throws(() => sb.applyModeEvent({ mode: "yolo", deep }), { code: "InvalidArg" });
    assert.throws(() => sb.applyModeEvent(undefined), { code: "InvalidArg" });
    assert.throws(() => sb.applyModeEvent(() => 1), { code: "InvalidArg" });
    const huge = sb.applyModeEvent({ mode: "manual", readRoots: [`/${"a".repeat(10 * MiB)}`] });
    assert.equal(huge.changed, false);
    assert.equal(huge.skipped.length, 1);
    for (const payload of [null, 42, "yolo", { mode: "yolo\0" }, { mode: "YOLO" }, { readRoots: ["/etc\0"] }]) {
      const m = sb.applyModeEvent(payload);
      assert.equal(m.workspaceMode, "read-only", `payload ${JSON.stringify(payload)}`);
      assert.deepEqual(m.readRoots, []);
    }
    const after = sb.status();
    assert.equal(after.executions, before.executions);
    assert.equal(after.generation, before.generation);
    const kept = await sb.execute("kept");
    assert.equal(kept.repr, "1");
    assert.equal(kept.generation, 1);
  });

  test("constructor options: missing, mistyped, NUL bytes and relative paths", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const Ctor = fx.sb.constructor as new (o: unknown) => typeof fx.sb;
    assert.throws(() => new Ctor({}), { code: "InvalidArg" });
    assert.throws(() => new Ctor({ projectDir: "" }), { code: "InvalidArg" });
    assert.throws(() => new Ctor({ projectDir: 5 }), { code: "StringExpected" });
    assert.throws(() => new Ctor(null));
    assert.throws(() => new Ctor({ projectDir: "relative/dir" }), { code: "InvalidArg", message: /absolute/ });
    assert.throws(() => new Ctor({ projectDir: fx.project, runtimeRoot: "rel/root" }), { code: "InvalidArg", message: /absolute/ });
    for (const [opts, diagnostic] of [
      [{ projectDir: `${fx.project}\0x` }, /NUL byte/],
      [{ projectDir: fx.project, runtimeRoot: `${fx.base}/r\0t` }, /NUL byte/],
      [{ projectDir: fx.project, interpreter: "/usr/bin/pyth\0on3" }, /not found/],
      [{ projectDir: `${fx.base}/\ud800` }, /not accessible/],
    ] as [Record<string, string>, RegExp][]) {
      const sb = fx.open(opts);
      const r = await sb.execute("1");
      assert.equal(r.status, "unavailable", `${JSON.stringify(opts)}: ${show(r)}`);
      assert.match(r.diagnostic ?? "", diagnostic);
    }
    assert.deepEqual(hostPidsWithCmdline(fx.runtimeRoot), []);
  });

  test(
    "execute and cancel refuse a callId that is not an integer in 0..2^32-1",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb } = await makeFixture(t);
      for (const bad of [-1, 1.5, 2 ** 32, Number.NaN]) {
        await assert.rejects(async () => sb.execute("1", 5, bad), { code: "InvalidArg" }, `execute callId ${bad}`);
        assert.throws(() => sb.cancel(bad), { code: "InvalidArg" }, `cancel(${bad})`);
      }
    },
  );
});

// ---------------------------------------------------------------------------------------------

describe("host process death", () => {
  test("SIGKILL of Node with two sandboxes mid-execution leaves no sandbox process", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { project, runtimeRoot } = await makeFixture(t);
    // Everything reaches the child through its environment, so that its own command line never
    // matches the runtime root the assertion looks for.
    const script = `
      const { PythonSandbox } = require(process.env.PPS_INDEX);
      const open = () => new PythonSandbox({ projectDir: process.env.PPS_PROJECT, runtimeRoot: process.env.PPS_RUNTIME_ROOT });
      const sandboxes = [open(), open()];
      (async () => {
        await Promise.all(sandboxes.map((s) => s.execute("1")));  // so that spares start too
        // (once no call runs: a running sandbox's spare waits for a quiet moment)
        while (!sandboxes.every((s) => s.status().spare === "ready")) await new Promise((r) => setTimeout(r, 20));
        for (const s of sandboxes) s.execute("import time\\ntime.sleep(60)", 120);
        const busy = () => sandboxes.every((s) => s.status().busy && s.status().workerRunning);
        while (!busy()) await new Promise((r) => setTimeout(r, 20));
        console.log("running");
        setInterval(() => {}, 1000);
      })();
    `;
    const child: ChildProcess = spawn(process.execPath, ["-e", script], {
      stdio: ["ignore", "pipe", "inherit"],
      env: { ...process.env, PPS_INDEX: INDEX_CJS, PPS_PROJECT: project, PPS_RUNTIME_ROOT: runtimeRoot },
    });
    t.after(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    });
    const exited = new Promise((resolve) => child.on("exit", resolve));
    const ready = await new Promise<string>((resolve) => {
      let out = "";
      child.stdout?.on("data", (d) => {
        out += d;
        if (out.includes("\n")) resolve(out.trim());
      });
      child.on("exit", () => resolve(out.trim()));
    });
    assert.equal(ready, "running");
    await sleep(300); // let the spares finish starting
    const before = hostPidsWithCmdline(runtimeRoot).length;
    assert.ok(before >= 4, `expected both sandboxes (bwrap and its init each) on the host, saw ${before} processes`);
    child.kill("SIGKILL");
    await exited;
    const killedAt = Date.now();
    await assertNoProcess(runtimeRoot, 5000);
    t.diagnostic(`${before} sandbox processes gone ${Date.now() - killedAt} ms after the SIGKILL`);
    // Documented: a killed Node cannot delete its session directories.
    const left = sessionDirs(runtimeRoot).length;
    t.diagnostic(`${left} session directories left behind by the killed host (documented)`);
  });
});

// ---------------------------------------------------------------------------------------------
describe("leaks", () => {
  test("a batch of failures leaks no host descriptor, process or directory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const exitsAtOnce = await fakeInterpreter(fx, "exits", "exit 3");
    const garbage = await fakeInterpreter(fx, "garbage", "printf 'xxxxxxxx' >&4; exec sleep 30");
    async function batch(): Promise<void> {
      const sb = fx.open();
      assertOk(await sb.execute("kept = 1"));
      assert.equal((await sb.execute("import os\nos._exit(7)")).status, "worker_error");
      assert.equal((await sb.execute("import os\nos.write(4, b'\\x00\\x00\\x00\\x05hello')")).status, "worker_error");
      assert.equal((await sb.execute("while True:\n    pass", 1)).status, "timeout");
      const pending = sb.execute("import time\ntime.sleep(30)", 60, 5);
      await waitUntil(() => sb.status().busy && sb.status().workerRunning, 5000);
      sb.cancel(5);
      assert.equal((await pending).status, "cancelled");
      assert.equal((await sb.execute("print('x' * 2_000_000)")).status, "output_limit");
      await sb.reset();
      const last = sb.execute("import time\ntime.sleep(30)", 60);
      await waitUntil(() => sb.status().busy, 5000);
      await sb.dispose();
      assert.equal((await last).status, "cancelled");
      for (const interpreter of [exitsAtOnce, garbage, "/nonexistent/python3"]) {
        const broken = fx.open({ interpreter });
        assert.ok((await broken.execute("1")).isError);
        await broken.dispose();
      }
    }
    await batch(); // warm-up: the addon's runtime opens some descriptors on first use
    await assertNoProcess(fx.runtimeRoot);
    const before = fdTable();
    for (let i = 0; i < 3; i++) await batch();
    await assertNoProcess(fx.runtimeRoot);
    // A descriptor still in use by a cleanup that is finishing is not a leak: wait for quiet.
    await waitUntil(() => Object.keys(fdDiff(before, fdTable())).length === 0, 3000, 50);
    const after = fdTable();
    assert.deepEqual(fdDiff(before, after), {}, `descriptors opened and not closed (before ${Object.keys(before).length}, after ${Object.keys(after).length})`);
    assert.equal(Object.keys(after).length, Object.keys(before).length);
    assert.deepEqual(sessionDirs(fx.runtimeRoot), [], "session directories left after dispose");
    // Zombies are the subject of the next test; here they are only reported.
    const zombies = ownZombies();
    if (zombies.length > 0) t.diagnostic(`zombies of this process: ${zombies.join(", ")}`);
  });

  test(
    "a discarded spare sandbox is reaped, also when Node's child_process owns SIGCHLD",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb } = await makeFixture(t);
      const before = ownZombies();
      // Read-only mounts that differ (no spare is prepared while a sandbox can write the
      // project): a read root outside /tmp, on and off.
      const root = mkdtempSync("/var/tmp/pps-spare-root-");
      t.after(() => rmSync(root, { recursive: true, force: true }));
      const discardReadySpare = async (mode: string) => {
        assertOk(await sb.execute("1"));
        assert.ok(await waitUntil(() => sb.status().spare === "ready", 5000), "no spare became ready");
        const readRoots = mode === "with-root" ? [root] : [];
        assert.equal(sb.applyModeEvent({ mode: "manual", readRoots }).changed, true); // discards the ready spare
      };
      // The first orphan makes tokio install its SIGCHLD handler; then Node's child_process (as pi
      // uses it all the time) installs libuv's and, when its child is reaped, resets SIGCHLD to
      // SIG_DFL: tokio's orphan queue is never drained again. (A spare that dies before it is
      // dropped is reaped at once, so one round may not show it; eight rounds nearly always do.)
      for (const mode of ["with-root", "none", "with-root", "none", "with-root", "none", "with-root", "none"]) {
        await discardReadySpare(mode);
        await sleep(100);
        spawnSync("true");
      }
      for (let i = 0; i < 3; i++) {
        await sb.reset();
        assertOk(await sb.execute("1"));
      }
      await sleep(500);
      const leaked = ownZombies().filter((z) => !before.includes(z));
      assert.deepEqual(leaked, [], `${leaked.length} zombie sandboxes after 8 discarded spares: ${leaked.join(", ")}`);
    },
  );

  test("short soak: 200 executions and 5 resets, then 4 concurrent sessions; fds and RSS flat, nothing shared", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const lines: string[] = [];
    const result = await soak({ executions: 200, resets: 5, sessions: 4, perSession: 50, perSessionResets: 2, log: (l: string) => lines.push(l) });
    for (const line of lines) t.diagnostic(line.replace(/^# /, ""));
    assert.deepEqual(result.failures, []);
    assert.equal(result.failed, 0);
    assert.ok(result.passed > 400, `${result.passed} checks`);
  });
});

