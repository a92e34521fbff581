/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox.
 * Run: node --import tsx --test __test__/sandbox.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync, statSync } from "node:fs";
import { chmod, mkdir, readdir, readFile, stat, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { homedir } from "node:os";
import { join } from "node:path";
import { describe, type TestContext, test } from "node:test";
import {
  assertOk,
  FIXTURE_CONTENT,
  INDEX_CJS,
  jsonOut,
  lit,
  hostPidsWithCmdline,
  makeFixture as makeFixtureWithSpare,
  py,
  sessionDirs,
  show,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { assertNoProcess, parentOf } from "./helpers/host-procs.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { unfiltered } from "./helpers/unfiltered.ts";

/**
 * This suite checks the engine's own lifecycle ("nothing is left after a
 * reset"), so its sandboxes keep no spare; the spare has its own suite below.
 */
const makeFixture: typeof makeFixtureWithSpare = (t, options = {}) => makeFixtureWithSpare(t, { prewarm: false, ...options });

const CONCURRENCY = 4;
const EPERM = 1;
const MiB = 1024 * 1024;


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
describe("interpreter state and results", { concurrency: CONCURRENCY }, () => {
  test("variables, imports, functions and classes persist across calls", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("counter = 41"));
    assertOk(await sb.execute("import math as m"));
    assertOk(await sb.execute("def double(v):\n    return v * 2"));
    assertOk(await sb.execute("class Box:\n    def __init__(self, v):\n        self.v = v"));
    const r = await sb.execute("counter += 1\n(counter, m.floor(2.5), double(21), Box(7).v)");
    assertOk(r);
    assert.equal(r.repr, "(42, 2, 42, 7)");
    assert.equal(r.generation, 1);
    assert.equal(r.stateLost, false);
  });

  test("only a final expression produces a repr", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const last = await sb.execute("1; 2");
    assertOk(last);
    assert.equal(last.repr, "2");
    const assignment = await sb.execute("x = 5");
    assertOk(assignment);
    assert.equal(assignment.repr, undefined);
    const printed = await sb.execute("print(1)");
    assertOk(printed);
    assert.equal(printed.repr, undefined, "print() returns None: no repr");
    assert.equal(printed.stdout, "1\n");
    const noneValue = await sb.execute("None");
    assert.equal(noneValue.repr, undefined);
    const earlier = await sb.execute("x * 10\ny = 3");
    assert.equal(earlier.repr, undefined, "an expression that is not last gives no repr");
    assert.equal((await sb.execute("x + y")).repr, "8");
  });

  test('code runs as __main__ (if __name__ == "__main__" blocks run)', async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('if __name__ == "__main__":\n    print("main block ran")\n__name__');
    assertOk(r);
    assert.equal(r.stdout, "main block ran\n");
    assert.equal(r.repr, "'__main__'");
  });

  test("input() meets EOF at once", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const started = Date.now();
    const r = await sb.execute("kept = 1\ninput()", 10);
    assert.ok(Date.now() - started < 5000, "input() waited");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "EOFError");
    assert.equal((await sb.execute("kept")).repr, "1");
  });

  test("a large repr is truncated to about 8 KiB with both ends kept", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute("'x' * 100000");
    assertOk(r);
    assert.equal(r.reprTruncated, true);
    assert.ok(r.repr !== undefined);
    assert.ok(Buffer.byteLength(r.repr) <= 8 * 1024 + 64, `${Buffer.byteLength(r.repr)} bytes`);
    assert.ok(r.repr.startsWith("'xxxx") && r.repr.endsWith("xxxx'"), "head and tail kept");
    assert.match(r.repr, /bytes omitted/);
    assert.ok(Buffer.byteLength(r.text) <= 50 * 1024);
    const small = await sb.execute("'x' * 10");
    assert.equal(small.reprTruncated, false);
    assert.equal(small.repr, `'${"x".repeat(10)}'`);
  });
});

