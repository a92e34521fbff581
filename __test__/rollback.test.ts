/**
 * Rollback (the default; PI_PYTHON_TOOL_ROLLBACK=0 gives the spec's kill-and-restart, which
 * every other suite runs with, and the lifecycle, fault, permission and pi end-to-end suites with
 * rollback on too, asserting the setting in force): a failed call returns the interpreter to its state from right
 * before it, every other process of the sandbox is killed, and a reset is a fresh interpreter in
 * the same sandbox. Also the attempts of a failed call to reach its rollback point or the
 * sandbox's PID 1, each with a baseline that shows the attempt works where the defence is absent.
 * Run: node --import tsx --test __test__/rollback.test.ts
 *
 * Every test owns its project, runtime root and sandboxes (cleaned up in t.after) and keeps no
 * spare, so that what it finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, type TestContext, test } from "node:test";
import {
  assertOk,
  type ExecResult,
  hostPidsWithCmdline,
  jsonOut,
  makeFixtureWithoutSpare,
  py,
  type PythonSandbox,
  show,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { assertNoProcess } from "./helpers/host-procs.ts";
import { createPiHarness, messageText } from "./helpers/pi-session.ts";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";

if (!ROLLBACK) {
  throw new Error("rollback.test.ts tests rollback: run it without PI_PYTHON_TOOL_ROLLBACK=0");
}

/** Earlier calls' state: a variable, a list, a function, a class and an import. */
const STATE = py`
  import json, collections
  kept = 1
  data = list(range(1000))
  def helper(x):
      return x * 2
  class Model:
      size = 3
`;

/** The state STATE made, unchanged, as JSON on stdout. */
const CHECK = py`
  print(json.dumps({"kept": kept, "n": len(data), "helper": helper(21), "size": Model.size,
                    "mutated": "mutated" in globals(), "collections": "collections" in globals()}))
`;
const INTACT = { kept: 1, n: 1000, helper: 42, size: 3, mutated: false, collections: true };

/** The live processes of the sandbox other than PID 1, this interpreter and this call's rollback
 * point (a child of the interpreter): none after a rollback. */
const OTHERS = py`
  import os
  me = os.getpid()
  def stat(p):
      try:
          return open(f'/proc/{p}/stat').read().rsplit(') ', 1)[1].split()
      except OSError:
          return ['X', '0']
  sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, me)
         and stat(p)[0] not in 'ZX' and int(stat(p)[1]) != me)
`;

async function fixture(t: TestContext): Promise<{ sb: PythonSandbox; runtimeRoot: string }> {
  const fx = await makeFixtureWithoutSpare(t);
  assertOk(await fx.sb.execute(STATE));
  // The second call is the first with a rollback point (a first call rolls back to a fresh one).
  assertOk(await fx.sb.execute("warm = True"));
  return { sb: fx.sb, runtimeRoot: fx.runtimeRoot };
}

/** A call that changes every part of STATE before it fails with `tail`. */
const mutateThen = (tail: string) => py`
  kept = 2
  data.append(99)
  data.clear()
  def helper(x):
      return -1
  Model.size = 99
  mutated = True
  del collections
` + "\n" + tail;

function assertRolledBack(r: ExecResult, status: string): void {
  assert.equal(r.status, status, show(r));
  assert.equal(r.rolledBack, true, show(r));
  assert.equal(r.stateLost, false, show(r));
  assert.match(r.diagnostic ?? "", /rolled back to its state before this call/);
  assert.match(r.text, /rolled back/);
}

async function assertIntact(sb: PythonSandbox, failed: ExecResult): Promise<void> {
  const after = await sb.execute(CHECK);
  assert.deepEqual(jsonOut(after), INTACT, show(after));
  assert.equal(after.generation, failed.generation, "a rollback keeps the interpreter's generation");
}

