/**
 * Rollback (the default; PI_PYTHON_TOOL_ROLLBACK=0 gives the spec's kill-and-restart, which the
 * rest of the suite runs with): a failed call returns the interpreter to its state from right
 * before it, every other process of the sandbox is killed, and a reset is a fresh interpreter in
 * the same sandbox. Also the attempts of a failed call to reach its rollback point or the
 * sandbox's PID 1, each with a baseline that shows the attempt works where the defence is absent.
 * Run: node --import tsx --test __test__/rollback.test.ts
 *
 * Every test owns its project, runtime root and sandboxes (cleaned up in t.after) and keeps no
 * spare, so that what it finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { describe, type TestContext, test } from "node:test";
import {
  assertOk,
  type ExecResult,
  jsonOut,
  makeFixtureWithoutSpare,
  py,
  type PythonSandbox,
  show,
} from "./helpers/sandbox-fixture.ts";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { assertNoProcess } from "./helpers/host-procs.ts";
import { createPiHarness, messageText } from "./helpers/pi-session.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

if (/^(0|false|off|no)$/i.test(process.env.PI_PYTHON_TOOL_ROLLBACK?.trim() ?? "")) {
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
    const running = sb.execute(mutateThen("import time\nprint('started', flush=True)\ntime.sleep(60)"), 30, 4242);
    await new Promise((resolve) => setTimeout(resolve, 500));
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
    const before = await sb.execute("open('/tmp/t', 'w').write('x'); open('/dev/shm/s', 'w').write('x'); open('/scratch/k', 'w').write('x')\nimport os\nos.getpid()");
    assertOk(before);
    await sb.reset();
    const after = await sb.execute("import os\n(os.listdir('/tmp'), os.listdir('/dev/shm'), os.path.exists('/scratch/k'), 'kept' in globals())");
    assertOk(after);
    assert.equal(after.repr, "([], [], True, False)");
    assert.equal(after.generation, before.generation + 1);
    assert.equal(sb.status().lastResetReason, "explicit_reset");
  });

  test("an interpreter that died between calls is reported, and the next call's code runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await fixture(t);
    const first = await sb.execute("import os, subprocess\nsubprocess.Popen(['sh', '-c', f'sleep 1.5; kill -9 {os.getpid()}'])\nos.getpid()", 10);
    assertOk(first);
    await new Promise((resolve) => setTimeout(resolve, 2500));
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
    assert.match(s.text, /rollback: on \(last rollback point \d+\.\d s ago\)/);
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
            req = json.loads(os.read(3, 1 << 20)[4:])
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
    assert.match(status.text, /rollback: on \(last rollback point/);
  });
});