// ---------------------------------------------------------------------------------------------
describe("output capture", { concurrency: CONCURRENCY }, () => {
  test("print (with unicode) and sys.stderr.write land on separate streams with byte counts", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('import sys\nprint("héllo wörld ✓ 🐍")\nsys.stderr.write("err-line\\n")\nprint("second")');
    assertOk(r);
    assert.equal(r.stdout, "héllo wörld ✓ 🐍\nsecond\n");
    assert.equal(r.stderr, "err-line\n");
    assert.equal(r.stdoutBytes, Buffer.byteLength(r.stdout));
    assert.equal(r.stderrBytes, 9);
    assert.equal(r.excerptTruncated, false);
    assert.match(r.text, /--- stdout ---\nhéllo wörld ✓ 🐍/);
  });

  test("os.write to fds 1 and 2 and subprocess output are captured", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import os, subprocess
      os.write(1, b"fd1-out\n")
      os.write(2, b"fd2-err\n")
      subprocess.run(["echo", "from-echo"])
      subprocess.run(["sh", "-c", "echo sub-err >&2"])
      print("after")
    `);
    assertOk(r);
    assert.equal(r.stdout, "fd1-out\nfrom-echo\nafter\n");
    assert.equal(r.stderr, "fd2-err\nsub-err\n");
    assert.equal(r.stdoutBytes, Buffer.byteLength(r.stdout));
    assert.equal(r.stderrBytes, Buffer.byteLength(r.stderr));
  });

  test("trailing output of a subprocess stays with its own execution", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(
      'import subprocess\nsubprocess.Popen(["sh", "-c", "sleep 0.4; echo trailing"])\nprint("main")',
    );
    assertOk(r);
    assert.equal(r.stdout, "main\ntrailing\n");
    const next = await sb.execute('print("next")');
    assertOk(next);
    assert.equal(next.stdout, "next\n", "trailing output leaked into the next execution");
  });

  test("a background process left running does not hang later calls", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const first = await sb.execute('import subprocess\np = subprocess.Popen(["sleep", "30"])\n"started"', 10);
    assertOk(first);
    for (const code of ["1 + 1", "p.poll() is None"]) {
      const started = Date.now();
      const r = await sb.execute(code, 10);
      assertOk(r);
      // Only processes the call itself started are waited for (up to 1 s).
      assert.ok(Date.now() - started < 900, `call took ${Date.now() - started} ms`);
    }
    assert.equal((await sb.execute("p.poll() is None")).repr, "True", "the background process keeps running");
  });

  test("an endless output flood stops at output_limit with a partial log", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute('while True:\n    print("y" * 499)', 60);
    assert.ok(Date.now() - started < 15_000, "the flood was not stopped promptly");
    assert.equal(r.status, "output_limit", show(r));
    assert.equal(r.outputLimitExceeded, true);
    assert.equal(r.logComplete, false);
    assert.equal(r.stateLost, true);
    assert.ok(r.stdoutBytes <= MiB && r.stdoutBytes > 0, `${r.stdoutBytes}`);
    assert.ok(r.logPaths, "log paths reported");
    const size = statSync(r.logPaths.stdout).size;
    assert.ok(size > 0 && size <= MiB, `log is ${size} bytes`);
    assert.ok(Buffer.byteLength(r.text) <= 50 * 1024, `text is ${Buffer.byteLength(r.text)} bytes`);
    assert.ok(r.text.split("\n").length <= 2000);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.generation, r.generation + 1);
  });

  test("output of exactly the 1 MiB budget is ok; one byte more is output_limit", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const exact = await sb.execute(`import sys\nsys.stdout.write("a" * ${MiB - 10})\nsys.stderr.write("b" * 10)\nNone`);
    assertOk(exact);
    assert.equal(exact.outputLimitExceeded, false);
    assert.equal(exact.logComplete, true);
    assert.equal(exact.stdoutBytes + exact.stderrBytes, MiB);
    assert.ok(exact.logPaths);
    assert.equal(statSync(exact.logPaths.stdout).size, MiB - 10);
    assert.equal(statSync(exact.logPaths.stderr).size, 10);
    const over = await sb.execute(`import sys\nsys.stdout.write("a" * ${MiB - 10})\nsys.stderr.write("b" * 11)\nNone`);
    assert.equal(over.status, "output_limit", show(over));
    assert.equal(over.stdoutBytes + over.stderrBytes, MiB);
  });

  test("each execution writes complete NNNN-out/err logs outside scratch; long output is an excerpt", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const first = await sb.execute('import sys\nprint("o" * 10)\nsys.stderr.write("e" * 5)\nNone');
    assertOk(first);
    const { logDir, scratchDir } = sb.status().paths;
    assert.ok(logDir && scratchDir);
    assert.ok(!logDir.startsWith(`${scratchDir}/`) && logDir !== scratchDir, "logs must not be under scratch");
    assert.deepEqual(first.logPaths, { stdout: join(logDir, "0001-out.log"), stderr: join(logDir, "0001-err.log") });
    assert.equal(await readFile(join(logDir, "0001-out.log"), "utf8"), `${"o".repeat(10)}\n`);
    assert.equal(await readFile(join(logDir, "0001-err.log"), "utf8"), "e".repeat(5));

    const big = await sb.execute('print("z" * 200000)');
    assertOk(big);
    assert.equal(big.stdoutBytes, 200001);
    assert.equal(big.excerptTruncated, true);
    assert.ok(big.stdout.length < 200001 / 2, `excerpt is ${big.stdout.length} chars`);
    assert.ok(big.stdout.startsWith("zzzz") && big.stdout.trimEnd().endsWith("zzzz"));
    assert.match(big.stdout, /bytes omitted/);
    assert.equal(big.logPaths?.stdout, join(logDir, "0002-out.log"));
    assert.equal(await readFile(join(logDir, "0002-out.log"), "utf8"), `${"z".repeat(200000)}\n`);
    assert.match(big.text, /Full output saved to: .*0002-out\.log/);
    assert.equal(big.logPaths?.stderr, undefined, "a quiet stream has no log file");
    assert.deepEqual((await readdir(logDir)).sort(), ["0001-err.log", "0001-out.log", "0002-out.log"]);

    const inside = await sb.execute(`import os\n(os.path.exists(${lit(logDir)}), sorted(os.listdir("/scratch")))`);
    assert.equal(inside.repr, "(False, [])", "the sandbox must not see its logs");
  });
});

// ---------------------------------------------------------------------------------------------
describe("errors keep the interpreter", { concurrency: CONCURRENCY }, () => {
  test("an exception full of control characters is bounded, shown, and keeps the interpreter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    // JSON spells each of these as six bytes: unbounded, the result would overflow its frame.
    const r = await sb.execute('raise ValueError("\\x01" * 20000 + "\\x1b[31mend")');
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "ValueError");
    assert.match(r.exception?.message ?? "", /^\u2401{100}/);
    assert.ok(Buffer.byteLength(r.exception?.message ?? "") <= 8192, "the message stays within its bound");
    assert.equal(r.stateLost, false);
    assert.equal((await sb.execute("kept")).repr, "1");
  });

  test("a display hook that raises SystemExit is a runtime_error and keeps the interpreter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import sys
      kept = 1
      class Shy:
          def _repr_markdown_(self):
              sys.exit(3)
      Shy()
    `);
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "SystemExit");
    assert.equal(r.stateLost, false);
    assert.equal((await sb.execute("kept")).repr, "1");
  });

  test("a write outside the mounts fails in the sandbox and is not a read prompt", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    for (const code of ["open('/srv/pps-out.csv', 'w')", "import os\nos.open('/srv/pps-out.csv', os.O_WRONLY | os.O_CREAT)"]) {
      const r = await sb.execute(code);
      assert.equal(r.status, "runtime_error", `${code}: ${show(r)}`);
      assert.match(r.exception?.type ?? "", /^(FileNotFoundError|OSError|PermissionError)$/, code);
    }
    const read = await sb.execute("open('/srv/pps-out.csv')");
    assert.equal(read.status, "permission_needed", "a read of the same path still asks");
  });

  test("SyntaxError is a runtime_error and keeps state", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("x = 10"));
    const r = await sb.execute("def broken(:\n    pass");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "SyntaxError");
    assert.match(r.exception?.traceback ?? "", /File "<python>", line 1/);
    assert.equal(r.stateLost, false);
    const after = await sb.execute("x");
    assert.equal(after.repr, "10");
    assert.equal(after.generation, 1);
  });

  test("ValueError reports type, message and a traceback of user lines only; state kept", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('y = 2\ndef f():\n    raise ValueError("bad value")\nf()');
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.isError, true);
    assert.equal(r.exception?.type, "ValueError");
    assert.equal(r.exception?.message, "bad value");
    const tb = r.exception?.traceback ?? "";
    assert.match(tb, /File "<python>", line 4, in <module>/);
    assert.match(tb, /File "<python>", line 3, in f/);
    assert.doesNotMatch(tb, /worker\.py/);
    assert.match(r.text, /--- exception: ValueError ---/);
    const after = await sb.execute("(y, f.__name__)");
    assert.equal(after.repr, "(2, 'f')", "mutations before the error remain");
    assert.equal(after.generation, 1);
  });

  test("SystemExit is a runtime_error and the interpreter survives", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 'yes'"));
    const r = await sb.execute("import sys\nsys.exit(3)");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "SystemExit");
    assert.equal(r.exception?.message, "3");
    assert.equal(r.stateLost, false);
    const after = await sb.execute("kept");
    assert.equal(after.repr, "'yes'");
    assert.equal(after.generation, 1);
  });

  test("a NUL byte in the code is a runtime_error, not a crash", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const r = await sb.execute("x = 1\0");
    assert.equal(r.status, "runtime_error", show(r));
    assert.ok(["ValueError", "SyntaxError"].includes(r.exception?.type ?? ""), show(r));
    assert.match(r.exception?.message ?? "", /null bytes/);
    const after = await sb.execute("kept");
    assert.equal(after.repr, "1");
    assert.equal(after.generation, 1);
  });

  test("a lone surrogate in the code does not crash anything", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('s = "\ud800"\nlen(s)');
    assertOk(r);
    assert.equal(r.repr, "1");
    const after = await sb.execute("print(repr(s))\n2");
    assertOk(after);
    assert.equal(after.repr, "2");
    assert.equal(after.generation, 1);
  });

  test("a huge exception message and a deep traceback are bounded runtime_errors", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import sys
      sys.setrecursionlimit(10000)
      def a(n):
          if n == 0:
              raise ValueError("m" * 100000)
          return b(n - 1)
      def b(n):
          return a(n - 1)
      a(3000)
    `);
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "ValueError");
    const { message, traceback } = r.exception ?? { message: "", traceback: "" };
    assert.ok(message.startsWith("mmmm"));
    assert.ok(Buffer.byteLength(message) <= 8 * 1024 + 64, `message is ${Buffer.byteLength(message)} bytes`);
    assert.ok(Buffer.byteLength(traceback) <= 16 * 1024 + 64, `traceback is ${Buffer.byteLength(traceback)} bytes`);
    assert.ok(traceback.length > 4096, "the traceback keeps a useful tail");
    assert.ok(Buffer.byteLength(r.text) <= 50 * 1024);
    assert.equal(r.stateLost, false);
    assert.equal((await sb.execute("a.__name__")).repr, "'a'");
  });

  test("infinite recursion is a RecursionError and the interpreter survives", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute("def g():\n    return g()\ng()");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "RecursionError");
    assert.equal(r.stateLost, false);
    const after = await sb.execute("g.__name__");
    assert.equal(after.repr, "'g'");
    assert.equal(after.generation, 1);
  });
});

// ---------------------------------------------------------------------------------------------
describe("lifecycle: reset, timeout, cancel, worker death", { concurrency: CONCURRENCY }, () => {
  test("reset discards state, keeps scratch files and reports explicit_reset", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    assertOk(await sb.execute("x = 1\nopen('/scratch/keep.txt', 'w').write('kept')"));
    const scratchDir = sb.status().paths.scratchDir;
    assert.ok(scratchDir);
    assert.equal(await readFile(join(scratchDir, "keep.txt"), "utf8"), "kept");
    const reset = await sb.reset();
    assert.equal(reset.scratchDir, scratchDir);
    const s = sb.status();
    assert.equal(s.workerRunning, false);
    assert.equal(s.lastResetReason, "explicit_reset");
    assert.equal(s.generation, 1);
    await assertNoProcess(runtimeRoot);
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
    await sb.reset();
    assert.ok(await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 5000), "background processes survived reset");
    await assertNoProcess(runtimeRoot);
    const after = await sb.execute("import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())");
    assert.equal(after.repr, "[1, 2]");
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

  test("timeout kills the interpreter and the next call starts a fresh one", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("x = 1"));
    const started = Date.now();
    const r = await sb.execute("while True:\n    pass", 1);
    const took = Date.now() - started;
    assert.equal(r.status, "timeout", show(r));
    assert.equal(r.isError, true);
    assert.equal(r.stateLost, true);
    assert.equal(r.stateLostReason, "timeout");
    assert.ok(took >= 900 && took < 6000, `timeout result after ${took} ms`);
    const next = await sb.execute("'x' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.generation, r.generation + 1);
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
      time.sleep(30)
    `;
    const timedOut = await sb.execute(code("before-timeout"), 1);
    assert.equal(timedOut.status, "timeout", show(timedOut));
    assert.equal(timedOut.stdout, "before-timeout out 1\n");
    assert.equal(timedOut.stderr, "before-timeout err\n");
    const pending = sb.execute(code("before-cancel"), 60, 77);
    assert.ok(await waitUntil(() => sb.status().busy && sb.status().workerRunning, 5000));
    await sleep(500);
    sb.cancel(77);
    const cancelled = await pending;
    assert.equal(cancelled.status, "cancelled", show(cancelled));
    assert.equal(cancelled.stdout, "before-cancel out 2\n");
    assert.equal(cancelled.stderr, "before-cancel err\n");
    await assertNoProcess(runtimeRoot);
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
    assert.equal(r.stateLost, true);
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
    assert.equal(r.stateLost, true);
    assert.equal(r.stateLostReason, "cancelled");
    const scratchDir = sb.status().paths.scratchDir;
    assert.ok(scratchDir);
    await assertGrandchildGone(marker, scratchDir);
    const next = await sb.execute("'x' in globals()");
    assert.equal(next.repr, "False");
    assert.equal(next.generation, r.generation + 1);
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

  test("worker death mid-call is a worker_error with partial output; the next call is fresh", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const r = await sb.execute("print('partial')\nimport os\nos._exit(7)");
    assert.equal(r.status, "worker_error", show(r));
    assert.equal(r.stateLost, true);
    assert.equal(r.stdout, "partial\n");
    assert.match(r.diagnostic ?? "", /worker died/);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.generation, r.generation + 1);
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
    // pid 2 in the sandbox's pid namespace is the worker (pid 1 is bwrap's init). The killer
    // outlives the 1 s drain window, so the kill lands after the result, while idle.
    const first = await sb.execute(
      "import os, subprocess\nx = 41\nsubprocess.Popen(['sh', '-c', 'sleep 1.5; kill -9 2'])\nos.getpid()",
      10,
    );
    assertOk(first);
    assert.equal(first.repr, "2");
    await assertNoProcess(runtimeRoot, 8000);
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
describe("protocol violations from user code", { concurrency: CONCURRENCY }, () => {
  async function violation(t: TestContext, code: string, diagnostic: RegExp | null): Promise<void> {
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute(code, 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assert.equal(r.status, "worker_error", show(r));
    assert.equal(r.stateLost, true);
    if (diagnostic) assert.match(r.diagnostic ?? "", diagnostic);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.generation, r.generation + 1);
  }

  test("a malformed reply frame is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, 'import os\nos.write(4, b"\\x00\\x00\\x00\\x05hello")', /Protocol violation/);
  });

  test("an oversize reply frame length is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, "import os\nos.write(4, (10**7).to_bytes(4, 'big'))", /Protocol violation.*exceeds/);
  });

  test("closing the reply fd (4) is a worker_error, not a hang", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, "import os\nos.close(4)", null);
  });

  test("closing the request fd (3) ends the interpreter after its result; the next call says so", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute("import os\nos.close(3)", 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assertOk(r); // the code itself ran to completion; the worker dies when it reads the next request
    await assertNoProcess(runtimeRoot);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.stateLost, true);
    assert.match(next.stateLostReason ?? "", /died while idle/);
    assert.equal(next.generation, r.generation + 1);
  });
});