describe("a failed call rolls back", { concurrency: 4 }, () => {
  test("a timeout rolls back: variables, functions, classes and imports are as before the call", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(mutateThen("while True: pass"), 1);
    assertRolledBack(r, "timeout");
    await assertIntact(sb, r);
  });

  test("a cancel rolls back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const running = sb.execute(mutateThen("import time\nprint('started', flush=True)\nopen('/scratch/started', 'w').close()\ntime.sleep(60)"), 30, 4242);
    // Cancelled once its output is written.
    const started = join(sb.status().paths.scratchDir as string, "started");
    assert.ok(await waitUntil(() => existsSync(started), 10_000), "the call never started");
    assert.equal(sb.cancel(4242), true);
    const r = await running;
    assertRolledBack(r, "cancelled");
    assert.equal(r.stdout, "started\n", "the output written before the cancel is kept");
    await assertIntact(sb, r);
  });

  test("an output flood rolls back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(mutateThen("import sys\nwhile True: sys.stdout.write('x' * 65536)"), 30);
    assertRolledBack(r, "output_limit");
    assert.equal(r.outputLimitExceeded, true);
    await assertIntact(sb, r);
  });

  test("the interpreter's exit rolls back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(mutateThen("import os\nprint('partial', flush=True)\nos._exit(7)"));
    assertRolledBack(r, "worker_error");
    assert.equal(r.stdout, "partial\n");
    await assertIntact(sb, r);
  });

  test("a segfault of the interpreter rolls back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(mutateThen("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"));
    assertRolledBack(r, "worker_error");
    await assertIntact(sb, r);
  });

  test("a protocol violation (a forged reply frame) rolls back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(mutateThen("import os\nos.write(4, b'\\x00\\x00\\x00\\x05hello')\nimport time\ntime.sleep(5)"), 30);
    assertRolledBack(r, "worker_error");
    assert.match(r.diagnostic ?? "", /Protocol violation/);
    await assertIntact(sb, r);
  });

  test("two failures in a row each roll back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const first = await sb.execute(mutateThen("while True: pass"), 1);
    assertRolledBack(first, "timeout");
    const second = await sb.execute(mutateThen("import os\nos._exit(3)"));
    assertRolledBack(second, "worker_error");
    await assertIntact(sb, second);
  });

  test("the first call of an interpreter rolls back to a fresh one", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixtureWithoutSpare(t);
    const r = await sb.execute("x = 1\nwhile True: pass", 1);
    assertRolledBack(r, "timeout");
    const after = await sb.execute("'x' in globals()");
    assertOk(after);
    assert.equal(after.repr, "False");
  });

  test("a 200 MiB heap is rolled back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    assertOk(await sb.execute("big = bytearray(200 << 20)\nbig[12345] = 7"));
    const r = await sb.execute("big[12345] = 9\nbig[0] = 1\nwhile True: pass", 2);
    assertRolledBack(r, "timeout");
    const after = await sb.execute("(len(big), big[12345], big[0])");
    assertOk(after);
    assert.equal(after.repr, `(${200 * 1024 * 1024}, 7, 0)`);
  });

  test("setsid'd and earlier background processes are killed; only PID 1 and the interpreter remain", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const marker = `bg-${process.pid}-${Date.now()}`;
    assertOk(await sb.execute(`import subprocess\nearlier = subprocess.Popen(['sh', '-c', 'exec -a ${marker}-earlier sleep 300'])`));
    const r = await sb.execute(
      py`
        import subprocess, os
        subprocess.Popen(['sh', '-c', 'exec -a ${marker}-setsid sleep 300'], start_new_session=True)
        while True: pass
      `,
      2,
    );
    assertRolledBack(r, "timeout");
    await assertNoProcess(marker, 3000);
    const after = await sb.execute(OTHERS);
    assertOk(after);
    assert.equal(after.repr, "[]", "processes inside after the rollback besides PID 1, the interpreter and its copy");
  });

  test("no rollback point while threads of earlier calls run: the spec's recovery, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    assertOk(await sb.execute("import threading, time\nthreading.Thread(target=time.sleep, args=(300,), name='poller', daemon=True).start()"));
    const r = await sb.execute("kept = 2\nwhile True: pass", 1);
    assert.equal(r.status, "timeout", show(r));
    assert.equal(r.rolledBack, false);
    assert.equal(r.stateLost, true);
    assert.match(r.stateLostReason ?? "", /no rollback point: 1 thread started by earlier calls was running \(poller\)/);
    const after = await sb.execute("'kept' in globals()");
    assertOk(after);
    assert.equal(after.repr, "False", "a fresh interpreter replaces it");
    assert.equal(after.generation, r.generation);
    assert.equal(r.generation > 0, true);
  });

  test("a reset is a fresh interpreter in the same sandbox: /tmp and /dev/shm emptied, /scratch kept", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // A new sandbox's /tmp holds the project's host path as a link when the project is under /tmp.
    const fresh = await sb.execute("import os\nsorted(os.listdir('/tmp'))");
    assertOk(fresh);
    const before = await sb.execute("open('/tmp/t', 'w').write('x'); open('/dev/shm/s', 'w').write('x'); open('/scratch/k', 'w').write('x')\nimport os\nos.getpid()");
    assertOk(before);
    await sb.reset();
    const after = await sb.execute("import os\n(sorted(os.listdir('/tmp')), os.listdir('/dev/shm'), os.path.exists('/scratch/k'), 'kept' in globals())");
    assertOk(after);
    assert.equal(after.repr, `(${fresh.repr}, [], True, False)`);
    assert.equal(after.generation, before.generation + 1);
    assert.equal(sb.status().lastResetReason, "explicit_reset");
  });

  test("an interpreter that died between calls is reported, and the next call's code runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // The next call once the killer (named by its $0) is done.
    const marker = `pps-killer-${randomUUID()}`;
    const first = await sb.execute(`import os, subprocess\nsubprocess.Popen(['sh', '-c', f'sleep 1.5; kill -9 {os.getpid()}', ${JSON.stringify(marker)}])\nos.getpid()`, 10);
    assertOk(first);
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 20_000), "the killer never ended");
    const next = await sb.execute("ran = 'yes'\nran");
    assertOk(next);
    assert.equal(next.repr, "'yes'");
    assert.equal(next.stateLost, true);
    assert.match(next.stateLostReason ?? "", /died while idle/);
  });

  test("status says rollback is on and when the last rollback point was taken", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const s = sb.status();
    assert.equal(s.rollback, true);
    assert.ok(typeof s.lastRollbackPoint === "number" && Date.now() - s.lastRollbackPoint < 60_000);
    assert.match(s.text, /^after a timeout, a cancel, too much output or a crash: the interpreter goes back to its state before that call \(state last saved \d+\.\d s ago\)$/m);
  });
});

/** In a failed call: the host pid namespace's view of this interpreter's rollback point (its
 * copy, a child of this process blocked in sigwaitinfo). */
const FIND_COPY = py`
  import os
  me = os.getpid()
  def live(p):
      try:
          return open(f'/proc/{p}/stat').read().rsplit(') ', 1)[1][0] not in 'ZX'
      except OSError:
          return False
  # Copies of earlier calls may still be listed while they are reaped.
  copy = max(int(c) for c in open(f'/proc/{me}/task/{me}/children').read().split() if live(c))
`;

describe("the rollback point is made while the interpreter is idle", () => {
  test("a call finds its copy waiting, made after the last call ended, and rolls back to it", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    await new Promise((r) => setTimeout(r, 500));
    const r = await sb.execute(
      FIND_COPY + "\n" + mutateThen(py`
        start = int(open(f'/proc/{copy}/stat').read().rsplit(') ', 1)[1].split()[19]) / os.sysconf('SC_CLK_TCK')
        open('/scratch/age', 'w').write(str(float(open('/proc/uptime').read().split()[0]) - start))
        while True: pass
      `),
      1,
    );
    assertRolledBack(r, "timeout");
    await assertIntact(sb, r);
    const age = Number((await sb.execute("float(open('/scratch/age').read())")).repr);
    // Made at the request, the copy would be younger than this call (a clock tick is 10 ms).
    assert.ok(age >= 0.3, `the copy was made ${age} s before the call's code ran, not while the interpreter was idle`);
  });

  test("the warm-up after the idle copy (a statement x = 1 run in a namespace of its own) leaves the code's names alone", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const idle = () => new Promise((r) => setTimeout(r, 300));
    assertOk(await sb.execute("x = 'mine'"));
    await idle();
    assert.equal((await sb.execute("x")).repr, "'mine'");
    assertOk(await sb.execute("del x"));
    await idle();
    assert.equal((await sb.execute("'x' in globals()")).repr, "False");
    await idle();
    const r = await sb.execute(mutateThen("while True: pass"), 1);
    assertRolledBack(r, "timeout");
    await assertIntact(sb, r);
    // A fresh interpreter after a reset warms up the same way: its first call sees no x.
    assertOk(await sb.execute("x = 'mine'"));
    await sb.reset();
    assert.equal((await sb.execute("'x' in globals()")).repr, "False");
  });
});

describe("a failed call cannot reach its rollback point or PID 1", { concurrency: 4 }, () => {
  test("the rollback point's memory cannot be opened (baseline: a dumpable child's can)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(
      FIND_COPY +
        "\n" +
        py`
          import json, ctypes, time
          def try_mem(pid):
              try:
                  with open(f'/proc/{pid}/mem', 'r+b'):
                      return 'opened'
              except OSError as e:
                  return type(e).__name__
          # Baseline: a child of ours that execs, which makes it dumpable again.
          import subprocess, sys
          child = subprocess.Popen([sys.executable, '-I', '-S', '-c', 'print(1, flush=True)\nimport time\ntime.sleep(30)'], stdout=subprocess.PIPE)
          child.stdout.readline()
          baseline = try_mem(child.pid)
          child.kill()
          print(json.dumps({"copy": try_mem(copy), "pid1": try_mem(1), "baseline": baseline}), flush=True)
          while True: pass
        `,
      3,
    );
    assertRolledBack(r, "timeout");
    const seen = JSON.parse(r.stdout.trim().split("\n")[0]);
    assert.equal(seen.baseline, "opened", "the baseline must show that the attempt works on a dumpable process");
    assert.equal(seen.copy, "PermissionError");
    assert.equal(seen.pid1, "PermissionError");
    await assertIntact(sb, r);
  });

  test("a signal from inside does not make the rollback point take over", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(
      FIND_COPY + "\n" + py`
        import signal, time
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            os.kill(copy, sig)
        time.sleep(0.5)
        print('still here', flush=True)
        while True: pass
      `,
      2,
    );
    assertRolledBack(r, "timeout");
    assert.equal(r.stdout, "still here\n", "the interpreter was not killed by a premature takeover");
    await assertIntact(sb, r);
    // Signals queued at the copy are dropped: the restored interpreter keeps running.
    assertOk(await sb.execute("import time\ntime.sleep(0.3)\n1"));
  });

  test("a stopped rollback point is continued by the host and rolls back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(FIND_COPY + "\nimport signal\nos.kill(copy, signal.SIGSTOP)\nwhile True: pass", 1);
    assertRolledBack(r, "timeout");
    await assertIntact(sb, r);
  });

  test("a killed rollback point is noticed: a fresh interpreter, honestly reported", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(FIND_COPY + "\nkept = 5\nos.kill(copy, 9)\nwhile True: pass", 1);
    assert.equal(r.status, "timeout", show(r));
    assert.equal(r.rolledBack, false);
    assert.equal(r.stateLost, true);
    assert.match(r.stateLostReason ?? "", /rollback point was gone/);
    const after = await sb.execute("'kept' in globals()");
    assertOk(after);
    assert.equal(after.repr, "False");
  });

  test("a process of an earlier call that forges the begin frame does not become the interpreter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // It steals the next request from fd 3, kills the interpreter, names itself as the rollback
    // point, and waits for the host's signal to take over with a patched print.
    const first = await sb.execute(
      py`
        import os, json, signal, sys, builtins
        W = sys.modules['__main__']
        def fr(obj):
            body = json.dumps(obj).encode()
            return len(body).to_bytes(4, 'big') + body
        if os.fork() == 0:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT})
            def take(n):
                got = b""
                while len(got) < n:
                    got += os.read(3, n - len(got))
                return got
            req = {}
            while req.get("type") != "exec":  # the host's point and release frames come too, maybe in one read
                req = json.loads(take(int.from_bytes(take(4), 'big')))
            os.kill(os.getppid(), 9)
            os.write(4, fr({"type": "begin", "id": req["id"], "copy": os.getpid(), "why": None}))
            os.write(4, (7).to_bytes(4, 'big') + b"garbage")
            while signal.sigwaitinfo({signal.SIGUSR1}).si_pid != 0:
                pass
            W.kill_now()
            nonce = W.fresh_channels(lambda: W.kill_all())
            W.prepare_streams()
            W.send({"type": "restored", "fresh": False, "threads": [], "streams": W.PREPARED, "nonce": nonce})
            real = builtins.print
            builtins.print = lambda *a, **k: real('[PWNED]', *a, **k)
            W.serve()
            os._exit(0)
        "armed"
      `,
      10,
    );
    assertOk(first);
    // The impostor and the interpreter both wait on fd 3: each call is the impostor's with about
    // even odds. Until it wins, the interpreter answers; once it wins, no rollback is reported.
    let stolen: ExecResult | undefined;
    for (let i = 0; i < 12 && !stolen; i++) {
      const r = await sb.execute(`print('call ${i}')`, 3);
      if (r.status === "ok") assert.equal(r.stdout, `call ${i}\n`, show(r));
      else stolen = r;
    }
    assert.ok(stolen, "the impostor never got a request: the attack did not happen");
    assert.equal(stolen.rolledBack, false, `a rollback was reported: ${show(stolen)}`);
    assert.equal(stolen.stateLost, true, show(stolen));
    const after = await sb.execute("print('hello')");
    assertOk(after);
    assert.equal(after.stdout, "hello\n", "the impostor serves the calls");
  });

  test("the code's own files at descriptors 10-17 are neither taken by the host nor lost by a rollback", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // Twelve files: before the placeholders they landed on 5-16, where the fresh channels go.
    assertOk(await sb.execute("fs = [open(f'/tmp/f{i}', 'w') for i in range(12)]\n[f.fileno() for f in fs]"));
    const r = await sb.execute("fs[7].write('during')\nwhile True: pass", 1);
    assertRolledBack(r, "timeout");
    const after = await sb.execute("fs[7].write('after')\nfs[7].flush()\nopen('/tmp/f7').read()");
    assertOk(after);
    assert.equal(after.repr, "'after'", show(after));
  });

  test("code that makes the interpreter dumpable again cannot write its next rollback point's memory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    assertOk(await sb.execute("import ctypes\nctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\nba = bytearray(b'ORIGINAL-VALUE')"));
    const r = await sb.execute(
      FIND_COPY + "\n" + py`
        import ctypes, json
        addr = ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba))
        try:
            with open(f'/proc/{copy}/mem', 'r+b') as m:
                m.seek(addr)
                m.write(b'TAMPERED-VALUE')
            got = 'written'
        except OSError as e:
            got = type(e).__name__
        print(got, flush=True)
        while True: pass
      `,
      2,
    );
    assertRolledBack(r, "timeout");
    assert.equal(r.stdout, "PermissionError\n");
    const after = await sb.execute("bytes(ba)");
    assert.equal(after.repr, "b'ORIGINAL-VALUE'");
  });

  test("PID 1 ignores SIGKILL from inside; the sandbox stays", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute("import os, signal, time\nos.kill(1, signal.SIGKILL)\nos.kill(1, signal.SIGSTOP)\ntime.sleep(0.3)\nopen('/proc/1/stat').read().split(') ')[1][0]");
    assertOk(r);
    assert.equal(r.repr, "'S'", "PID 1 neither died nor stopped");
    await assertIntact(sb, r);
  });

  test("the first call's SIGINT to PID 1 does nothing: PID 1 reset it before the interpreter existed", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixtureWithoutSpare(t);
    // The first code of a new sandbox: nothing waits for PID 1 before it runs.
    const r = await sb.execute(py`
      import os, signal, time
      os.kill(1, signal.SIGINT)
      time.sleep(0.3)
      kept = 1
      (open('/proc/1/stat').read().split(') ')[1][0], signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    `);
    assertOk(r);
    assert.equal(r.repr, "('S', True)", "PID 1 lives on, and the interpreter keeps Python's own SIGINT handler");
    const after = await sb.execute("kept");
    assertOk(after);
    assert.equal(after.repr, "1", "the same interpreter: PID 1 never ended the sandbox");
    assert.equal(after.generation, r.generation);
  });

  test("directories the first call makes in /tmp are not what a reset makes again (PID 1's seed is from before any code)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixtureWithoutSpare(t);
    const first = await sb.execute(py`
      import os
      fresh = sorted(os.listdir('/tmp'))
      os.makedirs('/tmp/made/by/code')
      os.symlink('/workspace', '/tmp/link-by-code')
      fresh
    `);
    assertOk(first);
    await sb.reset();
    const after = await sb.execute("import os\nsorted(os.listdir('/tmp'))");
    assertOk(after);
    assert.equal(after.repr, first.repr, "after the reset /tmp holds what bubblewrap made, none of the code's");
  });

  test("processes forking as fast as they can do not survive the rollback", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const marker = `race-${process.pid}-${Date.now()}`;
    // Each process forks a successor and exits: a chain that is always mid-fork (bounded by the
    // sandbox's rlimits and by the test's own timeout).
    const r = await sb.execute(
      py`
        import subprocess
        subprocess.Popen(['sh', '-c', 'f() { ( exec -a ${marker} sh -c "sleep 0.001" ); f & }; f'], start_new_session=True)
        while True: pass
      `,
      2,
    );
    assertRolledBack(r, "timeout");
    await assertNoProcess(marker, 3000);
    const after = await sb.execute(OTHERS);
    assertOk(after);
    assert.equal(after.repr, "[]");
  });
});