// ---------------------------------------------------------------------------------------------
describe("resource limits", { concurrency: CONCURRENCY }, () => {
  test("a 600 MiB allocation fails with MemoryError and the interpreter keeps working", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const r = await sb.execute("big = bytearray(600 * 1024 * 1024)");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "MemoryError");
    const after = await sb.execute("small = bytearray(50 * 1024 * 1024)\n(kept, len(small))");
    assertOk(after);
    assert.equal(after.repr, `(1, ${50 * MiB})`);
    assert.equal(after.generation, 1);
  });

  test("a 17 MiB scratch file stops at 16 MiB with EFBIG", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os
      try:
          with open("/scratch/big.bin", "wb") as f:
              f.write(b"\0" * (17 * 1024 * 1024))
          outcome = "written"
      except OSError as e:
          outcome = e.errno
      print(json.dumps([outcome, os.path.getsize("/scratch/big.bin")]))
    `);
    assert.deepEqual(jsonOut(r), [27, 16 * MiB]); // EFBIG
  });

  test("opening /dev/null 200 times fails with EMFILE", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json
      files = []
      try:
          for _ in range(200):
              files.append(open("/dev/null"))
          outcome = "opened all"
      except OSError as e:
          outcome = e.errno
      count = len(files)
      for f in files:
          f.close()
      print(json.dumps([outcome, count]))
    `);
    const [outcome, count] = jsonOut(r);
    assert.equal(outcome, 24); // EMFILE
    assert.ok(count < 128, `${count} files opened`);
  });

  test("rlimits inside and in subprocesses are the documented values", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const probe = "import json, resource; print(json.dumps([resource.getrlimit(getattr(resource, n)) for n in ('RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_CORE')]))";
    const own = jsonOut(await sb.execute(probe));
    const child = jsonOut(await sb.execute(`import subprocess\nsubprocess.run(["python3", "-c", ${lit(probe)}])`));
    const { limits } = sb.status();
    const expected = [
      [512 * MiB, 512 * MiB],
      [16 * MiB, 16 * MiB],
      [128, 128],
      [0, 0],
    ];
    assert.deepEqual(own, expected);
    assert.deepEqual(child, expected);
    assert.equal(limits.rlimitAsBytes, 512 * MiB);
    assert.equal(limits.rlimitFsizeBytes, 16 * MiB);
    assert.equal(limits.rlimitNofile, 128);
    assert.equal(limits.coreDumps, "disabled");
  });
});