/** Without the defence: the previous rollback point, in a scratch interpreter of the sandbox.
 * `setup` runs; a copy is made with os.fork (every signal held while `hold`, as the rollback
 * point had them) and waits on a pipe; `during` runs in the parent as the failed call would (it
 * knows the copy as `copy`); then the copy runs `wake` (what the old copy ran when it took over),
 * prints `report` (a Python expression) and ends (`exit`: as an interpreter ends, else with
 * os._exit). Returns {copy, parent, go}: the report in each, and when the copy was woken. */
const OLD_POINT = py`
  import json, os, signal, sys, time
  setup, during, wake, report, hold, end = json.loads(sys.argv[1])
  exec(setup, globals())
  r, w = os.pipe()
  ready_r, ready_w = os.pipe()
  ALL = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
  mask = signal.pthread_sigmask(signal.SIG_BLOCK, ALL if hold else set())
  copy = os.fork()
  if copy == 0:
      os.close(w)
      null = os.open('/dev/null', os.O_RDWR)
      waiting = [{signal.SIGUSR1}]  # what the old copy built before its wait
      os.write(ready_w, b"1")
      os.read(r, 1)
      exec(wake, globals())
      for sig in signal.sigpending():
          h = signal.signal(sig, signal.SIG_IGN)
          signal.signal(sig, h)
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)
      print(json.dumps({"copy": eval(report)}), flush=True)
      if end == "exit":
          sys.exit(0)
      os._exit(0)
  signal.pthread_sigmask(signal.SIG_SETMASK, mask)
  os.read(ready_r, 1)  # the copy waits
  exec(during, globals())
  print(json.dumps({"parent": eval(report)}), flush=True)
  print(json.dumps({"go": time.monotonic()}), flush=True)
  os.write(w, b"1")
  os.waitpid(copy, 0)
  os._exit(0)
`;

type Old = { setup: string; during?: string; wake?: string; report: string; hold?: boolean; end?: "exit" };

async function oldPoint(sb: PythonSandbox, o: Old): Promise<{ copy: unknown; parent: unknown; go: number }> {
  const args = JSON.stringify([o.setup, o.during ?? "time.sleep(0.3)", o.wake ?? "", o.report, o.hold ?? true, o.end ?? ""]);
  const r = await sb.execute(
    py`
      import subprocess, sys
      p = subprocess.run([sys.executable, '-I', '-S', '-c', ${JSON.stringify(OLD_POINT)}, ${JSON.stringify(args)}],
                         capture_output=True, text=True, timeout=30)
      print(p.stdout, end='')
      print(p.stderr, end='', file=sys.stderr)
    `,
    40,
  );
  assertOk(r);
  const out: Record<string, unknown> = {};
  for (const line of r.stdout.trim().split("\n")) Object.assign(out, JSON.parse(line));
  assert.ok("copy" in out && "parent" in out, `the scratch interpreter did not report: ${show(r)}`);
  return out as { copy: unknown; parent: unknown; go: number };
}