// ---------------------------------------------------------------------------------------------
/**
 * Seccomp catalogue: each call is made through ctypes with x86_64 numbers and arguments chosen so
 * that an allowed call fails differently (EFAULT, ESRCH, ...) or succeeds. The same probe runs in
 * plain bwrap without the filter to prove the probe can tell "blocked" from "ran and failed".
 * `gated`: the kernel itself may answer EPERM there (capability or sysctl checks before argument
 * checks), so the baseline is reported, not asserted.
 */
const SYSCALLS: { name: string; nr: number; args: number[]; gated?: boolean }[] = [
  { name: "socket", nr: 41, args: [2, 1, 0] }, // AF_INET, SOCK_STREAM: allowed -> an fd
  { name: "socketpair", nr: 53, args: [1, 1, 0, 1] }, // bad sv pointer: allowed -> EFAULT
  { name: "ptrace", nr: 101, args: [12, 999999, 0, 0] }, // PTRACE_GETREGS on no pid: allowed -> ESRCH
  { name: "bpf", nr: 321, args: [0, 1, 16], gated: true }, // bad attr pointer
  { name: "userfaultfd", nr: 323, args: [1], gated: true }, // UFFD_USER_MODE_ONLY: allowed -> an fd
  { name: "perf_event_open", nr: 298, args: [1, 0, -1, -1, 0] }, // bad attr pointer: EFAULT
  { name: "process_vm_readv", nr: 310, args: [1, 1, 1, 1, 1, 0] }, // bad iovec: EFAULT
  { name: "process_vm_writev", nr: 311, args: [1, 1, 1, 1, 1, 0] },
  { name: "kexec_load", nr: 246, args: [0, 0, 0, 0], gated: true }, // CAP_SYS_BOOT or ENOSYS
  { name: "kexec_file_load", nr: 320, args: [-1, -1, 0, 0, 0], gated: true },
  { name: "open_by_handle_at", nr: 304, args: [-100, 1, 0], gated: true }, // CAP_DAC_READ_SEARCH
  { name: "name_to_handle_at", nr: 303, args: [-100, 1, 1, 1, 0] }, // bad path pointer: EFAULT
];