/** The value of a Python expression in the sandbox's interpreter, through JSON. */
async function valueOf(sb: PythonSandbox, expr: string): Promise<unknown> {
  return jsonOut(await sb.execute(`import json as _json\nprint(_json.dumps(${expr}))`));
}

/** A fork hook (`kind` of os.register_at_fork) that counts its runs in g["n"] and starts a thread
 * that marks g["t"]. */
const forkHook = (kind: string) => py`
  import os, threading, time
  g = {"n": 0, "t": None}
  def _spawned():
      g["t"] = "ran"
      time.sleep(60)
  def _hook():
      g["n"] += 1
      threading.Thread(target=_spawned, daemon=True).start()
  os.register_at_fork(${kind}=_hook)
`;
const HOOK_REPORT = `{"n": g["n"], "t": g["t"], "threads": threading.active_count()}`;
const UNTOUCHED = { n: 0, t: null, threads: 1 };

describe("no code of the call runs in its rollback copy", { concurrency: 4 }, () => {
  test("an after_in_child fork hook does not run in the copy: no thread is born there", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup: forkHook("after_in_child"), report: HOOK_REPORT });
    assert.deepEqual(old.copy, { n: 1, t: "ran", threads: 2 }, "baseline: os.fork runs the hook in the copy");
    assertOk(await sb.execute(forkHook("after_in_child")));
    const r = await sb.execute('g["n"] = 7\nwhile True: pass', 1);
    assertRolledBack(r, "timeout");
    assert.deepEqual(await valueOf(sb, HOOK_REPORT), UNTOUCHED);
  });

  test("a before fork hook does not run: the state is the call's start", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup: forkHook("before"), report: `g["n"]` });
    assert.equal(old.copy, 1, "baseline: os.fork runs the hook before the copy is made");
    assertOk(await sb.execute(forkHook("before")));
    const r = await sb.execute("while True: pass", 1);
    assertRolledBack(r, "timeout");
    assert.deepEqual(await valueOf(sb, HOOK_REPORT), UNTOUCHED);
  });

  test("an after_in_parent fork hook does not run: no thread, and the next call still rolls back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup: forkHook("after_in_parent"), report: HOOK_REPORT });
    assert.deepEqual(old.parent, { n: 1, t: "ran", threads: 2 }, "baseline: os.fork runs the hook in the parent");
    assertOk(await sb.execute(forkHook("after_in_parent")));
    assertOk(await sb.execute("x = 1"));
    assert.deepEqual(await valueOf(sb, HOOK_REPORT), UNTOUCHED);
    const r = await sb.execute("while True: pass", 1);
    assertRolledBack(r, "timeout");
    assert.deepEqual(await valueOf(sb, HOOK_REPORT), UNTOUCHED);
  });

  const HANDLERS = py`
    import os, signal, time
    hits = []
    def _handler(sig, frame):
        hits.append(int(sig))
    SIGS = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGRTMIN]
    for _s in SIGS + [signal.SIGALRM]:
        signal.signal(_s, _handler)
  `;

  test("signal handlers do not run in the copy: signals sent to it are dropped, a timer's ticks stay the interpreter's", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, {
      setup: HANDLERS,
      during: "for _s in SIGS: os.kill(copy, _s)\ntime.sleep(0.3)",
      report: "sorted(hits)",
      hold: false,
    });
    assert.equal((old.copy as number[]).length, 6, "baseline: a copy that does not hold its signals runs the handlers");
    // The timer fires between calls too: its signals wait, held, for the next call to start.
    assertOk(await sb.execute(HANDLERS + "\nsignal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)\ntime.sleep(0.05)"));
    const r = await sb.execute(
      FIND_COPY + "\n" + py`
        open('/scratch/ticks', 'w').write(str(len(hits)))
        for _s in SIGS:
            os.kill(copy, _s)
        while True: pass
      `,
      1,
    );
    assertRolledBack(r, "timeout");
    const after = (await valueOf(sb, "hits")) as number[];
    const atStart = Number((await sb.execute("int(open('/scratch/ticks').read())")).repr);
    assert.deepEqual(after.filter((s) => s !== 14), [], "no handler ran for the signals sent to the copy");
    assert.ok(after.length <= atStart, `the copy ran the timer's handler: ${after.length} ticks > ${atStart} at the call's start`);
  });

  test("atexit handlers never run in a copy or in the interpreter a rollback replaced", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const setup = py`
      import atexit, os
      def _bye():
          open('/scratch/atexit-%d' % os.getpid(), 'w').close()
      atexit.register(_bye)
    `;
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup, report: "os.getpid()", end: "exit" });
    const seen = await sb.execute(`import os\n[f for f in os.listdir('/scratch') if f.startswith('atexit-')]`);
    assert.equal(seen.repr, `['atexit-${old.copy}']`, "baseline: a copy that ends as an interpreter does runs them");
    assertOk(await sb.execute(`import os\nos.unlink('/scratch/atexit-${old.copy}')`));
    assertOk(await sb.execute(setup));
    assertOk(await sb.execute("x = 1"));
    assertRolledBack(await sb.execute("while True: pass", 1), "timeout");
    assertRolledBack(await sb.execute("import os\nos._exit(3)"), "worker_error");
    const after = await sb.execute(`[f for f in os.listdir('/scratch') if f.startswith('atexit-')]`);
    assert.equal(after.repr, "[]");
  });

  // Garbage that is always there: each collection finalizes a cycle whose __del__ makes the
  // next, and notes when it first ran in each process.
  const GARBAGE = py`
    import gc, os, time
    seen = {}
    class _Cycle:
        def __del__(self):
            seen.setdefault(os.getpid(), time.monotonic())
            c = _Cycle()
            c.me = c
    _c = _Cycle()
    _c.me = _c
    del _c
    gc.set_threshold(1)
  `;

  test("the collector does not run __del__ of cyclic garbage in the copy while it waits", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup: GARBAGE, report: "seen.get(os.getpid())" });
    assert.ok(typeof old.copy === "number" && old.copy < old.go, `baseline: os.fork's copy collects before it is woken: ${JSON.stringify(old)}`);
    assertOk(await sb.execute(GARBAGE));
    const r = await sb.execute(
      FIND_COPY + "\n" + py`
        import json, time
        open('/scratch/t0', 'w').write(json.dumps([copy, time.monotonic()]))
        while True: pass
      `,
      2,
    );
    assertRolledBack(r, "timeout");
    const [copy, t0] = JSON.parse((await sb.execute("print(open('/scratch/t0').read())")).stdout) as [number, number];
    const first = (await valueOf(sb, `seen.get(${copy})`)) as number | null;
    assert.ok(first === null || first > t0 + 1.5, `__del__ ran in the copy ${first === null ? "" : (first - t0).toFixed(3)} s after the call began`);
    assertOk(await sb.execute("gc.set_threshold(700)"));
  });

  test("random's state after a rollback is the call's start (the copy is not reseeded)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const setup = "import random\nrandom.seed(1234)\nexpected = [random.random() for _ in range(3)]\nrandom.seed(1234)";
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup, report: "[random.random() for _ in range(3)] == expected" });
    assert.equal(old.copy, false, "baseline: random reseeds itself in an os.fork child");
    assertOk(await sb.execute(setup));
    assertRolledBack(await sb.execute("random.random()\nrandom.random()\nwhile True: pass", 1), "timeout");
    assert.equal(await valueOf(sb, "[random.random() for _ in range(3)] == expected"), true);
  });

  test("an audit hook would run in the copy: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const setup = "import sys, os\ng = {'n': 0}\nsys.addaudithook(lambda e, a: e == 'os.kill' and g.__setitem__('n', g['n'] + 1))";
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup, wake: "os.kill(os.getpid(), 0)", report: "g['n']" });
    assert.equal(old.copy, 1, "baseline: the hook runs on the copy's os.kill");
    assertOk(await sb.execute(setup));
    const r = await sb.execute("g['n'] = 5\nwhile True: pass", 1);
    assert.equal(r.status, "timeout", show(r));
    assert.equal(r.rolledBack, false, show(r));
    assert.equal(r.stateLost, true, show(r));
    assert.match(r.stateLostReason ?? "", /no rollback point: the code added an audit hook/);
  });

  test("a standard-library function the copy calls, replaced by the code: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    for (const [name, setup, wake] of [
      ["time.sleep", "import time\ng = {'n': 0}\n_real = time.sleep\ndef _p(s):\n    g['n'] += 1\n    return _real(s)\ntime.sleep = _p", "time.sleep(0)"],
      ["os.kill", "import os\ng = {'n': 0}\n_real = os.kill\ndef _p(*a):\n    g['n'] += 1\n    return _real(*a)\nos.kill = _p", "os.kill(os.getpid(), 0)"],
      ["builtins.open", "import builtins\ng = {'n': 0}\n_real = builtins.open\ndef _p(*a, **k):\n    g['n'] += 1\n    return _real(*a, **k)\nbuiltins.open = _p", "open('/dev/null').close()"],
      // The newest pid is read through os.open(path, os.O_RDONLY | ...) before each call's code.
      ["os.O_RDONLY", "import os\ng = {'n': 0}\nclass _I(int):\n    def __or__(self, other):\n        g['n'] += 1\n        return int(self) | other\nos.O_RDONLY = _I(os.O_RDONLY)", "os.O_RDONLY | os.O_CLOEXEC"],
    ]) {
      const old = await oldPoint(sb, { setup, wake, report: "g['n']" });
      assert.equal(old.copy, 1, `baseline: the copy runs the replaced ${name}`);
      assertOk(await sb.execute(setup));
      const r = await sb.execute("while True: pass", 1);
      assert.equal(r.rolledBack, false, show(r));
      assert.equal(r.stateLost, true, show(r));
      assert.match(r.stateLostReason ?? "", new RegExp(`no rollback point: the code replaced ${name.replace(".", "\\.")}`));
    }
  });

  test("a function of the worker the copy calls, replaced through a frame: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // The worker's globals are one frame up from the call's code.
    const setup = py`
      import sys
      W = sys._getframe(1).f_globals
      counter = 0
      _real = W["to_dev_null"]
      def _evil(*a):
          globals()["counter"] += 1000
          return _real(*a)
      W["to_dev_null"] = _evil
    `;
    assertOk(await sb.execute(setup));
    const r = await sb.execute("counter += 1\nimport time\ntime.sleep(5)", 1);
    assert.equal(r.status, "timeout", show(r));
    const after = await sb.execute("counter");
    if (r.rolledBack) {
      // Baseline (before the check): "rolled back", yet the replaced function ran in the copy.
      assert.fail(`rolled back with a replaced worker function: counter is ${after.repr} (0 before the call)`);
    }
    assert.equal(r.stateLost, true, show(r));
    assert.match(r.stateLostReason ?? "", /no rollback point: the code replaced the worker's to_dev_null/);
    // The same through the function's code, in a fresh interpreter.
    const code = py`
      import sys
      W = sys._getframe(1).f_globals
      counter = 0
      def _evil():
          globals()["counter"] += 1000
      W["kill_now"].__code__ = _evil.__code__
    `;
    assertOk(await sb.execute(code));
    const again = await sb.execute("counter += 1\nimport time\ntime.sleep(5)", 1);
    assert.equal(again.rolledBack, false, show(again));
    assert.match(again.stateLostReason ?? "", /no rollback point: the code replaced kill_now \(its code\)/);
  });

  test("attack: a closure cell of the worker's JSON reader, replaced through a frame, runs in the copy as it takes over: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // loads() reads the resume request in the copy, and every request after: its scanner is a
    // closure cell, which the function's code and defaults do not show.
    const setup = py`
      import sys
      W = sys._getframe(1).f_globals
      counter = 0
      _cell = W["loads"].__closure__[W["loads"].__code__.co_freevars.index("scan")]
      _real = _cell.cell_contents
      def _evil(text, i):
          if '"resume"' in text:
              globals()["counter"] += 1000
          return _real(text, i)
      _cell.cell_contents = _evil
    `;
    assertOk(await sb.execute(setup));
    const r = await sb.execute("counter += 1\nimport time\ntime.sleep(5)", 1);
    assert.equal(r.status, "timeout", show(r));
    const after = await sb.execute("counter");
    if (r.rolledBack) {
      // Baseline (before the check): "rolled back", yet the code ran in the copy as it took over.
      assert.fail(`rolled back with a replaced closure cell: counter is ${after.repr} (0 before the call)`);
    }
    assert.equal(r.stateLost, true, show(r));
    assert.match(r.stateLostReason ?? "", /no rollback point: the code replaced loads \(its closure\)/);
  });

  test("attack: binascii.a2b_base64, which decodes each call's code between the idle fork and the call, replaced by the code: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // Runs in the restored interpreter before the next call's code, signals held and the
    // collector off: a rolled-back interpreter is then not the state before the failed call.
    const setup = py`
      import binascii
      counter = 0
      _real = binascii.a2b_base64
      def _evil(*a, **k):
          globals()["counter"] += 1000
          return _real(*a, **k)
      binascii.a2b_base64 = _evil
    `;
    assertOk(await sb.execute(setup));
    const r = await sb.execute("counter += 1\nimport time\ntime.sleep(5)", 1);
    assert.equal(r.status, "timeout", show(r));
    const after = await sb.execute("counter");
    if (r.rolledBack) {
      assert.fail(`rolled back with a replaced binascii.a2b_base64: counter is ${after.repr} (0 before the call)`);
    }
    assert.equal(r.stateLost, true, show(r));
    assert.match(r.stateLostReason ?? "", /no rollback point: the code replaced binascii\.a2b_base64/);
  });

  test("a trace or profile function would run on the copy's own lines: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    for (const [name, set] of [["sys.settrace", "sys.settrace(_f)"], ["sys.setprofile", "sys.setprofile(_f)"]]) {
      const setup = py`
        import os, sys
        g = {'n': 0}
        _parent = os.getpid()
        def _f(frame, event, arg):
            if os.getpid() != _parent:
                g['n'] += 1
            return _f
        ${set}
      `;
      const old = await oldPoint(sb, { setup, wake: "def _w():\n    pass\n_w()", report: "g['n'] > 0" });
      assert.equal(old.copy, true, `baseline: ${name}'s function runs in the copy`);
      assertOk(await sb.execute(setup));
      const r = await sb.execute("while True: pass", 1);
      assert.equal(r.rolledBack, false, show(r));
      assert.equal(r.stateLost, true, show(r));
      assert.match(r.stateLostReason ?? "", /no rollback point: the code set a trace or profile function/);
    }
  });

  // Marks, in `ran`, code of the user that runs in a copy (another pid) outside a call's code (no
  // frame of the worker's `run` on the stack): between the fork and the next call's start.
  const OUTSIDE = py`
    import os, sys
    P = os.getpid()
    ran = []
    def _outside():
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_name == 'run' and f.f_globals is not globals():
                return False
            f = f.f_back
        return True
    def _mark(what):
        if os.getpid() != P and _outside():
            ran.append(what)
  `;

  /** `setup` (after OUTSIDE) makes `what` run in a copy: the baseline copy, woken with `wake`,
   * runs it; the rollback copy, through its takeover and until the next call starts, does not. */
  async function notInCopy(t: TestContext, what: string, setup: string, wake = ""): Promise<void> {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const old = await oldPoint(sb, { setup: OUTSIDE + "\n" + setup, wake, report: "ran" });
    assert.ok(Array.isArray(old.copy) && old.copy.includes(what), `baseline: a plain os.fork copy runs it: ${JSON.stringify(old)}`);
    assertOk(await sb.execute(OUTSIDE + "\n" + setup));
    assertOk(await sb.execute("x = 1"));
    const r = await sb.execute("x = 2\nimport time\ntime.sleep(100)", 1);
    assertRolledBack(r, "timeout");
    assert.deepEqual(await valueOf(sb, "[ran, x]"), [[], 1], "code of the user ran in the copy before the next call");
  }

  test("gc.callbacks do not run in the copy: it never collects until the next call starts", async (t) => {
    await notInCopy(t, "gc", "import gc\ngc.callbacks.append(lambda phase, info: _mark('gc'))\ngc.set_threshold(1, 1, 1)");
  });

  test("__del__ of cyclic garbage does not run in the copy, neither while it waits nor once it took over", async (t) => {
    await notInCopy(t, "del", py`
      import gc
      class _Cycle:
          def __del__(self):
              _mark('del')
              c = _Cycle()
              c.me = c
      _c = _Cycle()
      _c.me = _c
      del _c
      gc.set_threshold(1)
    `);
  });

  test("weakref callbacks of cyclic garbage do not run in the copy", async (t) => {
    await notInCopy(t, "weakref", py`
      import gc, weakref
      _refs = []
      class _Node:
          pass
      def _grow(ref=None):
          if ref is not None:
              _mark('weakref')
          n = _Node()
          n.me = n
          _refs.append(weakref.ref(n, _grow))
      _grow()
      gc.set_threshold(1)
    `);
  });

  test("an import in the copy would consult a module's __spec__, which the code replaced: the copy imports nothing", async (t) => {
    await notInCopy(t, "import", py`
      import fcntl
      class _Spec:
          name = 'fcntl'
          @property
          def _initializing(self):
              _mark('import')
              return False
      fcntl.__spec__ = _Spec()
    `, "import fcntl");
  });

  test("the code's sys.stdout is not flushed in a restored interpreter before its next call", async (t) => {
    await notInCopy(t, "flush", py`
      class _Out:
          def __init__(self, s):
              self.s = s
          def write(self, text):
              return self.s.write(text)
          def flush(self):
              _mark('flush')
              return self.s.flush()
          def __getattr__(self, name):
              return getattr(self.s, name)
      sys.stdout = _Out(sys.stdout)
    `, "sys.stdout.flush()");
  });

  test("a value of the worker the copy uses, replaced through a frame by one whose type runs code: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    // The copy iterates the worker's KEEPER_FDS as it takes over (a tuple; here a subclass
    // whose iteration records the pid it runs in).
    const setup = py`
      import sys, os
      W = sys._getframe(1).f_globals
      seen = []
      class _T(tuple):
          def __iter__(self):
              seen.append(os.getpid())
              return tuple.__iter__(self)
          def __radd__(self, other):
              seen.append(os.getpid())
              return other + tuple(self)
      W["KEEPER_FDS"] = _T(W["KEEPER_FDS"])
    `;
    assertOk(await sb.execute(setup));
    const r = await sb.execute("import time\ntime.sleep(5)", 1);
    assert.equal(r.status, "timeout", show(r));
    if (r.rolledBack) {
      // Baseline (before the check): "rolled back", yet the copy ran the code's __iter__.
      const ran = await sb.execute("os.getpid() in seen");
      assert.fail(`rolled back with a replaced worker value; the copy ran its code: ${ran.repr}`);
    }
    assert.equal(r.stateLost, true, show(r));
    assert.match(r.stateLostReason ?? "", /no rollback point: the code replaced the worker's KEEPER_FDS/);
    // The same through a container of the worker's, filled in place.
    const inPlace = py`
      import sys
      W = sys._getframe(1).f_globals
      class _I(int):
          def __eq__(self, other):
              return int.__eq__(self, other)
          __hash__ = int.__hash__
      W["ALL_SIGNALS"].add(_I(99))
    `;
    assertOk(await sb.execute(inPlace));
    const again = await sb.execute("import time\ntime.sleep(5)", 1);
    assert.equal(again.rolledBack, false, show(again));
    assert.match(again.stateLostReason ?? "", /no rollback point: the code replaced the contents of the worker's ALL_SIGNALS/);
  });

  test("a constant the copy uses, replaced by an int subclass that runs code: no rollback point, and why", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    for (const [name, setup, wake] of [
      ["os.O_CLOEXEC", "class _I(int):\n    def __ror__(self, o):\n        _mark('const')\n        return int(self) | o\nos.O_CLOEXEC = _I(os.O_CLOEXEC)", "os.close(os.open('/dev/null', os.O_RDWR | os.O_CLOEXEC))"],
      ["_signal.SIGUSR1", "import _signal\nclass _I(int):\n    def __hash__(self):\n        _mark('const')\n        return int.__hash__(self)\n_signal.SIGUSR1 = _I(_signal.SIGUSR1)", "{_signal.SIGUSR1}"],
    ]) {
      const old = await oldPoint(sb, { setup: OUTSIDE + "\n" + setup, wake, report: "ran" });
      assert.ok(Array.isArray(old.copy) && old.copy.includes("const"), `baseline: the copy runs the replaced ${name}: ${JSON.stringify(old)}`);
      assertOk(await sb.execute(OUTSIDE + "\n" + setup));
      const r = await sb.execute("while True: pass", 1);
      assert.equal(r.rolledBack, false, show(r));
      assert.equal(r.stateLost, true, show(r));
      assert.match(r.stateLostReason ?? "", new RegExp(`no rollback point: the code replaced ${name.replace(".", "\\.")}`));
    }
  });

  test("the code's own forks still run their hooks: os.fork, multiprocessing's fork, subprocess", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const r = await sb.execute(py`
      import os, random, multiprocessing, subprocess, json
      ran = []
      os.register_at_fork(after_in_child=lambda: ran.append(1))
      rd, wr = os.pipe()
      pid = os.fork()
      if pid == 0:
          os.write(wr, json.dumps([len(ran), random.random()]).encode())
          os._exit(0)
      os.waitpid(pid, 0)
      child = json.loads(os.read(rd, 1000))
      ctx = multiprocessing.get_context('fork')
      q = ctx.SimpleQueue()
      p = ctx.Process(target=lambda: q.put([len(ran), random.random()]))
      p.start()
      p.join()
      mp = q.get()
      mine = random.random()
      out = subprocess.run(['echo', 'ok'], capture_output=True, text=True).stdout
      print(json.dumps({"child": child[0], "childDiffers": child[1] != mine, "mp": mp[0], "mpDiffers": mp[1] != mine,
                        "ran": len(ran), "out": out}))
    `);
    assert.deepEqual(jsonOut(r), { child: 1, childDiffers: true, mp: 1, mpDiffers: true, ran: 0, out: "ok\n" });
    assertRolledBack(await sb.execute("ran.append(2)\nwhile True: pass", 1), "timeout");
    assert.equal(await valueOf(sb, "len(ran)"), 0);
  });
});