function syscallProbe(nr: number, args: number[]): string {
  return py`
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(${nr}), *[ctypes.c_long(a) for a in ${JSON.stringify(args)}])
    err = ctypes.get_errno()
    if ret >= 0 and ${nr} in (41, 323):
        os.close(ret)
    print(json.dumps({"ret": ret, "errno": err}))
  `;
}

describe("seccomp blocks the documented system calls", { concurrency: CONCURRENCY }, () => {
  for (const { name, nr, args, gated } of SYSCALLS) {
    test(`blocks ${name}`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      if (process.arch !== "x64") {
        console.log(`# SKIP blocks ${name}: syscall numbers are x86_64, this is ${process.arch}`);
        t.skip(`x86_64 syscall numbers; this is ${process.arch}`);
        return;
      }
      const { sb } = await makeFixture(t);
      const code = syscallProbe(nr, args);
      const inside = jsonOut<{ ret: number; errno: number }>(await sb.execute(code));
      assert.deepEqual(inside, { ret: -1, errno: EPERM }, `${name} inside the sandbox`);
      const baseline = JSON.parse(await unfiltered(code, { capabilities: false })) as { ret: number; errno: number };
      if (gated && baseline.errno === EPERM) {
        t.diagnostic(`${name}: the unfiltered kernel also answers EPERM here; the probe cannot tell the filter apart`);
      } else {
        assert.notEqual(baseline.errno, EPERM, `the ${name} probe must not fail with EPERM unfiltered (${JSON.stringify(baseline)})`);
      }
      if (name === "socket" || name === "socketpair") {
        const api = await sb.execute(py`
          import socket
          try:
              socket.${name}()
              outcome = "created"
          except OSError as e:
              outcome = (type(e).__name__, e.errno)
          outcome
        `);
        assert.equal(api.repr, "('PermissionError', 1)", `socket.${name}()`);
      }
    });
  }
});