describe("through pi, rollback is the default", () => {
  test("a timeout in a pi session rolls back; the model reads so and the next call has the state", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const cwd = await mkdtemp(join(tmpdir(), "pps-rollback-pi-"));
    t.after(() => rm(cwd, { recursive: true, force: true }));
    const h = await createPiHarness({ cwd, extensionPaths: [fileURLToPath(new URL("..", import.meta.url))] });
    t.after(() => h.dispose());
    let n = 0;
    const call = async (params: unknown) => {
      const r = await h.getTool("python").execute(`rb-${++n}`, params as never, undefined, undefined);
      return { text: messageText(r as never), details: (r.details ?? {}) as Record<string, unknown> };
    };
    assert.equal((await call({ code: "kept = 41" })).details.status, "ok");
    assert.equal((await call({ code: "warm = 1" })).details.status, "ok");
    const failed = await call({ code: "kept = 0\nwhile True: pass", timeoutSeconds: 1 });
    assert.equal(failed.details.status, "timeout", failed.text);
    assert.equal(failed.details.rolledBack, true, failed.text);
    assert.equal(failed.details.stateLost, false, failed.text);
    assert.match(failed.text, /rolled back to its state before this call/);
    assert.doesNotMatch(failed.text, /state was LOST/);
    const next = await call({ code: "kept + 1" });
    assert.match(next.text, /42/, next.text);
    const status = await call({ action: "status" });
    assert.match(status.text, /after a timeout, a cancel, too much output or a crash: the interpreter goes back to its state before that call \(state last saved/);
  });
});