// ---------------------------------------------------------------------------------------------
describe("isolation", { concurrency: CONCURRENCY }, () => {
  test("/workspace is read-only and the host file stays unchanged", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os
      def attempt(fn):
          try:
              fn()
              return "allowed"
          except OSError as e:
              return e.errno
      print(json.dumps({
          "read": open("/workspace/data.txt").read(),
          "overwrite": attempt(lambda: open("/workspace/data.txt", "w").write("pwned")),
          "append": attempt(lambda: open("data.txt", "a").write("pwned")),
          "remove": attempt(lambda: os.remove("/workspace/data.txt")),
          "create": attempt(lambda: open("/workspace/new.txt", "w")),
          "mkdir": attempt(lambda: os.mkdir("/workspace/d")),
      }))
    `);
    const out = jsonOut(r);
    assert.equal(out.read, FIXTURE_CONTENT);
    for (const op of ["overwrite", "append", "remove", "create", "mkdir"]) {
      assert.equal(out[op], 30, `${op}: expected EROFS, got ${out[op]}`);
    }
    assert.equal(await readFile(join(project, "data.txt"), "utf8"), FIXTURE_CONTENT);
    assert.deepEqual(await readdir(project), ["data.txt"]);
    assert.equal(sb.status().workspaceMode, "read-only");
  });

  test("cwd is /workspace and /scratch is the host scratch directory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(
      "import os\nopen('/scratch/from-sandbox.txt', 'w').write('inside')\n(os.getcwd(), open('data.txt').read())",
    );
    assertOk(r);
    assert.equal(r.repr, "('/workspace', 'fixture-content\\n')");
    const scratchDir = sb.status().paths.scratchDir;
    assert.ok(scratchDir);
    assert.equal(await readFile(join(scratchDir, "from-sandbox.txt"), "utf8"), "inside");
    await writeFile(join(scratchDir, "from-host.txt"), "outside");
    assert.equal((await sb.execute("open('/scratch/from-host.txt').read()")).repr, "'outside'");
    const mode = (await stat(scratchDir)).mode & 0o777;
    assert.equal(mode, 0o700, `scratch mode ${mode.toString(8)}`);
  });

  test("the environment holds only the sandbox's variables, never the host's", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const secret = `pps-secret-${randomUUID()}`;
    process.env.PI_SANDBOX_TEST_SECRET = secret;
    t.after(() => {
      delete process.env.PI_SANDBOX_TEST_SECRET;
    });
    const { sb, runtimeRoot } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os, subprocess
      child = subprocess.run(["env"], capture_output=True, text=True).stdout
      print(json.dumps({
          "env": dict(os.environ),
          "child": sorted(line.split("=", 1)[0] for line in child.splitlines()),
          "environ": open("/proc/self/environ").read(),
      }))
    `);
    const out = jsonOut(r);
    // Exactly the documented --clearenv + --setenv set (the worker drops the PWD bwrap exports).
    assert.deepEqual(out.env, { HOME: "/scratch", LANG: "C.UTF-8", PATH: "/usr/bin:/bin", TMPDIR: "/tmp" });
    assert.deepEqual(out.child, ["HOME", "LANG", "PATH", "TMPDIR"]);
    assert.ok(!r.stdout.includes(secret), "the host secret reached the sandbox");
    // Nor does bwrap itself carry the host environment.
    const bwraps = hostPidsWithCmdline(runtimeRoot);
    assert.ok(bwraps.length > 0, "no sandbox process found on the host");
    for (const pid of bwraps) {
      try {
        assert.ok(!readFileSync(`/proc/${pid}/environ`).includes(secret), `pid ${pid} has the secret`);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
      }
    }
  });

  test("/proc shows only the sandbox's own processes", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os
      pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
      print(json.dumps({"pids": pids, "me": os.getpid(), "host": os.path.exists("/proc/${process.pid}"),
                        "init": open("/proc/1/cmdline").read().split("\0")[0]}))
    `);
    const out = jsonOut(r);
    assert.deepEqual(out.pids, [1, 2], "only bwrap's init and the worker");
    assert.equal(out.me, 2);
    assert.equal(out.host, false, "the host node process is visible");
    assert.match(out.init, /bwrap$/);
  });

  test("host secrets are unreachable: /etc/shadow, the home directory, host temp files", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, base, project } = await makeFixture(t);
    const canaryText = `pps-canary-${randomUUID()}`;
    const canary = join(base, "canary.txt");
    await writeFile(canary, canaryText);
    await symlink(canary, join(project, "abs-link"));
    await symlink("../canary.txt", join(project, "rel-link"));
    const home = homedir();
    const r = await sb.execute(py`
      import json, os, subprocess
      # The read hook refuses these first (SandboxReadDenied); the kernel
      # mounts are the enforcement, shown by the same reads from a subprocess.
      def read(path):
          try:
              with open(path) as f:
                  return "READ:" + f.read()
          except Exception as e:
              return type(e).__name__
      def listing(path):
          try:
              return "LISTED:" + ",".join(os.listdir(path))
          except Exception as e:
              return type(e).__name__
      def cat(path):
          r = subprocess.run(["cat", path], capture_output=True, text=True)
          return "READ:" + r.stdout if r.returncode == 0 else "failed"
      print(json.dumps({
          "shadow": read("/etc/shadow"),
          "passwd": read("/etc/passwd"),
          "home": listing(${lit(home)}),
          "canary": read(${lit(canary)}),
          "abs-link": read("/workspace/abs-link"),
          "rel-link": read("/workspace/rel-link"),
          "tmp": listing("/tmp"),
          "base": listing(${lit(base)}),
          "shadow-sub": cat("/etc/shadow"),
          "canary-sub": cat(${lit(canary)}),
          "abs-link-sub": cat("/workspace/abs-link"),
      }))
    `);
    const out = jsonOut(r);
    for (const [what, value] of Object.entries(out)) {
      if (what === "tmp") continue;
      assert.ok(!String(value).startsWith("READ:") && !String(value).startsWith("LISTED:"), `${what}: ${value}`);
    }
    assert.equal(out.tmp, "LISTED:", "/tmp is a private, empty tmpfs");
    assert.ok(!r.stdout.includes(canaryText));
  });

  test("a TCP connection to a host loopback server fails", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    let connections = 0;
    const server: Server = createServer((c) => {
      connections++;
      c.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const port = (server.address() as { port: number }).port;
    const r = await sb.execute(py`
      import socket
      try:
          socket.create_connection(("127.0.0.1", ${port}), timeout=3)
          outcome = "connected"
      except OSError as e:
          outcome = (type(e).__name__, e.errno)
      outcome
    `);
    assertOk(r);
    assert.equal(r.repr, "('PermissionError', 1)");
    await sleep(100);
    assert.equal(connections, 0);
  });

  test("an AF_UNIX connection to a socket bound in the project fails", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    let connections = 0;
    const server: Server = createServer((c) => {
      connections++;
      c.destroy();
    });
    await new Promise<void>((resolve) => server.listen(join(project, "host.sock"), resolve));
    t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const r = await sb.execute(py`
      import os, socket
      assert os.path.exists("/workspace/host.sock")
      try:
          s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
          s.connect("/workspace/host.sock")
          outcome = "connected"
      except OSError as e:
          outcome = (type(e).__name__, e.errno)
      outcome
    `);
    assertOk(r);
    assert.equal(r.repr, "('PermissionError', 1)");
    await sleep(100);
    assert.equal(connections, 0);
  });

  test("no_new_privs is set, seccomp is in filter mode and no capabilities remain", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, subprocess
      def fields(text):
          return {k: v.strip() for k, v in (l.split(":", 1) for l in text.splitlines() if ":" in l)}
      own = fields(open("/proc/self/status").read())
      child = fields(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout)
      keys = ["NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
      print(json.dumps([{k: own[k] for k in keys}, {k: child[k] for k in keys}]))
    `);
    const zero = "0000000000000000";
    const expected = { NoNewPrivs: "1", Seccomp: "2", CapInh: zero, CapPrm: zero, CapEff: zero, CapBnd: zero, CapAmb: zero };
    const [own, child] = jsonOut(r);
    assert.deepEqual(own, expected);
    assert.deepEqual(child, expected, "a subprocess inherits the confinement");
  });

  test("workspaceWritable mounts the project read-write", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const sb = fx.open({ workspaceWritable: true });
    assert.equal(sb.status().workspaceMode, "read-write");
    const r = await sb.execute("open('/workspace/new.txt', 'w').write('written')\nopen('data.txt', 'a').write('more')\nNone");
    assertOk(r);
    assert.equal(await readFile(join(fx.project, "new.txt"), "utf8"), "written");
    assert.equal(await readFile(join(fx.project, "data.txt"), "utf8"), `${FIXTURE_CONTENT}more`);
  });

  test("readRoots are mounted read-only at their own host paths", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const root = join(fx.base, "granted");
    const other = join(fx.base, "not-granted");
    await mkdir(root);
    await mkdir(other);
    await writeFile(join(root, "f.txt"), "granted-content");
    await writeFile(join(other, "f.txt"), "other-content");
    const sb = fx.open({ readRoots: [root] });
    const r = await sb.execute(py`
      import json
      def attempt(fn):
          try:
              return fn()
          except OSError as e:
              return type(e).__name__ + ":" + str(e.errno)
      print(json.dumps({
          "read": attempt(lambda: open(${lit(join(root, "f.txt"))}).read()),
          "write": attempt(lambda: open(${lit(join(root, "new.txt"))}, "w") and "written"),
          "other": attempt(lambda: open(${lit(join(other, "f.txt"))}).read()),
      }))
    `);
    assert.deepEqual(jsonOut(r), { read: "granted-content", write: "OSError:30", other: "FileNotFoundError:2" });
    assert.deepEqual(sb.status().readRoots, [root]);
    assert.equal(existsSync(join(root, "new.txt")), false);
  });

  test("nested user namespaces cannot be created", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import ctypes, json, subprocess
      libc = ctypes.CDLL(None, use_errno=True)
      ret = libc.unshare(0x10000000)  # CLONE_NEWUSER
      err = ctypes.get_errno()
      tool = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True)
      print(json.dumps({"ret": ret, "errno": err, "tool": tool.returncode}))
    `);
    const out = jsonOut(r);
    assert.equal(out.ret, -1, "unshare(CLONE_NEWUSER) succeeded");
    assert.notEqual(out.errno, 0);
    assert.notEqual(out.tool, 0, "`unshare -U true` succeeded");
  });
});

// ---------------------------------------------------------------------------------------------
describe("sessions and the JS API", { concurrency: CONCURRENCY }, () => {
  test("two sessions are independent, have their own scratch and run concurrently", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const a = fx.sb;
    const b = fx.open();
    assertOk(await a.execute("only_in_a = 1\nopen('/scratch/a.txt', 'w').write('a')"));
    const missing = await b.execute("only_in_a");
    assert.equal(missing.status, "runtime_error", show(missing));
    assert.equal(missing.exception?.type, "NameError");
    assert.equal((await b.execute("import os\nos.path.exists('/scratch/a.txt')")).repr, "False");
    assert.notEqual(a.status().paths.scratchDir, b.status().paths.scratchDir);
    const window = "import time\nstart = time.time()\ntime.sleep(1)\n[start, time.time()]";
    const [ra, rb] = await Promise.all([a.execute(window), b.execute(window)]);
    const [sa, ea] = JSON.parse(ra.repr ?? "null") as number[];
    const [sb2, eb] = JSON.parse(rb.repr ?? "null") as number[];
    assert.ok(sa < eb && sb2 < ea, `executions did not overlap: A ${sa}-${ea}, B ${sb2}-${eb}`);
  });

  test("four sandboxes in one process each keep their own value", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const sandboxes = [fx.sb, fx.open(), fx.open(), fx.open()];
    const set = await Promise.all(sandboxes.map((s, i) => s.execute(`value = "session-${i}"`)));
    set.forEach(assertOk);
    const got = await Promise.all(sandboxes.map((s) => s.execute("value")));
    assert.deepEqual(got.map((r) => r.repr), ["'session-0'", "'session-1'", "'session-2'", "'session-3'"]);
  });

  test("concurrent execute calls on one sandbox are queued, their outputs not interleaved", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const code = (tag: string) =>
      `import time\nstart = time.time()\nfor i in range(200):\n    print("${tag}", i)\n    time.sleep(0.002)\n[start, time.time()]`;
    const [a, b] = await Promise.all([sb.execute(code("A")), sb.execute(code("B"))]);
    for (const [r, tag] of [[a, "A"], [b, "B"]] as const) {
      assertOk(r);
      const lines = r.stdout.trimEnd().split("\n");
      assert.equal(lines.length, 200);
      assert.deepEqual(lines, Array.from({ length: 200 }, (_, i) => `${tag} ${i}`));
    }
    const [sa, ea] = JSON.parse(a.repr ?? "null") as number[];
    const [sb2, eb] = JSON.parse(b.repr ?? "null") as number[];
    assert.ok(ea <= sb2 || eb <= sa, `executions overlapped: A ${sa}-${ea}, B ${sb2}-${eb}`);
    assert.equal(a.generation, b.generation);
  });

  test("status before any execute starts nothing", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project, runtimeRoot } = await makeFixture(t);
    const s = sb.status();
    assert.equal(s.available, "unverified");
    assert.equal(s.workerRunning, false);
    assert.equal(s.busy, false);
    assert.equal(s.generation, 0);
    assert.equal(s.executions, 0);
    assert.equal(s.disposed, false);
    assert.equal(s.workspaceMode, "read-only");
    assert.equal(s.paths.projectDir, project);
    assert.equal(s.paths.scratchDir, undefined);
    assert.equal(s.paths.logDir, undefined);
    assert.equal(s.paths.sandboxProject, "/workspace");
    assert.equal(s.paths.sandboxScratch, "/scratch");
    assert.equal(s.limits.maxCodeBytes, 65536);
    assert.equal(s.limits.outputBudgetBytes, MiB);
    assert.equal(s.limits.maxTimeoutSeconds, 120);
    assert.match(s.text, /not started yet/);
    await sleep(200);
    assert.equal(existsSync(runtimeRoot), false, "runtimeRoot was created");
    assert.deepEqual(hostPidsWithCmdline(runtimeRoot), []);
    assert.equal(sb.status().workerRunning, false);
  });

  test("code over 64 KiB rejects with InvalidArg and leaves state alone; 64 KiB exactly runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("x = 1"));
    const before = sb.status();
    await assert.rejects(sb.execute(`#${"a".repeat(65536)}`), { code: "InvalidArg" });
    // 32769 JS characters but 65537 UTF-8 bytes: the limit counts bytes.
    await assert.rejects(sb.execute(`#${"é".repeat(32768)}`), { code: "InvalidArg" });
    const after = sb.status();
    assert.equal(after.executions, before.executions);
    assert.equal(after.generation, before.generation);
    const x = await sb.execute("x");
    assert.equal(x.repr, "1");
    assert.equal(x.generation, 1);
    const exact = await sb.execute(`#${"a".repeat(65535)}`);
    assertOk(exact);
    const exactMultibyte = await sb.execute(`#${"é".repeat(32767)}a`);
    assertOk(exactMultibyte);
  });

  test("64 KiB of newlines runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute("\n".repeat(65536));
    assertOk(r);
    assert.equal(r.repr, undefined);
  });

  test("invalid timeouts reject with InvalidArg; 1 and 120 are accepted", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    for (const bad of [0, 121, 1.5, Number.NaN, -1, Number.POSITIVE_INFINITY]) {
      await assert.rejects(sb.execute("1", bad), { code: "InvalidArg" }, `timeoutSeconds ${bad}`);
    }
    assert.equal(sb.status().generation, 0, "a rejected call starts nothing");
    assertOk(await sb.execute("1", 1));
    assertOk(await sb.execute("1", 120));
    assertOk(await sb.execute("1", undefined));
  });

  test("dispose during a running call settles it, deletes the directories and kills the sandbox", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    const pending = sb.execute("import time\ntime.sleep(30)", 60);
    assert.ok(await waitUntil(() => sb.status().busy && sb.status().workerRunning, 5000));
    await sleep(200);
    const { scratchDir, logDir } = sb.status().paths;
    assert.ok(scratchDir && logDir && existsSync(scratchDir) && existsSync(logDir));
    assert.ok(hostPidsWithCmdline(runtimeRoot).length > 0, "the sandbox was not visible before dispose");
    const disposedAt = Date.now();
    await sb.dispose();
    const r = await pending;
    assert.ok(Date.now() - disposedAt < 3000, `pending call settled after ${Date.now() - disposedAt} ms`);
    assert.equal(r.status, "cancelled", show(r));
    assert.equal(r.stateLost, true);
    assert.equal(existsSync(scratchDir), false, "scratch dir remains");
    assert.equal(existsSync(logDir), false, "log dir remains");
    await assertNoProcess(runtimeRoot);
    const s = sb.status();
    assert.equal(s.disposed, true);
    assert.equal(s.workerRunning, false);
    assert.equal(s.paths.scratchDir, undefined);
    await sb.dispose(); // idempotent
    const later = await sb.execute("1");
    assert.equal(later.isError, true, show(later));
    assert.equal(later.status, "unavailable", show(later));
    assert.equal(sb.status().generation, s.generation, "nothing started after dispose");
    assert.equal(existsSync(scratchDir), false);
    assert.deepEqual(hostPidsWithCmdline(runtimeRoot), []);
  });

  test(
    "every execute after dispose answers unavailable",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb } = await makeFixture(t);
      assertOk(await sb.execute("1"));
      await sb.dispose();
      const statuses = [];
      for (let i = 0; i < 20; i++) statuses.push((await sb.execute("1")).status);
      assert.deepEqual(statuses, Array(20).fill("unavailable"));
    },
  );
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
    await assertNoProcess(runtimeRoot);
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
  test("a ready spare takes over after a reset and a timeout, and never carries state", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixtureWithSpare(t);
    assert.equal(sb.status().spare, "none", "nothing starts before the first execution");
    assertOk(await sb.execute("secret = 'first'"));
    assert.ok(await waitUntil(() => sb.status().spare === "ready", 5000), "the spare became ready");
    const spareAndActive = hostPidsWithCmdline(runtimeRoot).length;
    await sb.reset();
    const afterReset = await sb.execute("'secret' in globals()");
    assert.equal(afterReset.repr, "False");
    assert.equal(afterReset.generation, 2);
    assert.ok(await waitUntil(() => sb.status().spare === "ready", 5000), "a new spare was started");
    const timedOut = await sb.execute("secret = 'second'\nwhile True: pass", 1);
    assert.equal(timedOut.status, "timeout");
    const afterTimeout = await sb.execute("'secret' in globals()");
    assert.equal(afterTimeout.repr, "False");
    assert.equal(afterTimeout.generation, 3);
    assert.ok(await waitUntil(() => hostPidsWithCmdline(runtimeRoot).length <= spareAndActive, 5000), "no sandbox piles up");
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

    await sb.reset();
    const second = await sb.execute(failing);
    assert.equal(sb.status().workerCode, "bytecode");
    // Tracebacks still hide the worker's frames and show the user's.
    assert.equal(second.status, "runtime_error", show(second));
    assert.equal(second.exception?.traceback, first.exception?.traceback);
    assert.match(second.exception?.traceback ?? "", /line 4, in outer\n.*line 2, in inner\nZeroDivisionError/);
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
    await sb.reset();
    const r = await sb.execute("'fresh'");
    assert.equal(r.repr, "'fresh'", show(r));
    assert.equal(sb.status().workerCode, "source");
    assert.equal((await stat(image)).mode & 0o777, 0o400, "a new image replaced the broken one");
    await sb.reset();
    assertOk(await sb.execute("1"));
    assert.equal(sb.status().workerCode, "bytecode");
  });
});

test("status says which hardening is active and what is not contained", async (t) => {
  const { sb } = await makeFixture(t);
  const st = sb.status();
  assert.ok(st.seccompRules >= 40, `${st.seccompRules} rules`);
  assert.ok(st.protectedPaths.includes(".git") && st.protectedPaths.includes(".mcp.json") && st.protectedPaths.includes(".claude"));
  assert.match(
    st.text,
    /hardening: default-deny seccomp filter \(allowlist of \d{3} calls, \d+ refusals; other calls answer ENOSYS; native architecture only\); no nested user namespaces/,
  );
  assert.match(st.text, /Not applied: limits on the number of processes or on total memory/);
  const saved = process.env.PI_PYTHON_TOOL_PROTECTED;
  process.env.PI_PYTHON_TOOL_PROTECTED = "";
  t.after(() => {
    if (saved === undefined) delete process.env.PI_PYTHON_TOOL_PROTECTED;
    else process.env.PI_PYTHON_TOOL_PROTECTED = saved;
  });
  assert.deepEqual(sb.status().protectedPaths, []);
  assert.match(sb.status().text, /protected paths when \/workspace is writable: none \(PI_PYTHON_TOOL_PROTECTED is empty\)/);
});
